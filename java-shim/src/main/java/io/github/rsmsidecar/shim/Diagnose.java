package io.github.rsmsidecar.shim;

import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.FetchIndexResponse;
import io.github.rsmsidecar.proto.v1.IndexType;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.github.rsmsidecar.proto.v1.SegmentState;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.IOException;
import java.io.PrintStream;
import java.security.SecureRandom;
import java.util.Base64;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * Connectivity check from a broker host, using the shim's own channel code and configuration keys,
 * and nothing from Kafka (runs from the shaded jar alone):
 *
 * <pre>
 * java -jar rsm-sidecar-shim.jar unix:///run/rsm-sidecar/rsm.sock [tls.enabled=true tls.ca.file=... ...]
 * </pre>
 *
 * It asks the sidecar for the transaction index of a random, non-existent segment (read-only) and
 * prints the status on one line. Any answer from the sidecar (normally NOT_FOUND) means the
 * transport works: exit 0. UNAVAILABLE or DEADLINE_EXCEEDED (not reachable): exit 2; when TLS
 * refused, the line says who refused what and the file or setting to fix, as the broker's log does
 * ({@link TlsRefusal}). Bad arguments or unusable TLS files (the message names the key): exit 64.
 */
public final class Diagnose {

    private Diagnose() {
    }

    public static void main(String[] args) {
        System.exit(run(args, System.out, System.err));
    }

    /** Whether the sidecar's fetch channel answers, with the shim's own client of it. */
    static String fetchChannelReport(ShimConfig config) {
        try {
            TlsFiles tls = config.tlsEnabled() ? TlsFiles.read(config).check(config) : null;
            io.grpc.netty.shaded.io.netty.handler.ssl.SslContext context =
                    tls == null ? null : tls.fetchChannelContext(config);
            String[] address = config.fetchChannelAddress();
            String host = !config.tlsAuthorityOverride().isEmpty() ? config.tlsAuthorityOverride()
                    : address.length == 2 ? address[0] : "localhost";
            int port = address.length == 2 ? Integer.parseInt(address[1]) : 0;
            return io.github.rsmsidecar.shim.read.FetchChannel.probe(config,
                    context == null ? null : () -> TlsFiles.newEngine(context, host, port));
        } catch (IOException e) {
            return "fetch channel: not checked (" + e.getMessage() + ")";
        }
    }

    static int run(String[] args, PrintStream out, PrintStream err) {
        if (args.length < 1 || args[0].startsWith("-")) {
            err.println("usage: java -jar rsm-sidecar-shim.jar <sidecar.target> [key=value ...]");
            err.println("keys (rsm.config. prefix stripped): " + ShimConfig.KEYS.keySet());
            return 64;
        }
        Map<String, String> configs = new LinkedHashMap<>();
        configs.put(ShimConfig.SIDECAR_TARGET, args[0]);
        for (int i = 1; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq <= 0) {
                err.println("expected key=value, got: " + args[i]);
                return 64;
            }
            configs.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        ShimConfig config;
        ManagedChannel channel;
        TlsFiles tls;
        try {
            config = ShimConfig.parse(configs);
            if (!config.unknownKeys().isEmpty()) {
                err.println("unknown keys: " + config.unknownKeys());
                return 64;
            }
            tls = config.tlsEnabled() ? TlsFiles.read(config).check(config) : null;
            channel = ChannelFactory.NETTY.create(config, tls);
        } catch (Exception e) {
            err.println(StatusText.oneLine(String.valueOf(e.getMessage())));
            return 64;
        }
        try {
            byte[] id = new byte[16];
            new SecureRandom().nextBytes(id);
            String uuid = Base64.getUrlEncoder().withoutPadding().encodeToString(id);
            FetchIndexRequest request = FetchIndexRequest.newBuilder()
                    .setMetadata(SegmentMetadata.newBuilder()
                            .setTopicId(uuid).setTopicName("rsm-sidecar-shim-diagnose").setPartition(0)
                            .setSegmentId(uuid).setStartOffset(0).setEndOffset(0)
                            .putSegmentLeaderEpochs(0, 0L).setState(SegmentState.COPY_SEGMENT_FINISHED))
                    .setIndexType(IndexType.TRANSACTION)
                    .build();
            Status status;
            try {
                Iterator<FetchIndexResponse> it = RemoteStorageGrpc.newBlockingStub(channel)
                        .withDeadlineAfter(config.fetchIndexDeadlineMs(), TimeUnit.MILLISECONDS)
                        .fetchIndex(request);
                while (it.hasNext()) {
                    it.next();
                }
                status = Status.OK;
            } catch (StatusRuntimeException e) {
                status = e.getStatus();
            }
            String refused = new TlsRefusal(config, () -> tls).reason(status);
            if (refused != null) {
                status = Status.UNAVAILABLE.withDescription(refused).withCause(status.getCause());
            }
            out.println("FetchIndex to the sidecar at " + config.target() + " ended with "
                    + StatusText.of(status));
            boolean unreachable = status.getCode() == Status.Code.UNAVAILABLE
                    || status.getCode() == Status.Code.DEADLINE_EXCEEDED;
            if (!unreachable) {
                out.println(fetchChannelReport(config));
            }
            return unreachable ? 2 : 0;
        } finally {
            channel.shutdownNow();
        }
    }
}
