package io.github.rsmsidecar.shim;

import java.net.URI;
import java.net.URISyntaxException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

/**
 * The shim's configuration: the {@code rsm.config.*} broker properties with the prefix stripped.
 *
 * <p>Values arrive as the raw strings of server.properties (other types are accepted through
 * {@code String.valueOf}). Parsing only validates and reads small local files (TLS material); it
 * never connects anywhere, so it is safe on the broker start-up path.
 *
 * <p>This class has no Kafka dependency so that {@link Diagnose} can run from the shaded jar alone.
 * Every key is documented in {@code docs/shim.md}; a unit test keeps {@link #KEYS} and that table in
 * step.
 */
public final class ShimConfig {

    public static final String SIDECAR_TARGET = "sidecar.target";
    public static final String TRANSFER_MODE = "transfer.mode";
    public static final String COPY_DEADLINE_MS = "copy.deadline.ms";
    public static final String FETCH_DEADLINE_MS = "fetch.deadline.ms";
    public static final String FETCH_READ_TIMEOUT_MS = "fetch.read.timeout.ms";
    public static final String FETCH_IDLE_TIMEOUT_MS = "fetch.idle.timeout.ms";
    public static final String FETCH_WINDOW_BYTES = "fetch.window.bytes";
    public static final String FETCH_READAHEAD_BYTES = "fetch.readahead.bytes";
    public static final String FETCH_READAHEAD_MAX_BYTES = "fetch.readahead.max.bytes";
    public static final String FETCH_INDEX_DEADLINE_MS = "fetch.index.deadline.ms";
    public static final String DELETE_DEADLINE_MS = "delete.deadline.ms";
    public static final String RETRY_MAX_ATTEMPTS = "retry.max.attempts";
    public static final String RETRY_INITIAL_BACKOFF_MS = "retry.initial.backoff.ms";
    public static final String RETRY_MAX_BACKOFF_MS = "retry.max.backoff.ms";
    public static final String RETRY_FETCH_MAX_MS = "retry.fetch.max.ms";
    public static final String TLS_ENABLED = "tls.enabled";
    public static final String TLS_CA_FILE = "tls.ca.file";
    public static final String TLS_CERT_FILE = "tls.cert.file";
    public static final String TLS_KEY_FILE = "tls.key.file";
    public static final String TLS_AUTHORITY_OVERRIDE = "tls.authority.override";
    public static final String TLS_RELOAD_INTERVAL_MS = "tls.reload.interval.ms";
    public static final String CLOSE_TIMEOUT_MS = "close.timeout.ms";
    public static final String CONNECT_TIMEOUT_MS = "connect.timeout.ms";
    public static final String KEEPALIVE_TIME_MS = "keepalive.time.ms";
    public static final String KEEPALIVE_TIMEOUT_MS = "keepalive.timeout.ms";
    public static final String CHANNEL_IDLE_TIMEOUT_MS = "channel.idle.timeout.ms";


    /** A consumer's default fetch (1 MiB) plus room for the index lookup's skip to the offset. */
    static final int DEFAULT_FETCH_WINDOW_BYTES = 1024 * 1024 + 64 * 1024;
    /** Windows double up to this size. */
    public static final int MAX_FETCH_WINDOW_BYTES = 32 * 1024 * 1024;
    /** 8 MiB: the measured setting (docs/performance.md, remote reads). */
    static final int DEFAULT_FETCH_READAHEAD_BYTES = 8 * 1024 * 1024;
    /** The largest read-ahead window. */
    static final int MAX_FETCH_READAHEAD_BYTES = 64 * 1024 * 1024;
    /**
     * Read-ahead windows kept in all: eight 8 MiB windows, four partitions read sequentially at
     * once; more partitions share it in smaller windows (ReadAhead#currentWindowBytes).
     */
    static final long DEFAULT_FETCH_READAHEAD_MAX_BYTES = 64L * 1024 * 1024;

