package io.github.rsmsidecar.shim;

import com.google.common.util.concurrent.ListenableFuture;
import com.google.common.util.concurrent.MoreExecutors;
import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.CopyBegin;
import io.github.rsmsidecar.proto.v1.CopySegmentResponse;
import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.github.rsmsidecar.shim.read.RemoteReader;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.stub.ClientCalls;
import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * KIP-405 {@link RemoteStorageManager} that forwards every call to the rsm-sidecar ({@code rsm.v1}).
 * This class translates the KIP-405 calls: copies and deletes go over gRPC from here
 * ({@link SegmentCopier}), with deadlines, retries ({@link Retrier}) and gRPC statuses mapped to
 * KIP-405 exceptions ({@link ErrorMapper}); reads ({@code fetchLogSegment}, {@code fetchIndex}) go
 * to the read path, {@link io.github.rsmsidecar.shim.read.RemoteReader}, the one part of the shim
 * that keeps state of its own (read-ahead windows, index prefetch) and reads over the sidecar's
 * fetch channel. The sidecar does the storage work.
 *
 * <p>Broker configuration (see docs/shim.md for every key):
 *
 * <pre>
 * remote.log.storage.manager.class.name=io.github.rsmsidecar.shim.SidecarRemoteStorageManager
 * remote.log.storage.manager.class.path=/opt/rsm-sidecar/rsm-sidecar-shim.jar
 * rsm.config.sidecar.target=unix:///run/rsm-sidecar/rsm.sock
 * </pre>
 *
 * Compiled against kafka-storage-api 3.6; runs on brokers 3.6 through 4.4. Thread-safe: the broker
 * calls it from its copier, expiration, reader and fetcher threads concurrently.
 */
public class SidecarRemoteStorageManager implements RemoteStorageManager {

    private static final Logger LOG = LoggerFactory.getLogger(SidecarRemoteStorageManager.class);
    private final ChannelFactory channelFactory;
    private final ErrorMapper errorMapperOverride;

    private volatile ShimConfig config;
    private volatile Retrier retrier;
    private volatile ErrorMapper errorMapper;
    /** The read path: fetchLogSegment and fetchIndex ({@link RemoteReader}); made by configure(). */
    private volatile RemoteReader reader;
    /** The TLS context of the fetch channel's connections (null without TLS); follows the TLS files. */
    private volatile io.grpc.netty.shaded.io.netty.handler.ssl.SslContext fetchTls;
    /** The shim's counters; published through the broker's plugin metrics on Kafka 4.1+ (KIP-877). */
    final ShimMetrics metrics = new ShimMetrics();
    private volatile ScheduledThreadPoolExecutor scheduler;
    private ManagedChannel channel; // guarded by this
    /** Channels replaced after a TLS reload, finishing their calls in flight. Guarded by this. */
    private final List<ManagedChannel> retired = new ArrayList<>();
    /** The TLS files the next channel uses (null without TLS). */
    private volatile TlsFiles tlsFiles;
    /** A changed set of TLS files that was not usable (warned about once). */
    private volatile TlsFiles rejectedTls;
    private java.util.concurrent.ScheduledFuture<?> tlsReload; // guarded by this
    private volatile boolean closed;

    /** The constructor the broker uses. */
    public SidecarRemoteStorageManager() {
        this(ChannelFactory.NETTY, null);
    }

    /** For tests: another channel (in-process) and/or another retriable-exception lookup. */
    SidecarRemoteStorageManager(ChannelFactory channelFactory, ErrorMapper errorMapper) {
        this.channelFactory = Objects.requireNonNull(channelFactory);
        this.errorMapperOverride = errorMapper;
    }

    // ---- lifecycle ---------------------------------------------------------------------------

