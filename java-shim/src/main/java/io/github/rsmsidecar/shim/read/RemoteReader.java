package io.github.rsmsidecar.shim.read;

import com.google.common.util.concurrent.MoreExecutors;
import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.FetchIndexResponse;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.github.rsmsidecar.shim.ErrorMapper;
import io.github.rsmsidecar.shim.MetadataMapper;
import io.github.rsmsidecar.shim.Retrier;
import io.github.rsmsidecar.shim.ShimConfig;
import io.github.rsmsidecar.shim.ShimMetrics;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.Status;
import io.grpc.StatusException;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Supplier;
import javax.net.ssl.SSLEngine;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The shim's read path: what {@code fetchLogSegment} and {@code fetchIndex} return, and everything
 * the shim keeps to make the broker's remote reads cost it little more than a local read. The one
 * type the façade calls for reads; it owns the read path's state.
 *
 * <ul>
 *   <li><b>The fetch channel</b> ({@link FetchChannel}): a range's bytes come as raw frames on a
 *       connection of their own to the sidecar's address (TCP with TLS, or the Unix socket), read
 *       straight into the broker's arrays; gRPC, netty's HTTP/2 stack and protobuf parsing carry
 *       none of them. A sidecar without the channel (an older version) is read over gRPC instead,
 *       for {@link #NO_CHANNEL_RETRY_MS} at a time.
 *   <li><b>Windows</b> ({@link WindowedFetchStream}): the broker's read has no end position and
 *       takes about one consumer fetch; it is asked for in bounded windows sized from the
 *       partition's last read, so the sidecar sends about what is read.
 *   <li><b>Read-ahead</b> ({@link ReadAhead}): a sequential reader's next window, and at a segment's
 *       end the next segment's first window, is received in the background and kept in the heap
 *       under {@code rsm.config.fetch.readahead.max.bytes}; the broker's next fetches read memory.
 *   <li><b>Index prefetch</b> ({@link IndexPrefetch}): a segment's time and transaction indexes
 *       are asked for beside its offset index, and the next segment's three with its first window.
 * </ul>
 *
 * Any failure after bytes started flowing is an {@link java.io.IOException} from {@code read}, never
 * a short stream; failures before are {@link RemoteStorageException}s, retried and mapped as every
 * call's ({@link Retrier}, {@link ErrorMapper}).
 */
public final class RemoteReader implements AutoCloseable {

    private static final Logger LOG = LoggerFactory.getLogger(RemoteReader.class);

    /** Room beyond the partition's last read in the next window (the broker starts a batch back). */
    static final int FETCH_WINDOW_SLACK = 64 * 1024;
    /** Partitions whose last read is remembered (reads of more forget them all: a window is a guess). */
    static final int MAX_TRACKED_PARTITIONS = 100_000;
    /** After the sidecar turned out to have no fetch channel, reads go over gRPC this long before it is tried again. */
    static final long NO_CHANNEL_RETRY_MS = 60_000;
    /** Threads receiving read-ahead windows at once (the bytes in flight are bounded by the read-ahead's bound). */
    static final int BACKGROUND_THREADS = 32;

    private static final CallOptions STREAM_CALL = CallOptions.DEFAULT.withExecutor(MoreExecutors.directExecutor());

    /** The gRPC channel to the sidecar, as the façade keeps it (made on first use, replaced on a TLS reload). */
    @FunctionalInterface
    public interface GrpcChannel {
        Channel get() throws RemoteStorageException;
    }

    private final ShimConfig config;
    private final Retrier retrier;
    private final ErrorMapper errors;
    private final ShimMetrics metrics;
    private final GrpcChannel grpc;
    private final ScheduledExecutorService scheduler;
    private final FetchChannel channel;
    private final ReadAhead readAhead;
    private final IndexPrefetch indexPrefetch = new IndexPrefetch();
    private final ThreadPoolExecutor background;
    /** Background tasks (read-aheads, index prefetches) handed to {@link #background} and not ended yet. */
    private final AtomicInteger backgroundTasks = new AtomicInteger();
    private final ConcurrentHashMap<TopicIdPartition, Long> lastFetchBytes = new ConcurrentHashMap<>();
    private volatile long noChannelUntilNanos = System.nanoTime();

    /**
     * @param fetchChannel whether to use the sidecar's fetch channel (false: every range over gRPC)
     * @param tls          a new TLS engine for each fetch channel connection (the current
     *                     certificates), or null without TLS
     */
    public RemoteReader(ShimConfig config, Retrier retrier, ErrorMapper errors, ShimMetrics metrics,
                        GrpcChannel grpc, ScheduledExecutorService scheduler, boolean fetchChannel,
                        Supplier<SSLEngine> tls) {
        this.config = config;
        this.retrier = retrier;
        this.errors = errors;
        this.metrics = metrics;
        this.grpc = grpc;
        this.scheduler = scheduler;
        String[] address = config.fetchChannelAddress();
        ChannelConnection.Endpoint endpoint = address.length == 1
                ? new ChannelConnection.Endpoint(null, 0, address[0])
                : new ChannelConnection.Endpoint(address[0], Integer.parseInt(address[1]), null);
        this.channel = !fetchChannel ? null : new FetchChannel(endpoint, tls, config.connectTimeoutMs(),
                config.fetchDeadlineMs(), config.fetchReadTimeoutMs(), metrics.fetchChannelBytes)
                .keepalive(config.keepaliveTimeMs(), config.keepaliveTimeoutMs());
        this.readAhead = config.fetchReadaheadBytes() == 0 ? null
                : new ReadAhead(config.fetchReadaheadBytes(), config.fetchReadaheadMaxBytes());
        AtomicInteger n = new AtomicInteger();
        this.background = new ThreadPoolExecutor(BACKGROUND_THREADS, BACKGROUND_THREADS, 60, TimeUnit.SECONDS,
                new LinkedBlockingQueue<>(), r -> {
                    Thread t = new Thread(r, "rsm-sidecar-shim-read-ahead-" + n.incrementAndGet());
                    t.setDaemon(true);
                    return t;
                }) {
            @Override
            public void execute(Runnable task) {
                backgroundTasks.incrementAndGet(); // counted from here: a test that waits for none misses none
                try {
                    super.execute(() -> {
                        try {
                            task.run();
                        } finally {
                            backgroundTasks.decrementAndGet();
                        }
                    });
                } catch (RejectedExecutionException e) {
                    backgroundTasks.decrementAndGet();
                    throw e;
                }
            }
        };
        this.background.allowCoreThreadTimeOut(true);
    }

    // ---- fetchLogSegment ---------------------------------------------------------------------

    /** {@code fetchLogSegment}: bytes {@code [start, end]} of segment {@code md} ({@code end} null: to its end). */
    public InputStream fetch(RemoteLogSegmentMetadata md, int start, Integer end) throws RemoteStorageException {
        Objects.requireNonNull(md, "remoteLogSegmentMetadata");
        String op = "fetchLogSegment(" + MetadataMapper.describe(md) + ", start=" + start
                + (end != null ? ", end=" + end : "") + ")";
        TopicIdPartition partition = md.remoteLogSegmentId().topicIdPartition();
        long size = md.segmentSizeInBytes();
        ReadAhead ra = readAhead;
        if (end == null && ra != null) {
            WindowedFetchStream.Opened kept = ra.find(partition, ReadAhead.SegmentRef.of(md), start);
            if (kept != null) {
                LOG.debug("{}: read from the read-ahead window up to {}", op, kept.end());
                readAheadNext(md, start, kept.end(), ra);
                return windowed(md, start, kept, true, op);
            }
        }
        int window = config.fetchWindowBytes();
        Long lastRead = lastFetchBytes.get(partition);
        if (window > 0 && lastRead != null) {
            // what the partition's last read took, plus room: a sequential consumer's fetches alike
            window = (int) Math.min(Math.max(window, lastRead + FETCH_WINDOW_SLACK), ShimConfig.MAX_FETCH_WINDOW_BYTES);
        }
        // A read to the segment's end goes through WindowedFetchStream even when one window holds
        // it: a window broken by a sidecar restart or kill (UNAVAILABLE) is asked for again from
        // where the reader stopped, so the broker's read rides the restart out.
        if (end != null || window == 0) {
            long to = end == null ? size : Math.min((long) end + 1, size);
            RangeStream in = open(request(md, start, end, false), Math.max(0, to - start), op);
            in.armIdleTimeout(scheduler, config.fetchIdleTimeoutMs());
            return in;
        }
        // no end: read in windows, so the sidecar sends about what is read; with read-ahead also
        // when the first window reaches the segment's end, so the read is seen
        boolean sequential = ra != null && ra.sequential(partition, md.remoteLogSegmentId(), start);
        WindowedFetchStream.Opened first = sequential ? keptOrReadAhead(md, start, window, ra, op)
                : plainWindow(md, start, window, op);
        if (lastFetchBytes.size() > MAX_TRACKED_PARTITIONS) {
            lastFetchBytes.clear();
        }
        return windowed(md, start, first, sequential, op);
    }

    /**
     * A read of segment {@code md} from {@code start} in windows, the first one open; later windows
     * come from the read-ahead when it holds them, as read-ahead windows when the read is
     * {@code sequential}, and otherwise as plain continuations.
     */
    private InputStream windowed(RemoteLogSegmentMetadata md, long start, WindowedFetchStream.Opened first,
                                 boolean sequential, String op) {
        TopicIdPartition partition = md.remoteLogSegmentId().topicIdPartition();
        long size = md.segmentSizeInBytes();
        return new WindowedFetchStream(first, start, ShimConfig.MAX_FETCH_WINDOW_BYTES, size,
                (from, suggested) -> {
                    String windowOp = op + " window at " + from;
                    try {
                        ReadAhead ra = readAhead;
                        if (ra != null) {
                            if (sequential) {
                                return keptOrReadAhead(md, from, suggested, ra, windowOp);
                            }
                            WindowedFetchStream.Opened kept = ra.find(partition, ReadAhead.SegmentRef.of(md), from);
                            if (kept != null) {
                                return kept;
                            }
                        }
                        return plainWindow(md, from, suggested, windowOp);
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

    /** The range of {@code size} bytes from {@code start} (to the end if they reach it), as it arrives. */
    private WindowedFetchStream.Opened plainWindow(RemoteLogSegmentMetadata md, long start, int size, String op)
            throws RemoteStorageException {
        Integer to = WindowedFetchStream.windowEnd(start, size, md.segmentSizeInBytes());
        long end = to == null ? md.segmentSizeInBytes() : (long) to + 1;
        RangeStream in = open(request(md, (int) start, to, false), end - start, op);
        in.armIdleTimeout(scheduler, config.fetchIdleTimeoutMs());
        return new WindowedFetchStream.Opened(in, end);
    }

    /**
     * The window from {@code start} of a sequential read: a kept one (waiting for the background
     * read-ahead of it if one is under way); else one of {@code size} bytes received now and kept,
     * whose end is read ahead in the background at once. Once a read starts inside a kept window,
     * the next one is read ahead.
     */
    private WindowedFetchStream.Opened keptOrReadAhead(RemoteLogSegmentMetadata md, long start, int size,
                                                       ReadAhead ra, String op) throws RemoteStorageException {
        TopicIdPartition partition = md.remoteLogSegmentId().topicIdPartition();
        ReadAhead.SegmentRef seg = ReadAhead.SegmentRef.of(md);
        WindowedFetchStream.Opened w = ra.find(partition, seg, start);
        if (w == null) {
            try {
                ra.awaitPending(partition, md.remoteLogSegmentId(), start, config.fetchDeadlineMs());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new RemoteStorageException(op + ": interrupted while waiting for the read-ahead", e);
            }
            w = ra.find(partition, seg, start);
        }
        if (w == null) {
            Integer to = WindowedFetchStream.windowEnd(start, size, md.segmentSizeInBytes());
            long end = to == null ? md.segmentSizeInBytes() : (long) to + 1;
            Window received = receive(request(md, (int) start, to, to == null), start, end - start, op);
            ra.keep(partition, seg, received, false); // the next reads may start inside it
            w = new WindowedFetchStream.Opened(received.stream(start), end);
            readAheadNext(md, end, end, ra);
        } else {
            readAheadNext(md, start, w.end(), ra);
        }
        return w;
    }

    /** A whole window, received now (retried as any fetch). */
    private Window receive(FetchSegmentRequest request, long start, long length, String op)
            throws RemoteStorageException {
        try (RangeStream in = open(request, length, op)) {
            return Window.read(in, start, length);
        } catch (IOException e) {
            throw new RemoteStorageException(op + ": " + e.getMessage(), e);
        }
    }

    /**
     * Starts the background read-ahead of the window from {@code windowEnd} when {@code ra} says a
     * read at {@code position} of the window ending there calls for it ({@link ReadAhead#claimNext});
     * at the segment's end, of the first window of the next segment, when the sidecar named one.
     * Any failure only means the reader asks for the window itself when it gets there.
     */
    private void readAheadNext(RemoteLogSegmentMetadata md, long position, long windowEnd, ReadAhead ra) {
        if (windowEnd >= md.segmentSizeInBytes()) {
            readAheadNextSegment(md, ra);
            return;
        }
        TopicIdPartition partition = md.remoteLogSegmentId().topicIdPartition();
        ReadAhead.Claim claim = ra.claimNext(partition, md.remoteLogSegmentId(), position, windowEnd,
                md.segmentSizeInBytes());
        if (claim != null) {
            readAheadInBackground(partition, ReadAhead.SegmentRef.of(md), MetadataMapper.toProto(md), windowEnd,
                    false, ra, claim);
        }
    }

    /**
     * A read in the last window of segment {@code md}: reads the first window of the partition's
     * next segment ahead, as the sidecar named it with that window, and that segment's indexes.
     * The name comes from what storage holds, so it is checked for the same topic and partition
     * here, and its window serves only a broker read whose metadata names the same segment id,
     * offsets and size ({@link ReadAhead#find}).
     */
    private void readAheadNextSegment(RemoteLogSegmentMetadata md, ReadAhead ra) {
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
            readAheadInBackground(partition, ref, next, 0, true, ra, claim);
            indexPrefetch.start(this::indexOnce, background, ref, FetchIndexRequest.newBuilder().setMetadata(next)
                            .setIndexType(io.github.rsmsidecar.proto.v1.IndexType.OFFSET).build(),
                    io.github.rsmsidecar.proto.v1.IndexType.OFFSET, io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP,
                    io.github.rsmsidecar.proto.v1.IndexType.TRANSACTION);
        }
    }

    /**
     * Receives the window of {@code seg} ({@code request} its metadata) from {@code from}, claimed
     * in {@code ra}, on a background thread, and keeps it; a window that reaches the segment's end
     * asks the sidecar to name the next segment. {@code follows}: the first window of the segment
     * after the one being read. One attempt: a failure leaves the window to the reader.
     */
    private void readAheadInBackground(TopicIdPartition partition, ReadAhead.SegmentRef seg,
                                       SegmentMetadata request, long from, boolean follows, ReadAhead ra,
                                       ReadAhead.Claim claim) {
        Integer to = WindowedFetchStream.windowEnd(from, (int) claim.bytes(), seg.size());
        long length = (to == null ? seg.size() : (long) to + 1) - from;
        FetchSegmentRequest.Builder req = FetchSegmentRequest.newBuilder()
                .setMetadata(request)
                .setStartPosition((int) from)
                .setWantNextSegment(to == null);
        if (to != null) {
            req.setEndPosition(to);
        }
        String op = "read-ahead of " + seg.id() + " (offsets " + seg.startOffset() + ".." + seg.endOffset()
                + ") at " + from;
        try {
            background.execute(() -> {
                try {
                    metrics.call(ShimMetrics.Op.BACKGROUND);
                    Window w;
                    try (RangeStream in = openOnce(req.build(), length, op)) {
                        w = Window.read(in, from, length);
                    }
                    ra.keep(partition, seg, w, follows);
                } catch (StatusException e) {
                    metrics.error(ShimMetrics.Op.BACKGROUND, e.getStatus().getCode());
                    LOG.debug("{}: {}", op, e.getStatus());
                } catch (IOException | RemoteStorageException | RuntimeException e) {
                    metrics.error(ShimMetrics.Op.BACKGROUND, Status.Code.UNKNOWN);
                    LOG.debug("{}: {}", op, e.toString()); // the reader asks for the window itself
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                } finally {
                    ra.pendingDone(partition, claim);
                }
            });
        } catch (RejectedExecutionException e) {
            ra.pendingDone(partition, claim); // closing
        }
    }

    // ---- opening a range ---------------------------------------------------------------------

    private static FetchSegmentRequest request(RemoteLogSegmentMetadata md, int start, Integer end, boolean wantNext) {
        FetchSegmentRequest.Builder req = FetchSegmentRequest.newBuilder()
                .setMetadata(MetadataMapper.toProto(md))
                .setStartPosition(start)
                .setWantNextSegment(wantNext);
        if (end != null) {
            req.setEndPosition(end);
        }
        return req.build();
    }

    /** The range {@code request} asks for ({@code length} bytes), with the shim's retries. */
    private RangeStream open(FetchSegmentRequest request, long length, String op) throws RemoteStorageException {
        return retrier.call(ShimMetrics.Op.FETCH, op, attempt -> openOnce(request, length, op));
    }

    /**
     * One attempt at the range: over the fetch channel, or over gRPC while the sidecar has none
     * (then without {@code next_segment} hints: read-ahead stops at segment ends).
     */
    private RangeStream openOnce(FetchSegmentRequest request, long length, String op)
            throws StatusException, InterruptedException, RemoteStorageException {
        RangeStream overChannel = overChannel(c -> c.open(request, length, op), op);
        if (overChannel != null) {
            return overChannel;
        }
        GrpcInputStream<FetchSegmentResponse> s = GrpcInputStream.start(grpc.get(),
                RemoteStorageGrpc.getFetchSegmentMethod(), STREAM_CALL, request, r -> {
                    metrics.fetchGrpcBytes.add(r.getData().size());
                    return r.getData();
                }, op, config.fetchReadTimeoutMs(), ShimConfig.FETCH_READ_TIMEOUT_MS);
        s.awaitFirst(config.fetchDeadlineMs(), ShimConfig.FETCH_DEADLINE_MS);
        return s;
    }

    /** The sidecar has no fetch channel: ranges and indexes over gRPC for {@link #NO_CHANNEL_RETRY_MS}. */
    /** One request over the fetch channel. */
    private interface ChannelRequest {
        RangeStream send(FetchChannel channel)
                throws StatusException, FetchChannel.NotAvailable, InterruptedIOException;
    }

    /**
     * {@code request} over the fetch channel; null when there is none or the sidecar has none
     * (the caller then asks over gRPC).
     */
    private RangeStream overChannel(ChannelRequest request, String op) throws StatusException, InterruptedException {
        if (channel == null || System.nanoTime() - noChannelUntilNanos < 0) {
            return null;
        }
        try {
            return request.send(channel);
        } catch (FetchChannel.NotAvailable e) {
            noChannel(e, op);
            return null;
        } catch (InterruptedIOException e) {
            InterruptedException ie = new InterruptedException(op + ": interrupted");
            ie.initCause(e);
            throw ie;
        }
    }

    private void noChannel(FetchChannel.NotAvailable e, String op) {
        noChannelUntilNanos = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(NO_CHANNEL_RETRY_MS);
        metrics.fetchChannelFallbacks.increment();
        LOG.warn("{}: {}; fetching over gRPC for the next {} s (upgrade the sidecar: its fetch channel "
                + "costs the broker a fraction of gRPC's CPU)", op, e.getMessage(), NO_CHANNEL_RETRY_MS / 1000);
    }

    // ---- fetchIndex --------------------------------------------------------------------------

    /** {@code fetchIndex}: index {@code indexType} of segment {@code md}. */
    public InputStream index(RemoteLogSegmentMetadata md, IndexType indexType) throws RemoteStorageException {
        Objects.requireNonNull(md, "remoteLogSegmentMetadata");
        Objects.requireNonNull(indexType, "indexType");
        String op = "fetchIndex(" + MetadataMapper.describe(md) + ", " + indexType + ")";
        io.github.rsmsidecar.proto.v1.IndexType type = MetadataMapper.indexType(indexType);
        if (type == null) {
            throw new RemoteStorageException(op + ": index type " + indexType + " is not known to rsm.v1");
        }
        ReadAhead ra = readAhead;
        if (ra != null && indexType == IndexType.OFFSET
                && ra.sequential(md.remoteLogSegmentId().topicIdPartition(), md.remoteLogSegmentId(), 0)) {
            // The broker loads a segment's indexes (offset, time, transaction: three calls) right
            // before its first read of it; a sequential reader that reached the end of the previous
            // segment reads this one from 0, so its first window is read ahead now, beside those calls.
            readAheadNext(md, 0, 0, ra);
        }
        FetchIndexRequest request = FetchIndexRequest.newBuilder()
                .setMetadata(MetadataMapper.toProto(md))
                .setIndexType(type)
                .build();
        ReadAhead.SegmentRef seg = ReadAhead.SegmentRef.of(md);
        if (indexType == IndexType.OFFSET) {
            // the broker asks for the time and transaction indexes right after this one
            indexPrefetch.start(this::indexOnce, background, seg, request,
                    io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP,
                    io.github.rsmsidecar.proto.v1.IndexType.TRANSACTION);
        }
        // the offset index too was asked for ahead when the segment before was read to its end
        IndexPrefetch.Answer prefetched;
        try {
            prefetched = indexPrefetch.take(seg, type, config.fetchIndexDeadlineMs());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw errors.retriable(op + ": interrupted while waiting for the index", e);
        }
        if (prefetched != null && prefetched.notFound() != null) {
            throw errors.map(op, prefetched.notFound(), false);
        }
        if (prefetched != null) {
            return new java.io.ByteArrayInputStream(prefetched.data());
        }
        return retrier.call(ShimMetrics.Op.FETCH_INDEX, op, attempt -> openIndex(request, op));
    }

    /**
     * One attempt at an index: over the fetch channel, or over gRPC while the sidecar has none.
     * The broker's index loads and the prefetch then make no gRPC call at all, so its HTTP/2 stack
     * is not JIT-compiled for reads (docs/performance.md: over half the broker's C2 compilations
     * during a 12-partition cold read were gRPC's and netty's HTTP/2 while indexes went over gRPC).
     */
    private RangeStream openIndex(FetchIndexRequest request, String op)
            throws StatusException, InterruptedException, RemoteStorageException {
        RangeStream overChannel = overChannel(c -> c.openIndex(request, op), op);
        if (overChannel != null) {
            return overChannel;
        }
        GrpcInputStream<FetchIndexResponse> s = GrpcInputStream.start(grpc.get(),
                RemoteStorageGrpc.getFetchIndexMethod(),
                STREAM_CALL.withDeadlineAfter(config.fetchIndexDeadlineMs(), TimeUnit.MILLISECONDS), request,
                FetchIndexResponse::getData, op, 0, ShimConfig.FETCH_INDEX_DEADLINE_MS);
        s.awaitFirst(0, ShimConfig.FETCH_INDEX_DEADLINE_MS);
        return s;
    }

    /** One index, whole, for the prefetch (one attempt: a failure leaves it to the broker's call). */
    private byte[] indexOnce(FetchIndexRequest request)
            throws StatusException, IOException, InterruptedException {
        String op = "index prefetch (" + request.getIndexType() + " of " + request.getMetadata().getSegmentId() + ")";
        metrics.call(ShimMetrics.Op.BACKGROUND);
        try (RangeStream in = openIndex(request, op)) {
            return in.readAllBytes();
        } catch (RemoteStorageException e) {
            throw new IOException(e.getMessage(), e);
        }
    }

    // ---- lifecycle ---------------------------------------------------------------------------

    /**
     * Read-aheads and index prefetches started and not ended yet (tests: a read that started none
     * is seen to have started none once this is 0, without waiting a guessed time).
     */
    int backgroundTasks() {
        return backgroundTasks.get();
    }

    /** Drops what is kept of segment {@code id} (it is being deleted): nothing of it is served again. */
    public void forget(RemoteLogSegmentId id) {
        ReadAhead ra = readAhead;
        if (ra != null) {
            ra.forget(id);
        }
        indexPrefetch.forget(id);
    }

    /** Stops the read-ahead and closes the fetch channel's connections. */
    @Override
    public void close() {
        background.shutdownNow();
        if (readAhead != null) {
            readAhead.close();
        }
        if (channel != null) {
            channel.close();
        }
    }
}
