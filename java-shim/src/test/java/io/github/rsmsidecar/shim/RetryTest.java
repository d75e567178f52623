package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.CopySegmentRequest;
import io.github.rsmsidecar.proto.v1.CopySegmentResponse;
import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.FetchIndexResponse;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.grpc.ManagedChannel;
import io.grpc.Status;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.stub.StreamObserver;
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

@Timeout(value = 60, unit = TimeUnit.SECONDS)
class RetryTest {

    @TempDir
    Path dir;

    /** Fails the first {@code failures} calls of every method with {@code status}, then succeeds. */
    static final class FlakySidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final int failures;
        final Status status;
        final AtomicInteger copy = new AtomicInteger();
        final AtomicInteger fetch = new AtomicInteger();
        /** Per index type: fetchIndex(OFFSET) also starts the time and transaction calls (IndexPrefetch). */
        final java.util.Map<io.github.rsmsidecar.proto.v1.IndexType, AtomicInteger> index =
                new java.util.concurrent.ConcurrentHashMap<>();

        int index(io.github.rsmsidecar.proto.v1.IndexType type) {
            return index.computeIfAbsent(type, t -> new AtomicInteger()).get();
        }

        /** The attempts of each call: fetches, time-index fetches, deletes, copies. */
        void assertCalls(int fetches, int timeIndexes, int deletes, int copies) {
            assertEquals(fetches, fetch.get());
            assertEquals(timeIndexes, index(io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP));
            assertEquals(deletes, delete.get());
            assertEquals(copies, copy.get());
        }
        final AtomicInteger delete = new AtomicInteger();
        final List<Long> callNanos = new CopyOnWriteArrayList<>();
        final List<List<CopySegmentRequest>> copies = new CopyOnWriteArrayList<>();

        FlakySidecar(int failures, Status status) {
            this.failures = failures;
            this.status = status;
        }

        @Override
        public StreamObserver<CopySegmentRequest> copySegment(StreamObserver<CopySegmentResponse> observer) {
            int n = copy.incrementAndGet();
            List<CopySegmentRequest> got = new CopyOnWriteArrayList<>();
            copies.add(got);
            return new StreamObserver<>() {
                boolean failed;

                public void onNext(CopySegmentRequest v) {
                    got.add(v);
                    // Fail after some data arrived, so a retry must start over from the beginning.
                    if (n <= failures && v.hasData() && !failed) {
                        failed = true;
                        observer.onError(status.asRuntimeException());
                    }
                }

                public void onError(Throwable t) {
                }

                public void onCompleted() {
                    if (!failed) {
                        observer.onNext(CopySegmentResponse.getDefaultInstance());
                        observer.onCompleted();
                    }
                }
            };
        }

        /** Fails while {@code calls} is at most {@code failures}, then answers {@code response}. */
        private <T> void answer(AtomicInteger calls, StreamObserver<T> observer, T response) {
            if (calls.incrementAndGet() <= failures) {
                observer.onError(status.asRuntimeException());
                return;
            }
            observer.onNext(response);
            observer.onCompleted();
        }

        @Override
        public void fetchSegment(FetchSegmentRequest request, StreamObserver<FetchSegmentResponse> observer) {
            callNanos.add(System.nanoTime());
            answer(fetch, observer, FetchSegmentResponse.newBuilder().setData(ByteString.copyFromUtf8("segment")).build());
        }

        @Override
        public void fetchIndex(FetchIndexRequest request, StreamObserver<FetchIndexResponse> observer) {
            answer(index.computeIfAbsent(request.getIndexType(), t -> new AtomicInteger()), observer,
                    FetchIndexResponse.newBuilder().setData(ByteString.copyFromUtf8("index")).build());
        }