    /**
     * Keys of earlier versions that do nothing now, with what replaced them: accepted, with one
     * warning each (a broker's configuration outlives an upgrade of the shim).
     */
    public static final Map<String, String> REMOVED_KEYS = Map.of(
            "fetch.handoff", "fetches use the sidecar's fetch channel, over the Unix socket too",
            "fetch.zstd.max.chunk.bytes", "the sidecar sends a fetch's bytes decompressed over its fetch channel");

    /** Keys the broker itself adds to the map; accepted silently. */
    static final Set<String> BROKER_KEYS = Set.of("broker.id", "node.id");

    /** Every key of this shim with its default (as the string a user would write). */
    public static final Map<String, String> KEYS;

    static {
        Map<String, String> k = new LinkedHashMap<>();
        k.put(SIDECAR_TARGET, "127.0.0.1:9095");
        k.put(TRANSFER_MODE, "stream");
        k.put(COPY_DEADLINE_MS, "600000");
        k.put(FETCH_DEADLINE_MS, "30000");
        k.put(FETCH_READ_TIMEOUT_MS, "30000");
        k.put(FETCH_IDLE_TIMEOUT_MS, "300000");
        k.put(FETCH_WINDOW_BYTES, String.valueOf(DEFAULT_FETCH_WINDOW_BYTES));
        k.put(FETCH_READAHEAD_BYTES, String.valueOf(DEFAULT_FETCH_READAHEAD_BYTES));
        k.put(FETCH_READAHEAD_MAX_BYTES, String.valueOf(DEFAULT_FETCH_READAHEAD_MAX_BYTES));
        k.put(FETCH_INDEX_DEADLINE_MS, "30000");
        k.put(DELETE_DEADLINE_MS, "30000");
        k.put(RETRY_MAX_ATTEMPTS, "3");
        k.put(RETRY_INITIAL_BACKOFF_MS, "100");
        k.put(RETRY_MAX_BACKOFF_MS, "5000");
        k.put(RETRY_FETCH_MAX_MS, "5000");
        k.put(TLS_ENABLED, "false");
        k.put(TLS_CA_FILE, "");
        k.put(TLS_CERT_FILE, "");
        k.put(TLS_KEY_FILE, "");
        k.put(TLS_AUTHORITY_OVERRIDE, "");
        k.put(TLS_RELOAD_INTERVAL_MS, "60000");
        k.put(CLOSE_TIMEOUT_MS, "5000");
        k.put(CONNECT_TIMEOUT_MS, "5000");
        k.put(KEEPALIVE_TIME_MS, "2000");
        k.put(KEEPALIVE_TIMEOUT_MS, "5000");
        k.put(CHANNEL_IDLE_TIMEOUT_MS, "0");
        KEYS = Collections.unmodifiableMap(k);
    }

    static final int MAX_RETRY_ATTEMPTS = 10;

    /** How the segment files reach the sidecar. */
    public enum TransferMode {
        /** The shim streams the file bytes over gRPC (works everywhere). */
        STREAM,
        /** The sidecar reads the broker's files itself (same host or a shared filesystem). */
        PATH
    }

    /** Thrown for an invalid value; the message names the key. */
    public static final class ShimConfigException extends IllegalArgumentException {
        private static final long serialVersionUID = 1L;
        private final String key;
        private final transient Object value;

        ShimConfigException(String key, Object value, String reason) {
            super("Invalid value " + render(key, value) + " for configuration rsm.config." + key + ": " + reason);
            this.key = key;
            this.value = value;
        }

        public String key() {
            return key;
        }

        public Object value() {
            return value;
        }

        public String reason() {
            String m = getMessage();
            return m.substring(m.indexOf(": ") + 2);
        }

        private static String render(String key, Object value) {
            return value == null ? "null" : "'" + value + "'";
        }
    }