    /**
     * Validates the configuration. Does not connect: the channel is created on the first call and
     * grpc-java connects lazily, so a sidecar that is not up yet never delays broker start-up.
     *
     * @throws ConfigException naming the offending {@code rsm.config.*} key
     */
    @Override
    public void configure(Map<String, ?> configs) {
        ShimConfig c;
        TlsFiles tls;
        io.grpc.netty.shaded.io.netty.handler.ssl.SslContext fetchContext;
        try {
            c = ShimConfig.parse(configs);
            // reads the TLS files now so a bad path fails start-up clearly
            tls = c.tlsEnabled() ? TlsFiles.read(c).check(c) : null;
            ChannelFactory.credentials(c, tls);
            fetchContext = fetchTlsContext(c, tls);
        } catch (ShimConfig.ShimConfigException e) {
            throw new ConfigException(e.getMessage());
        } catch (IOException e) {
            throw new ConfigException(e.getMessage());
        }
        for (String removed : c.removedKeys()) {
            LOG.warn("rsm.config.{} is no longer used ({}); remove it", removed, ShimConfig.REMOVED_KEYS.get(removed));
        }
        for (String unknown : c.unknownKeys()) {
            LOG.warn("Ignoring unknown configuration rsm.config.{} (known keys: {})", unknown, ShimConfig.KEYS.keySet());
        }
        ErrorMapper mapper = errorMapperOverride != null ? errorMapperOverride : ErrorMapper.forBroker();
        synchronized (this) {
            if (closed) {
                throw new IllegalStateException("configure() after close()");
            }
            this.retrier = new Retrier(c, mapper, this::resetConnectBackoff, metrics, () -> tlsFiles);
            this.errorMapper = mapper;
            if (scheduler == null) {
                ScheduledThreadPoolExecutor s = new ScheduledThreadPoolExecutor(1, r -> {
                    Thread t = new Thread(r, "rsm-sidecar-shim-timer");
                    t.setDaemon(true);
                    return t;
                });
                s.setRemoveOnCancelPolicy(true);
                this.scheduler = s;
            }
            this.config = c;
            this.tlsFiles = tls;
            if (tlsReload != null) {
                tlsReload.cancel(false);
                tlsReload = null;
            }
            if (tls != null && c.tlsReloadIntervalMs() > 0) {
                tlsReload = scheduler.scheduleWithFixedDelay(this::reloadTls, c.tlsReloadIntervalMs(),
                        c.tlsReloadIntervalMs(), TimeUnit.MILLISECONDS);
            }
            this.fetchTls = fetchContext;
            RemoteReader previous = this.reader;
            String[] address = c.fetchChannelAddress();
            String host = !c.tlsAuthorityOverride().isEmpty() ? c.tlsAuthorityOverride()
                    : address.length == 2 ? address[0] : "localhost";
            int port = address.length == 2 ? Integer.parseInt(address[1]) : 0;
            this.reader = new RemoteReader(c, retrier, mapper, metrics, this::channel, scheduler,
                    channelFactory.fetchChannel(), c.tlsEnabled() ? () -> TlsFiles.newEngine(fetchTls, host, port) : null);
            if (previous != null) {
                previous.close();
            }
            if (channel != null) {
                // Reconfigured (the broker configures once; tests may not): the next call uses the new target.
                channel.shutdown();
                channel = null;
            }
        }
        LOG.info("SidecarRemoteStorageManager {} configured on broker {}: {}; transient errors raise {}",
                Version.get(), c.brokerId(), c,
                mapper.hasRetriableClass() ? "RetriableRemoteStorageException" : "RemoteStorageException");
        warnIfNotValidNow(tls, c);
    }

    /** Shuts the channel down, waiting at most {@code close.timeout.ms} for calls to end. */
    @Override
    public void close() throws IOException {
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
        for (ManagedChannel r : old) {
            r.shutdownNow();
        }
        RemoteReader r = reader;
        if (r != null) {
            r.close();
        }
        ScheduledThreadPoolExecutor s = scheduler;
        if (s != null) {
            s.shutdownNow();
        }
        if (ch == null) {
            return;
        }
        long timeoutMs = config == null ? 5000 : config.closeTimeoutMs();
        ch.shutdown();
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
        LOG.info("SidecarRemoteStorageManager closed");
    }

    private ShimConfig config() throws RemoteStorageException {
        ShimConfig c = config;
        if (c == null) {
            throw new RemoteStorageException("SidecarRemoteStorageManager: configure() has not been called");
        }
        if (closed) {
            throw new RemoteStorageException("SidecarRemoteStorageManager is closed");
        }
        return c;
    }

    private synchronized Channel channel() throws RemoteStorageException {
        if (closed) {
            throw new RemoteStorageException("SidecarRemoteStorageManager is closed");
        }
        if (channel == null) {
            ShimConfig c = config;
            try {
                channel = channelFactory.create(c, tlsFiles);
            } catch (IOException | RuntimeException e) {
                throw new RemoteStorageException("cannot create the gRPC channel to the sidecar at "
                        + c.target() + ": " + e.getMessage(), e);
            }
            LOG.info("gRPC channel to the sidecar at {} created{}", c.target(),
                    c.tlsEnabled() ? "; TLS by " + ChannelFactory.tlsProvider() : "");
            String noKeepalive = ChannelFactory.keepaliveUnavailable(c);
            if (noKeepalive != null) {
                LOG.warn("rsm.config.{} and {} do not apply: {}; a connection whose sidecar vanished is "
                        + "noticed only when a call's timeout passes", ShimConfig.KEEPALIVE_TIME_MS,
                        ShimConfig.KEEPALIVE_TIMEOUT_MS, noKeepalive);
            }
        }
        return channel;
    }

