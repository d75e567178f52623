package io.github.rsmsidecar.shim;

import io.grpc.Status;
import java.util.EnumMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.LongAdder;

/**
 * The shim's own counters: sidecar calls, errors by status, latency, bytes, retries, waits for a
 * busy sidecar, fetch channel fallbacks and whether the sidecar answers. Plain Java (no Kafka metrics
 * types), so the shim counts on every broker; on Kafka 4.1+ {@link MonitorableSidecarRemoteStorageManager}
 * publishes them through the broker's plugin metrics (KIP-877, {@link PluginMetricsBinding}).
 *
 * <p>Thread-safe and cheap: {@link LongAdder}s, written by whichever thread makes the call.
 */
public final class ShimMetrics {

    /** A kind of sidecar call, named as the {@code op} tag of its metrics. */
    public enum Op {
        COPY("copy"),
        FETCH("fetch"),
        FETCH_INDEX("fetch-index"),
        DELETE("delete"),
        /** The shim's own background calls: read-ahead windows. */
        BACKGROUND("background");

        final String tag;

        Op(String tag) {
            this.tag = tag;
        }
    }

    /** Counters of one kind of call. */
    public static final class OpCounters {
        public final LongAdder calls = new LongAdder();
        public final LongAdder retries = new LongAdder();
        public final LongAdder busyWaits = new LongAdder();
        public final LongAdder latencyNanos = new LongAdder();
        public final Map<Status.Code, LongAdder> errors = new ConcurrentHashMap<>();
    }

    /** Told of what a plain counter cannot hold: latencies (windowed by Kafka) and new error codes. */
    interface Listener {
        void latency(Op op, long nanos);

        void firstError(Op op, Status.Code code, LongAdder counter);
    }

    private final Map<Op, OpCounters> ops = new EnumMap<>(Op.class);
    /** Segment bytes copied (stream and path mode alike: the log file and its indexes). */
    final LongAdder copyBytes = new LongAdder();
    /** Fetched bytes received over the sidecar's fetch channel. */
    public final LongAdder fetchChannelBytes = new LongAdder();
    /** Fetched bytes received in gRPC messages (a sidecar without a fetch channel). */
    public final LongAdder fetchGrpcBytes = new LongAdder();
    /** Times the shim found the sidecar without a fetch channel and fetched over gRPC for a while. */
    public final LongAdder fetchChannelFallbacks = new LongAdder();
    /** Times the TLS files were reloaded after they changed. */
    final LongAdder tlsReloads = new LongAdder();
    /** 1 while the sidecar answers; 0 after a call found it unreachable (UNAVAILABLE), until one reaches it. */
    private volatile int reachable = 1;
    private volatile Listener listener;

    ShimMetrics() {
        for (Op op : Op.values()) {
            ops.put(op, new OpCounters());
        }
    }

    public OpCounters of(Op op) {
        return ops.get(op);
    }

    int reachable() {
        return reachable;
    }

    void listen(Listener l) {
        this.listener = l;
    }

    /** One call (or attempt) was started. */
    public void call(Op op) {
        ops.get(op).calls.increment();
    }

    /** A call ended (after its retries) in {@code nanos}; {@code status} null when it succeeded. */
    void ended(Op op, long nanos, Status status) {
        OpCounters c = ops.get(op);
        c.latencyNanos.add(nanos);
        Listener l = listener;
        if (l != null) {
            l.latency(op, nanos);
        }
        if (status != null) {
            error(op, status.getCode());
        }
    }

    /** A call or attempt failed with {@code code}. */
    public void error(Op op, Status.Code code) {
        OpCounters c = ops.get(op);
        LongAdder counter = c.errors.get(code);
        if (counter == null) {
            LongAdder fresh = new LongAdder();
            counter = c.errors.putIfAbsent(code, fresh);
            if (counter == null) {
                counter = fresh;
                Listener l = listener;
                if (l != null) {
                    l.firstError(op, code, fresh);
                }
            }
        }
        counter.increment();
    }

    /**
     * What a call's end says about reaching the sidecar ({@code status} null: success).
     * UNAVAILABLE: not reached; a deadline or a cancellation says nothing; any other status is an
     * answer from the sidecar.
     */
    public void answered(Status status) {
        Status.Code code = status == null ? Status.Code.OK : status.getCode();
        if (code == Status.Code.UNAVAILABLE) {
            reachable = 0;
        } else if (code != Status.Code.DEADLINE_EXCEEDED && code != Status.Code.CANCELLED) {
            reachable = 1;
        }
    }
}