    private final String target;
    private final String grpcTarget;
    private final TransferMode transferMode;
    private final long copyDeadlineMs;
    private final long fetchDeadlineMs;
    private final long fetchReadTimeoutMs;
    private final long fetchIdleTimeoutMs;
    private final int fetchWindowBytes;
    private final int fetchReadaheadBytes;
    private final long fetchReadaheadMaxBytes;
    private final long fetchIndexDeadlineMs;
    private final long deleteDeadlineMs;
    private final int retryMaxAttempts;
    private final long retryInitialBackoffMs;
    private final long retryMaxBackoffMs;
    private final long retryFetchMaxMs;
    private final boolean tlsEnabled;
    private final Path tlsCaFile;
    private final Path tlsCertFile;
    private final Path tlsKeyFile;
    private final String tlsAuthorityOverride;
    private final long tlsReloadIntervalMs;
    private final long closeTimeoutMs;
    private final long connectTimeoutMs;
    private final long keepaliveTimeMs;
    private final long keepaliveTimeoutMs;
    private final long channelIdleTimeoutMs;
    private final String brokerId;
    private final List<String> unknownKeys;
    private final List<String> removedKeys;

    private ShimConfig(Map<String, ?> configs) {
        Map<String, String> raw = new LinkedHashMap<>();
        List<String> unknown = new ArrayList<>();
        for (Map.Entry<String, ?> e : configs.entrySet()) {
            String key = e.getKey();
            if (KEYS.containsKey(key)) {
                raw.put(key, e.getValue() == null ? null : String.valueOf(e.getValue()).trim());
            } else if (!BROKER_KEYS.contains(key) && !REMOVED_KEYS.containsKey(key)) {
                unknown.add(key);
            }
        }
        Collections.sort(unknown);
        this.unknownKeys = Collections.unmodifiableList(unknown);
        this.removedKeys = configs.keySet().stream().filter(REMOVED_KEYS::containsKey).sorted().toList();
        Object broker = configs.get("node.id") != null ? configs.get("node.id") : configs.get("broker.id");
        this.brokerId = broker == null ? "?" : String.valueOf(broker);

        this.target = string(raw, SIDECAR_TARGET);
        this.grpcTarget = parseTarget(target);
        this.transferMode = parseMode(string(raw, TRANSFER_MODE));
        this.copyDeadlineMs = positiveMillis(raw, COPY_DEADLINE_MS);
        this.fetchDeadlineMs = positiveMillis(raw, FETCH_DEADLINE_MS);
        this.fetchReadTimeoutMs = positiveMillis(raw, FETCH_READ_TIMEOUT_MS);
        this.fetchIdleTimeoutMs = nonNegativeMillis(raw, FETCH_IDLE_TIMEOUT_MS);
        long windowBytes = longValue(raw, FETCH_WINDOW_BYTES);
        if (windowBytes != 0 && (windowBytes < 4096 || windowBytes > MAX_FETCH_WINDOW_BYTES)) {
            throw new ShimConfigException(FETCH_WINDOW_BYTES, raw.get(FETCH_WINDOW_BYTES),
                    "must be 0 (off) or between 4096 and " + MAX_FETCH_WINDOW_BYTES);
        }
        this.fetchWindowBytes = (int) windowBytes;
        long readahead = longValue(raw, FETCH_READAHEAD_BYTES);
        if (readahead != 0 && (readahead < 65536 || readahead > MAX_FETCH_READAHEAD_BYTES)) {
            throw new ShimConfigException(FETCH_READAHEAD_BYTES, raw.get(FETCH_READAHEAD_BYTES),
                    "must be 0 (off) or between 65536 and " + MAX_FETCH_READAHEAD_BYTES);
        }
        this.fetchReadaheadBytes = (int) readahead;
        this.fetchReadaheadMaxBytes = longValue(raw, FETCH_READAHEAD_MAX_BYTES);
        if (readahead != 0 && fetchReadaheadMaxBytes < readahead) {
            throw new ShimConfigException(FETCH_READAHEAD_MAX_BYTES, raw.get(FETCH_READAHEAD_MAX_BYTES),
                    "must be at least " + FETCH_READAHEAD_BYTES + " (" + readahead + ")");
        }
        this.fetchIndexDeadlineMs = positiveMillis(raw, FETCH_INDEX_DEADLINE_MS);
        this.deleteDeadlineMs = positiveMillis(raw, DELETE_DEADLINE_MS);
        long attempts = longValue(raw, RETRY_MAX_ATTEMPTS);
        if (attempts < 1 || attempts > MAX_RETRY_ATTEMPTS) {
            throw new ShimConfigException(RETRY_MAX_ATTEMPTS, raw.get(RETRY_MAX_ATTEMPTS),
                    "must be between 1 and " + MAX_RETRY_ATTEMPTS + " (total attempts, 1 = no retry)");
        }
        this.retryMaxAttempts = (int) attempts;
        this.retryInitialBackoffMs = nonNegativeMillis(raw, RETRY_INITIAL_BACKOFF_MS);
        this.retryMaxBackoffMs = nonNegativeMillis(raw, RETRY_MAX_BACKOFF_MS);
        if (retryMaxBackoffMs < retryInitialBackoffMs) {
            throw new ShimConfigException(RETRY_MAX_BACKOFF_MS, raw.get(RETRY_MAX_BACKOFF_MS),
                    "must be >= " + RETRY_INITIAL_BACKOFF_MS + " (" + retryInitialBackoffMs + ")");
        }
        this.retryFetchMaxMs = nonNegativeMillis(raw, RETRY_FETCH_MAX_MS);
        this.closeTimeoutMs = nonNegativeMillis(raw, CLOSE_TIMEOUT_MS);
        this.connectTimeoutMs = positiveMillis(raw, CONNECT_TIMEOUT_MS);
        if (connectTimeoutMs > Integer.MAX_VALUE) {
            throw new ShimConfigException(CONNECT_TIMEOUT_MS, raw.get(CONNECT_TIMEOUT_MS),
                    "must be at most " + Integer.MAX_VALUE + " (milliseconds)");
        }
        this.keepaliveTimeMs = nonNegativeMillis(raw, KEEPALIVE_TIME_MS);
        if (keepaliveTimeMs != 0 && (keepaliveTimeMs < 1000 || keepaliveTimeMs > 3_600_000)) {
            throw new ShimConfigException(KEEPALIVE_TIME_MS, raw.get(KEEPALIVE_TIME_MS),
                    "must be 0 (off) or between 1000 and 3600000 (whole seconds for the kernel)");
        }
        this.keepaliveTimeoutMs = positiveMillis(raw, KEEPALIVE_TIMEOUT_MS);
        if (keepaliveTimeoutMs > Integer.MAX_VALUE) {
            throw new ShimConfigException(KEEPALIVE_TIMEOUT_MS, raw.get(KEEPALIVE_TIMEOUT_MS),
                    "must be at most " + Integer.MAX_VALUE + " (milliseconds)");
        }
        this.channelIdleTimeoutMs = nonNegativeMillis(raw, CHANNEL_IDLE_TIMEOUT_MS);
        if (channelIdleTimeoutMs != 0 && channelIdleTimeoutMs < 1000) {
            throw new ShimConfigException(CHANNEL_IDLE_TIMEOUT_MS, raw.get(CHANNEL_IDLE_TIMEOUT_MS),
                    "must be 0 (never) or at least 1000 (gRPC's minimum)");
        }

        this.tlsEnabled = bool(raw, TLS_ENABLED);
        this.tlsCaFile = optionalFile(raw, TLS_CA_FILE);
        this.tlsCertFile = optionalFile(raw, TLS_CERT_FILE);
        this.tlsKeyFile = optionalFile(raw, TLS_KEY_FILE);
        this.tlsAuthorityOverride = string(raw, TLS_AUTHORITY_OVERRIDE);
        this.tlsReloadIntervalMs = nonNegativeMillis(raw, TLS_RELOAD_INTERVAL_MS);
        if (!tlsEnabled) {
            for (String key : List.of(TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE, TLS_AUTHORITY_OVERRIDE)) {
                if (!string(raw, key).isEmpty()) {
                    throw new ShimConfigException(key, raw.get(key),
                            "TLS settings need " + TLS_ENABLED + "=true (it is false)");
                }
            }
        } else {
            if ((tlsCertFile == null) != (tlsKeyFile == null)) {
                String missing = tlsCertFile == null ? TLS_CERT_FILE : TLS_KEY_FILE;
                String present = tlsCertFile == null ? TLS_KEY_FILE : TLS_CERT_FILE;
                throw new ShimConfigException(missing, raw.get(missing),
                        "must be set together with " + present + " (client certificate for mTLS)");
            }
            if (tlsCaFile != null) {
                requirePem(TLS_CA_FILE, tlsCaFile, "-----BEGIN CERTIFICATE-----");
            }
            if (tlsCertFile != null) {
                requirePem(TLS_CERT_FILE, tlsCertFile, "-----BEGIN CERTIFICATE-----");
                requirePem(TLS_KEY_FILE, tlsKeyFile, "-----BEGIN PRIVATE KEY-----");
            }
            if (!tlsAuthorityOverride.isEmpty() && !tlsAuthorityOverride.matches("[A-Za-z0-9.\\-:\\[\\]_]+")) {
                throw new ShimConfigException(TLS_AUTHORITY_OVERRIDE, tlsAuthorityOverride,
                        "must be a host name (optionally host:port)");
            }
        }
    }

