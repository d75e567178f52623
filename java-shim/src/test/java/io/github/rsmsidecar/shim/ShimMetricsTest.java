package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.Status;
import java.io.InputStream;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.internals.Plugin;
import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.Metrics;
import org.apache.kafka.common.metrics.Monitorable;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The shim's counters, and their publication through the broker's plugin metrics (KIP-877). */
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class ShimMetricsTest {

    /** The metrics of the plugin group, as "name{tag=value,...}" (the plugin's own tags left out). */
    private static Map<String, Object> plugin(Metrics metrics) {
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<MetricName, KafkaMetric> e : metrics.metrics().entrySet()) {
            MetricName n = e.getKey();
            if (!n.group().equals("plugins")) {
                continue;
            }
            Map<String, String> tags = new TreeMap<>(n.tags());
            assertEquals("remote.log.storage.manager.class.name", tags.remove("config"));
            assertEquals(MonitorableSidecarRemoteStorageManager.class.getSimpleName(), tags.remove("class"));
            out.put(n.name() + tags, e.getValue().metricValue());
        }
        return out;
    }

    @Test
    void theBrokersPluginMetricsShowCallsErrorsLatencyBytesAndWaits() throws Exception {
        RetryTest.FlakySidecar sidecar = new RetryTest.FlakySidecar(1, Status.RESOURCE_EXHAUSTED);
        Metrics metrics = new Metrics();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(), null, true)) {
            assertTrue(h.rsm instanceof Monitorable);
            // what the broker does with the plugin once configured (RemoteLogManager, Kafka 4.1+)
            Plugin<RemoteStorageManager> plugin =
                    Plugin.wrapInstance(h.rsm, metrics, "remote.log.storage.manager.class.name");
            try (InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
                assertEquals(7, in.readAllBytes().length);
            }
            // a delete is not waited for (the broker retries it): its first call fails
            assertThrows(org.apache.kafka.server.log.remote.storage.RemoteStorageException.class,
                    () -> h.rsm.deleteLogSegmentData(Fixtures.metadata()));
            h.rsm.deleteLogSegmentData(Fixtures.metadata());
            Map<String, Object> m = plugin(metrics);
            assertEquals(1.0, m.get("errors-total{op=delete, status=RESOURCE_EXHAUSTED}"), m.toString());
            assertEquals(2.0, m.get("calls-total{op=fetch}"), m.toString()); // busy once, then served
            assertEquals(1.0, m.get("busy-waits-total{op=fetch}"), m.toString());
            assertEquals(2.0, m.get("calls-total{op=delete}"), m.toString());
            assertEquals(7.0, m.get("fetch-bytes-total{transfer=grpc}"), m.toString());
            assertEquals(0.0, m.get("fetch-bytes-total{transfer=channel}"), m.toString());
            assertEquals(0.0, m.get("fetch-channel-fallbacks-total{}"), m.toString());
            assertEquals(1.0, m.get("sidecar-reachable{}"), m.toString());
            assertTrue((Double) m.get("latency-max{op=fetch}") > 0, m.toString());
            assertFalse(m.containsKey("errors-total{op=fetch, status=RESOURCE_EXHAUSTED}"),
                    "a wait is not an error: " + m);
            plugin.close();
        }
        metrics.close();
    }


    @Test
    void errorsAreCountedByStatusAndUnreachableSidecarsShow() throws Exception {
        RetryTest.FlakySidecar sidecar = new RetryTest.FlakySidecar(100, Status.NOT_FOUND);
        Metrics metrics = new Metrics();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(), null, true)) {
            Plugin<RemoteStorageManager> plugin =
                    Plugin.wrapInstance(h.rsm, metrics, "remote.log.storage.manager.class.name");
            assertThrows(RemoteResourceNotFoundException.class,
                    () -> h.rsm.fetchIndex(Fixtures.metadata(), RemoteStorageManager.IndexType.TRANSACTION));
            assertThrows(RemoteResourceNotFoundException.class,
                    () -> h.rsm.fetchIndex(Fixtures.metadata(), RemoteStorageManager.IndexType.TRANSACTION));
            assertEquals(2.0, plugin(metrics).get("errors-total{op=fetch-index, status=NOT_FOUND}"));
            h.rsm.metrics.answered(Status.UNAVAILABLE);
            assertEquals(0.0, plugin(metrics).get("sidecar-reachable{}"));
            plugin.close();
        }
        assertTrue(metrics.metrics().keySet().stream().noneMatch(n -> n.group().equals("plugins")),
                "closing the plugin removes its metrics");
        metrics.close();
    }
}
