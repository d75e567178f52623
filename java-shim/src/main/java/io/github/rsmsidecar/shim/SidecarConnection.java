package io.github.rsmsidecar.shim;

import io.grpc.Channel;
import io.grpc.ManagedChannel;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import javax.net.ssl.SSLEngine;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * How the shim reaches its sidecar, for one configuration: the gRPC channel (made on the first call;
 * grpc-java connects lazily, so a sidecar not up yet delays nothing) and the TLS of the fetch
 * channel's connections, both following the TLS files as they are renewed
 * ({@code tls.reload.interval.ms}).
 */
final class SidecarConnection {

    private static final Logger LOG = LoggerFactory.getLogger(SidecarConnection.class);

    private final ShimConfig config;
    private final ChannelFactory factory;
    private final ShimMetrics metrics;
    private final String tlsHost;
    private final int tlsPort;
    private ManagedChannel channel; // guarded by this
    /** Channels replaced after a TLS reload, finishing their calls in flight. Guarded by this. */
    private final List<ManagedChannel> retired = new ArrayList<>();
    /** The TLS files new connections use (null without TLS). */
    private volatile TlsFiles tlsFiles;
    /** A changed set of TLS files that was not usable (warned about once). */
    private volatile TlsFiles rejectedTls;
    /** The TLS context of the fetch channel's connections (null without TLS). */
    private volatile io.grpc.netty.shaded.io.netty.handler.ssl.SslContext fetchTls;
    private final ScheduledFuture<?> tlsReload;
    private boolean closed; // guarded by this

    /**
     * Reads the TLS files now (a bad path or an unusable set fails here, at the broker's start-up).
     *
     * @throws IOException naming the key and file that are not usable
     */
    SidecarConnection(ShimConfig c, ChannelFactory factory, ShimMetrics metrics, ScheduledExecutorService scheduler)
            throws IOException {
        this.config = c;
        this.factory = factory;
        this.metrics = metrics;
        TlsFiles tls = c.tlsEnabled() ? TlsFiles.read(c).check(c) : null;
        ChannelFactory.credentials(c, tls);
        this.tlsFiles = tls;
        this.fetchTls = tls == null ? null : tls.fetchChannelContext(c);
        String[] address = c.fetchChannelAddress();
        this.tlsHost = !c.tlsAuthorityOverride().isEmpty() ? c.tlsAuthorityOverride()
                : address.length == 2 ? address[0] : "localhost";
        this.tlsPort = address.length == 2 ? Integer.parseInt(address[1]) : 0;
        this.tlsReload = tls != null && c.tlsReloadIntervalMs() > 0
                ? scheduler.scheduleWithFixedDelay(this::reloadTls, c.tlsReloadIntervalMs(), c.tlsReloadIntervalMs(),
                        TimeUnit.MILLISECONDS)
                : null;
        warnIfNotValidNow(tls);
    }

    /** The gRPC channel to the sidecar, made on first use. */
    synchronized Channel channel() throws RemoteStorageException {
        if (closed) {
            throw new RemoteStorageException("SidecarRemoteStorageManager is closed");
        }
        if (channel == null) {
            try {
                channel = factory.create(config, tlsFiles);
            } catch (IOException | RuntimeException e) {
                throw new RemoteStorageException("cannot create the gRPC channel to the sidecar at "
                        + config.target() + ": " + e.getMessage(), e);
            }
            LOG.info("gRPC channel to the sidecar at {} created{}", config.target(),
                    config.tlsEnabled() ? "; TLS by " + ChannelFactory.tlsProvider() : "");
            String noKeepalive = ChannelFactory.keepaliveUnavailable(config);
            if (noKeepalive != null) {
                LOG.warn("rsm.config.{} and {} do not apply: {}; a connection whose sidecar vanished is "
                        + "noticed only when a call's timeout passes", ShimConfig.KEEPALIVE_TIME_MS,
                        ShimConfig.KEEPALIVE_TIMEOUT_MS, noKeepalive);
            }
        }
        return channel;
    }

    /** A new TLS engine for each fetch channel connection (the current certificates), or null without TLS. */
    Supplier<SSLEngine> fetchChannelTls() {
        return config.tlsEnabled() ? () -> TlsFiles.newEngine(fetchTls, tlsHost, tlsPort) : null;
    }

