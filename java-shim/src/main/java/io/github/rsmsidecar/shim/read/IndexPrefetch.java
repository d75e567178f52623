package io.github.rsmsidecar.shim.read;

import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.IndexType;
import io.grpc.Status;
import io.grpc.StatusException;
import java.util.Iterator;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;

/**
 * A segment's indexes asked for in the background: its time and transaction indexes when the broker
 * asks for its offset index, and all three of the partition's next segment when a sequential reader
 * reads its first window ahead ({@link ReadAhead}).
 *
 * <p>The broker loads a segment's indexes one after the other before its first read of the segment
 * ({@code RemoteIndexCache.createCacheEntry}: offset, time, then transaction, whose absence it
 * expects as {@code RemoteResourceNotFoundException}), each a call to the sidecar, while its
 * consumer waits. The two later calls are started beside the first here, and the broker's own
 * calls for them take their answers ({@link #take}): one round trip at a segment start instead of
 * three ({@code benchmarks/remote_read.py}: each cost 7-10 ms on a loaded 2-core machine). The
 * answers come over the sidecar's fetch channel (over gRPC from a sidecar without one), on the read
 * path's background threads. When the
 * sidecar has named the partition's next segment (read-ahead across a segment's end), its offset
 * index is asked for too, with the next segment's first window, so the broker's call at the
 * segment change makes no round trip at all (with 12 partitions read at once, that call took
 * 27-37 ms at the median over TCP + mTLS, on every segment change).
 *
 * <ul>
 *   <li>An answer serves only a broker call whose metadata names the same segment id, offsets and
 *       size as the request it was asked with ({@link ReadAhead.SegmentRef}): a next segment's
 *       name comes from what storage holds, not from the broker.
 *   <li>An answer is used once, by the broker's call for it, and only within
 *       {@link #MAX_AGE_MS} of its start: a segment is immutable, so a prefetched index is never
 *       stale, but nothing is kept for a broker that never asks.
 *   <li>At most {@link #MAX_BYTES} bytes are held in all, and {@link #MAX_ENTRIES} answers: an
 *       answer that would go beyond is dropped and its broker call asks the sidecar itself.
 *   <li>Anything but an answer (an error, a cancelled call, the bound) makes the broker's call ask
 *       the sidecar as if nothing had been prefetched, with its own retries and error mapping;
 *       only NOT_FOUND (no transaction index) is passed on as the answer it is.
 * </ul>
 */
final class IndexPrefetch {

    /** Index bytes held at once, all answers together. */
    static final long MAX_BYTES = 32L * 1024 * 1024;
    /** Answers held (or under way) at once. */
    static final int MAX_ENTRIES = 64;
    /** An answer nobody took within this time of its start is dropped. */
    static final long MAX_AGE_MS = 60_000;

    /** An index's bytes, or the NOT_FOUND status the sidecar answered. */
    record Answer(byte[] data, Status notFound) {
    }

    private record Key(ReadAhead.SegmentRef seg, IndexType type) {
    }

    private record Entry(CompletableFuture<Answer> answer, long startNanos) {
    }

    private final Map<Key, Entry> entries = new ConcurrentHashMap<>();
    private final AtomicLong heldBytes = new AtomicLong();

    /** Fetches one index, blocking: its bytes, or a {@link StatusException} (NOT_FOUND: none). */
    @FunctionalInterface
    interface Fetcher {
        byte[] fetch(FetchIndexRequest request) throws StatusException, java.io.IOException, InterruptedException;
    }

    /**
     * Asks {@code fetcher}, on {@code executor}, for each of {@code types} of {@code request}'s
     * segment ({@code seg}, as the request's metadata names it) that is not already held or under way.
     */
    void start(Fetcher fetcher, java.util.concurrent.Executor executor, ReadAhead.SegmentRef seg,
               FetchIndexRequest request, IndexType... types) {
        expire();
        for (IndexType type : types) {
            if (entries.size() >= MAX_ENTRIES) {
                return;
            }
            Key key = new Key(seg, type);
            CompletableFuture<Answer> answer = new CompletableFuture<>();
            Entry entry = new Entry(answer, System.nanoTime());
            if (entries.putIfAbsent(key, entry) != null) {
                continue;
            }
            answer.whenComplete((a, e) -> {
                if (e != null) {
                    entries.remove(key, entry); // the broker's call asks for itself
                }
            });
            try {
                executor.execute(() -> collect(fetcher, request.toBuilder().setIndexType(type).build(), answer));
            } catch (java.util.concurrent.RejectedExecutionException e) {
                answer.completeExceptionally(e);
            }
        }
    }

    private void collect(Fetcher fetcher, FetchIndexRequest request, CompletableFuture<Answer> answer) {
        if (answer.isDone()) {
            return; // taken or dropped before it started
        }
        Answer a;
        try {
            byte[] data = fetcher.fetch(request);
            if (heldBytes.addAndGet(data.length) > MAX_BYTES) {
                heldBytes.addAndGet(-data.length);
                answer.completeExceptionally(new IllegalStateException("over the prefetch bound"));
                return;
            }
            a = new Answer(data, null);
        } catch (StatusException e) {
            if (e.getStatus().getCode() != Status.Code.NOT_FOUND) {
                answer.completeExceptionally(e);
                return;
            }
            a = new Answer(null, e.getStatus());
        } catch (Exception e) {
            if (e instanceof InterruptedException) {
                Thread.currentThread().interrupt();
            }
            answer.completeExceptionally(e);
            return;
        }
        if (!answer.complete(a)) {
            release(a); // dropped meanwhile: nobody will take it
        }
    }

    /**
     * The answer prefetched for index {@code type} of segment {@code seg} (same id, offsets and
     * size), waiting at most {@code timeoutMs} for it; null when there is none or it failed (the
     * caller asks the sidecar).
     */
    Answer take(ReadAhead.SegmentRef seg, IndexType type, long timeoutMs) throws InterruptedException {
        Entry e = entries.remove(new Key(seg, type));
        if (e == null) {
            return null;
        }
        try {
            Answer a = e.answer().get(timeoutMs, TimeUnit.MILLISECONDS);
            release(a);
            return a;
        } catch (ExecutionException | TimeoutException ex) {
            e.answer().cancel(false);
            return null;
        }
    }

    /** Drops what is held for segment {@code id} (it was deleted). */
    void forget(RemoteLogSegmentId id) {
        entries.entrySet().removeIf(en -> {
            if (en.getKey().seg().id().equals(id)) {
                drop(en.getValue());
                return true;
            }
            return false;
        });
    }

    /** Bytes held now (tests). */
    long heldBytes() {
        return heldBytes.get();
    }

    /** Answers held or under way now (tests). */
    int size() {
        return entries.size();
    }

    private void expire() {
        long now = System.nanoTime();
        Iterator<Entry> it = entries.values().iterator();
        while (it.hasNext()) {
            Entry e = it.next();
            if (now - e.startNanos() > TimeUnit.MILLISECONDS.toNanos(MAX_AGE_MS)) {
                it.remove();
                drop(e);
            }
        }
    }

    private void drop(Entry e) {
        CompletableFuture<Answer> answer = e.answer();
        if (!answer.cancel(false) && !answer.isCompletedExceptionally()) {
            release(answer.getNow(null)); // answered, never taken (a call under way releases its own bytes)
        }
    }

    private void release(Answer a) {
        if (a != null && a.data() != null) {
            heldBytes.addAndGet(-a.data().length);
        }
    }
}