    /**
     * Reads the TLS files again (every {@code tls.reload.interval.ms}); when their bytes changed and
     * form a usable set ({@link TlsFiles#check}), calls from now on use a new channel made of them,
     * and the old channel is shut down gracefully: its calls in flight (fetch streams, copies) finish
     * on the connection they started on. A changed set that is not usable (caught half-written, a
     * key from another renewal) is warned about once and read again at the next check.
     */
    private void reloadTls() {
        ShimConfig c = config;
        TlsFiles now;
        try {
            now = TlsFiles.read(c);
        } catch (IOException e) {
            LOG.warn("TLS files: {}; keeping the ones in use", StatusText.oneLine(String.valueOf(e.getMessage())));
            return;
        }
        if (now.sameAs(tlsFiles) || now.sameAs(rejectedTls)) {
            return;
        }
        try {
            now.check(c);
        } catch (IOException e) {
            rejectedTls = now;
            LOG.warn("TLS files changed but are not usable yet ({}); keeping the ones in use and checking again "
                    + "in {} ms", StatusText.oneLine(String.valueOf(e.getMessage())), c.tlsReloadIntervalMs());
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
                    fresh = channelFactory.create(c, now);
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
        }
        try {
            fetchTls = fetchTlsContext(c, now);
        } catch (IOException e) {
            LOG.warn("TLS files changed but the fetch channel cannot use them ({}); its new connections keep the "
                    + "ones in use", e.getMessage());
        }
        metrics.tlsReloads.increment();
        if (old != null) {
            old.shutdown(); // graceful: its calls in flight finish, new calls go to the new channel
        }
        LOG.info("TLS files changed: new connections to the sidecar use them (client certificate {}){}",
                now.subject(), old != null ? "; calls in flight finish on the previous connection" : "");
        warnIfNotValidNow(now, c);
    }

    /** A WARN line when the client certificate in {@code tls} (null: none) is expired or not yet valid. */
    private static void warnIfNotValidNow(TlsFiles tls, ShimConfig c) {
        String why = tls == null ? null : tls.notValidNow(c);
        if (why != null) {
            LOG.warn("TLS files: {}", why);
        }
    }

    private synchronized void resetConnectBackoff() {
        if (channel != null) {
            channel.resetConnectBackoff();
        }
    }

    /**
     * Fetch and index calls: their listener ({@link GrpcInputStream}) only queues what arrives, so it
     * runs on the transport's thread instead of a hop to gRPC's default executor per message and
     * per call end (the reader thread takes the message from the queue either way).
     */
    private static final CallOptions STREAM_CALL = CallOptions.DEFAULT.withExecutor(MoreExecutors.directExecutor());

    private static CallOptions deadline(long ms) {
        return CallOptions.DEFAULT.withDeadlineAfter(ms, TimeUnit.MILLISECONDS);
    }

    // ---- copy --------------------------------------------------------------------------------