    /** The TLS files in use (null without TLS): what a refused handshake is explained against. */
    TlsFiles tlsFiles() {
        return tlsFiles;
    }

    /** Before a retry: connect again at once rather than after gRPC's reconnect backoff. */
    synchronized void resetConnectBackoff() {
        if (channel != null) {
            channel.resetConnectBackoff();
        }
    }

    /**
     * Stops using this connection: no more reloads or new calls; waits at most {@code timeoutMs} for
     * calls in flight (0: none, they finish on their own), then cancels them.
     */
    void close(long timeoutMs) {
        ManagedChannel ch;
        List<ManagedChannel> old;
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
            ch = channel;
            channel = null;
            old = new ArrayList<>(retired);
            retired.clear();
        }
        if (tlsReload != null) {
            tlsReload.cancel(false);
        }
        for (ManagedChannel r : old) {
            r.shutdownNow();
        }
        if (ch == null) {
            return;
        }
        ch.shutdown();
        if (timeoutMs == 0) {
            return;
        }
        try {
            if (!ch.awaitTermination(timeoutMs, TimeUnit.MILLISECONDS)) {
                LOG.warn("sidecar calls still running {} ms after close(); cancelling them", timeoutMs);
                ch.shutdownNow();
                ch.awaitTermination(Math.min(timeoutMs, 1000), TimeUnit.MILLISECONDS);
            }
        } catch (InterruptedException e) {
            ch.shutdownNow();
            Thread.currentThread().interrupt();
        }
    }

    /**
     * Reads the TLS files again; when their bytes changed and form a usable set
     * ({@link TlsFiles#check}), calls from now on use a new channel made of them, and the old
     * channel is shut down gracefully: its calls in flight (copies, streams) finish on the
     * connection they started on; new fetch channel connections take the new certificates. A
     * changed set that is not usable (caught half-written, a key from another renewal) is warned
     * about once and read again at the next check.
     */
    private void reloadTls() {
        TlsFiles now;
        try {
            now = TlsFiles.read(config);
        } catch (IOException e) {
            LOG.warn("TLS files: {}; keeping the ones in use", StatusText.oneLine(String.valueOf(e.getMessage())));
            return;
        }
        if (now.sameAs(tlsFiles) || now.sameAs(rejectedTls)) {
            return;
        }
        io.grpc.netty.shaded.io.netty.handler.ssl.SslContext fetchContext;
        try {
            now.check(config);
            fetchContext = now.fetchChannelContext(config);
        } catch (IOException e) {
            rejectedTls = now;
            LOG.warn("TLS files changed but are not usable yet ({}); keeping the ones in use and checking again "
                    + "in {} ms", StatusText.oneLine(String.valueOf(e.getMessage())), config.tlsReloadIntervalMs());
            return;
        }
        ManagedChannel old;
        synchronized (this) {
            if (closed) {
                return;
            }
            old = channel;
            if (old != null) {
                ManagedChannel fresh;
                try {
                    fresh = factory.create(config, now);
                } catch (IOException | RuntimeException e) {
                    LOG.warn("TLS files changed but no channel could be made of them ({}); keeping the ones in use",
                            StatusText.oneLine(String.valueOf(e.getMessage())));
                    rejectedTls = now;
                    return;
                }
                channel = fresh;
                retired.removeIf(ManagedChannel::isTerminated);
                retired.add(old);
            }
            tlsFiles = now;
            fetchTls = fetchContext;
        }
        metrics.tlsReloads.increment();
        if (old != null) {
            old.shutdown(); // graceful: its calls in flight finish, new calls go to the new channel
        }
        LOG.info("TLS files changed: new connections to the sidecar use them (client certificate {}){}",
                now.subject(), old != null ? "; calls in flight finish on the previous connection" : "");
        warnIfNotValidNow(now);
    }

    /** A WARN line when the client certificate in {@code tls} (null: none) is expired or not yet valid. */
    private void warnIfNotValidNow(TlsFiles tls) {
        String why = tls == null ? null : tls.notValidNow(config);
        if (why != null) {
            LOG.warn("TLS files: {}", why);
        }
    }
}