    /**
     * Parses and validates {@code configs}.
     *
     * @throws ShimConfigException naming the first invalid key
     */
    public static ShimConfig parse(Map<String, ?> configs) {
        return new ShimConfig(configs);
    }

    // ---- parsing helpers -------------------------------------------------------------------

    private static String string(Map<String, String> raw, String key) {
        String v = raw.get(key);
        return v == null ? KEYS.get(key) : v;
    }

    private static long longValue(Map<String, String> raw, String key) {
        String v = string(raw, key);
        try {
            return Long.parseLong(v);
        } catch (NumberFormatException e) {
            throw new ShimConfigException(key, raw.get(key), "not an integer");
        }
    }

    private static long positiveMillis(Map<String, String> raw, String key) {
        long v = longValue(raw, key);
        if (v <= 0) {
            throw new ShimConfigException(key, raw.get(key), "must be > 0 (milliseconds)");
        }
        return v;
    }

    private static long nonNegativeMillis(Map<String, String> raw, String key) {
        long v = longValue(raw, key);
        if (v < 0) {
            throw new ShimConfigException(key, raw.get(key), "must be >= 0 (milliseconds)");
        }
        return v;
    }

    private static boolean bool(Map<String, String> raw, String key) {
        String v = string(raw, key).toLowerCase(Locale.ROOT);
        if (v.equals("true")) {
            return true;
        }
        if (v.equals("false")) {
            return false;
        }
        throw new ShimConfigException(key, raw.get(key), "must be true or false");
    }

