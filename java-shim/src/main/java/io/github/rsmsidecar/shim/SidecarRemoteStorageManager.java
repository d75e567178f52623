package io.github.rsmsidecar.shim;

import com.google.common.util.concurrent.ListenableFuture;
import com.google.common.util.concurrent.MoreExecutors;
import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.CopyBegin;
import io.github.rsmsidecar.proto.v1.CopySegmentResponse;
import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.FetchIndexResponse;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.FileKind;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.SegmentFiles;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.github.rsmsidecar.proto.v1.TransferMode;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.stub.ClientCalls;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import org.apache.kafka.common.TopicIdPartition;
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
 * KIP-405 {@link RemoteStorageManager} that forwards every call over gRPC ({@code rsm.v1}) to the
 * rsm-sidecar. The shim only translates types, streams bytes, applies deadlines and retries, and
 * maps gRPC statuses to KIP-405 exceptions; the sidecar does the storage work.
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
    /** Room over the partition's last read for the first window of its next read. */
    static final int FETCH_WINDOW_SLACK = 64 * 1024;
    /** Partitions whose last read size is remembered (forgotten all at once beyond this). */
    static final int MAX_TRACKED_PARTITIONS = 100_000;

    /** Bytes the last windowed read of each partition took (see {@link WindowedFetchStream}). */
    private final ConcurrentHashMap<TopicIdPartition, Long> lastFetchBytes = new ConcurrentHashMap<>();

    private final ChannelFactory channelFactory;
    private final ErrorMapper errorMapperOverride;

    private volatile ShimConfig config;
    /** Null when fetch hand-off is off or the sidecar is reached over TCP. */
    private volatile FetchHandoff handoff;
    private volatile Retrier retrier;
    private volatile ScheduledThreadPoolExecutor scheduler;
    private ManagedChannel channel; // guarded by this
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
            ChannelFactory.credentials(c); // reads the TLS files now so a bad path fails start-up clearly
        } catch (ShimConfig.ShimConfigException e) {
            throw new ConfigException(e.getMessage());
        } catch (IOException e) {
            throw new ConfigException(e.getMessage());
        }
        for (String unknown : c.unknownKeys()) {
            LOG.warn("Ignoring unknown configuration rsm.config.{} (known keys: {})", unknown, ShimConfig.KEYS.keySet());
        }
        ErrorMapper mapper = errorMapperOverride != null ? errorMapperOverride : ErrorMapper.forBroker();
        synchronized (this) {
            if (closed) {
                throw new IllegalStateException("configure() after close()");
            }
            this.retrier = new Retrier(c, mapper, this::resetConnectBackoff);
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
            this.handoff = c.handoffDir() == null ? null : new FetchHandoff(c.handoffDir());
            if (channel != null) {
                // Reconfigured (the broker configures once; tests may not): the next call uses the new target.
                channel.shutdown();
                channel = null;
            }
        }
        LOG.info("SidecarRemoteStorageManager {} configured on broker {}: {}; transient errors raise {}",
                Version.get(), c.brokerId(), c,
                mapper.hasRetriableClass() ? "RetriableRemoteStorageException" : "RemoteStorageException");
    }

    /** Shuts the channel down, waiting at most {@code close.timeout.ms} for calls to end. */
    @Override
    public void close() throws IOException {
        ManagedChannel ch;
        synchronized (this) {
            if (closed) {
                return;
            }
            closed = true;
            ch = channel;
            channel = null;
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
                channel = channelFactory.create(c);
            } catch (IOException | RuntimeException e) {
                throw new RemoteStorageException("cannot create the gRPC channel to the sidecar at "
                        + c.target() + ": " + e.getMessage(), e);
            }
            LOG.info("gRPC channel to the sidecar at {} created", c.target());
        }
        return channel;
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

        CopyBegin.Builder begin = CopyBegin.newBuilder().setMetadata(metadata).setLeaderEpochCheckpoint(leaderEpochs);
        List<SegmentCopier.FilePart> parts = new ArrayList<>();
        if (c.transferMode() == ShimConfig.TransferMode.PATH) {
            SegmentFiles.Builder files = SegmentFiles.newBuilder()
                    .setLogPath(absolute(data.logSegment()))
                    .setOffsetIndexPath(absolute(data.offsetIndex()))
                    .setTimeIndexPath(absolute(data.timeIndex()))
                    .setProducerSnapshotPath(absolute(data.producerSnapshotIndex()));
            data.transactionIndex().ifPresent(p -> files.setTransactionIndexPath(absolute(p)));
            begin.setMode(TransferMode.PATH).setFiles(files);
        } else {
            SegmentFiles.Builder files = SegmentFiles.newBuilder();
            // The proto's file order: LOG, OFFSET_INDEX, TIME_INDEX, PRODUCER_SNAPSHOT_FILE, TRANSACTION_INDEX.
            parts.add(part(op, FileKind.LOG, data.logSegment()));
            parts.add(part(op, FileKind.OFFSET_INDEX, data.offsetIndex()));
            parts.add(part(op, FileKind.TIME_INDEX, data.timeIndex()));
            parts.add(part(op, FileKind.PRODUCER_SNAPSHOT_FILE, data.producerSnapshotIndex()));
            if (data.transactionIndex().isPresent()) {
                parts.add(part(op, FileKind.TRANSACTION_INDEX, data.transactionIndex().get()));
            }
            for (SegmentCopier.FilePart p : parts) {
                switch (p.kind) {
                    case LOG:
                        files.setLogSize(p.size);
                        break;
                    case OFFSET_INDEX:
                        files.setOffsetIndexSize(p.size);
                        break;
                    case TIME_INDEX:
                        files.setTimeIndexSize(p.size);
                        break;
                    case PRODUCER_SNAPSHOT_FILE:
                        files.setProducerSnapshotSize(p.size);
                        break;
                    case TRANSACTION_INDEX:
                        files.setTransactionIndexSize(p.size);
                        break;
                    default:
                        throw new IllegalStateException(p.kind.toString());
                }
            }
            begin.setMode(TransferMode.STREAM).setFiles(files);
        }
        CopyBegin beginMessage = begin.build();
        long started = System.nanoTime();
        CopySegmentResponse response = retrier.call(op, false, attempt -> SegmentCopier.copy(
                channel(), deadline(c.copyDeadlineMs()), op, beginMessage, parts));
        LOG.info("{}: copied in {} ms ({} mode, {} bytes stored as {}, custom metadata: {} bytes)", op,
                TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started), c.transferMode(),
                response.getStoredBytes(), response.getObjectKeyBase(),
                response.hasCustomMetadata() ? response.getCustomMetadata().size() : "none");
        return response.hasCustomMetadata()
                ? Optional.of(new CustomMetadata(response.getCustomMetadata().toByteArray()))
                : Optional.empty();
    }

    private static String absolute(Path p) {
        return p.toAbsolutePath().toString();
    }

    private static SegmentCopier.FilePart part(String op, FileKind kind, Path path) throws RemoteStorageException {
        try {
            return new SegmentCopier.FilePart(kind, path, Files.size(path));
        } catch (IOException e) {
            throw new RemoteStorageException(op + " failed: cannot read the size of " + kind + " file " + path
                    + ": " + e, e);
        }
    }

    // ---- fetch -------------------------------------------------------------------------------

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
        ShimConfig c = config();
        String op = "fetchLogSegment(" + MetadataMapper.describe(md) + ", start=" + start
                + (end != null ? ", end=" + end : "") + ")";
        int window = c.fetchWindowBytes();
        TopicIdPartition partition = md.remoteLogSegmentId().topicIdPartition();
        Long lastRead = lastFetchBytes.get(partition);
        if (window > 0 && lastRead != null) {
            // what the partition's last read took, plus room: a sequential consumer's fetches alike
            window = (int) Math.min(Math.max(window, lastRead + FETCH_WINDOW_SLACK), ShimConfig.MAX_FETCH_WINDOW_BYTES);
        }
        long size = md.segmentSizeInBytes();
        if (end != null || window == 0 || WindowedFetchStream.windowEnd(start, window, size) == null) {
            InputStream in = openFetch(c, md, start, end, op);
            LOG.debug("{}: stream open", op);
            return in;
        }
        // no end: read in windows (see WindowedFetchStream), so the sidecar sends about what is read
        InputStream first = openFetch(c, md, start, WindowedFetchStream.windowEnd(start, window, size), op);
        LOG.debug("{}: stream open, first window {} bytes", op, window);
        if (lastFetchBytes.size() > MAX_TRACKED_PARTITIONS) {
            lastFetchBytes.clear();
        }
        return new WindowedFetchStream(first, start, window, ShimConfig.MAX_FETCH_WINDOW_BYTES, size,
                (from, to) -> {
                    try {
                        return openFetch(c, md, from, to, op + " window at " + from);
                    } catch (RemoteStorageException e) {
                        throw new IOException(op + ": opening the next window at " + from + " failed: "
                                + e.getMessage(), e);
                    }
                }, read -> lastFetchBytes.put(partition, read), op);
    }

    /**
     * One {@code FetchSegment} call for {@code [start, end]} ({@code end} null: to the end), open.
     * Offers fetch hand-off when it is on (see {@link FetchHandoff}); if reading the handed-off
     * file fails, asks again without.
     */
    private InputStream openFetch(ShimConfig c, RemoteLogSegmentMetadata md, int start, Integer end, String op)
            throws RemoteStorageException {
        FetchSegmentRequest.Builder req = FetchSegmentRequest.newBuilder()
                .setMetadata(MetadataMapper.toProto(md))
                .setStartPosition(start);
        if (end != null) {
            req.setEndPosition(end);
        }
        FetchHandoff handoff = this.handoff;
        if (handoff != null && handoff.active()) {
            try {
                return openFetch(c, req.setAcceptHandoff(true).build(), handoff, op);
            } catch (FetchHandoff.HandoffException e) {
                handoff.turnOff(op, e);
                req.setAcceptHandoff(false);
            }
        }
        return openFetch(c, req.build(), null, op);
    }

    private InputStream openFetch(ShimConfig c, FetchSegmentRequest request, FetchHandoff handoff, String op)
            throws RemoteStorageException {
        Function<FetchSegmentResponse, ByteString> data = response -> {
            if (response.hasHandoff()) {
                throw new UncheckedIOException(new IOException(handoff == null
                        ? "the sidecar answered with a hand-off file that was not asked for"
                        : "the sidecar sent a hand-off file after other messages"));
            }
            return response.getData();
        };
        Function<FetchSegmentResponse, InputStream> handedOff = handoff == null ? null
                : response -> response.hasHandoff() ? handoff.open(response.getHandoff()) : null;
        try {
            return retrier.call(op, false, attempt -> {
                GrpcInputStream<FetchSegmentResponse> s = GrpcInputStream.start(channel(),
                        FetchResponseMarshaller.FETCH_SEGMENT, STREAM_CALL, request,
                        data, op, c.fetchReadTimeoutMs(), ShimConfig.FETCH_READ_TIMEOUT_MS)
                        .substitutingFirst(handedOff);
                s.awaitFirst(c.fetchDeadlineMs(), ShimConfig.FETCH_DEADLINE_MS);
                s.armIdleTimeout(scheduler, c.fetchIdleTimeoutMs());
                return s;
            });
        } catch (FetchHandoff.HandoffException e) {
            throw e; // the caller asks again without hand-off
        } catch (UncheckedIOException e) {
            throw new RemoteStorageException(op + ": " + e.getCause().getMessage(), e.getCause());
        }
    }

    @Override
    public InputStream fetchIndex(RemoteLogSegmentMetadata md, IndexType indexType) throws RemoteStorageException {
        Objects.requireNonNull(md, "remoteLogSegmentMetadata");
        Objects.requireNonNull(indexType, "indexType");
        ShimConfig c = config();
        String op = "fetchIndex(" + MetadataMapper.describe(md) + ", " + indexType + ")";
        io.github.rsmsidecar.proto.v1.IndexType type = MetadataMapper.indexType(indexType);
        if (type == null) {
            throw new RemoteStorageException(op + ": index type " + indexType + " is not known to rsm.v1");
        }
        FetchIndexRequest request = FetchIndexRequest.newBuilder()
                .setMetadata(MetadataMapper.toProto(md))
                .setIndexType(type)
                .build();
        return retrier.call(op, false, attempt -> {
            GrpcInputStream<FetchIndexResponse> s = GrpcInputStream.start(channel(),
                    RemoteStorageGrpc.getFetchIndexMethod(),
                    STREAM_CALL.withDeadlineAfter(c.fetchIndexDeadlineMs(), TimeUnit.MILLISECONDS), request,
                    FetchIndexResponse::getData, op, 0, ShimConfig.FETCH_INDEX_DEADLINE_MS);
            s.awaitFirst(0, ShimConfig.FETCH_INDEX_DEADLINE_MS);
            return s;
        });
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
        DeleteSegmentRequest request = DeleteSegmentRequest.newBuilder().setMetadata(MetadataMapper.toProto(md)).build();
        long started = System.nanoTime();
        retrier.call(op, true, attempt -> {
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
