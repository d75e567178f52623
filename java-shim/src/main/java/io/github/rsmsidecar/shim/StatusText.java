package io.github.rsmsidecar.shim;

import io.grpc.Status;

/**
 * How the shim words a gRPC status: on one line. gRPC's own descriptions may hold line breaks (a
 * failed connection's {@code io exception} is followed by a line {@code Channel Pipeline: [...]}),
 * which would split one event over two log lines. No Kafka and no SLF4J here: the connectivity
 * check ({@link Diagnose}) runs from the shaded jar alone.
 */
final class StatusText {

    private StatusText() {
    }

    /** {@code "<CODE>: <description> (cause: <cause>)"} on one line. */
    static String of(Status status) {
        StringBuilder sb = new StringBuilder().append(status.getCode());
        if (status.getDescription() != null) {
            sb.append(": ").append(status.getDescription());
        }
        // a TLS refusal is said in full in the description: its cause is a TLS library's wording of the same
        if (status.getCause() != null
                && (status.getDescription() == null || !status.getDescription().startsWith(TlsRefusal.PREFIX))) {
            sb.append(" (cause: ").append(status.getCause()).append(')');
        }
        return oneLine(sb.toString());
    }

    /** {@code text} with each line break (and the blanks around it) replaced by {@code "; "}. */
    static String oneLine(String text) {
        return text.strip().replaceAll("\\s*(?:\\r\\n|\\r|\\n)\\s*", "; ");
    }
}