    private static Path optionalFile(Map<String, String> raw, String key) {
        String v = string(raw, key);
        if (v.isEmpty()) {
            return null;
        }
        Path p = Path.of(v);
        if (!Files.isRegularFile(p)) {
            throw new ShimConfigException(key, v, "no such file");
        }
        if (!Files.isReadable(p)) {
            throw new ShimConfigException(key, v, "file is not readable");
        }
        return p;
    }

    private static void requirePem(String key, Path file, String header) {
        String text;
        try {
            text = Files.readString(file, StandardCharsets.US_ASCII);
        } catch (Exception e) {
            throw new ShimConfigException(key, file, "cannot read: " + e);
        }
        if (!text.contains(header)) {
            String hint = header.contains("PRIVATE KEY")
                    ? " (an unencrypted PKCS#8 PEM key; convert with `openssl pkcs8 -topk8 -nocrypt`)"
                    : " (PEM)";
            throw new ShimConfigException(key, file, "does not contain " + header + hint);
        }
    }

    private static TransferMode parseMode(String v) {
        switch (v.toLowerCase(Locale.ROOT)) {
            case "stream":
                return TransferMode.STREAM;
            case "path":
                return TransferMode.PATH;
            default:
                throw new ShimConfigException(TRANSFER_MODE, v, "must be stream or path");
        }
    }

