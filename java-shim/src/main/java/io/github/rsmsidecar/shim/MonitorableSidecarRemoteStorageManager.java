package io.github.rsmsidecar.shim;

import org.apache.kafka.common.metrics.Monitorable;
import org.apache.kafka.common.metrics.PluginMetrics;

/**
 * {@link SidecarRemoteStorageManager} with its metrics in the broker's own (KIP-877): on Kafka 4.1+
 * the broker hands a plugin that implements {@link Monitorable} its {@link PluginMetrics}, and the
 * shim's counters ({@link ShimMetrics}) then appear in the broker's JMX and metrics reporters
 * (docs/shim.md, "Metrics"). Kafka 3.6-4.0 have no {@code Monitorable}, so this class does not load
 * there: name {@link SidecarRemoteStorageManager} on those brokers (the same jar).
 *
 * <p>Kafka (checked up to 4.4.0) offers plugin metrics only to a class loaded from the broker's own
 * class path: with {@code remote.log.storage.manager.class.path} set, it wraps the plugin in
 * {@code ClassLoaderAwareRemoteStorageManager}, which does not pass {@code Monitorable} on, and
 * this class then works like the plain one.
 */
public class MonitorableSidecarRemoteStorageManager extends SidecarRemoteStorageManager implements Monitorable {

    /** The constructor the broker uses. */
    public MonitorableSidecarRemoteStorageManager() {
        super();
    }

    /** For tests: another channel (in-process) and/or another retriable-exception lookup. */
    MonitorableSidecarRemoteStorageManager(ChannelFactory channelFactory, ErrorMapper errorMapper) {
        super(channelFactory, errorMapper);
    }

    @Override
    public void withPluginMetrics(PluginMetrics pluginMetrics) {
        PluginMetricsBinding.bind(pluginMetrics, metrics);
    }
}
