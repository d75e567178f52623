package io.github.rsmsidecar.shim;

import com.google.common.util.concurrent.ListenableFuture;
import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.CopyBegin;
import io.github.rsmsidecar.proto.v1.CopySegmentResponse;
import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.github.rsmsidecar.shim.read.RemoteReader;
import io.grpc.CallOptions;
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
 * KIP-405 {@link RemoteStorageManager} backed by the rsm-sidecar ({@code rsm.v1}).
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
    /** How the shim reaches the sidecar: the gRPC channel and the fetch channel's TLS; made by configure(). */
    private volatile SidecarConnection connection;
    /** The read path: fetchLogSegment and fetchIndex ({@link RemoteReader}); made by configure(). */
    private volatile RemoteReader reader;
    /** The shim's counters; published through the broker's plugin metrics on Kafka 4.1+ (KIP-877). */
    final ShimMetrics metrics = new ShimMetrics();
    private volatile ScheduledThreadPoolExecutor scheduler;
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
        try {
            c = ShimConfig.parse(configs);
        } catch (ShimConfig.ShimConfigException e) {
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
            if (scheduler == null) {
                ScheduledThreadPoolExecutor s = new ScheduledThreadPoolExecutor(1, r -> {
                    Thread t = new Thread(r, "rsm-sidecar-shim-timer");
                    t.setDaemon(true);
                    return t;
                });
                s.setRemoveOnCancelPolicy(true);
                this.scheduler = s;
            }
            SidecarConnection conn;
            try {
                // reads the TLS files now so a bad path fails start-up clearly
                conn = new SidecarConnection(c, channelFactory, metrics, scheduler);
            } catch (IOException e) {
                throw new ConfigException(e.getMessage());
            }
            Retrier retries = new Retrier(c, mapper, conn::resetConnectBackoff, metrics, conn::tlsFiles);
            RemoteReader read = new RemoteReader(c, retries, mapper, metrics, conn::channel, scheduler,
                    channelFactory.fetchChannel(), conn.fetchChannelTls());
            // Reconfigured (the broker configures once; tests may not): the next call uses the new target.
            SidecarConnection previousConnection = this.connection;
            RemoteReader previousReader = this.reader;
            this.config = c;
            this.retrier = retries;
            this.connection = conn;
            this.reader = read;
            if (previousReader != null) {
                previousReader.close();
            }
            if (previousConnection != null) {
                previousConnection.close(0);
            }
        }
        LOG.info("SidecarRemoteStorageManager {} configured on broker {}: {}; transient errors raise {}",
                Version.get(), c.brokerId(), c,
                mapper.hasRetriableClass() ? "RetriableRemoteStorageException" : "RemoteStorageException");
    }

    /** Shuts the channel down, waiting at most {@code close.timeout.ms} for calls to end. */
    @Override
    public void close() throws IOException {
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
        }
        RemoteReader r = reader;
        if (r != null) {
            r.close();
        }
        ScheduledThreadPoolExecutor s = scheduler;
        if (s != null) {
            s.shutdownNow();
        }
        SidecarConnection conn = connection;
        if (conn != null) {
            conn.close(config.closeTimeoutMs());
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
                connection.channel(), deadline(c.copyDeadlineMs()), op, beginMessage, parts));
        metrics.copyBytes.add(SegmentCopier.copiedBytes(data));
        LOG.info("{}: copied in {} ms ({} mode, {} bytes stored as {}, custom metadata: {} bytes)", op,
                TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started), c.transferMode(),
                response.getStoredBytes(), response.getObjectKeyBase(),
                response.hasCustomMetadata() ? response.getCustomMetadata().size() : "none");
        return response.hasCustomMetadata()
                ? Optional.of(new CustomMetadata(response.getCustomMetadata().toByteArray()))
                : Optional.empty();
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
                    connection.channel().newCall(RemoteStorageGrpc.getDeleteSegmentMethod(), deadline(c.deleteDeadlineMs())),
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
