package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.io.InputStream;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** A fetch without an end position is read in bounded windows (rsm.config.fetch.window.bytes). */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class WindowedFetchTest {

    static final int SIZE = 3 * 1024 * 1024 + 12_345;
    static final byte[] SEGMENT = Fixtures.content(SIZE, 7);
    static final int WINDOW = 64 * 1024;

    /** Serves [start, end] of SEGMENT in 16 KiB messages (end absent: to the end); records each request. */
    static class RangeSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final List<long[]> requests = new CopyOnWriteArrayList<>(); // {start, end or -1}
        final AtomicLong sent = new AtomicLong();
        /** Lies: ends every bounded window this many bytes early (0 = honest). */
        volatile int shortBy;
        /** Lies: ignores the end position. */
        volatile boolean ignoreEnd;
        /** Breaks this many calls with UNAVAILABLE after 48 KiB (the sidecar killed under a stream). */
        final java.util.concurrent.atomic.AtomicInteger breaks = new java.util.concurrent.atomic.AtomicInteger();

        @Override
        public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
            int start = req.getStartPosition();
            boolean bounded = req.hasEndPosition() && !ignoreEnd;
            requests.add(new long[] {start, req.hasEndPosition() ? req.getEndPosition() : -1});
            int end = bounded ? Math.min(req.getEndPosition() + 1 - shortBy, SIZE) : SIZE;
            boolean breaking = breaks.getAndUpdate(b -> Math.max(0, b - 1)) > 0;
            for (int p = start; p < end; p += 16 * 1024) {
                if (breaking && p - start >= 48 * 1024) {
                    observer.onError(io.grpc.Status.UNAVAILABLE.withDescription("Network closed for unknown reason")
                            .asRuntimeException());
                    return;
                }
                int n = Math.min(16 * 1024, end - p);
                sent.addAndGet(n);
                observer.onNext(FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(SEGMENT, p, n)).build());
            }
            observer.onCompleted();
        }
    }

    static RemoteLogSegmentMetadata metadata(int size) {
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(Fixtures.TIP, Uuid.randomUuid()), 100L, 199L,
                1_700_000_000_000L, 7, 1_700_000_001_000L, size, Optional.empty(),
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(0, 100L));
    }

    /** Plain windows: read-ahead (which over this in-process channel comes in messages) off. */
    static Map<String, String> config(int window) {
        Map<String, String> c = Fixtures.config();
        c.put(ShimConfig.FETCH_WINDOW_BYTES, String.valueOf(window));
        c.put(ShimConfig.FETCH_READAHEAD_BYTES, "0");
        return c;
    }

    @Test
    void readsTheWholeRestInDoublingWindowsAndEndsOnlyAtTheSegmentEnd() throws Exception {
        RangeSidecar sidecar = new RangeSidecar();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(WINDOW));
             InputStream in = h.rsm.fetchLogSegment(metadata(SIZE), 1000)) {
            assertArrayEquals(Arrays.copyOfRange(SEGMENT, 1000, SIZE), in.readAllBytes());
            assertEquals(-1, in.read());
        }
        long start = 1000;
        long window = WINDOW;
        for (int i = 0; i < sidecar.requests.size() - 1; i++) {
            long[] r = sidecar.requests.get(i);
            assertEquals(start, r[0], "window " + i);
            assertEquals(start + window - 1, r[1], "window " + i);
            start += window;
            window = i == 0 ? (256 * 1024) : window * 2;
        }
        long[] last = sidecar.requests.get(sidecar.requests.size() - 1);
        assertEquals(start, last[0]);
        assertEquals(-1, last[1], "the last window is open-ended");
        assertEquals(SIZE - 1000, sidecar.sent.get(), "every byte sent once");
    }

    @Test
    void aBrokerStyleReadOfOneFetchCostsOneWindow() throws Exception {
        RangeSidecar sidecar = new RangeSidecar();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(WINDOW))) {
            for (int start : new int[] {0, 70_000, 2_000_000}) {
                try (InputStream in = h.rsm.fetchLogSegment(metadata(SIZE), start)) {
                    // RemoteLogManager.read: read up to one fetch's worth, then close
                    assertArrayEquals(Arrays.copyOfRange(SEGMENT, start, start + WINDOW - 4096),
                            in.readNBytes(WINDOW - 4096));
                }
            }
        }
        assertEquals(3, sidecar.requests.size(), "one call per fetch");
        // the first read's window, then windows of what it took plus 64 KiB
        long later = WINDOW - 4096 + (64 * 1024);
        int[] starts = {0, 70_000, 2_000_000};
        long[] sizes = {WINDOW, later, later};
        for (int i = 0; i < 3; i++) {
            assertEquals(starts[i], sidecar.requests.get(i)[0]);
            assertEquals(starts[i] + sizes[i] - 1, sidecar.requests.get(i)[1], "window " + i);
        }
        // (a close may cancel a window before the sidecar has sent all of it)
        assertTrue(sidecar.sent.get() <= WINDOW + 2 * later, "the sidecar sent beyond the windows");
    }

    @Test
    void theNextReadOfAPartitionStartsWithWhatTheLastOneTook() throws Exception {
        RangeSidecar sidecar = new RangeSidecar();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(WINDOW))) {
            RemoteLogSegmentMetadata md = metadata(SIZE);
            try (InputStream in = h.rsm.fetchLogSegment(md, 0)) {
                // one fetch plus the producer batch before it: beyond the first window
                assertArrayEquals(Arrays.copyOfRange(SEGMENT, 0, 100_000), in.readNBytes(100_000));
            }
            assertEquals(2, sidecar.requests.size(), "the first window and a continuation");
            try (InputStream in = h.rsm.fetchLogSegment(md, 100_000)) {
                assertArrayEquals(Arrays.copyOfRange(SEGMENT, 100_000, 200_000), in.readNBytes(100_000));
            }
            assertEquals(3, sidecar.requests.size(), "one call: the window grew to the last read + 64 KiB");
            assertEquals(100_000 + 100_000 + (64 * 1024) - 1,
                    sidecar.requests.get(2)[1]);
        }
    }

    /**
     * A window whose call breaks (the sidecar killed or restarted under it) is asked for again
     * from where the reader stopped, to the same end: the reader sees every byte once, in order.
     */
    @Test
    void aBrokenWindowIsOpenedAgainWhereTheReaderStopped() throws Exception {
        RangeSidecar sidecar = new RangeSidecar();
        sidecar.breaks.set(2); // the first window, then its first resumption
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(WINDOW * 2));
             InputStream in = h.rsm.fetchLogSegment(metadata(SIZE), 1000)) {
            assertArrayEquals(Arrays.copyOfRange(SEGMENT, 1000, 1000 + 3 * WINDOW), in.readNBytes(3 * WINDOW));
        }
        long[] first = sidecar.requests.get(0);
        long[] again = sidecar.requests.get(1);
        long[] third = sidecar.requests.get(2);
        assertEquals(1000 + 2 * WINDOW - 1, first[1]);
        assertEquals(1000 + 48 * 1024, again[0], "opened again where the reader stopped");
        assertEquals(first[1], again[1], "to the same end");
        assertEquals(again[0] + 48 * 1024, third[0]);
        assertEquals(first[1], third[1]);
    }

    @Test
    void aWindowBrokenTooOftenFailsTheRead() throws Exception {
        RangeSidecar sidecar = new RangeSidecar();
        sidecar.breaks.set(3 /* WindowedFetchStream.MAX_RESUMES */ + 1);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(WINDOW * 8));
             InputStream in = h.rsm.fetchLogSegment(metadata(SIZE), 0)) {
            IOException e = assertThrows(IOException.class, in::readAllBytes);
            assertTrue(e.getMessage().contains("UNAVAILABLE"), e.getMessage());
        }
        assertEquals(3 /* WindowedFetchStream.MAX_RESUMES */ + 1, sidecar.requests.size());
    }

    @Test
    void aWindowEndedEarlyIsAnErrorNotTheEndOfTheSegment() throws Exception {
        RangeSidecar sidecar = new RangeSidecar();
        sidecar.shortBy = 100;
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(WINDOW));
             InputStream in = h.rsm.fetchLogSegment(metadata(SIZE), 0)) {
            IOException e = assertThrows(IOException.class, in::readAllBytes);
            assertTrue(e.getMessage().contains("short stream"), e.getMessage());
            assertTrue(e.getMessage().contains("[0, " + WINDOW + ")"), e.getMessage());
        }
    }

    @Test
    void aSidecarSendingBeyondTheWindowIsAnError() throws Exception {
        RangeSidecar sidecar = new RangeSidecar();
        sidecar.ignoreEnd = true;
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(WINDOW));
             InputStream in = h.rsm.fetchLogSegment(metadata(SIZE), 0)) {
            IOException e = assertThrows(IOException.class, in::readAllBytes);
            assertTrue(e.getMessage().contains("for the window [0, " + WINDOW + ")"), e.getMessage());
        }
    }

    @Test
    void windowZeroOrAnExplicitEndOrAShortRestIsOneCall() throws Exception {
        RangeSidecar sidecar = new RangeSidecar();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(0));
             InputStream in = h.rsm.fetchLogSegment(metadata(SIZE), 5)) {
            assertArrayEquals(Arrays.copyOfRange(SEGMENT, 5, SIZE), in.readAllBytes());
        }
        assertEquals(1, sidecar.requests.size());
        assertEquals(-1, sidecar.requests.get(0)[1]);

        RangeSidecar s2 = new RangeSidecar();
        try (Fixtures.Harness h = new Fixtures.Harness(s2, config(WINDOW))) {
            try (InputStream in = h.rsm.fetchLogSegment(metadata(SIZE), 5, 500_000)) {
                assertArrayEquals(Arrays.copyOfRange(SEGMENT, 5, 500_001), in.readAllBytes());
            }
            try (InputStream in = h.rsm.fetchLogSegment(metadata(SIZE), SIZE - WINDOW + 1)) {
                assertArrayEquals(Arrays.copyOfRange(SEGMENT, SIZE - WINDOW + 1, SIZE), in.readAllBytes());
            }
        }
        assertEquals(2, s2.requests.size());
        assertEquals(500_000, s2.requests.get(0)[1]);
        assertFalse(s2.requests.get(1)[1] >= 0, "the rest fits in a window: open-ended");
    }
}