    @Override
    public Optional<CustomMetadata> copyLogSegmentData(RemoteLogSegmentMetadata md, LogSegmentData data)
            throws RemoteStorageException {
        Objects.requireNonNull(md, "remoteLogSegmentMetadata");
        Objects.requireNonNull(data, "logSegmentData");
        ShimConfig c = config();
        String op = "copyLogSegmentData(" + MetadataMapper.describe(md) + ")";
        SegmentMetadata metadata = MetadataMapper.toProto(md);
        // duplicate(): never move the broker's buffer; copyFrom reads position..limit, array or not.
        ByteString leaderEpochs = ByteString.copyFrom(data.leaderEpochIndex().duplicate());

        List<SegmentCopier.FilePart> parts = new ArrayList<>();
        CopyBegin beginMessage = SegmentCopier.begin(op, metadata, leaderEpochs, data, c.transferMode(), parts);
        long started = System.nanoTime();
        CopySegmentResponse response = retrier.call(ShimMetrics.Op.COPY, op, attempt -> SegmentCopier.copy(
                channel(), deadline(c.copyDeadlineMs()), op, beginMessage, parts));
        metrics.copyBytes.add(SegmentCopier.copiedBytes(data));
        LOG.info("{}: copied in {} ms ({} mode, {} bytes stored as {}, custom metadata: {} bytes)", op,
                TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started), c.transferMode(),
                response.getStoredBytes(), response.getObjectKeyBase(),
                response.hasCustomMetadata() ? response.getCustomMetadata().size() : "none");
        return response.hasCustomMetadata()
                ? Optional.of(new CustomMetadata(response.getCustomMetadata().toByteArray()))
                : Optional.empty();
    }

    /** The fetch channel's TLS context of {@code tls} (null without TLS). */
    private static io.grpc.netty.shaded.io.netty.handler.ssl.SslContext fetchTlsContext(ShimConfig c, TlsFiles tls)
            throws IOException {
        return tls == null ? null : tls.fetchChannelContext(c);
    }

    // ---- fetch (the read path: RemoteReader) -------------------------------------------------

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata md, int startPosition) throws RemoteStorageException {
        return fetch(md, startPosition, null);
    }

    @Override
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata md, int startPosition, int endPosition)
            throws RemoteStorageException {
        return fetch(md, startPosition, endPosition);
    }

    /**
     * Forward compatibility with KIP-1333 (64-bit positions; not an override on any released
     * Kafka). rsm.v1 positions are int32, so a start beyond 2 GiB fails.
     */
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata md, long startPosition) throws RemoteStorageException {
        return fetch(md, checkedStart(startPosition), null);
    }

    /**
     * Forward compatibility with KIP-1333. The end is clamped to {@link Integer#MAX_VALUE}: rsm.v1
     * segments are at most 2 GiB and the sidecar clamps the end to the segment's last byte anyway.
     */
    public InputStream fetchLogSegment(RemoteLogSegmentMetadata md, long startPosition, long endPosition)
            throws RemoteStorageException {
        if (endPosition < startPosition) {
            throw new IllegalArgumentException("endPosition (" + endPosition + ") must be >= startPosition ("
                    + startPosition + ")");
        }
        return fetch(md, checkedStart(startPosition), (int) Math.min(endPosition, Integer.MAX_VALUE));
    }

    private static int checkedStart(long startPosition) throws RemoteStorageException {
        if (startPosition < 0) {
            throw new IllegalArgumentException("startPosition must be >= 0, was " + startPosition);
        }
        if (startPosition > Integer.MAX_VALUE) {
            throw new RemoteStorageException("startPosition " + startPosition
                    + " is beyond 2 GiB: rsm.v1 carries positions as int32");
        }
        return (int) startPosition;
    }

    private InputStream fetch(RemoteLogSegmentMetadata md, int start, Integer end) throws RemoteStorageException {
        Objects.requireNonNull(md, "remoteLogSegmentMetadata");
        if (start < 0) {
            throw new IllegalArgumentException("startPosition must be >= 0, was " + start);
        }
        if (end != null && end < start) {
            throw new IllegalArgumentException("endPosition (" + end + ") must be >= startPosition (" + start + ")");
        }
        config();
        return reader.fetch(md, start, end);
    }

    /** The read path, as configured (tests). */
    RemoteReader reader() {
        return reader;
    }

    @Override
    public InputStream fetchIndex(RemoteLogSegmentMetadata md, IndexType indexType) throws RemoteStorageException {
        config();
        return reader.index(md, indexType);
    }

    // ---- delete ------------------------------------------------------------------------------

    /**
     * Idempotent. Never throws {@link RemoteResourceNotFoundException}: a NOT_FOUND answer (which
     * rsm.v1 forbids for delete) is logged and treated as "already deleted".
     */
    @Override
    public void deleteLogSegmentData(RemoteLogSegmentMetadata md) throws RemoteStorageException {
        Objects.requireNonNull(md, "remoteLogSegmentMetadata");
        ShimConfig c = config();
        String op = "deleteLogSegmentData(" + MetadataMapper.describe(md) + ")";
        reader.forget(md.remoteLogSegmentId()); // nothing of a deleted segment is served again
        DeleteSegmentRequest request = DeleteSegmentRequest.newBuilder().setMetadata(MetadataMapper.toProto(md)).build();
        long started = System.nanoTime();
        retrier.call(ShimMetrics.Op.DELETE, op, attempt -> {
            ListenableFuture<DeleteSegmentResponse> f = ClientCalls.futureUnaryCall(
                    channel().newCall(RemoteStorageGrpc.getDeleteSegmentMethod(), deadline(c.deleteDeadlineMs())),
                    request);
            try {
                f.get();
                return Boolean.TRUE;
            } catch (InterruptedException e) {
                f.cancel(true);
                throw e;
            } catch (ExecutionException e) {
                Status status = Status.fromThrowable(e.getCause());
                if (status.getCode() == Status.Code.NOT_FOUND) {
                    LOG.warn("{}: the sidecar answered NOT_FOUND ({}), which rsm.v1 does not allow for delete; "
                            + "treated as already deleted", op, status.getDescription());
                    return Boolean.FALSE;
                }
                throw status.asException();
            }
        });
        LOG.info("{}: deleted in {} ms", op, TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started));
    }
}
