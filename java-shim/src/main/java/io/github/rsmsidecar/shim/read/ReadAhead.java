package io.github.rsmsidecar.shim.read;

import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;

/**
 * Read-ahead for sequential remote reads: windows of a partition's segments received ahead of the
 * broker's reads and kept in the heap ({@link Window}).
 *
 * <p>The broker reads a tiered partition one consumer fetch at a time (1 MiB by default), each a
 * new {@code fetchLogSegment} call, and each of those cost a {@code FetchSegment} call to the
 * sidecar: a round trip through two processes' threads while the consumer waits, about twice
 * what the read itself cost the broker ({@code benchmarks/remote_read.py}). A reader that continues
 * where the partition's last read ended is sequential; its next window is asked for as one larger
 * range ({@code rsm.config.fetch.readahead.bytes}, 8 MiB by default) which is kept here after the
 * read that asked for it, and the following fetches inside it read memory with no call at all. As soon as a read starts inside a kept window, the next window is
 * asked for in the background ({@link #claimNext}), so a sequential reader does not wait for the
 * sidecar at the window's end either. At a segment's end the sidecar names the partition's next
 * stored segment with the last window ({@code want_next_segment} in rsm.proto), and a read inside
 * that window reads the next segment's first window ahead too; such a window serves only a read
 * whose broker metadata names the same segment id, offsets and size ({@link SegmentRef}), since the
 * name comes from what storage holds, not from the broker. A read that is not sequential (the first of a
 * partition, a consumer that seeks) asks for one window as before, so a random read costs no more
 * than it did.
 *
 * <ul>
 *   <li>At most {@link #WINDOWS_PER_PARTITION} kept windows per partition (the one being read and
 *       the next; a sequential reader leaves the older ones behind), and at most
 *       {@code rsm.config.fetch.readahead.max.bytes} in all: the least recently used partition's
 *       windows are dropped beyond it. A dropped window that a fetch still reads stays readable
 *       until that fetch is done with it (the garbage collector frees it then), so the heap holds
 *       at most the bound plus one window per fetch in progress.
 *   <li>A window holds exactly the bytes asked for, received to a clean end of its range
 *       ({@link Window#read}).
 *   <li>Segments are immutable: a kept window is never stale. {@code deleteLogSegmentData} drops
 *       the segment's windows anyway, so nothing deleted is served.
 * </ul>
 */
final class ReadAhead {

    /** A read starting this close to where the partition's last read ended continues it. */
    static final long SEQUENTIAL_SLACK = 2L * 1024 * 1024;

    /** A segment as a kept window was read for: its id, first and last offset, and size in bytes. */
    record SegmentRef(RemoteLogSegmentId id, long startOffset, long endOffset, long size) {
        static SegmentRef of(RemoteLogSegmentMetadata md) {
            return new SegmentRef(md.remoteLogSegmentId(), md.startOffset(), md.endOffset(), md.segmentSizeInBytes());
        }
    }

    /** A window of segment {@code seg}. */
    private record Kept(SegmentRef seg, Window window) {
        long bytes() {
            return window.length();
        }

        long start() {
            return window.start();
        }

        long end() {
            return window.end();
        }

        RemoteLogSegmentId id() {
            return seg.id();
        }
    }

    /** Where a partition's last read started and ended, and whether that was the end of its segment. */
    private record LastRead(RemoteLogSegmentId id, long start, long end, boolean atSegmentEnd) {
    }

    /** Windows kept per partition: the one being read and the next one, read ahead in the background. */
    static final int WINDOWS_PER_PARTITION = 2;
    /** A partition read within this time is being read: it has a share of the bound. */
    static final long ACTIVE_NANOS = TimeUnit.SECONDS.toNanos(5);
    /** A window is not made smaller than this for a share of the bound (nor larger than the configured one). */
    static final int MIN_WINDOW_BYTES = 1024 * 1024;

    private final int windowBytes;
    private final long maxBytes;
    /** Oldest first; access order over partitions: the first is the least recently used. Guarded by this. */
    private final LinkedHashMap<TopicIdPartition, ArrayDeque<Kept>> kept = new LinkedHashMap<>(16, 0.75f, true);
    private long keptBytes; // guarded by this
    private boolean closed; // guarded by this
    /** The window being read ahead in the background, per partition: its segment and start. Guarded by this. */
    private final Map<TopicIdPartition, Claim> pending = new HashMap<>();

    /**
     * A background read-ahead of the window of {@code id} from {@code start}, {@code bytes} long (a
     * window, or less at the segment's end), done when {@code done} completes.
     */
    record Claim(RemoteLogSegmentId id, long start, long bytes, CompletableFuture<Void> done) {
    }
    /** The bytes of the windows being read ahead ({@link #pending}'s claims). Guarded by this. */
    private long pendingBytes;
    private final Map<TopicIdPartition, LastRead> lastReads = new ConcurrentHashMap<>();
    /** When each partition's last read ended, least recent first; only those within ACTIVE_NANOS. Guarded by this. */
    private final LinkedHashMap<TopicIdPartition, Long> recentlyRead = new LinkedHashMap<>(16, 0.75f, true);
    /** Segments deleted lately: a background read-ahead that ends after the delete keeps nothing. Guarded by this. */
    private final LinkedHashMap<RemoteLogSegmentId, Boolean> deleted = new LinkedHashMap<>() {
        @Override
        protected boolean removeEldestEntry(Map.Entry<RemoteLogSegmentId, Boolean> eldest) {
            return size() > 1024;
        }
    };

