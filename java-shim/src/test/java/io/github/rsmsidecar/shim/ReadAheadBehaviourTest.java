package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.FetchEnd;
import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.FetchIndexResponse;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.github.rsmsidecar.shim.read.FrameSidecar;
import io.github.rsmsidecar.shim.read.ReaderProbe;
import io.grpc.stub.StreamObserver;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Read-ahead (rsm.config.fetch.readahead.bytes) as the broker sees it: the real shim reads from a
 * sidecar that speaks the fetch channel ({@link FrameSidecar}; deletes go to an in-process gRPC
 * service), and the test counts the requests the sidecar sees. The tests named {@code
 * withoutTheFetchChannel...} read from a sidecar without it (an older version), over gRPC.
 *
 * <p>The broker's way of reading: each fetch opens the segment at a position without an end,
 * reads about one consumer fetch and closes the stream; the next starts one batch (10,000 bytes
 * here) before where the last one stopped. Windows are 256 KiB, read-ahead windows 1 MiB.
 *
 * <p>A read that must start nothing in the background is checked once the shim's background
 * work is over ({@link ReaderProbe#awaitBackgroundIdle}), not after a guessed sleep.
 */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class ReadAheadBehaviourTest {

    static final int MIB = 1024 * 1024;
    static final int SIZE = 3 * MIB + 777;
    static final byte[] SEGMENT = Fixtures.content(SIZE, 11);
    /** Every index is these bytes. */
    static final byte[] INDEX = {1, 2, 3, 4, 5, 6, 7, 8};
    /** How an older sidecar answers the fetch channel's preface: an HTTP/2 SETTINGS frame. */
    static final byte[] HTTP2_SETTINGS = "\0\0\022\004\0\0\0\0".getBytes(StandardCharsets.ISO_8859_1);

    /**
     * Serves {@link #SEGMENT} for any segment over the fetch channel and over gRPC, each range in
     * 64 KiB pieces, and names {@link #nextSegment} at the end of a range that reaches the
     * segment's end and asks for it.
     */
    static final class Sidecar implements AutoCloseable {
        /** Range requests over either transport, in the order they arrived. */
        final List<FetchSegmentRequest> requests = new CopyOnWriteArrayList<>();
        final List<FetchSegmentRequest> overGrpc = new CopyOnWriteArrayList<>();
        final List<FetchIndexRequest> indexRequests = new CopyOnWriteArrayList<>();
        /** Named as the partition's next segment (null: none). */
        volatile SegmentMetadata nextSegment;
        /** Lies in read-ahead windows (1 MiB asked) only: sends this many bytes more (negative: fewer). */
        volatile int readAheadLongerBy;
        /** When set, read-ahead windows (1 MiB asked) are answered once it opens (at most 10 s). */
        volatile CountDownLatch readAheadGate;
        final FrameSidecar frames;

        final RemoteStorageGrpc.RemoteStorageImplBase grpc = new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
                requests.add(req);
                overGrpc.add(req);
                int start = req.getStartPosition();
                int sent = sentEnd(req);
                for (int p = start; p < sent; p += FrameSidecar.FRAME_BYTES) {
                    int n = Math.min(FrameSidecar.FRAME_BYTES, sent - p);
                    observer.onNext(FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(SEGMENT, p, n))
                            .build());
                }
                SegmentMetadata next = named(req);
                if (next != null) {
                    observer.onNext(FetchSegmentResponse.newBuilder().setNextSegment(next).build());
                }
                observer.onCompleted();
            }

            @Override
            public void fetchIndex(FetchIndexRequest req, StreamObserver<FetchIndexResponse> observer) {
                indexRequests.add(req);
                observer.onNext(FetchIndexResponse.newBuilder().setData(ByteString.copyFrom(INDEX)).build());
                observer.onCompleted();
            }

            @Override
            public void deleteSegment(DeleteSegmentRequest req, StreamObserver<DeleteSegmentResponse> observer) {
                observer.onNext(DeleteSegmentResponse.getDefaultInstance());
                observer.onCompleted();
            }
        };

        /** {@code fetchChannel} false: a sidecar without the channel (an older version). */
        Sidecar(boolean fetchChannel) throws IOException {
            frames = new FrameSidecar(this::answer, this::answerIndex);
            if (!fetchChannel) {
                frames.preface = HTTP2_SETTINGS;
            }
        }

        private void answer(FetchSegmentRequest req, DataOutputStream out) {
            requests.add(req);
            CountDownLatch gate = readAheadGate;
            if (gate != null && isReadAhead(req)) {
                try {
                    gate.await(10, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            int start = req.getStartPosition();
            int sent = sentEnd(req);
            FrameSidecar.data(out, SEGMENT, start, sent, FrameSidecar.FRAME_BYTES);
            FetchEnd.Builder end = FetchEnd.newBuilder().setLength(sent - start);
            SegmentMetadata next = named(req);
            if (next != null) {
                end.setNextSegment(next);
            }
            FrameSidecar.end(out, end.build());
        }

        private void answerIndex(FetchIndexRequest req, DataOutputStream out) {
            indexRequests.add(req);
            FrameSidecar.data(out, INDEX, 0, INDEX.length);
            FrameSidecar.end(out, FetchEnd.newBuilder().setLength(INDEX.length).build());
        }

        /** Where the bytes sent for {@code req} end (exclusive): the range's end, unless it lies. */
        private int sentEnd(FetchSegmentRequest req) {
            int end = end(req);
            return isReadAhead(req) ? Math.min(end + readAheadLongerBy, SIZE) : end;
        }

        private SegmentMetadata named(FetchSegmentRequest req) {
            SegmentMetadata next = nextSegment;
            return req.getWantNextSegment() && end(req) == SIZE ? next : null;
        }

        /** The configuration of a shim reading from this sidecar, with {@code more} keys and values. */
        Map<String, String> config(String... more) {
            Map<String, String> c = Fixtures.config(ShimConfig.SIDECAR_TARGET, frames.target(),
                    ShimConfig.FETCH_WINDOW_BYTES, "262144", ShimConfig.FETCH_READAHEAD_BYTES, String.valueOf(MIB));
            for (int i = 0; i < more.length; i += 2) {
                c.put(more[i], more[i + 1]);
            }
            return c;
        }

        Fixtures.Harness shim(String... more) throws IOException {
            return Fixtures.Harness.withFetchChannel(grpc, config(more));
        }

        @Override
        public void close() throws IOException {
            CountDownLatch gate = readAheadGate;
            if (gate != null) {
                gate.countDown();
            }
            frames.close();
        }
    }

    static int end(FetchSegmentRequest r) {
        return r.hasEndPosition() ? Math.min(r.getEndPosition() + 1, SIZE) : SIZE;
    }

    static long asked(FetchSegmentRequest r) {
        return end(r) - r.getStartPosition();
    }

    /** A read-ahead window: 1 MiB, or what is left of the segment after the window before. */
    static boolean isReadAhead(FetchSegmentRequest r) {
        return asked(r) == MIB || (!r.hasEndPosition() && asked(r) < MIB);
    }

    static String describe(List<FetchSegmentRequest> requests) {
        return requests.stream().map(r -> r.getMetadata().getSegmentId().substring(0, 4) + "@" + r.getStartPosition()
                + "+" + asked(r)).toList().toString();
    }

    /** Each of {@code requests} asked for one plain window (well under a read-ahead window). */
    static void assertPlainWindows(List<FetchSegmentRequest> requests) {
        for (FetchSegmentRequest r : requests) {
            assertTrue(asked(r) < MIB / 2, "a plain window, not a read-ahead: " + describe(List.of(r)));
        }
    }

    /**
     * The requests the sidecar has seen once the shim's read-aheads and index prefetches are over:
     * any the reads so far started have arrived, and no more will.
     */
    static List<FetchSegmentRequest> settled(Fixtures.Harness h, Sidecar sidecar) throws InterruptedException {
        assertTrue(ReaderProbe.awaitBackgroundIdle(h.rsm.reader()), "background reads still under way after 10 s");
        return List.copyOf(sidecar.requests);
    }

    /** Waits at most 10 s until the sidecar has seen {@code n} range requests; then it must have seen exactly that many. */
    static void awaitRequests(Sidecar sidecar, int n) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (sidecar.requests.size() < n && System.nanoTime() < deadline) {
            Thread.sleep(2);
        }
        assertEquals(n, sidecar.requests.size(), describe(sidecar.requests));
    }

    static List<FetchSegmentRequest> from(List<FetchSegmentRequest> requests, int first) {
        return requests.subList(first, requests.size());
    }

    /** Reads {@code n} bytes from {@code start} as the broker does (open-ended fetch, read, close); where it stopped. */
    static int brokerRead(Fixtures.Harness h, RemoteLogSegmentMetadata md, int start, int n) throws Exception {
        try (InputStream in = h.rsm.fetchLogSegment(md, start)) {
            assertArrayEquals(range(start, n), in.readNBytes(n), "bytes at " + start);
        }
        return start + n;
    }

    /** Reads {@code md} from 0 to its end as a sequential consumer does, in 200,000-byte fetches. */
    static void readToTheEnd(Fixtures.Harness h, RemoteLogSegmentMetadata md) throws Exception {
        int position = brokerRead(h, md, 0, 200_000);
        while (position < SIZE) {
            int from = position - 10_000;
            position = brokerRead(h, md, from, Math.min(200_000, SIZE - from));
        }
    }

    static byte[] range(int start, int length) {
        return Arrays.copyOfRange(SEGMENT, start, start + length);
    }

    /** A new segment of the fixtures' partition, offsets 100..199. */
    static RemoteLogSegmentMetadata md() {
        return segment(Uuid.randomUuid(), 100, 199);
    }

    /** Segment {@code id} of the fixtures' partition, offsets {@code first..last}, {@link #SIZE} bytes. */
    static RemoteLogSegmentMetadata segment(Uuid id, long first, long last) {
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(Fixtures.TIP, id), first, last,
                1_700_000_000_000L, 7, 1_700_000_001_000L, SIZE, Optional.empty(),
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(0, first));
    }

    /** Two consecutive segments of the fixtures' partition (offsets 0-99 and 100-199), new per test. */
    final RemoteLogSegmentMetadata first = segment(Uuid.randomUuid(), 0, 99);
    final RemoteLogSegmentMetadata next = segment(Uuid.randomUuid(), 100, 199);

    /**
     * {@link #next} as storage could hold it under its id: claiming other offsets (up to 150) than
     * the broker's metadata says.
     */
    SegmentMetadata nextWithOtherOffsets() {
        return MetadataMapper.toProto(next).toBuilder().setEndOffset(150).build();
    }

    /** A segment of partition {@code p} of the fixtures' topic. */
    static RemoteLogSegmentMetadata partitionSegment(int p) {
        TopicIdPartition tip = new TopicIdPartition(Fixtures.TIP.topicId(), p, Fixtures.TIP.topic());
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(tip, Uuid.randomUuid()), 100L, 199L,
                1_700_000_000_000L, 7, 1_700_000_001_000L, SIZE, Optional.empty(),
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(0, 100L));
    }

    static List<FetchSegmentRequest> requestsFor(List<FetchSegmentRequest> requests, RemoteLogSegmentMetadata md) {
        String id = md.remoteLogSegmentId().id().toString();
        return requests.stream().filter(r -> r.getMetadata().getSegmentId().equals(id)).toList();
    }

    static List<FetchIndexRequest> indexRequestsFor(Sidecar sidecar, RemoteLogSegmentMetadata md) {
        String id = md.remoteLogSegmentId().id().toString();
        return List.copyOf(sidecar.indexRequests).stream().filter(r -> r.getMetadata().getSegmentId().equals(id))
                .toList();
    }

    /** Two sequential reads of {@code md}; the second keeps its window and reads the next ahead. Where that one starts. */
    static int sequentialReadWithAWindowAhead(Fixtures.Harness h, Sidecar sidecar, RemoteLogSegmentMetadata md)
            throws Exception {
        brokerRead(h, md, brokerRead(h, md, 0, 100_000), 100_000);
        List<FetchSegmentRequest> r = requestsFor(settled(h, sidecar), md);
        assertEquals(3, r.size(), describe(r));
        assertTrue(isReadAhead(r.get(2)), describe(r));
        return r.get(2).getStartPosition();
    }

    /** A scenario run against a sidecar, with or without the fetch channel. */
    @FunctionalInterface
    interface Scenario {
        void run(Fixtures.Harness h, Sidecar sidecar) throws Exception;
    }

    /** {@code scenario} against a sidecar with the fetch channel: every range goes over it. */
    static void overTheFetchChannel(Scenario scenario) throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            scenario.run(h, sidecar);
            assertTrue(sidecar.overGrpc.isEmpty(), "every range over the fetch channel");
        }
    }

    // ---- a sequential reader -----------------------------------------------------------------

    @Test
    void aSequentialReaderIsServedFromReadAheadWindowsReceivedInTheBackground() throws Exception {
        overTheFetchChannel(ReadAheadBehaviourTest::readSequentiallyFromReadAheadWindows);
    }

    /**
     * A sequential reader of a new segment: it waits for its first two windows only; every later
     * window is read ahead in the background, once each.
     */
    static void readSequentiallyFromReadAheadWindows(Fixtures.Harness h, Sidecar sidecar) throws Exception {
        RemoteLogSegmentMetadata md = md();
        int position = brokerRead(h, md, 0, 200_000);
        List<FetchSegmentRequest> r = settled(h, sidecar);
        assertEquals(1, r.size(), "the first read of a partition: one plain window, nothing ahead");
        assertEquals(262_143, r.get(0).getEndPosition());
        position = brokerRead(h, md, position - 10_000, 200_000);
        // the second continues the first: one plain window, kept, and the window after it read
        // ahead at once, before any reader needs it (this read stopped well inside the kept one)
        r = settled(h, sidecar);
        assertEquals(3, r.size(), describe(r));
        assertFalse(isReadAhead(r.get(1)), "the reader waits for one window only: " + describe(r));
        assertTrue(r.get(1).getEndPosition() + 1 < SIZE && position < r.get(1).getEndPosition(), describe(r));
        assertEquals(r.get(1).getEndPosition() + 1, r.get(2).getStartPosition());
        assertTrue(isReadAhead(r.get(2)), describe(r));
        while (position < SIZE - 250_000) {
            position = brokerRead(h, md, position - 10_000, 200_000);
        }
        // 3 MiB in 200 kB fetches: every later window was read ahead, each once, end to end
        r = settled(h, sidecar);
        assertEquals(2 + 3, r.size(), describe(r));
        for (int i = 2; i < r.size(); i++) {
            assertTrue(isReadAhead(r.get(i)), "a read-ahead window: " + describe(r));
            assertEquals(end(r.get(i - 1)), r.get(i).getStartPosition(), "no byte asked for twice: " + describe(r));
        }
        assertEquals(SIZE, end(r.get(r.size() - 1)));
        // reads crossing a kept window's end continue seamlessly into the next (the last two are kept)
        brokerRead(h, md, r.get(3).getStartPosition() + MIB - 100, 300_000);
        assertEquals(r.size(), settled(h, sidecar).size(), "served from the kept windows");
        brokerRead(h, md, 0, SIZE);
    }

    @Test
    void aSequentialReadAtASegmentsTailKeepsTheWindowToItsEnd() throws Exception {
        // the default first window (1 MiB + 64 KiB) reaches the end of the segment from here on
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim(ShimConfig.FETCH_WINDOW_BYTES,
                String.valueOf(ShimConfig.DEFAULT_FETCH_WINDOW_BYTES))) {
            RemoteLogSegmentMetadata md = md();
            int position = brokerRead(h, md, SIZE - 900_000, 100_000);
            position = brokerRead(h, md, position - 1000, 100_000); // sequential: its window is kept
            List<FetchSegmentRequest> r = settled(h, sidecar);
            assertEquals(2, r.size(), describe(r));
            assertFalse(r.get(1).hasEndPosition(), "open-ended to the segment's end");
            while (position < SIZE - 100_000) {
                position = brokerRead(h, md, position - 1000, 100_000);
            }
            brokerRead(h, md, SIZE - 500, 500);
            assertEquals(2, settled(h, sidecar).size(), "the rest of the segment came from the kept window");
        }
    }

    // ---- across a segment's end --------------------------------------------------------------

    @Test
    void theNextSegmentsFirstWindowIsReadAheadWhileTheBrokerLoadsItsIndexes() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            RemoteLogSegmentMetadata first = md();
            RemoteLogSegmentMetadata next = md();
            brokerRead(h, first, SIZE - 100_000, 100_000); // a read that reaches its segment's end
            int calls = settled(h, sidecar).size();
            // the broker's first use of the next segment: its indexes (offset first), then a read from 0
            try (InputStream in = h.rsm.fetchIndex(next, IndexType.OFFSET)) {
                assertArrayEquals(INDEX, in.readAllBytes());
            }
            List<FetchSegmentRequest> r = settled(h, sidecar);
            assertEquals(calls + 1, r.size(), describe(r));
            FetchSegmentRequest ahead = r.get(calls);
            assertEquals(next.remoteLogSegmentId().id().toString(), ahead.getMetadata().getSegmentId());
            assertEquals(0, ahead.getStartPosition());
            assertTrue(isReadAhead(ahead), "a read-ahead window: " + describe(r));
            try (InputStream in = h.rsm.fetchIndex(next, IndexType.TIMESTAMP)) {
                assertArrayEquals(INDEX, in.readAllBytes());
            }
            int position = brokerRead(h, next, 0, 200_000);
            brokerRead(h, next, position - 10_000, 200_000);
            // the reads made no call: what followed is the read-ahead of the window after this one
            r = from(settled(h, sidecar), calls);
            assertEquals(2, r.size(), describe(r));
            assertEquals(MIB, r.get(1).getStartPosition());
            assertTrue(isReadAhead(r.get(1)), describe(r));
        }
    }

    @Test
    void theNextSegmentsFirstWindowIsReadAheadFromTheLastWindowOfTheSegmentBefore() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            sidecar.nextSegment = MetadataMapper.toProto(next);
            int position = brokerRead(h, first, 0, 200_000);
            while (position < SIZE - 400_000) { // into the last window (from 2,552,688)
                position = brokerRead(h, first, position - 10_000, 200_000);
            }
            // the read-ahead of the last window asked the sidecar to name the next segment, and a
            // read inside that window read the named segment's first window ahead
            List<FetchSegmentRequest> r = settled(h, sidecar);
            List<FetchSegmentRequest> toTheEnd = requestsFor(r, first).stream().filter(q -> !q.hasEndPosition())
                    .toList();
            assertEquals(1, toTheEnd.size(), "one window reached the end: " + describe(r));
            assertTrue(toTheEnd.get(0).getWantNextSegment() && isReadAhead(toTheEnd.get(0)), describe(r));
            List<FetchSegmentRequest> ahead = requestsFor(r, next);
            assertEquals(1, ahead.size(), "the next segment's first window: " + describe(r));
            assertEquals(0, ahead.get(0).getStartPosition());
            assertEquals(MIB - 1, ahead.get(0).getEndPosition());
            assertFalse(ahead.get(0).getWantNextSegment());
            // the reader finishes the segment from the last window, kept beside the next one's first
            int calls = r.size();
            while (position < SIZE) {
                int from = position - 10_000;
                position = brokerRead(h, first, from, Math.min(200_000, SIZE - from));
            }
            r = settled(h, sidecar);
            assertEquals(calls, r.size(), "the last window was dropped: " + describe(from(r, calls)));

            // the broker moves on to the next segment (no index call: its index cache had them)
            position = brokerRead(h, next, 0, 200_000);
            brokerRead(h, next, position - 10_000, 200_000);
            r = from(settled(h, sidecar), calls);
            assertEquals(1, r.size(), "only the window after it: " + describe(r));
            assertTrue(isReadAhead(r.get(0)) && r.get(0).getStartPosition() == MIB, describe(r));
        }
    }

    @Test
    void aNextSegmentNamedWithOtherOffsetsThanTheBrokersIsNeverServed() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            sidecar.nextSegment = nextWithOtherOffsets();
            readToTheEnd(h, first);
            List<FetchSegmentRequest> asked = requestsFor(settled(h, sidecar), next);
            assertEquals(1, asked.size(), "read ahead as named: " + describe(asked));
            assertEquals(150, asked.get(0).getMetadata().getEndOffset());
            brokerRead(h, next, 0, 200_000);
            asked = requestsFor(settled(h, sidecar), next);
            assertTrue(asked.size() >= 2, "the broker's read asked for its own window: " + describe(asked));
            assertEquals(0, asked.get(1).getStartPosition(), describe(asked));
            for (FetchSegmentRequest q : from(asked, 1)) {
                assertEquals(199, q.getMetadata().getEndOffset(), "with the broker's metadata");
            }

            // a name for another partition, or one that does not start right after, is not read at all
            for (SegmentMetadata wrong : new SegmentMetadata[] {
                MetadataMapper.toProto(segment(Uuid.randomUuid(), 100, 199)).toBuilder().setPartition(5).build(),
                MetadataMapper.toProto(segment(Uuid.randomUuid(), 101, 199)),
            }) {
                sidecar.nextSegment = wrong;
                RemoteLogSegmentMetadata before = segment(Uuid.randomUuid(), 0, 99);
                readToTheEnd(h, before);
                List<FetchSegmentRequest> r = settled(h, sidecar);
                assertTrue(requestsFor(r, before).stream().anyMatch(FetchSegmentRequest::getWantNextSegment),
                        "the sidecar was asked to name the next segment: " + describe(r));
                String id = wrong.getSegmentId();
                assertTrue(r.stream().noneMatch(q -> q.getMetadata().getSegmentId().equals(id)), "read: " + wrong);
                assertTrue(sidecar.indexRequests.stream().noneMatch(q -> q.getMetadata().getSegmentId().equals(id)),
                        "indexes asked for: " + wrong);
            }
        }
    }

    @Test
    void loadingASegmentsIndexesReadsNothingAheadUnlessTheLastReadReachedItsSegmentsEnd() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            RemoteLogSegmentMetadata first = md();
            h.rsm.fetchIndex(md(), IndexType.OFFSET).close(); // no read of the partition yet
            brokerRead(h, first, 100_000, 100_000); // stops in the middle of its segment
            int calls = settled(h, sidecar).size();
            assertEquals(1, calls);
            h.rsm.fetchIndex(md(), IndexType.OFFSET).close(); // e.g. a timestamp lookup elsewhere
            brokerRead(h, first, SIZE - 100_000, 100_000); // a seek to the end
            h.rsm.fetchIndex(md(), IndexType.TIMESTAMP).close(); // only the offset index starts it
            List<FetchSegmentRequest> r = settled(h, sidecar);
            assertEquals(calls + 1, r.size(), "only the seek's own window: " + describe(r));
        }
    }

    // ---- kept windows ------------------------------------------------------------------------

    @Test
    void aReaderInterruptedInsideAKeptWindowDoesNotBreakItForTheNextReader() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            RemoteLogSegmentMetadata md = md();
            sequentialReadWithAWindowAhead(h, sidecar, md); // the second read's window is kept
            int calls = sidecar.requests.size();
            // Kafka cancels remote reads with Future.cancel(true): the reader thread is interrupted
            Thread.currentThread().interrupt();
            try (InputStream in = h.rsm.fetchLogSegment(md, 150_000)) {
                assertArrayEquals(range(150_000, 1000), in.readNBytes(1000));
                assertTrue(Thread.currentThread().isInterrupted(), "the reader keeps its interrupt status");
            } finally {
                Thread.interrupted();
            }
            assertEquals(calls, settled(h, sidecar).size(), "served from the kept window");
            brokerRead(h, md, 160_000, 100_000);
            assertEquals(calls, settled(h, sidecar).size(), "still served from the kept window");
        }
    }

    @Test
    void aStreamStillReadingADroppedWindowKeepsItsBytesUntilItCloses() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            RemoteLogSegmentMetadata md = md();
            int ahead = sequentialReadWithAWindowAhead(h, sidecar, md);
            int calls = sidecar.requests.size();
            try (InputStream in = h.rsm.fetchLogSegment(md, ahead)) {
                assertArrayEquals(range(ahead, 1000), in.readNBytes(1000));
                List<FetchSegmentRequest> r = from(settled(h, sidecar), calls);
                assertEquals(1, r.size(), "served from the kept window, reading the next one ahead: " + describe(r));
                assertEquals(ahead + MIB, r.get(0).getStartPosition());
                // the window is dropped while the stream reads it (a delete; the bound alike): the
                // stream still reads the window's bytes, all of them the right ones
                h.rsm.deleteLogSegmentData(md);
                assertArrayEquals(range(ahead + 1000, 200_000), in.readNBytes(200_000));
                assertEquals(calls + 1, settled(h, sidecar).size(), "from the dropped window: no call");
            }
            // dropped indeed: a new read of the same bytes asks the sidecar
            brokerRead(h, md, ahead + 1000, 100_000);
            List<FetchSegmentRequest> r = from(settled(h, sidecar), calls + 1);
            assertFalse(r.isEmpty(), "the dropped window served a new read");
            assertEquals(ahead + 1000, r.get(0).getStartPosition());
        }
    }

    @Test
    void aReaderThatSeeksAsksForOneWindowNotAReadAhead() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            RemoteLogSegmentMetadata md = md();
            brokerRead(h, md, 3 * MIB - 200_000, 100_000); // the segment's tail
            brokerRead(h, md, 10_000, 100_000);            // far back: a seek
            brokerRead(h, md, 5 * MIB / 2, 100_000);       // far ahead: a seek
            List<FetchSegmentRequest> r = settled(h, sidecar);
            assertEquals(3, r.size(), describe(r));
            assertFalse(r.get(0).hasEndPosition(), "the tail: open-ended to the segment's end");
            assertPlainWindows(r.subList(1, 3));
        }
    }

    @Test
    void readingTheSamePositionAgainReadsNothingAhead() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            RemoteLogSegmentMetadata md = md();
            // a retry, or a second consumer at the same offset: it ends near where the last read
            // ended, but does not continue it
            for (int i = 0; i < 3; i++) {
                brokerRead(h, md, 500_000, 200_000);
            }
            brokerRead(h, md, 400_000, 200_000); // before the last read's start: not forward either
            brokerRead(h, md, 400_000, 200_000);
            List<FetchSegmentRequest> r = settled(h, sidecar);
            assertEquals(5, r.size(), describe(r));
            assertPlainWindows(r);
        }
    }

    @Test
    void aDeletedSegmentIsNeverServedFromItsReadAheadWindow() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            RemoteLogSegmentMetadata md = md();
            int ahead = sequentialReadWithAWindowAhead(h, sidecar, md);
            // inside the read-ahead window: no call but the read-ahead of the window after it, which
            // the sidecar holds until the delete is done
            sidecar.readAheadGate = new CountDownLatch(1);
            brokerRead(h, md, ahead + 1000, 100_000);
            awaitRequests(sidecar, 4);
            FetchSegmentRequest after = sidecar.requests.get(3);
            assertTrue(isReadAhead(after) && after.getStartPosition() == ahead + MIB, describe(sidecar.requests));
            h.rsm.deleteLogSegmentData(md);
            brokerRead(h, md, ahead + 200_000, 1000);
            assertTrue(sidecar.requests.size() > 4, "after the delete the fetch asks the sidecar");
            assertEquals(ahead + 200_000, sidecar.requests.get(4).getStartPosition());
            // nor from the window that was being read ahead at the delete, received whole after it
            sidecar.readAheadGate.countDown();
            List<FetchSegmentRequest> r = settled(h, sidecar);
            int calls = r.size();
            brokerRead(h, md, ahead + MIB + 1000, 1000);
            r = settled(h, sidecar);
            assertTrue(r.size() > calls, "served from the read-ahead of a deleted segment: " + describe(r));
            assertEquals(ahead + MIB + 1000, r.get(calls).getStartPosition());
        }
    }

    @Test
    void readAheadWindowsKeptAreBoundedAndDroppedLeastRecentlyUsedFirst() throws Exception {
        try (Sidecar sidecar = new Sidecar(true);
             Fixtures.Harness h = sidecar.shim(ShimConfig.FETCH_READAHEAD_MAX_BYTES, String.valueOf(3 * MIB))) {
            List<RemoteLogSegmentMetadata> partitions = List.of(partitionSegment(0), partitionSegment(1),
                    partitionSegment(2));
            // each partition's second read keeps its plain window (256 KiB) and reads ahead from its
            // end (1 MiB), while that fits: the third partition's read-ahead would not
            int[] requests = {3, 6, 8};
            for (int i = 0; i < 3; i++) {
                RemoteLogSegmentMetadata p = partitions.get(i);
                brokerRead(h, p, brokerRead(h, p, 0, 100_000), 100_000);
                List<FetchSegmentRequest> r = settled(h, sidecar);
                assertEquals(requests[i], r.size(), "partition " + i + ": " + describe(r));
            }
            List<FetchSegmentRequest> r = settled(h, sidecar);
            assertPlainWindows(r.subList(6, 8)); // no read-ahead beyond the bound
            brokerRead(h, partitions.get(0), 400_000, 100_000); // inside kept windows: no call
            brokerRead(h, partitions.get(1), 400_000, 100_000);
            assertEquals(8, settled(h, sidecar).size());
            // partition 2 reads on: a second plain window, 3 MiB kept in all
            brokerRead(h, partitions.get(2), 400_000, 100_000);
            assertEquals(9, settled(h, sidecar).size());
            // partition 0 is read again, inside its read-ahead window: partition 1 is now the least
            // recently read (the first one kept is not)
            brokerRead(h, partitions.get(0), 1_000_000, 100_000);
            assertEquals(9, settled(h, sidecar).size());
            // a fourth partition's first kept window overflows the bound: the least recently read
            // partition (1) loses its oldest window, and only that
            RemoteLogSegmentMetadata p3 = partitionSegment(3);
            brokerRead(h, p3, brokerRead(h, p3, 0, 100_000), 100_000);
            assertEquals(11, settled(h, sidecar).size());
            brokerRead(h, partitions.get(0), 150_000, 100_000);
            brokerRead(h, partitions.get(1), 1_000_000, 100_000);
            brokerRead(h, partitions.get(2), 450_000, 100_000);
            assertEquals(11, settled(h, sidecar).size(), "partition 0's and 2's windows and 1's read-ahead were kept");
            brokerRead(h, partitions.get(1), 150_000, 100_000);
            r = settled(h, sidecar);
            assertEquals(12, r.size(), "partition 1's plain window was dropped: " + describe(r));
            assertEquals(partitions.get(1).remoteLogSegmentId().id().toString(), r.get(11).getMetadata().getSegmentId());
            assertEquals(150_000, r.get(11).getStartPosition());
        }
    }

    @Test
    void aReadAheadWindowOfAnotherLengthThanAskedIsNotKept() throws Exception {
        overTheFetchChannel(ReadAheadBehaviourTest::readAheadWindowsOfAnotherLengthAreNotKept);
    }

    /**
     * The sidecar lies in every read-ahead window (set before the reads that start one): 1000
     * bytes fewer than asked for, then 1000 more. The reader gets the right bytes, asked for again.
     */
    static void readAheadWindowsOfAnotherLengthAreNotKept(Fixtures.Harness h, Sidecar sidecar) throws Exception {
        for (int lie : new int[] {-1000, 1000}) {
            sidecar.readAheadLongerBy = lie;
            RemoteLogSegmentMetadata md = md();
            int ahead = sequentialReadWithAWindowAhead(h, sidecar, md);
            int calls = sidecar.requests.size();
            brokerRead(h, md, ahead + 1000, 100_000);
            List<FetchSegmentRequest> r = from(settled(h, sidecar), calls);
            assertFalse(r.isEmpty(), lie + ": served from a window of another length");
            assertEquals(ahead + 1000, r.get(0).getStartPosition(), lie + ": " + describe(r));
        }
    }

    // ---- the next segment's indexes ------------------------------------------------------------

    @Test
    void theNextSegmentsIndexesAskedForWithItsFirstWindowAnswerTheBrokersCalls() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            sidecar.nextSegment = MetadataMapper.toProto(next);
            readToTheEnd(h, first);
            settled(h, sidecar);
            List<FetchIndexRequest> asked = indexRequestsFor(sidecar, next);
            assertEquals(Set.of(io.github.rsmsidecar.proto.v1.IndexType.OFFSET,
                            io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP,
                            io.github.rsmsidecar.proto.v1.IndexType.TRANSACTION),
                    asked.stream().map(FetchIndexRequest::getIndexType).collect(Collectors.toSet()),
                    "the next segment's three indexes, asked for ahead: " + asked);
            assertEquals(3, asked.size());
            // the broker changes segment: it loads the indexes (offset, time, transaction), then reads
            for (IndexType type : List.of(IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.TRANSACTION)) {
                try (InputStream in = h.rsm.fetchIndex(next, type)) {
                    assertArrayEquals(INDEX, in.readAllBytes(), type.toString());
                }
            }
            brokerRead(h, next, 0, 200_000);
            settled(h, sidecar);
            assertEquals(3, indexRequestsFor(sidecar, next).size(), "the broker's index calls made no call of their own");
            // each answer serves once: the broker loading them again asks the sidecar
            try (InputStream in = h.rsm.fetchIndex(next, IndexType.OFFSET)) {
                assertArrayEquals(INDEX, in.readAllBytes());
            }
            assertTrue(indexRequestsFor(sidecar, next).size() >= 4, "asked again");
        }
    }

    @Test
    void aNextSegmentsIndexesAskedForUnderOtherOffsetsThanTheBrokersAreNeverServed() throws Exception {
        try (Sidecar sidecar = new Sidecar(true); Fixtures.Harness h = sidecar.shim()) {
            sidecar.nextSegment = nextWithOtherOffsets();
            readToTheEnd(h, first);
            settled(h, sidecar);
            assertEquals(3, indexRequestsFor(sidecar, next).size(), "asked ahead as named");
            try (InputStream in = h.rsm.fetchIndex(next, IndexType.OFFSET)) {
                assertArrayEquals(INDEX, in.readAllBytes());
            }
            List<FetchIndexRequest> asked = indexRequestsFor(sidecar, next);
            assertEquals(3, asked.stream().filter(r -> r.getMetadata().getEndOffset() == 150).count(), "" + asked);
            assertTrue(asked.stream().anyMatch(r -> r.getMetadata().getEndOffset() == 199
                            && r.getIndexType() == io.github.rsmsidecar.proto.v1.IndexType.OFFSET),
                    "the broker's call asked for itself, with the broker's metadata: " + asked);
        }
    }

    // ---- a sidecar without the fetch channel: over gRPC ----------------------------------------

    @Test
    void withoutTheFetchChannelASequentialReaderIsServedFromReadAheadWindowsOverGrpc() throws Exception {
        try (Sidecar sidecar = new Sidecar(false); Fixtures.Harness h = sidecar.shim()) {
            readSequentiallyFromReadAheadWindows(h, sidecar);
            assertEquals(sidecar.requests, sidecar.overGrpc, "every range over gRPC");
            assertEquals(1, sidecar.frames.connections.get(), "the fetch channel tried once (again after 60 s)");
            assertTrue(sidecar.frames.requests.isEmpty());
        }
    }

    @Test
    void withoutTheFetchChannelAReadAheadWindowOfAnotherLengthIsNotKept() throws Exception {
        try (Sidecar sidecar = new Sidecar(false); Fixtures.Harness h = sidecar.shim()) {
            readAheadWindowsOfAnotherLengthAreNotKept(h, sidecar);
            assertEquals(sidecar.requests, sidecar.overGrpc, "every range over gRPC");
        }
    }
}