        @Override
        public void deleteSegment(DeleteSegmentRequest request, StreamObserver<DeleteSegmentResponse> observer) {
            answer(delete, observer, DeleteSegmentResponse.getDefaultInstance());
        }
    }

    @Test
    void unavailableIsRetriedUntilSuccessForEveryIdempotentCall() throws Exception {
        FlakySidecar sidecar = new FlakySidecar(2, Status.UNAVAILABLE.withDescription("storage throttled"));
        LogSegmentData data = Fixtures.segmentData(dir, 3 * (1 << 20), 10, 10, 10, null, Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.RETRY_MAX_ATTEMPTS, "3"))) {
            try (InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
                assertEquals("segment", new String(in.readAllBytes()));
            }
            try (InputStream in = h.rsm.fetchIndex(Fixtures.metadata(), RemoteStorageManager.IndexType.OFFSET)) {
                assertEquals("index", new String(in.readAllBytes()));
            }
            h.rsm.deleteLogSegmentData(Fixtures.metadata());
            h.rsm.copyLogSegmentData(Fixtures.metadata(), data);
        }
        assertEquals(3, sidecar.fetch.get());
        assertEquals(3, sidecar.index(io.github.rsmsidecar.proto.v1.IndexType.OFFSET));
        assertEquals(3, sidecar.delete.get());
        assertEquals(3, sidecar.copy.get());
        // Each copy attempt starts over: CopyBegin first, and the last attempt carries the whole segment.
        for (List<CopySegmentRequest> attempt : sidecar.copies) {
            assertTrue(attempt.get(0).hasBegin());
        }
        ByteArrayOutputStream log = new ByteArrayOutputStream();
        for (CopySegmentRequest m : sidecar.copies.get(2)) {
            if (m.hasData() && m.getData().getFile() == io.github.rsmsidecar.proto.v1.FileKind.LOG) {
                log.writeBytes(m.getData().getData().toByteArray());
            }
        }
        assertArrayEquals(java.nio.file.Files.readAllBytes(data.logSegment()), log.toByteArray());
    }

    @Test
    void givesUpAfterMaxAttempts() throws Exception {
        FlakySidecar sidecar = new FlakySidecar(100, Status.UNAVAILABLE.withDescription("down"));
        LogSegmentData data = Fixtures.segmentData(dir, 100, 10, 10, 10, null, Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.RETRY_MAX_ATTEMPTS, "4"))) {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 0));
            assertTrue(e.getMessage().contains("(attempt 4 of 4)"), e.getMessage());
            assertTrue(e.getMessage().contains("UNAVAILABLE: down"), e.getMessage());
            assertThrows(RemoteStorageException.class,
                    () -> h.rsm.fetchIndex(Fixtures.metadata(), RemoteStorageManager.IndexType.TIMESTAMP));
            assertThrows(RemoteStorageException.class, () -> h.rsm.deleteLogSegmentData(Fixtures.metadata()));
            assertThrows(RemoteStorageException.class, () -> h.rsm.copyLogSegmentData(Fixtures.metadata(), data));
        }
        sidecar.assertCalls(4, 4, 4, 4);
    }

    @ParameterizedTest
    @EnumSource(value = Status.Code.class, mode = EnumSource.Mode.EXCLUDE,
            names = {"OK", "UNAVAILABLE", "RESOURCE_EXHAUSTED"})
    void onlyUnavailableIsRetried(Status.Code code) throws Exception {
        FlakySidecar sidecar = new FlakySidecar(1, Status.fromCode(code));
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.RETRY_MAX_ATTEMPTS, "5"))) {
            assertThrows(RemoteStorageException.class, () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 0));
        }
        assertEquals(1, sidecar.fetch.get(), code + " must not be retried");
    }

    @Test
    void fetchesAndIndexesWaitForABusySidecarInsteadOfFailing() throws Exception {
        FlakySidecar sidecar = new FlakySidecar(3, Status.RESOURCE_EXHAUSTED.withDescription("all 1 fetch slots are busy"));
        LogSegmentData data = Fixtures.segmentData(dir, 100, 10, 10, 10, null, Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.RETRY_MAX_ATTEMPTS, "1"))) {
            try (InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
                assertEquals("segment", new String(in.readAllBytes()));
            }
            try (InputStream in = h.rsm.fetchIndex(Fixtures.metadata(), RemoteStorageManager.IndexType.TIMESTAMP)) {
                assertEquals("index", new String(in.readAllBytes()));
            }
            assertEquals(3, h.rsm.metrics.of(ShimMetrics.Op.FETCH).busyWaits.sum());
            assertEquals(3, h.rsm.metrics.of(ShimMetrics.Op.FETCH_INDEX).busyWaits.sum());
            // copies and deletes are not waited for: the broker retries them itself
            assertThrows(RemoteStorageException.class, () -> h.rsm.deleteLogSegmentData(Fixtures.metadata()));
            assertThrows(RemoteStorageException.class, () -> h.rsm.copyLogSegmentData(Fixtures.metadata(), data));
        }
        sidecar.assertCalls(4, 4, 1, 1);
    }

    @Test
    void aSidecarBusyBeyondTheOpenDeadlineFailsTheFetch() throws Exception {
        FlakySidecar sidecar = new FlakySidecar(1_000_000, Status.RESOURCE_EXHAUSTED.withDescription("busy"));
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.FETCH_DEADLINE_MS, "300"))) {
            long t0 = System.nanoTime();
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 0));
            long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
            assertTrue(e.getMessage().contains("RESOURCE_EXHAUSTED: busy"), e.getMessage());
            assertTrue(ms >= 290 && ms < 3000, "waited " + ms + " ms for a 300 ms deadline");
            assertTrue(sidecar.fetch.get() > 3, "asked again while waiting: " + sidecar.fetch.get());
        }
    }

    @Test
    void backoffGrowsExponentially() throws Exception {
        FlakySidecar sidecar = new FlakySidecar(3, Status.UNAVAILABLE);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.RETRY_MAX_ATTEMPTS, "4",
                ShimConfig.RETRY_INITIAL_BACKOFF_MS, "100", ShimConfig.RETRY_MAX_BACKOFF_MS, "1000"))) {
            h.rsm.fetchLogSegment(Fixtures.metadata(), 0).close();
        }
        List<Long> t = sidecar.callNanos;
        assertEquals(4, t.size());
        long[] gaps = new long[3];
        for (int i = 0; i < 3; i++) {
            gaps[i] = TimeUnit.NANOSECONDS.toMillis(t.get(i + 1) - t.get(i));
        }
        // 100, 200, 400 ms, each with jitter in [0.8, 1.2).
        assertTrue(gaps[0] >= 80 && gaps[0] < 1000, "gap 1: " + gaps[0]);
        assertTrue(gaps[1] >= 160, "gap 2: " + gaps[1]);
        assertTrue(gaps[2] >= 320, "gap 3: " + gaps[2]);
    }

    /** Answers UNAVAILABLE (as a sidecar that is restarting) until {@code backAt}, then serves. */
    static final class RestartingSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        volatile long backAt;
        final AtomicInteger fetches = new AtomicInteger();
        final AtomicInteger deletes = new AtomicInteger();

        RestartingSidecar(long awayMs) {
            backAt = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(awayMs);
        }

        private boolean away(StreamObserver<?> observer) {
            if (System.nanoTime() - backAt < 0) {
                observer.onError(Status.UNAVAILABLE.withDescription("connection refused").asRuntimeException());
                return true;
            }
            return false;
        }

        @Override
        public void fetchSegment(FetchSegmentRequest request, StreamObserver<FetchSegmentResponse> observer) {
            fetches.incrementAndGet();
            if (!away(observer)) {
                observer.onNext(FetchSegmentResponse.newBuilder().setData(ByteString.copyFromUtf8("segment")).build());
                observer.onCompleted();
            }
        }

        @Override
        public void fetchIndex(FetchIndexRequest request, StreamObserver<FetchIndexResponse> observer) {
            if (!away(observer)) {
                observer.onNext(FetchIndexResponse.newBuilder().setData(ByteString.copyFromUtf8("index")).build());
                observer.onCompleted();
            }
        }

        @Override
        public void deleteSegment(DeleteSegmentRequest request, StreamObserver<DeleteSegmentResponse> observer) {
            deletes.incrementAndGet();
            if (!away(observer)) {
                observer.onNext(DeleteSegmentResponse.getDefaultInstance());
                observer.onCompleted();
            }
        }
    }

    /**
     * A sidecar away for 800 ms (a restart: longer than the attempts' backoffs, 10 + 20 ms here):
     * fetches and index reads wait for it (retry.fetch.max.ms) and get their bytes; a delete keeps
     * to its attempts, as copies do (the broker retries those itself).
     */
    @Test
    void readsRideOutASidecarRestartAndOtherCallsKeepToTheirAttempts() throws Exception {
        RestartingSidecar sidecar = new RestartingSidecar(800);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.RETRY_MAX_ATTEMPTS, "3",
                ShimConfig.RETRY_FETCH_MAX_MS, "5000"))) {
            assertThrows(RemoteStorageException.class, () -> h.rsm.deleteLogSegmentData(Fixtures.metadata()));
            assertEquals(3, sidecar.deletes.get());
            long t0 = System.nanoTime();
            try (InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
                assertEquals("segment", new String(in.readAllBytes()));
            }
            long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
            assertTrue(ms < 3000, "the fetch waited " + ms + " ms for a sidecar away 800 ms (it asks every 200 ms at most)");
            assertTrue(sidecar.fetches.get() > 3, "more attempts than retry.max.attempts: " + sidecar.fetches.get());
            try (InputStream in = h.rsm.fetchIndex(Fixtures.metadata(), RemoteStorageManager.IndexType.TIMESTAMP)) {
                assertEquals("index", new String(in.readAllBytes()));
            }
            assertEquals(1, h.rsm.metrics.reachable());
        }
    }

    /**
     * A sidecar that shuts down (gRPC core's server) cancels the calls it had received but not
     * started yet: for a read that is the sidecar going away, waited for like UNAVAILABLE; a copy
     * or a delete is not retried for it (the broker retries them).
     */
    @Test
    void aReadCancelledByASidecarShuttingDownIsAskedAgain() throws Exception {
        FlakySidecar sidecar = new FlakySidecar(2, Status.CANCELLED.withDescription("CANCELLED"));
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.RETRY_FETCH_MAX_MS, "5000"))) {
            try (InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
                assertEquals("segment", new String(in.readAllBytes()));
            }
            assertThrows(RemoteStorageException.class, () -> h.rsm.deleteLogSegmentData(Fixtures.metadata()));
        }
        assertEquals(3, sidecar.fetch.get());
        assertEquals(1, sidecar.delete.get());
    }

    /**
     * The wait is counted from when the sidecar was first missed, not per call: once a sidecar has
     * been away for retry.fetch.max.ms, fetches fail after their attempts instead of each holding a
     * broker thread that long again; and once it is back, the next outage gets the whole wait.
     */
    @Test
    void theWaitForAnAbsentSidecarIsCountedFromWhenItWasFirstMissed() throws Exception {
        RestartingSidecar sidecar = new RestartingSidecar(60_000);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.RETRY_MAX_ATTEMPTS, "3",
                ShimConfig.RETRY_FETCH_MAX_MS, "600"))) {
            long t0 = System.nanoTime();
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 0));
            long first = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
            assertTrue(first >= 590 && first < 3000, "the first fetch waited " + first + " ms of 600");
            assertTrue(e.getMessage().contains("UNAVAILABLE: connection refused"), e.getMessage());
            t0 = System.nanoTime();
            assertThrows(RemoteStorageException.class, () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 0));
            long second = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
            assertTrue(second < 500, "the second fetch, 600 ms into the outage, waited " + second + " ms");

            sidecar.backAt = System.nanoTime();
            h.rsm.fetchLogSegment(Fixtures.metadata(), 0).close(); // reached: the outage is over
            sidecar.backAt = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(300);
            try (InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
                assertEquals("segment", new String(in.readAllBytes()), "a new outage: the whole wait again");
            }
        }
    }

    @Test
    void backoffFormula() {
        assertEquals(80, Retrier.backoffMs(1, 100, 5000, 0.0));
        assertEquals(100, Retrier.backoffMs(1, 100, 5000, 0.5));
        assertEquals(200, Retrier.backoffMs(2, 100, 5000, 0.5));
        assertEquals(400, Retrier.backoffMs(3, 100, 5000, 0.5));
        assertEquals(5000, Retrier.backoffMs(10, 100, 5000, 0.99), "capped");
        assertEquals(4000, Retrier.backoffMs(10, 100, 5000, 0.0), "capped, then jittered down");
        assertEquals(0, Retrier.backoffMs(3, 0, 0, 0.7));
    }

    @Test
    void anUnreachableSidecarIsRetriedThenReported() throws Exception {
        // A channel to an in-process name nobody serves: every attempt fails with UNAVAILABLE locally.
        AtomicInteger channels = new AtomicInteger();
        SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager(c -> {
            channels.incrementAndGet();
            ManagedChannel ch = InProcessChannelBuilder.forName("nobody-" + System.nanoTime()).build();
            return ch;
        }, null);
        rsm.configure(Fixtures.config(ShimConfig.RETRY_MAX_ATTEMPTS, "3"));
        try {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> rsm.deleteLogSegmentData(Fixtures.metadata()));
            assertTrue(e.getMessage().contains("(attempt 3 of 3)"), e.getMessage());
            assertTrue(e.getMessage().contains("UNAVAILABLE"), e.getMessage());
            assertEquals(1, channels.get(), "one channel for the shim's life");
        } finally {
            rsm.close();
        }
    }
}