    ReadAhead(int windowBytes, long maxBytes) {
        if (windowBytes <= 0 || maxBytes < windowBytes) {
            throw new IllegalArgumentException("window " + windowBytes + ", at most " + maxBytes);
        }
        this.windowBytes = windowBytes;
        this.maxBytes = maxBytes;
    }

    /** The size of a read-ahead window, as configured. */
    int windowBytes() {
        return windowBytes;
    }

    /**
     * The window a read-ahead asks for now: the configured one, or, when more partitions are being
     * read than the bound holds two such windows of, an equal share of the bound for each (two
     * windows per partition read in the last {@link #ACTIVE_NANOS}), at least {@link #MIN_WINDOW_BYTES}.
     * A fixed window let the first partitions take the bound and left the others no read-ahead at
     * all (12 partitions over TCP: 259 of a run's last 284 reads waited for the sidecar); smaller windows for
     * all keep every sequential reader's next bytes on their way, at one background call per window.
     */
    synchronized int currentWindowBytes() {
        long now = System.nanoTime();
        Iterator<Map.Entry<TopicIdPartition, Long>> it = recentlyRead.entrySet().iterator();
        while (it.hasNext() && now - it.next().getValue() > ACTIVE_NANOS) {
            it.remove();
        }
        long share = maxBytes / ((long) WINDOWS_PER_PARTITION * Math.max(1, recentlyRead.size()));
        return (int) Math.min(windowBytes, Math.max(MIN_WINDOW_BYTES, share));
    }

    /**
     * The kept window of {@code partition} that holds {@code start} of segment {@code seg} (same
     * id, offsets and size), as a stream from {@code start} to the window's end; null when there is none.
     */
    synchronized WindowedFetchStream.Opened find(TopicIdPartition partition, SegmentRef seg, long start) {
        ArrayDeque<Kept> windows = kept.get(partition);
        if (windows == null) {
            return null;
        }
        for (Kept k : windows) {
            if (k.seg().equals(seg) && k.window().contains(start)) {
                return new WindowedFetchStream.Opened(k.window().stream(start), k.end());
            }
        }
        return null;
    }

    /**
     * Claims the background read-ahead of the window after one that a read of {@code partition}
     * (from {@code position}) found ending at {@code windowEnd}, when the window is not the
     * segment's last, the next one is neither kept nor already claimed, and
     * it fits under the bound beside the windows kept and those being read ahead (each counted at
     * its length: a window, or what is left of the segment; counting every claim as a whole
     * window refused most read-aheads of 12 partitions of 4 MiB segments under the 64 MiB
     * default): a read-ahead
     * never pushes out another partition's window, which would waste both (with more partitions
     * read at once than the bound holds, the others read in plain windows).
     * The caller starts the read-ahead and calls {@link #pendingDone} with the claim returned (null:
     * nothing claimed) as soon as its window is kept or will not be: a read inside the window
     * just kept must be able to claim the one after, also before the call has closed.
     * ({@code position = windowEnd = 0}: the first window of a segment the broker is about to read,
     * claimed when it loads the segment's offset index after a read that reached the previous end.)
     */
    synchronized Claim claimNext(TopicIdPartition partition, RemoteLogSegmentId id, long position, long windowEnd,
                                 long segmentSize) {
        long bytes = Math.min(currentWindowBytes(), segmentSize - windowEnd);
        if (windowEnd >= segmentSize || position > windowEnd || pending.containsKey(partition)
                || keptBytes + pendingBytes + bytes > maxBytes) {
            return null;
        }
        ArrayDeque<Kept> windows = kept.get(partition);
        if (windows != null) {
            for (Kept k : windows) {
                if (k.id().equals(id) && k.start() <= windowEnd && windowEnd < k.end()) {
                    return null;
                }
            }
        }
        Claim claim = new Claim(id, windowEnd, bytes, new CompletableFuture<>());
        pending.put(partition, claim);
        pendingBytes += bytes;
        return claim;
    }

    /**
     * The background read-ahead of {@code claim} for {@code partition} is over (its window kept or
     * not); idempotent, and a later claim of the partition stays.
     */
    void pendingDone(TopicIdPartition partition, Claim claim) {
        synchronized (this) {
            if (pending.remove(partition, claim)) {
                pendingBytes -= claim.bytes();
            }
        }
        claim.done().complete(null);
    }