    /** Validates {@code host:port} / {@code [v6]:port} / {@code unix:///abs/path}; returns the gRPC target. */
    static String parseTarget(String v) {
        if (v.isEmpty()) {
            throw new ShimConfigException(SIDECAR_TARGET, v, "must not be empty");
        }
        if (v.startsWith("unix:")) {
            String path = v.startsWith("unix://") ? v.substring("unix://".length()) : v.substring("unix:".length());
            if (!path.startsWith("/") || path.length() < 2) {
                throw new ShimConfigException(SIDECAR_TARGET, v,
                        "a Unix domain socket must be an absolute path: unix:///path/to/socket");
            }
            // a path may hold characters a URI may not (a space, '%', '#', '?'): gRPC parses the
            // target as a URI, so they are percent-encoded (it decodes them again)
            try {
                return "unix://" + new URI(null, null, path, null).getRawPath();
            } catch (URISyntaxException e) {
                throw new ShimConfigException(SIDECAR_TARGET, v, "not a usable socket path: " + e.getMessage());
            }
        }
        if (v.contains("/")) {
            throw new ShimConfigException(SIDECAR_TARGET, v, "expected host:port or unix:///absolute/path");
        }
        String host;
        String port;
        if (v.startsWith("[")) {
            int end = v.indexOf("]:");
            if (end < 0) {
                throw new ShimConfigException(SIDECAR_TARGET, v, "expected [ipv6-address]:port");
            }
            host = v.substring(1, end);
            port = v.substring(end + 2);
        } else {
            int colon = v.lastIndexOf(':');
            if (colon < 0 || v.indexOf(':') != colon) {
                throw new ShimConfigException(SIDECAR_TARGET, v,
                        "expected host:port (write IPv6 addresses as [addr]:port) or unix:///absolute/path");
            }
            host = v.substring(0, colon);
            port = v.substring(colon + 1);
        }
        if (host.isEmpty()) {
            throw new ShimConfigException(SIDECAR_TARGET, v, "the host is empty");
        }
        int p;
        try {
            p = Integer.parseInt(port);
        } catch (NumberFormatException e) {
            throw new ShimConfigException(SIDECAR_TARGET, v, "the port is not a number");
        }
        if (p < 1 || p > 65535) {
            throw new ShimConfigException(SIDECAR_TARGET, v, "the port must be between 1 and 65535");
        }
        return "dns:///" + v;
    }

    // ---- accessors ---------------------------------------------------------------------------

    /** The target as configured. */
    public String target() {
        return target;
    }

    /** The target in gRPC URI form ({@code dns:///host:port} or {@code unix:///path}). */
    public String grpcTarget() {
        return grpcTarget;
    }

    public boolean isUnixSocket() {
        return grpcTarget.startsWith("unix:");
    }

    public TransferMode transferMode() {
        return transferMode;
    }

    public long copyDeadlineMs() {
        return copyDeadlineMs;
    }

    public long fetchDeadlineMs() {
        return fetchDeadlineMs;
    }

    public long fetchReadTimeoutMs() {
        return fetchReadTimeoutMs;
    }

    public long fetchIdleTimeoutMs() {
        return fetchIdleTimeoutMs;
    }

    /** First window of a fetch without an end position; 0 = one open-ended call. */
    public int fetchWindowBytes() {
        return fetchWindowBytes;
    }

    /**
     * Where the sidecar's fetch channel is: the host and port of a TCP target, or the path of a
     * Unix socket target (the same address as gRPC's; rsm.proto, "The fetch channel").
     */
    public String[] fetchChannelAddress() {
        if (isUnixSocket()) {
            return new String[] {URI.create(grpcTarget).getPath()};
        }
        String hostPort = grpcTarget.substring("dns:///".length());
        int colon = hostPort.lastIndexOf(':');
        String host = hostPort.substring(0, colon);
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        return new String[] {host, hostPort.substring(colon + 1)};
    }

    /** A sequential read's window, kept open for the fetches that follow (see ReadAhead); 0 = off. */
    public int fetchReadaheadBytes() {
        return fetchReadaheadBytes;
    }

    /** Read-ahead windows kept open in all. */
    public long fetchReadaheadMaxBytes() {
        return fetchReadaheadMaxBytes;
    }

    public long fetchIndexDeadlineMs() {
        return fetchIndexDeadlineMs;
    }

    public long deleteDeadlineMs() {
        return deleteDeadlineMs;
    }

    public int retryMaxAttempts() {
        return retryMaxAttempts;
    }

    public long retryInitialBackoffMs() {
        return retryInitialBackoffMs;
    }

