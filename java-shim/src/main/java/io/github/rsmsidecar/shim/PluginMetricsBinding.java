package io.github.rsmsidecar.shim;

import io.grpc.Status;
import java.util.EnumMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.metrics.Measurable;
import org.apache.kafka.common.metrics.PluginMetrics;
import org.apache.kafka.common.metrics.Sensor;
import org.apache.kafka.common.metrics.stats.Avg;
import org.apache.kafka.common.metrics.stats.Max;

/**
 * Publishes {@link ShimMetrics} through the broker's plugin metrics (KIP-877, Kafka 4.1+): they
 * appear in the broker's JMX as {@code kafka.server:type=plugins,config=remote.log.storage.manager.class.name,
 * class=MonitorableSidecarRemoteStorageManager,...} and in every metrics reporter the broker runs.
 * Only {@link MonitorableSidecarRemoteStorageManager} loads this class, so brokers without
 * {@code PluginMetrics} never do. docs/shim.md lists the metrics.
 */
final class PluginMetricsBinding implements ShimMetrics.Listener {

    private final PluginMetrics pm;
    private final Map<ShimMetrics.Op, Sensor> latency = new EnumMap<>(ShimMetrics.Op.class);

    private PluginMetricsBinding(PluginMetrics pm) {
        this.pm = pm;
    }

    /** Registers every metric of {@code m} with {@code pm} and keeps the windowed ones up to date. */
    static void bind(PluginMetrics pm, ShimMetrics m) {
        PluginMetricsBinding b = new PluginMetricsBinding(pm);
        for (ShimMetrics.Op op : ShimMetrics.Op.values()) {
            ShimMetrics.OpCounters c = m.of(op);
            b.counter("calls-total", "Calls made to the sidecar (each attempt and each wait for a slot counts)",
                    c.calls, "op", op.tag);
            b.counter("retries-total", "Calls repeated after the sidecar was unreachable (UNAVAILABLE)", c.retries,
                    "op", op.tag);
            b.counter("busy-waits-total", "Times a call waited for a fetch slot of a busy sidecar (RESOURCE_EXHAUSTED)",
                    c.busyWaits, "op", op.tag);
            Sensor s = pm.addSensor("rsm-sidecar-shim-latency-" + op.tag);
            s.add(b.name("latency-avg", "Average time of a call in ms, retries and waits included", "op", op.tag),
                    new Avg());
            s.add(b.name("latency-max", "Longest call in ms, retries and waits included", "op", op.tag), new Max());
            b.latency.put(op, s);
            for (Map.Entry<Status.Code, LongAdder> e : c.errors.entrySet()) {
                b.firstError(op, e.getKey(), e.getValue());
            }
        }
        b.counter("copy-bytes-total", "Bytes of the segment files copied", m.copyBytes);
        b.counter("fetch-bytes-total", "Fetched bytes received over the sidecar's fetch channel",
                m.fetchChannelBytes, "transfer", "channel");
        b.counter("fetch-bytes-total", "Fetched bytes received in gRPC messages (a sidecar without a fetch channel)",
                m.fetchGrpcBytes, "transfer", "grpc");
        b.counter("fetch-channel-fallbacks-total",
                "Times the sidecar had no fetch channel and fetches went over gRPC for a while",
                m.fetchChannelFallbacks);
        b.counter("tls-reloads-total", "Times changed TLS files were loaded", m.tlsReloads);
        pm.addMetric(b.name("sidecar-reachable", "1 while the sidecar answers, 0 after a call could not reach it"),
                (Measurable) (config, now) -> m.reachable());
        m.listen(b);
    }

    private MetricName name(String name, String description, String... tags) {
        LinkedHashMap<String, String> t = new LinkedHashMap<>();
        for (int i = 0; i < tags.length; i += 2) {
            t.put(tags[i], tags[i + 1]);
        }
        return pm.metricName(name, description, t);
    }

    private void counter(String name, String description, LongAdder value, String... tags) {
        pm.addMetric(name(name, description, tags), (Measurable) (config, now) -> value.sum());
    }

    @Override
    public void latency(ShimMetrics.Op op, long nanos) {
        Sensor s = latency.get(op);
        if (s != null) {
            s.record(nanos / (double) TimeUnit.MILLISECONDS.toNanos(1));
        }
    }

    @Override
    public void firstError(ShimMetrics.Op op, Status.Code code, LongAdder counter) {
        try {
            counter("errors-total", "Calls that failed, by gRPC status", counter, "op", op.tag, "status", code.name());
        } catch (IllegalArgumentException alreadyThere) {
            // registered by bind() and by a concurrent first error: one is enough
        }
    }
}
