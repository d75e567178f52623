package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.CopySegmentRequest;
import io.github.rsmsidecar.proto.v1.CopySegmentResponse;
import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.grpc.Status;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.nio.file.Path;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * Kafka 3.6-3.9.0 interrupts reader threads in the middle of RSM calls (pitfall 4), and copy tasks
 * are cancelled with interrupts on leadership changes. An interrupt must cancel the gRPC call (the
 * sidecar sees it), end the shim call with an exception, and leave the interrupt flag set.
 */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class InterruptTest {

    @TempDir
    Path dir;

    /** Hangs every call until cancelled; counts down {@code cancelled} when the client cancels. */
    static final class HangingSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final CountDownLatch started = new CountDownLatch(1);
        final CountDownLatch cancelled = new CountDownLatch(1);
        final boolean sendOneChunk;

        HangingSidecar(boolean sendOneChunk) {
            this.sendOneChunk = sendOneChunk;
        }

        @Override
        public void fetchSegment(FetchSegmentRequest request, StreamObserver<FetchSegmentResponse> observer) {
            ((ServerCallStreamObserver<FetchSegmentResponse>) observer).setOnCancelHandler(cancelled::countDown);
            if (sendOneChunk) {
                observer.onNext(FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(new byte[10])).build());
            }
            started.countDown();
        }

        @Override
        public void deleteSegment(DeleteSegmentRequest request, StreamObserver<DeleteSegmentResponse> observer) {
            ((ServerCallStreamObserver<DeleteSegmentResponse>) observer).setOnCancelHandler(cancelled::countDown);
            started.countDown();
        }

        @Override
        public StreamObserver<CopySegmentRequest> copySegment(StreamObserver<CopySegmentResponse> observer) {
            ServerCallStreamObserver<CopySegmentResponse> s = (ServerCallStreamObserver<CopySegmentResponse>) observer;
            s.setOnCancelHandler(cancelled::countDown);
            s.disableAutoRequest();
            s.request(1); // takes CopyBegin, then never asks for more: the client must wait
            return new StreamObserver<>() {
                public void onNext(CopySegmentRequest v) {
                    started.countDown();
                }

                public void onError(Throwable t) {
                }

                public void onCompleted() {
                }
            };
        }
    }

    interface Body {
        void run() throws Exception;
    }

    /** Runs {@code body} on a thread, interrupts it once {@code started}, returns what it threw. */
    static Throwable interruptDuring(CountDownLatch started, Body body, AtomicBoolean flagAfter) throws Exception {
        return interruptDuring(started, body, flagAfter, t -> true);
    }

    /** Whether thread {@code t} sleeps in the Retrier's back-off (not in the call before it). */
    static boolean inRetryBackoff(Thread t) {
        boolean sleeping = false;
        boolean retrier = false;
        for (StackTraceElement frame : t.getStackTrace()) {
            sleeping |= frame.getClassName().equals("java.lang.Thread") && frame.getMethodName().startsWith("sleep");
            retrier |= frame.getClassName().endsWith(".Retrier");
        }
        return sleeping && retrier;
    }

    /** As above, interrupting only once {@code ready} holds of the calling thread (within 5 s). */
    static Throwable interruptDuring(CountDownLatch started, Body body, AtomicBoolean flagAfter,
                                     java.util.function.Predicate<Thread> ready) throws Exception {
        AtomicReference<Throwable> thrown = new AtomicReference<>();
        Thread t = new Thread(() -> {
            try {
                body.run();
            } catch (Throwable e) {
                thrown.set(e);
            }
            flagAfter.set(Thread.currentThread().isInterrupted());
        });
        t.start();
        assertTrue(started.await(5, TimeUnit.SECONDS), "the call never reached the sidecar");
        Thread.sleep(100); // let the shim block
        long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        while (!ready.test(t) && System.nanoTime() < until) {
            Thread.sleep(10);
        }
        t.interrupt();
        t.join(5000);
        assertTrue(!t.isAlive(), "the shim call did not return after the interrupt");
        return thrown.get();
    }

    /** Interrupts {@code body} once the hanging sidecar has the call: the call ends with a
     * RemoteStorageException, the interrupt flag stays set and the sidecar sees the cancel. */
    static Throwable assertInterruptCancelsTheCall(HangingSidecar sidecar, Body body) throws Exception {
        AtomicBoolean flag = new AtomicBoolean();
        Throwable e = interruptDuring(sidecar.started, body, flag);
        assertInstanceOf(RemoteStorageException.class, e);
        assertTrue(flag.get(), "interrupt flag lost");
        assertTrue(sidecar.cancelled.await(5, TimeUnit.SECONDS), "sidecar did not see the cancel");
        return e;
    }

    @Test
    void interruptDuringDelete() throws Exception {
        HangingSidecar sidecar = new HangingSidecar(false);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            Throwable e = assertInterruptCancelsTheCall(sidecar, () -> h.rsm.deleteLogSegmentData(Fixtures.metadata()));
            assertTrue(e.getMessage().contains("interrupted"), e.getMessage());
        }
    }

    @Test
    void interruptWhileOpeningAFetch() throws Exception {
        HangingSidecar sidecar = new HangingSidecar(false);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            assertInterruptCancelsTheCall(sidecar, () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 0));
        }
    }

    @Test
    void interruptWhileReadingAFetch() throws Exception {
        HangingSidecar sidecar = new HangingSidecar(true);
        AtomicBoolean flag = new AtomicBoolean();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            InputStream in = h.rsm.fetchLogSegment(Fixtures.metadata(), 0);
            AtomicInteger got = new AtomicInteger();
            Throwable e = interruptDuring(sidecar.started, () -> {
                got.set(in.readNBytes(10).length);
                in.read(); // blocks: the sidecar sends nothing more
            }, flag);
            assertEquals(10, got.get());
            assertInstanceOf(InterruptedIOException.class, e);
            assertTrue(flag.get(), "interrupt flag lost");
            assertTrue(sidecar.cancelled.await(5, TimeUnit.SECONDS), "sidecar did not see the cancel");
            in.close();
        }
    }

    @Test
    void interruptWhileACopyWaitsForFlowControl() throws Exception {
        HangingSidecar sidecar = new HangingSidecar(false);
        AtomicBoolean flag = new AtomicBoolean();
        LogSegmentData data = Fixtures.segmentData(dir, 4 << 20, 10, 10, 10, null, Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            Throwable e = interruptDuring(sidecar.started, () -> h.rsm.copyLogSegmentData(Fixtures.metadata(), data), flag);
            assertInstanceOf(RemoteStorageException.class, e);
            assertTrue(flag.get(), "interrupt flag lost");
            assertTrue(sidecar.cancelled.await(5, TimeUnit.SECONDS), "sidecar did not see the cancel");
        }
    }

    @Test
    void interruptDuringRetryBackoffStopsRetrying() throws Exception {
        AtomicInteger calls = new AtomicInteger();
        CountDownLatch first = new CountDownLatch(1);
        RemoteStorageGrpc.RemoteStorageImplBase down = new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public void deleteSegment(DeleteSegmentRequest request, StreamObserver<DeleteSegmentResponse> observer) {
                calls.incrementAndGet();
                observer.onError(Status.UNAVAILABLE.asRuntimeException());
                first.countDown();
            }
        };
        AtomicBoolean flag = new AtomicBoolean();
        try (Fixtures.Harness h = new Fixtures.Harness(down, Fixtures.config(ShimConfig.RETRY_MAX_ATTEMPTS, "5",
                ShimConfig.RETRY_INITIAL_BACKOFF_MS, "10000", ShimConfig.RETRY_MAX_BACKOFF_MS, "10000"))) {
            long t0 = System.nanoTime();
            // on a loaded machine the first call's answer may still be on its way after 100 ms
            Throwable e = interruptDuring(first, () -> h.rsm.deleteLogSegmentData(Fixtures.metadata()), flag,
                    InterruptTest::inRetryBackoff);
            assertTrue(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0) < 5000);
            assertInstanceOf(RemoteStorageException.class, e);
            assertTrue(e.getMessage().contains("interrupted while waiting to retry"), e.getMessage());
            assertTrue(flag.get(), "interrupt flag lost");
            assertEquals(1, calls.get());
        }
    }
}