    public long retryMaxBackoffMs() {
        return retryMaxBackoffMs;
    }

    /**
     * How long fetches and index calls keep retrying {@code UNAVAILABLE}, counted from when the
     * sidecar was first missed (0: only {@code retry.max.attempts}, as other calls; see Retrier).
     */
    public long retryFetchMaxMs() {
        return retryFetchMaxMs;
    }

    public boolean tlsEnabled() {
        return tlsEnabled;
    }

    public Path tlsCaFile() {
        return tlsCaFile;
    }

    public Path tlsCertFile() {
        return tlsCertFile;
    }

    public Path tlsKeyFile() {
        return tlsKeyFile;
    }

    public String tlsAuthorityOverride() {
        return tlsAuthorityOverride;
    }

    /** How often the TLS files are checked for a change (0: never; see TlsFiles). */
    public long tlsReloadIntervalMs() {
        return tlsReloadIntervalMs;
    }

    public long closeTimeoutMs() {
        return closeTimeoutMs;
    }

    /** How long a new TCP connection to the sidecar may take (not used for a Unix socket). */
    public long connectTimeoutMs() {
        return connectTimeoutMs;
    }

    /**
     * After this long without a packet from the sidecar, TCP keepalive probes check that it is
     * still there (0: never; not used for a Unix socket; see ChannelFactory#tcpOptions).
     */
    public long keepaliveTimeMs() {
        return keepaliveTimeMs;
    }

    /**
     * How long keepalive probes, or data sent to the sidecar, may go unacknowledged by TCP
     * ({@code TCP_USER_TIMEOUT}) before the connection is taken for dead.
     */
    public long keepaliveTimeoutMs() {
        return keepaliveTimeoutMs;
    }

    /**
     * After this long without a call, the channel closes its connection and opens a new one for
     * the next call (0: never; see ChannelFactory#idleTimeoutMillis).
     */
    public long channelIdleTimeoutMs() {
        return channelIdleTimeoutMs;
    }

    /** {@code node.id} (Kafka 4.4+) or {@code broker.id} as passed by the broker, for logs. */
    public String brokerId() {
        return brokerId;
    }

    /** Keys of earlier versions in the map (see {@link #REMOVED_KEYS}); logged as a warning each. */
    public List<String> removedKeys() {
        return removedKeys;
    }

    /** Keys in the map that are neither ours nor the broker's (likely typos); logged as a warning. */
    public List<String> unknownKeys() {
        return unknownKeys;
    }

    @Override
    public String toString() {
        return "target=" + target + ", transfer.mode=" + transferMode.name().toLowerCase(Locale.ROOT)
                + ", tls=" + (tlsEnabled ? (tlsCertFile != null ? "mtls" : "tls") + ", tls.reload.interval.ms="
                        + tlsReloadIntervalMs : "off")
                + ", copy.deadline.ms=" + copyDeadlineMs + ", fetch.deadline.ms=" + fetchDeadlineMs
                + ", fetch.read.timeout.ms=" + fetchReadTimeoutMs + ", fetch.idle.timeout.ms=" + fetchIdleTimeoutMs
                + ", fetch.window.bytes=" + fetchWindowBytes
                + ", fetch.readahead.bytes=" + fetchReadaheadBytes + ", fetch.readahead.max.bytes=" + fetchReadaheadMaxBytes
                + ", fetch.index.deadline.ms=" + fetchIndexDeadlineMs + ", delete.deadline.ms=" + deleteDeadlineMs
                + ", retry.max.attempts=" + retryMaxAttempts + ", retry.initial.backoff.ms=" + retryInitialBackoffMs
                + ", retry.max.backoff.ms=" + retryMaxBackoffMs + ", retry.fetch.max.ms=" + retryFetchMaxMs
                + ", channel.idle.timeout.ms=" + channelIdleTimeoutMs
                + (isUnixSocket() ? "" : ", connect.timeout.ms=" + connectTimeoutMs + ", keepalive.time.ms="
                        + keepaliveTimeMs + ", keepalive.timeout.ms=" + keepaliveTimeoutMs);
    }
}
