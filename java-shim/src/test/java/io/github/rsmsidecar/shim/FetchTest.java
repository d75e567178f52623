package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.FetchIndexResponse;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.IndexType;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.grpc.Status;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 30, unit = TimeUnit.SECONDS)
class FetchTest {

    static final int CHUNK = 64 * 1024;

    /** FetchSegment that produces {@code count} chunks only as fast as the client asks for them. */
    static class LazySidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final int count;
        final int size;
        final AtomicInteger sent = new AtomicInteger();
        final AtomicInteger calls = new AtomicInteger();
        final CountDownLatch cancelled = new CountDownLatch(1);
        volatile FetchSegmentRequest request;

        LazySidecar(int count, int size) {
            this.count = count;
            this.size = size;
        }

        static byte[] chunk(int i, int size) {
            return Fixtures.content(size, i);
        }

        @Override
        public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
            calls.incrementAndGet();
            request = req;
            ServerCallStreamObserver<FetchSegmentResponse> s = (ServerCallStreamObserver<FetchSegmentResponse>) observer;
            s.setOnCancelHandler(cancelled::countDown);
            boolean[] done = {false};
            Runnable drain = () -> {
                synchronized (done) {
                    while (!done[0] && s.isReady() && sent.get() < count && !s.isCancelled()) {
                        int i = sent.getAndIncrement();
                        s.onNext(FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(chunk(i, size))).build());
                    }
                    if (!done[0] && sent.get() == count) {
                        done[0] = true;
                        s.onCompleted();
                    }
                }
            };
            s.setOnReadyHandler(drain);
            drain.run();
        }
    }

    static byte[] expected(int count, int size) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        for (int i = 0; i < count; i++) {
            out.writeBytes(LazySidecar.chunk(i, size));
        }
        return out.toByteArray();
    }

    /** Answers fetchSegment and fetchIndex with one message of {@code bytes} bytes (none when 0)
     * and then never again; counts the calls and sees the shim cancel them. */
    static final class StallingSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final CountDownLatch cancelled = new CountDownLatch(1);
        final AtomicInteger calls = new AtomicInteger();
        final int bytes;

        StallingSidecar(int bytes) {
            this.bytes = bytes;
        }

        @Override
        public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
            stall(observer, FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(new byte[bytes])).build());
        }

        @Override
        public void fetchIndex(FetchIndexRequest req, StreamObserver<FetchIndexResponse> observer) {
            stall(observer, FetchIndexResponse.newBuilder().setData(ByteString.copyFrom(new byte[bytes])).build());
        }

        private <T> void stall(StreamObserver<T> observer, T first) {
            calls.incrementAndGet();
            ((ServerCallStreamObserver<T>) observer).setOnCancelHandler(cancelled::countDown);
            if (bytes > 0) {
                observer.onNext(first);
            }
        }
    }

    @Test
    void streamsAllBytesInOrder() throws Exception {
        LazySidecar sidecar = new LazySidecar(20, CHUNK);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config());
             InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
            assertArrayEquals(expected(20, CHUNK), in.readAllBytes());
            assertEquals(-1, in.read());
        }
    }

    @Test
    void pullsLazilyAndCancelsOnClose() throws Exception {
        LazySidecar sidecar = new LazySidecar(200, CHUNK);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0);
            byte[] first = in.readNBytes(CHUNK + 10);
            assertArrayEquals(java.util.Arrays.copyOf(expected(2, CHUNK), CHUNK + 10), first);
            Thread.sleep(200);
            // One message being read plus one requested ahead (+1 in flight at most).
            assertTrue(sidecar.sent.get() <= 4, "sidecar produced " + sidecar.sent.get() + " chunks for 2 read");
            in.close();
            assertTrue(sidecar.cancelled.await(5, TimeUnit.SECONDS), "the sidecar did not see the cancellation");
            IOException e = assertThrows(IOException.class, in::read);
            assertTrue(e.getMessage().contains("closed"), e.getMessage());
        }
    }

    @Test
    void openErrorsSurfaceFromFetchLogSegment() throws Exception {
        RemoteStorageGrpc.RemoteStorageImplBase sidecar = new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
                observer.onError(Status.NOT_FOUND.withDescription("no manifest for segment").asRuntimeException());
            }
        };
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            RemoteResourceNotFoundException e = assertThrows(RemoteResourceNotFoundException.class,
                    () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 0));
            assertTrue(e.getMessage().contains("NOT_FOUND: no manifest for segment"), e.getMessage());
        }
    }

    /** A sidecar that sends {@code good} chunks and then fails with {@code status}. */
    static RemoteStorageGrpc.RemoteStorageImplBase breaksAfter(int good, Status status) {
        return new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
                for (int i = 0; i < good; i++) {
                    observer.onNext(FetchSegmentResponse.newBuilder()
                            .setData(ByteString.copyFrom(LazySidecar.chunk(i, CHUNK))).build());
                }
                observer.onError(status.asRuntimeException());
            }
        };
    }

    @Test
    void brokenStreamAfterFirstBytesIsIOExceptionNotEof() throws Exception {
        for (Status status : new Status[] {
            Status.DATA_LOSS.withDescription("GCM tag mismatch in chunk 3 of key x.log"),
            Status.UNAVAILABLE.withDescription("sidecar shutting down"),
            Status.INTERNAL.withDescription("bug"),
            Status.NOT_FOUND.withDescription("object vanished")}) {
            try (Fixtures.Harness h = new Fixtures.Harness(breaksAfter(2, status), Fixtures.config())) {
                InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0);
                byte[] buffer = new byte[2 * CHUNK];
                int n = in.readNBytes(buffer, 0, buffer.length);
                assertEquals(2 * CHUNK, n);
                assertArrayEquals(expected(2, CHUNK), buffer);
                IOException e = assertThrows(IOException.class, in::read, status.toString());
                assertTrue(e.getMessage().contains(status.getCode().name()), e.getMessage());
                assertTrue(e.getMessage().contains(status.getDescription()), e.getMessage());
                assertTrue(e.getMessage().contains("after " + (2 * CHUNK) + " bytes"), e.getMessage());
                // Still an error on the next read: never a late EOF.
                assertThrows(IOException.class, in::read);
                in.close();
            }
        }
    }

    @Test
    void readAllBytesOnABrokenStreamThrows() throws Exception {
        try (Fixtures.Harness h = new Fixtures.Harness(breaksAfter(3, Status.DATA_LOSS), Fixtures.config());
             InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
            assertThrows(IOException.class, in::readAllBytes);
        }
    }

    @Test
    void emptySegmentRangeIsCleanEof() throws Exception {
        RemoteStorageGrpc.RemoteStorageImplBase sidecar = new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
                observer.onNext(FetchSegmentResponse.newBuilder().build()); // an empty message is skipped
                observer.onCompleted();
            }
        };
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config());
             InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
            assertEquals(-1, in.read());
            assertEquals(-1, in.read(new byte[10]));
        }
    }

    @Test
    void openDeadlineCancelsASilentSidecar() throws Exception {
        StallingSidecar sidecar = new StallingSidecar(0);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.FETCH_DEADLINE_MS, "300"))) {
            long t0 = System.nanoTime();
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 0));
            long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
            assertTrue(ms >= 300 && ms < 3000, "took " + ms + " ms");
            assertTrue(e.getMessage().contains("DEADLINE_EXCEEDED"), e.getMessage());
            assertTrue(e.getMessage().contains("fetch.deadline.ms"), e.getMessage());
            assertTrue(sidecar.cancelled.await(5, TimeUnit.SECONDS));
            assertEquals(1, sidecar.calls.get(), "DEADLINE_EXCEEDED is not retried");
        }
    }

    @Test
    void aLongSlowStreamOutlivesTheOpenDeadline() throws Exception {
        RemoteStorageGrpc.RemoteStorageImplBase sidecar = new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
                try {
                    for (int i = 0; i < 8; i++) {
                        observer.onNext(FetchSegmentResponse.newBuilder()
                                .setData(ByteString.copyFrom(LazySidecar.chunk(i, 1000))).build());
                        Thread.sleep(100);
                    }
                    observer.onCompleted();
                } catch (InterruptedException e) {
                    observer.onError(e);
                }
            }
        };
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(
                ShimConfig.FETCH_DEADLINE_MS, "250", ShimConfig.FETCH_READ_TIMEOUT_MS, "2000"));
             InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
            assertArrayEquals(expected(8, 1000), in.readAllBytes());
        }
    }

    @Test
    void readTimeoutCancelsAStalledStream() throws Exception {
        StallingSidecar sidecar = new StallingSidecar(100);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.FETCH_READ_TIMEOUT_MS, "300"));
             InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
            assertEquals(100, in.readNBytes(100).length);
            IOException e = assertThrows(IOException.class, in::read);
            assertTrue(e.getMessage().contains("fetch.read.timeout.ms"), e.getMessage());
            assertTrue(e.getMessage().contains("after 100 bytes"), e.getMessage());
            assertTrue(sidecar.cancelled.await(5, TimeUnit.SECONDS));
        }
    }

    @Test
    void idleTimeoutCancelsAStreamTheBrokerForgot() throws Exception {
        LazySidecar sidecar = new LazySidecar(100, CHUNK);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.FETCH_IDLE_TIMEOUT_MS, "300"))) {
            InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0);
            assertTrue(sidecar.cancelled.await(5, TimeUnit.SECONDS), "idle stream not cancelled");
            IOException e = assertThrows(IOException.class, in::readAllBytes);
            assertTrue(e.getMessage().contains("fetch.idle.timeout.ms"), e.getMessage());
            in.close();
        }
    }

    @Test
    void idleTimeoutDoesNotHitAReaderThatKeepsReading() throws Exception {
        LazySidecar sidecar = new LazySidecar(12, 1000);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.FETCH_IDLE_TIMEOUT_MS, "300"));
             InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            byte[] b = new byte[1000];
            int n;
            while ((n = in.read(b)) > 0) {
                out.write(b, 0, n);
                Thread.sleep(100); // total 1.2 s, longer than the idle timeout, but never idle for 300 ms
            }
            assertArrayEquals(expected(12, 1000), out.toByteArray());
            assertEquals(1, sidecar.cancelled.getCount());
        }
    }

    @Test
    void positionsReachTheSidecar() throws Exception {
        LazySidecar sidecar = new LazySidecar(1, 10);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            h.rsm.fetchLogSegment(Fixtures.metadata(), 17).close();
            assertEquals(17, sidecar.request.getStartPosition());
            assertFalse(sidecar.request.hasEndPosition());

            h.rsm.fetchLogSegment(Fixtures.metadata(), 17, 99).close();
            assertEquals(17, sidecar.request.getStartPosition());
            assertEquals(99, sidecar.request.getEndPosition());

            h.rsm.fetchLogSegment(Fixtures.metadata(), 5L).close();
            assertEquals(5, sidecar.request.getStartPosition());
            assertFalse(sidecar.request.hasEndPosition());

            h.rsm.fetchLogSegment(Fixtures.metadata(), 5L, 1L << 40).close();
            assertEquals(Integer.MAX_VALUE, sidecar.request.getEndPosition(), "a long end is clamped");

            int before = sidecar.calls.get();
            assertThrows(RemoteStorageException.class, () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 1L << 31));
            assertThrows(IllegalArgumentException.class, () -> h.rsm.fetchLogSegment(Fixtures.metadata(), -1));
            assertThrows(IllegalArgumentException.class, () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 10, 9));
            assertThrows(IllegalArgumentException.class, () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 10L, 9L));
            assertEquals(before, sidecar.calls.get(), "invalid positions must not reach the sidecar");
        }
    }

    @Test
    void longOverloadsAreNotOverridesButPublic() throws Exception {
        var m1 = SidecarRemoteStorageManager.class.getMethod("fetchLogSegment",
                org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.class, long.class);
        var m2 = SidecarRemoteStorageManager.class.getMethod("fetchLogSegment",
                org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.class, long.class, long.class);
        assertEquals(InputStream.class, m1.getReturnType());
        assertEquals(InputStream.class, m2.getReturnType());
    }

    // ---- fetchIndex --------------------------------------------------------------------------

    static class IndexSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        /** Every request (fetchIndex(OFFSET) also starts the time and transaction calls: IndexPrefetch). */
        final java.util.List<IndexType> requests = new java.util.concurrent.CopyOnWriteArrayList<>();

        @Override
        public void fetchIndex(FetchIndexRequest req, StreamObserver<FetchIndexResponse> observer) {
            requests.add(req.getIndexType());
            switch (req.getIndexType()) {
                case TRANSACTION:
                    observer.onError(Status.NOT_FOUND.withDescription("segment has no transaction index")
                            .asRuntimeException());
                    return;
                case TIMESTAMP:
                    observer.onCompleted(); // an empty index file
                    return;
                default:
                    observer.onNext(FetchIndexResponse.newBuilder().setData(ByteString.copyFrom(Fixtures.content(3000, 1))).build());
                    observer.onNext(FetchIndexResponse.newBuilder().setData(ByteString.copyFrom(Fixtures.content(500, 2))).build());
                    observer.onCompleted();
            }
        }
    }

    @Test
    void fetchIndexStreamsTheIndexAndMapsMissingTransactionIndex() throws Exception {
        IndexSidecar sidecar = new IndexSidecar();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            for (RemoteStorageManager.IndexType type : new RemoteStorageManager.IndexType[] {
                RemoteStorageManager.IndexType.OFFSET, RemoteStorageManager.IndexType.PRODUCER_SNAPSHOT,
                RemoteStorageManager.IndexType.LEADER_EPOCH}) {
                try (InputStream in = h.rsm.fetchIndex(Fixtures.metadata(), type)) {
                    ByteArrayOutputStream want = new ByteArrayOutputStream();
                    want.writeBytes(Fixtures.content(3000, 1));
                    want.writeBytes(Fixtures.content(500, 2));
                    assertArrayEquals(want.toByteArray(), in.readAllBytes());
                    assertTrue(sidecar.requests.contains(IndexType.valueOf(type.name())), sidecar.requests.toString());
                }
            }
            try (InputStream in = h.rsm.fetchIndex(Fixtures.metadata(), RemoteStorageManager.IndexType.TIMESTAMP)) {
                assertEquals(0, in.readAllBytes().length);
            }
            RemoteResourceNotFoundException e = assertThrows(RemoteResourceNotFoundException.class,
                    () -> h.rsm.fetchIndex(Fixtures.metadata(), RemoteStorageManager.IndexType.TRANSACTION));
            assertTrue(e.getMessage().contains("no transaction index"), e.getMessage());
        }
    }

    @Test
    void fetchIndexDeadlineCoversTheWholeCall() throws Exception {
        StallingSidecar sidecar = new StallingSidecar(10);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.FETCH_INDEX_DEADLINE_MS, "300"));
             InputStream in = h.rsm.fetchIndex(Fixtures.metadata(), RemoteStorageManager.IndexType.OFFSET)) {
            IOException e = assertThrows(IOException.class, in::readAllBytes);
            assertTrue(e.getMessage().contains("DEADLINE_EXCEEDED"), e.getMessage());
            assertTrue(sidecar.cancelled.await(5, TimeUnit.SECONDS));
        }
    }
}