    /**
     * Waits at most {@code timeoutMs} for a background read-ahead of the window of {@code id} from
     * {@code start}, if one is under way (a reader that caught up with it takes its window instead
     * of asking for the same bytes again).
     */
    void awaitPending(TopicIdPartition partition, RemoteLogSegmentId id, long start, long timeoutMs)
            throws InterruptedException {
        Claim p;
        synchronized (this) {
            p = pending.get(partition);
        }
        if (p == null || !p.id().equals(id) || start < p.start() || start >= p.start() + p.bytes()) {
            return;
        }
        try {
            p.done().get(timeoutMs, TimeUnit.MILLISECONDS);
        } catch (ExecutionException | TimeoutException e) {
            // the reader asks for the window itself
        }
    }

    /**
     * Whether {@code bytes} more fit under the bound beside the windows kept and being read ahead
     * (a window that grows by its last chunk's tail must not push out another partition's).
     */
    synchronized boolean hasRoomFor(long bytes) {
        return keptBytes + pendingBytes + bytes <= maxBytes;
    }

    /**
     * Keeps {@code window} of segment {@code seg} as a window of {@code partition}; the partition's
     * previous window and, beyond the bound, the least recently used ones are dropped. Windows of
     * another segment are dropped too (a reader that moved there), unless this one {@code follows}
     * them: the next segment's first window, read ahead while the reader is still in the last
     * window of the segment before.
     */
    synchronized void keep(TopicIdPartition partition, SegmentRef seg, Window window, boolean follows) {
        if (closed || deleted.containsKey(seg.id())) {
            return; // closed, or a deleted segment: nothing to keep
        }
        ArrayDeque<Kept> windows = kept.computeIfAbsent(partition, p -> new ArrayDeque<>());
        windows.addLast(new Kept(seg, window));
        keptBytes += window.length();
        while (windows.size() > WINDOWS_PER_PARTITION || (!follows && windows.size() > 1
                && !windows.peekFirst().id().equals(seg.id()))) {
            drop(windows.removeFirst()); // behind the reader, or of a segment it left
        }
        Iterator<ArrayDeque<Kept>> lru = kept.values().iterator();
        while (keptBytes > maxBytes && lru.hasNext()) {
            ArrayDeque<Kept> oldest = lru.next();
            while (keptBytes > maxBytes && !oldest.isEmpty()) {
                drop(oldest.removeFirst());
            }
            if (oldest.isEmpty()) {
                lru.remove();
            }
        }
    }

    /**
     * The partition's next segment as the sidecar named it with the kept window that ends at
     * segment {@code id}'s end; null when no such window is kept or it named none.
     */
    synchronized SegmentMetadata nextSegment(TopicIdPartition partition, RemoteLogSegmentId id) {
        ArrayDeque<Kept> windows = kept.get(partition);
        if (windows != null) {
            for (Kept k : windows) {
                if (k.id().equals(id) && k.window().next() != null) {
                    return k.window().next();
                }
            }
        }
        return null;
    }

    /**
     * Whether a read of {@code partition} from {@code start} of segment {@code id} continues the
     * partition's last read: it starts after that one's start and near where it ended in the same
     * segment (a broker's next fetch starts at the batch holding the next offset, at most one batch
     * back), or near the start of the next segment after a read that reached the end of its own.
     * A read from the same position again (a retry, a second consumer) is not: it reads nothing ahead.
     */
    boolean sequential(TopicIdPartition partition, RemoteLogSegmentId id, long start) {
        LastRead last = lastReads.get(partition);
        if (last == null) {
            return false;
        }
        if (last.id().equals(id)) {
            return start > last.start() && Math.abs(start - last.end()) <= SEQUENTIAL_SLACK;
        }
        return last.atSegmentEnd() && start <= SEQUENTIAL_SLACK;
    }

    /** Records a read of {@code partition} from {@code start} that ended (its stream closed) at {@code end}. */
    void readEnded(TopicIdPartition partition, RemoteLogSegmentId id, long start, long end, long segmentSize) {
        if (lastReads.size() > RemoteReader.MAX_TRACKED_PARTITIONS) {
            lastReads.clear();
        }
        lastReads.put(partition, new LastRead(id, start, end, end >= segmentSize));
        synchronized (this) {
            recentlyRead.put(partition, System.nanoTime());
        }
    }

    /** Drops the windows of segment {@code id} (it was deleted). */
    synchronized void forget(RemoteLogSegmentId id) {
        deleted.put(id, Boolean.TRUE);
        Iterator<ArrayDeque<Kept>> it = kept.values().iterator();
        while (it.hasNext()) {
            ArrayDeque<Kept> windows = it.next();
            windows.removeIf(k -> {
                if (k.id().equals(id)) {
                    drop(k);
                    return true;
                }
                return false;
            });
            if (windows.isEmpty()) {
                it.remove();
            }
        }
    }

    /** Drops every window and keeps none from now on (a background read-ahead may still end). */
    synchronized void close() {
        closed = true;
        kept.values().forEach(windows -> windows.forEach(this::drop));
        kept.clear();
    }

    private void drop(Kept k) {
        keptBytes -= k.bytes();
    }
}
