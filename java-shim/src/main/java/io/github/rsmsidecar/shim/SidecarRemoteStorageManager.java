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
import io.grpc.ClientCall;
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
import java.util.function.Consumer;
import java.util.function.Function;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
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
    /** Null when read-ahead is off (or hand-off is: it reads ahead in hand-off files). */
    private volatile ReadAhead readAhead;
    /**
     * The {@code accept_zstd_max_bytes} of every fetch: {@code fetch.zstd.max.chunk.bytes}, or 0
     * without zstd-jni ({@link ZstdSlices#acceptMaxBytes}).
     */
    private volatile int zstdMaxBytes;
    /** Read-ahead is used again from this {@link System#nanoTime()} on (see {@link #readAheadRests}). */
    private volatile long readAheadOffUntilNanos = System.nanoTime();
    private volatile Retrier retrier;
    private volatile ErrorMapper errorMapper;
    /** The time and transaction indexes asked for beside a segment's offset index. */
    private final IndexPrefetch indexPrefetch = new IndexPrefetch();
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
        try {
            c = ShimConfig.parse(configs);
            // reads the TLS files now so a bad path fails start-up clearly
            tls = c.tlsEnabled() ? TlsFiles.read(c).check(c) : null;
            ChannelFactory.credentials(c, tls);
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
            this.handoff = c.handoffDir() == null ? null : new FetchHandoff(c.handoffDir());
            this.zstdMaxBytes = ZstdSlices.acceptMaxBytes(c.fetchZstdMaxChunkBytes());
            ReadAhead previous = this.readAhead;
            this.readAhead = c.fetchReadaheadBytes() == 0 ? null
                    : new ReadAhead(c.fetchReadaheadBytes(), c.fetchReadaheadMaxBytes());
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
        ReadAhead ra = readAhead;
        if (ra != null) {
            ra.close();
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
        CopySegmentResponse response = retrier.call(ShimMetrics.Op.COPY, op, attempt -> SegmentCopier.copy(
                channel(), deadline(c.copyDeadlineMs()), op, beginMessage, parts));
        metrics.copyBytes.add(copiedBytes(data));
        LOG.info("{}: copied in {} ms ({} mode, {} bytes stored as {}, custom metadata: {} bytes)", op,
                TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started), c.transferMode(),
                response.getStoredBytes(), response.getObjectKeyBase(),
                response.hasCustomMetadata() ? response.getCustomMetadata().size() : "none");
        return response.hasCustomMetadata()
                ? Optional.of(new CustomMetadata(response.getCustomMetadata().toByteArray()))
                : Optional.empty();
    }

    /** The bytes of a segment's files, as counted in {@link ShimMetrics#copyBytes}. */
    private static long copiedBytes(LogSegmentData data) {
        long n = data.leaderEpochIndex().remaining();
        List<Path> files = new ArrayList<>(List.of(data.logSegment(), data.offsetIndex(), data.timeIndex(),
                data.producerSnapshotIndex()));
        data.transactionIndex().ifPresent(files::add);
        for (Path p : files) {
            try {
                n += Files.size(p);
            } catch (IOException e) {
                // gone after the copy: not counted
            }
        }
        return n;
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
        TopicIdPartition partition = md.remoteLogSegmentId().topicIdPartition();
        long size = md.segmentSizeInBytes();
        ReadAhead ra = readAhead();
        if (end == null && ra != null) {
            WindowedFetchStream.Window kept = ra.find(partition, ReadAhead.SegmentRef.of(md), start);
            if (kept != null) {
                LOG.debug("{}: read from the read-ahead window up to {}", op, kept.end());
                readAheadNext(c, md, start, kept.end(), ra);
                return windowed(c, md, start, kept, true, op);
            }
        }
        int window = c.fetchWindowBytes();
        Long lastRead = lastFetchBytes.get(partition);
        if (window > 0 && lastRead != null) {
            // what the partition's last read took, plus room: a sequential consumer's fetches alike
            window = (int) Math.min(Math.max(window, lastRead + FETCH_WINDOW_SLACK), ShimConfig.MAX_FETCH_WINDOW_BYTES);
        }
        if (end != null || window == 0 || (ra == null && WindowedFetchStream.windowEnd(start, window, size) == null)) {
            InputStream in = openFetch(c, md, start, end, op);
            LOG.debug("{}: stream open", op);
            return in;
        }
        // no end: read in windows (see WindowedFetchStream), so the sidecar sends about what is read;
        // with read-ahead also when the first window reaches the segment's end, so the read is seen
        boolean sequential = ra != null && ra.sequential(partition, md.remoteLogSegmentId(), start);
        WindowedFetchStream.Window first = sequential ? keptOrReadAhead(c, md, start, window, ra, op)
                : plainWindow(c, md, start, window, op);
        LOG.debug("{}: stream open, first window up to {}{}", op, first.end(), sequential ? " (read-ahead)" : "");
        if (lastFetchBytes.size() > MAX_TRACKED_PARTITIONS) {
            lastFetchBytes.clear();
        }
        return windowed(c, md, start, first, sequential, op);
    }

    /**
     * The read-ahead, or null while it is off or resting. Over a Unix socket with hand-off it reads
     * ahead in hand-off files, and rests while hand-off does; otherwise (TCP) in gRPC messages kept
     * in the heap.
     */
    private ReadAhead readAhead() {
        ReadAhead ra = readAhead;
        FetchHandoff h = handoff;
        if (ra == null || (h != null && !h.active()) || System.nanoTime() - readAheadOffUntilNanos < 0) {
            return null;
        }
        return ra;
    }

    /**
     * A read of segment {@code md} from {@code start} in windows, the first one open; later windows
     * come from the read-ahead when it holds them, as read-ahead windows when the read is
     * {@code sequential}, and otherwise as plain continuations (see {@link WindowedFetchStream}).
     */
    private InputStream windowed(ShimConfig c, RemoteLogSegmentMetadata md, long start, WindowedFetchStream.Window first,
                                 boolean sequential, String op) {
        TopicIdPartition partition = md.remoteLogSegmentId().topicIdPartition();
        long size = md.segmentSizeInBytes();
        return new WindowedFetchStream(first, start, ShimConfig.MAX_FETCH_WINDOW_BYTES, size,
                (from, suggested) -> {
                    String windowOp = op + " window at " + from;
                    try {
                        ReadAhead ra = readAhead();
                        if (ra != null) {
                            if (sequential) {
                                return keptOrReadAhead(c, md, from, suggested, ra, windowOp);
                            }
                            WindowedFetchStream.Window kept = ra.find(partition, ReadAhead.SegmentRef.of(md), from);
                            if (kept != null) {
                                return kept;
                            }
                        }
                        return plainWindow(c, md, from, suggested, windowOp);
                    } catch (RemoteStorageException e) {
                        throw new IOException(op + ": opening the next window at " + from + " failed: "
                                + e.getMessage(), e);
                    }
                }, reached -> {
                    lastFetchBytes.put(partition, reached - start);
                    ReadAhead ra = readAhead;
                    if (ra != null) {
                        ra.readEnded(partition, md.remoteLogSegmentId(), start, reached, size);
                    }
                }, op);
    }

    /** One {@code FetchSegment} call for {@code size} bytes from {@code start} (to the end if they reach it). */
    private WindowedFetchStream.Window plainWindow(ShimConfig c, RemoteLogSegmentMetadata md, long start, int size,
                                                   String op) throws RemoteStorageException {
        return plainWindow(c, md, start, size, op, null);
    }

    /** As above; a handed-off window of the right size is kept by {@code ra} (when not null) too. */
    private WindowedFetchStream.Window plainWindow(ShimConfig c, RemoteLogSegmentMetadata md, long start, int size,
                                                   String op, ReadAhead ra) throws RemoteStorageException {
        Integer to = WindowedFetchStream.windowEnd(start, size, md.segmentSizeInBytes());
        long end = to == null ? md.segmentSizeInBytes() : (long) to + 1;
        return new WindowedFetchStream.Window(openFetch(c, md, (int) start, to, op, ra == null ? null : file -> {
            if (file.length() == end - start) { // anything else fails the read; never kept
                ra.keep(md.remoteLogSegmentId().topicIdPartition(), ReadAhead.SegmentRef.of(md), start, file,
                        null, false);
            }
        }), end);
    }

    /**
     * The window from {@code start} of a sequential read: a kept one (waiting for the background
     * read-ahead of it if one is under way); else a plain window of {@code size} bytes, kept too,
     * whose end is read ahead in the background at once (the reader waits for no more than one fetch's
     * bytes). Once a read starts inside a kept window, the next one is read ahead.
     */
    private WindowedFetchStream.Window keptOrReadAhead(ShimConfig c, RemoteLogSegmentMetadata md, long start,
                                                      int size, ReadAhead ra, String op) throws RemoteStorageException {
        TopicIdPartition partition = md.remoteLogSegmentId().topicIdPartition();
        WindowedFetchStream.Window w = ra.find(partition, ReadAhead.SegmentRef.of(md), start);
        if (w == null) {
            try {
                ra.awaitPending(partition, md.remoteLogSegmentId(), start, c.fetchDeadlineMs());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new RemoteStorageException(op + ": interrupted while waiting for the read-ahead", e);
            }
            w = ra.find(partition, ReadAhead.SegmentRef.of(md), start);
        }
        if (w == null) {
            w = plainWindow(c, md, start, size, op, ra); // kept: the next reads may start inside it
            readAheadNext(c, md, w.end(), w.end(), ra);
        } else {
            readAheadNext(c, md, start, w.end(), ra);
        }
        return w;
    }

    /**
     * Starts the background read-ahead of the window from {@code windowEnd} when {@code ra} says a
     * read at {@code position} of the window ending there calls for it ({@link ReadAhead#claimNext});
     * at the segment's end, of the first window of the next segment, when the sidecar named one
     * ({@link #readAheadNextSegment}). The call runs on gRPC's executor; its hand-off file is opened
     * and kept there. Any failure only means the reader asks for the window itself when it gets there.
     */
    private void readAheadNext(ShimConfig c, RemoteLogSegmentMetadata md, long position, long windowEnd, ReadAhead ra) {
        if (windowEnd >= md.segmentSizeInBytes()) {
            readAheadNextSegment(c, md, ra);
            return;
        }
        TopicIdPartition partition = md.remoteLogSegmentId().topicIdPartition();
        ReadAhead.Claim claim = ra.claimNext(partition, md.remoteLogSegmentId(), position, windowEnd,
                md.segmentSizeInBytes());
        if (claim != null) {
            readAhead(c, partition, ReadAhead.SegmentRef.of(md), MetadataMapper.toProto(md), windowEnd, false, ra,
                    claim);
        }
    }

    /**
     * A read in the last window of segment {@code md}: reads the first window of the partition's
     * next segment ahead, as the sidecar named it with that window (rsm.proto
     * {@code want_next_segment}). The name comes from what storage holds, so it is checked for the
     * same topic and partition here, and its window serves only a broker read whose metadata
     * names the same segment id, offsets and size ({@link ReadAhead#find}).
     */
    private void readAheadNextSegment(ShimConfig c, RemoteLogSegmentMetadata md, ReadAhead ra) {
        TopicIdPartition partition = md.remoteLogSegmentId().topicIdPartition();
        SegmentMetadata next = ra.nextSegment(partition, md.remoteLogSegmentId());
        if (next == null || !next.getTopicId().equals(partition.topicId().toString())
                || !next.getTopicName().equals(partition.topic()) || next.getPartition() != partition.partition()
                || next.getStartOffset() != md.endOffset() + 1 || next.getSegmentSizeInBytes() <= 0) {
            return;
        }
        ReadAhead.SegmentRef ref;
        try {
            ref = new ReadAhead.SegmentRef(new RemoteLogSegmentId(partition, Uuid.fromString(next.getSegmentId())),
                    next.getStartOffset(), next.getEndOffset(), next.getSegmentSizeInBytes());
        } catch (IllegalArgumentException e) {
            return; // not a Kafka Uuid: no read-ahead
        }
        ReadAhead.Claim claim = ra.claimNext(partition, ref.id(), 0, 0, ref.size());
        if (claim != null) {
            readAhead(c, partition, ref, next, 0, true, ra, claim);
            // and its indexes, which the broker loads before its first read there (IndexPrefetch)
            try {
                indexPrefetch.start(channel(), ref, FetchIndexRequest.newBuilder().setMetadata(next)
                                .setIndexType(io.github.rsmsidecar.proto.v1.IndexType.OFFSET).build(),
                        c.fetchIndexDeadlineMs(), io.github.rsmsidecar.proto.v1.IndexType.OFFSET,
                        io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP,
                        io.github.rsmsidecar.proto.v1.IndexType.TRANSACTION);
            } catch (RemoteStorageException e) {
                // no channel: the broker's own calls ask for the indexes
            }
        }
    }

    /**
     * The background call for the window of {@code seg} ({@code request} its metadata) from
     * {@code from}, claimed in {@code ra} ({@code claim}); a window that reaches the segment's end
     * asks the sidecar to name the next segment. {@code follows}: the first window of the segment
     * after the one being read (see {@link ReadAhead#keep}).
     */
    private void readAhead(ShimConfig c, TopicIdPartition partition, ReadAhead.SegmentRef seg, SegmentMetadata request,
                           long from, boolean follows, ReadAhead ra, ReadAhead.Claim claim) {
        FetchHandoff h = handoff;
        Integer to = WindowedFetchStream.windowEnd(from, (int) claim.bytes(), seg.size());
        long length = (to == null ? seg.size() : (long) to + 1) - from;
        FetchSegmentRequest.Builder req = FetchSegmentRequest.newBuilder()
                .setMetadata(request)
                .setStartPosition((int) from)
                .setAcceptHandoff(h != null)
                .setWantNextSegment(to == null)
                .setAcceptZstdMaxBytes(zstdMaxBytes);
        if (to != null) {
            req.setEndPosition(to);
        }
        ClientCall<FetchSegmentRequest, FetchSegmentResponse> call;
        try {
            call = channel().newCall(FetchResponseMarshaller.FETCH_SEGMENT,
                    CallOptions.DEFAULT.withDeadlineAfter(c.fetchDeadlineMs(), TimeUnit.MILLISECONDS));
        } catch (RemoteStorageException e) {
            ra.pendingDone(partition, claim);
            return;
        }
        String op = "read-ahead of " + seg.id() + " (offsets " + seg.startOffset() + ".." + seg.endOffset()
                + ") at " + from;
        metrics.call(ShimMetrics.Op.BACKGROUND);
        if (h == null) {
            readAheadReceived(call, partition, seg, from, length, follows, ra, claim, req.getAcceptZstdMaxBytes(), op);
        } else {
            readAheadHandedOff(call, h, partition, seg, from, length, follows, ra, claim, op);
        }
        call.sendMessage(req.build());
        call.halfClose();
    }

    /** The read-ahead window as a hand-off file, kept when it is exactly the window asked for. */
    private void readAheadHandedOff(ClientCall<FetchSegmentRequest, FetchSegmentResponse> call, FetchHandoff h,
                                    TopicIdPartition partition, ReadAhead.SegmentRef seg, long from, long length,
                                    boolean follows, ReadAhead ra, ReadAhead.Claim claim, String op) {
        call.start(new ClientCall.Listener<>() {
            @Override
            public void onMessage(FetchSegmentResponse response) {
                if (!response.hasHandoff()) {
                    call.cancel("the sidecar streamed the read-ahead window instead of handing it off", null);
                    readAheadRests(op, ra.windowBytes());
                    return;
                }
                try {
                    FetchHandoff.OpenFile file = h.open(response.getHandoff());
                    metrics.fetchHandoffBytes.add(file.length());
                    try {
                        if (file.length() == length) {
                            ra.keep(partition, seg, from, file,
                                    response.hasNextSegment() ? response.getNextSegment() : null, follows);
                        }
                    } finally {
                        file.release();
                        ra.pendingDone(partition, claim); // kept: a read inside it may claim the next now
                    }
                } catch (FetchHandoff.HandoffException e) {
                    LOG.debug("{}: {}", op, e.getMessage()); // the reader asks for the window itself
                }
            }

            @Override
            public void onClose(Status status, io.grpc.Metadata trailers) {
                if (!status.isOk() && status.getCode() != Status.Code.CANCELLED) {
                    LOG.debug("{}: {}", op, status);
                }
                ra.pendingDone(partition, claim);
            }
        }, new io.grpc.Metadata());
        call.request(1);
    }

    /**
     * The read-ahead window in gRPC messages (a sidecar reached over TCP): every message is asked
     * for at once (the window is bounded, so is what arrives), their arrays are kept as they came
     * (no copy; zstd slices decompressed, {@link ZstdSlices}), and the window is kept once the call
     * ended OK with exactly its bytes; anything else (a message refused: the call is cancelled)
     * keeps nothing and the reader asks for the window itself. The sidecar names the next segment
     * in a message of its own after the data (rsm.proto {@code want_next_segment}).
     */
    private void readAheadReceived(ClientCall<FetchSegmentRequest, FetchSegmentResponse> call,
                                   TopicIdPartition partition, ReadAhead.SegmentRef seg, long from, long length,
                                   boolean follows, ReadAhead ra, ReadAhead.Claim claim, int acceptZstd, String op) {
        call.start(new ClientCall.Listener<>() {
            private ByteString bytes = ByteString.EMPTY;
            /** The rest of the chunk after the last message's zstd slice (ZstdSlices.Decoded). */
            private ByteString tail = ByteString.EMPTY;
            private SegmentMetadata next;
            /** Set once a message was refused: nothing is kept, whatever still arrives or however the call ends. */
            private boolean refused;

            @Override
            public void onMessage(FetchSegmentResponse response) {
                if (refused) {
                    return;
                }
                if (response.hasHandoff()) {
                    refuse("the sidecar answered with a hand-off file that was not asked for", null);
                    return;
                }
                if (response.hasNextSegment()) {
                    next = response.getNextSegment();
                }
                try {
                    ZstdSlices.Decoded got = received(response, acceptZstd, true);
                    bytes = bytes.concat(got.slice());
                    tail = got.tail();
                } catch (IOException e) {
                    LOG.debug("{}: {}", op, e.getMessage()); // the reader asks for the window itself
                    refuse(e.getMessage(), e);
                    return;
                }
                if (bytes.size() > length) {
                    refuse("the sidecar sent more than the " + length + " bytes asked for", null);
                    return;
                }
                call.request(1);
            }

            private void refuse(String why, Throwable cause) {
                refused = true;
                bytes = ByteString.EMPTY;
                tail = ByteString.EMPTY;
                call.cancel(why, cause);
            }

            @Override
            public void onClose(Status status, io.grpc.Metadata trailers) {
                try {
                    if (!refused && status.isOk() && bytes.size() == length) {
                        // the window's last chunk, decompressed whole, to its end: the next window
                        // then starts at a chunk boundary (unless that would overrun the bound)
                        if (!tail.isEmpty() && from + length + tail.size() <= seg.size()
                                && ra.hasRoomFor(tail.size())) {
                            bytes = bytes.concat(tail);
                            countTail(tail);
                        }
                        FetchHandoff.OpenFile window = FetchHandoff.OpenFile.received(bytes, op);
                        ra.keep(partition, seg, from, window, next, follows);
                        window.release(); // keep() took its own reference
                    } else if (!status.isOk() && status.getCode() != Status.Code.CANCELLED) {
                        LOG.debug("{}: {}", op, status);
                    }
                } finally {
                    bytes = ByteString.EMPTY;
                    tail = ByteString.EMPTY;
                    ra.pendingDone(partition, claim);
                }
            }
        }, new io.grpc.Metadata());
        call.request(4); // a few messages in flight; each one received asks for one more
    }

    /**
     * The bytes of one streamed message of a fetch whose request had {@code acceptZstd} as
     * {@code accept_zstd_max_bytes}: its data, or its zstd slice decompressed, and with
     * {@code keepTail} the rest of that slice's chunk ({@link ZstdSlices.Decoded}); the slice is
     * counted (a tail only once it is kept: {@link #countTail}).
     *
     * @throws IOException the message is refused ({@link ZstdSlices#bytes}); the message says why
     */
    private ZstdSlices.Decoded received(FetchSegmentResponse response, int acceptZstd, boolean keepTail)
            throws IOException {
        if (response.hasZstd()) {
            metrics.fetchZstdFrameBytes.add(response.getZstd().getFrame().size());
        }
        ZstdSlices.Decoded got = ZstdSlices.bytes(response, acceptZstd, keepTail);
        if (response.hasZstd()) {
            metrics.fetchZstdSliceBytes.add(got.slice().size());
        }
        metrics.fetchGrpcBytes.add(got.slice().size());
        return got;
    }

    /** Counts a chunk's tail that a read-ahead window kept (see {@link #received}). */
    private void countTail(ByteString tail) {
        metrics.fetchZstdSliceBytes.add(tail.size());
        metrics.fetchGrpcBytes.add(tail.size());
    }

    private void readAheadRests(String op, int windowBytes) {
        metrics.handoffFallbacks.increment();
        readAheadOffUntilNanos = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(FetchHandoff.RETRY_AFTER_MS);
        LOG.warn("{}: the sidecar did not hand off a read-ahead window of {} bytes (its fetch.handoff_max_bytes "
                        + "is smaller, or its hand-off files are at their bound); read-ahead rests for {} s "
                        + "(rsm.config.{}=0 turns it off)", op, windowBytes,
                FetchHandoff.RETRY_AFTER_MS / 1000, ShimConfig.FETCH_READAHEAD_BYTES);
    }

    /**
     * One {@code FetchSegment} call for {@code [start, end]} ({@code end} null: to the end), open.
     * Offers fetch hand-off when it is on (see {@link FetchHandoff}); if reading the handed-off
     * file fails, asks again without.
     */
    private InputStream openFetch(ShimConfig c, RemoteLogSegmentMetadata md, int start, Integer end, String op)
            throws RemoteStorageException {
        return openFetch(c, md, start, end, op, null);
    }

    /** As above; {@code keep} (nullable) sees a handed-off file before the stream reads it. */
    private InputStream openFetch(ShimConfig c, RemoteLogSegmentMetadata md, int start, Integer end, String op,
                                  Consumer<FetchHandoff.OpenFile> keep) throws RemoteStorageException {
        FetchSegmentRequest.Builder req = FetchSegmentRequest.newBuilder()
                .setMetadata(MetadataMapper.toProto(md))
                .setStartPosition(start)
                .setAcceptZstdMaxBytes(zstdMaxBytes);
        if (end != null) {
            req.setEndPosition(end);
        }
        FetchHandoff handoff = this.handoff;
        if (handoff != null && handoff.active()) {
            try {
                return openFetch(c, req.setAcceptHandoff(true).build(), handoff, keep, op);
            } catch (FetchHandoff.HandoffException e) {
                handoff.turnOff(op, e);
                metrics.handoffFallbacks.increment();
                req.setAcceptHandoff(false);
            }
        }
        return openFetch(c, req.build(), null, null, op);
    }

    private InputStream openFetch(ShimConfig c, FetchSegmentRequest request, FetchHandoff handoff,
                                  Consumer<FetchHandoff.OpenFile> keep, String op) throws RemoteStorageException {
        Function<FetchSegmentResponse, ByteString> data = response -> {
            if (response.hasHandoff()) {
                throw new UncheckedIOException(new IOException(handoff == null
                        ? "the sidecar answered with a hand-off file that was not asked for"
                        : "the sidecar sent a hand-off file after other messages"));
            }
            try {
                return received(response, request.getAcceptZstdMaxBytes(), false).slice();
            } catch (IOException e) {
                throw new UncheckedIOException(e.getMessage(), e); // the stream cancels the call and fails the read
            }
        };
        Function<FetchSegmentResponse, InputStream> handedOff = handoff == null ? null
                : response -> {
                    if (!response.hasHandoff()) {
                        return null;
                    }
                    FetchHandoff.OpenFile file = handoff.open(response.getHandoff());
                    metrics.fetchHandoffBytes.add(file.length());
                    try {
                        if (keep != null) {
                            keep.accept(file);
                        }
                        return file.stream(0, file.length());
                    } finally {
                        file.release();
                    }
                };
        try {
            return retrier.call(ShimMetrics.Op.FETCH, op, attempt -> {
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
        ReadAhead ra = readAhead();
        if (ra != null && indexType == IndexType.OFFSET
                && ra.sequential(md.remoteLogSegmentId().topicIdPartition(), md.remoteLogSegmentId(), 0)) {
            // The broker loads a segment's indexes (offset, time, transaction: three calls) right
            // before its first read of it; a sequential reader that reached the end of the previous
            // segment reads this one from 0, so its first window is read ahead now, beside those calls.
            readAheadNext(c, md, 0, 0, ra);
        }
        FetchIndexRequest request = FetchIndexRequest.newBuilder()
                .setMetadata(MetadataMapper.toProto(md))
                .setIndexType(type)
                .build();
        ReadAhead.SegmentRef seg = ReadAhead.SegmentRef.of(md);
        if (indexType == IndexType.OFFSET) {
            // the broker asks for the time and transaction indexes right after this one (IndexPrefetch)
            indexPrefetch.start(channel(), seg, request, c.fetchIndexDeadlineMs(),
                    io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP,
                    io.github.rsmsidecar.proto.v1.IndexType.TRANSACTION);
        }
        // the offset index too was asked for ahead when the segment before was read to its end
        IndexPrefetch.Answer prefetched;
        try {
            prefetched = indexPrefetch.take(seg, type, c.fetchIndexDeadlineMs());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw errorMapper.retriable(op + ": interrupted while waiting for the index", e);
        }
        if (prefetched != null && prefetched.notFound() != null) {
            throw errorMapper.map(op, prefetched.notFound(), false);
        }
        if (prefetched != null) {
            return new java.io.ByteArrayInputStream(prefetched.data());
        }
        return retrier.call(ShimMetrics.Op.FETCH_INDEX, op, attempt -> {
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
        ReadAhead ra = readAhead;
        if (ra != null) {
            ra.forget(md.remoteLogSegmentId()); // nothing of a deleted segment is served again
        }
        indexPrefetch.forget(md.remoteLogSegmentId());
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
