package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.FetchIndexResponse;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.HandoffFile;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.Optional;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * Fetch hand-off (rsm.config.fetch.handoff): over a Unix socket the sidecar may answer with a file
 * in {@code <socket>.handoff/}. The sidecar here is in-process; the shim's target names a socket
 * path in a temp directory, so the hand-off directory is real and the shim reads real files.
 */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class HandoffTest {

    static final int SIZE = 3 * 1024 * 1024 + 777;
    static final byte[] SEGMENT = Fixtures.content(SIZE, 11);

    /** What the sidecar writes into the hand-off file and what it announces. */
    enum Behaviour { HONEST, PATH_IN_NAME, SYMLINK, LONGER_THAN_ANNOUNCED, MISSING, UNASKED }

    /** Hands off [start, end] when asked (as the real sidecar does), else streams 64 KiB messages. */
    static final class HandoffSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final Path dir;
        final List<FetchSegmentRequest> requests = new CopyOnWriteArrayList<>();
        volatile Behaviour behaviour = Behaviour.HONEST;
        /** Larger fetches are streamed, as the sidecar's fetch.handoff_max_bytes does. */
        volatile int handoffMaxBytes = Integer.MAX_VALUE;
        /** Lies: hands off (and announces) this many bytes less than asked for. */
        volatile int shortBy;
        /** Named as the next segment in a hand-off to the segment's end that asks for it (null: none). */
        volatile SegmentMetadata nextSegment;
        /** Lies: streams this many bytes less than asked for in read-ahead windows (only those). */
        volatile int readAheadStreamShortBy;

        HandoffSidecar(Path dir) {
            this.dir = dir;
        }

        @Override
        public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
            requests.add(req);
            int start = req.getStartPosition();
            int end = req.hasEndPosition() ? Math.min(req.getEndPosition() + 1, SIZE) : SIZE;
            byte[] range = Arrays.copyOfRange(SEGMENT, start, end - (req.getAcceptHandoff() ? shortBy : 0));
            if ((req.getAcceptHandoff() && range.length <= handoffMaxBytes) || behaviour == Behaviour.UNASKED) {
                try {
                    String name = UUID.randomUUID().toString().replace("-", "");
                    Path file = dir.resolve(name);
                    String announced = name;
                    long length = range.length;
                    switch (behaviour) {
                        case PATH_IN_NAME:
                            Files.write(dir.getParent().resolve("outside"), range);
                            announced = "../outside";
                            break;
                        case SYMLINK:
                            Path target = dir.getParent().resolve("target-" + name);
                            Files.write(target, range);
                            Files.createSymbolicLink(file, target);
                            break;
                        case LONGER_THAN_ANNOUNCED:
                            Files.write(file, Arrays.copyOfRange(SEGMENT, start, end + 1));
                            break;
                        case MISSING:
                            break;
                        default:
                            Files.write(file, range);
                    }
                    FetchSegmentResponse.Builder response = FetchSegmentResponse.newBuilder()
                            .setHandoff(HandoffFile.newBuilder().setName(announced).setLength(length));
                    SegmentMetadata next = nextSegment;
                    if (req.getWantNextSegment() && end == SIZE && next != null) {
                        response.setNextSegment(next);
                    }
                    observer.onNext(response.build());
                    observer.onCompleted();
                    return;
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
            }
            int streamShortBy = isReadAhead(req) ? readAheadStreamShortBy : 0;
            streamData(Arrays.copyOf(range, range.length - streamShortBy), observer, false);
            SegmentMetadata next = nextSegment;
            if (req.getWantNextSegment() && end == SIZE && next != null) { // named after the data
                observer.onNext(FetchSegmentResponse.newBuilder().setNextSegment(next).build());
            }
            observer.onCompleted();
        }

        /** Every index is these bytes. */
        static final byte[] INDEX = {1, 2, 3, 4, 5, 6, 7, 8};

        final List<FetchIndexRequest> indexRequests = new CopyOnWriteArrayList<>();

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

        private static void streamData(byte[] range, StreamObserver<FetchSegmentResponse> observer, boolean end) {
            for (int p = 0; p < range.length; p += 64 * 1024) {
                int n = Math.min(64 * 1024, range.length - p);
                observer.onNext(FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(range, p, n)).build());
            }
            if (end) {
                observer.onCompleted();
            }
        }
    }

    static RemoteLogSegmentMetadata md() { // a new segment id each time
        return WindowedFetchTest.metadata(SIZE);
    }

    static Map<String, String> config(Path socket, String... more) {
        Map<String, String> c = Fixtures.config(more);
        c.put(ShimConfig.SIDECAR_TARGET, "unix://" + socket);
        return c;
    }

    static HandoffSidecar sidecar(Path tmp) throws IOException {
        Path dir = Files.createDirectories(tmp.resolve("rsm.sock.handoff"));
        return new HandoffSidecar(dir);
    }

    static byte[] range(int start, int length) {
        return Arrays.copyOfRange(SEGMENT, start, start + length);
    }

    @Test
    void aFetchOverAUnixSocketReadsTheHandedOffFileAndDeletesIt(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(tmp.resolve("rsm.sock")))) {
            for (int start : new int[] {0, 123_456, SIZE - 5000}) {
                try (InputStream in = h.rsm.fetchLogSegment(md(), start)) {
                    int want = Math.min(1024 * 1024, SIZE - start);
                    assertArrayEquals(range(start, want), in.readNBytes(want));
                }
            }
            try (InputStream in = h.rsm.fetchLogSegment(md(), 1000, 9999)) {
                assertArrayEquals(range(1000, 9000), in.readAllBytes());
            }
        }
        assertEquals(4, sidecar.requests.size(), "one call per fetch");
        assertTrue(sidecar.requests.stream().allMatch(FetchSegmentRequest::getAcceptHandoff));
        try (var files = Files.list(sidecar.dir)) {
            assertEquals(0, files.count(), "every handed-off file was deleted once open");
        }
    }

    @Test
    void aWindowedReadPastTheFirstWindowContinuesWithMoreHandOffs(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar,
                config(tmp.resolve("rsm.sock"), ShimConfig.FETCH_WINDOW_BYTES, "65536"));
             InputStream in = h.rsm.fetchLogSegment(md(), 10)) {
            assertArrayEquals(range(10, SIZE - 10), in.readAllBytes());
            assertEquals(-1, in.read());
        }
        assertTrue(sidecar.requests.size() > 3, "several windows");
        assertTrue(sidecar.requests.stream().allMatch(FetchSegmentRequest::getAcceptHandoff));
    }

    @Test
    void aFileTheShimMustNotReadTurnsHandOffOffAndTheFetchIsAskedAgainWithoutIt(@TempDir Path tmp) throws Exception {
        for (Behaviour b : List.of(Behaviour.PATH_IN_NAME, Behaviour.SYMLINK, Behaviour.LONGER_THAN_ANNOUNCED,
                Behaviour.MISSING)) {
            Path root = Files.createDirectories(tmp.resolve(b.name()));
            HandoffSidecar sidecar = sidecar(root);
            sidecar.behaviour = b;
            try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(root.resolve("rsm.sock")))) {
                for (int start : new int[] {5000, 600_000}) {
                    try (InputStream in = h.rsm.fetchLogSegment(md(), start)) {
                        assertArrayEquals(range(start, 500_000), in.readNBytes(500_000), b.name());
                    }
                }
            }
            // the first fetch: offered, failed, asked again without; the second: not offered (off for 60 s)
            assertEquals(3, sidecar.requests.size(), b.name());
            assertTrue(sidecar.requests.get(0).getAcceptHandoff(), b.name());
            assertFalse(sidecar.requests.get(1).getAcceptHandoff(), b.name());
            assertFalse(sidecar.requests.get(2).getAcceptHandoff(), b.name());
        }
    }

    @Test
    void handOffIsNeverOfferedWhenTurnedOffOrOverTcp(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar,
                config(tmp.resolve("rsm.sock"), ShimConfig.FETCH_HANDOFF, "false"));
             InputStream in = h.rsm.fetchLogSegment(md(), 0)) {
            assertArrayEquals(range(0, 300_000), in.readNBytes(300_000));
        }
        Map<String, String> tcp = Fixtures.config(ShimConfig.SIDECAR_TARGET, "127.0.0.1:9095");
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcp);
             InputStream in = h.rsm.fetchLogSegment(md(), 0)) {
            assertArrayEquals(range(0, 300_000), in.readNBytes(300_000));
        }
        assertEquals(2, sidecar.requests.size());
        assertFalse(sidecar.requests.get(0).getAcceptHandoff());
        assertFalse(sidecar.requests.get(1).getAcceptHandoff());
        assertNull(ShimConfig.parse(tcp).handoffDir());
        assertEquals(tmp.resolve("rsm.sock.handoff"), ShimConfig.parse(config(tmp.resolve("rsm.sock"))).handoffDir());
    }

    @Test
    void aHandOffNobodyAskedForIsAnErrorNotSilence(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        sidecar.behaviour = Behaviour.UNASKED;
        Map<String, String> tcp = Fixtures.config(ShimConfig.SIDECAR_TARGET, "127.0.0.1:9095");
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcp)) {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.fetchLogSegment(md(), 0, 999).close());
            assertTrue(e.getMessage().contains("hand-off file that was not asked for"), e.getMessage());
        }
    }

    // ---- read-ahead (rsm.config.fetch.readahead.bytes) ----------------------------------------

    static final int MIB = 1024 * 1024;

    static Map<String, String> readAheadConfig(Path tmp, String... more) {
        Map<String, String> c = config(tmp.resolve("rsm.sock"), ShimConfig.FETCH_WINDOW_BYTES, "262144",
                ShimConfig.FETCH_READAHEAD_BYTES, String.valueOf(MIB));
        for (int i = 0; i < more.length; i += 2) {
            c.put(more[i], more[i + 1]);
        }
        return c;
    }

    /** Reads {@code n} bytes from {@code start} as the broker does (open-ended fetch, read, close); where it stopped. */
    static int brokerRead(Fixtures.Harness h, RemoteLogSegmentMetadata md, int start, int n) throws Exception {
        try (InputStream in = h.rsm.fetchLogSegment(md, start)) {
            assertArrayEquals(range(start, n), in.readNBytes(n), "bytes at " + start);
        }
        return start + n;
    }

    static long asked(FetchSegmentRequest r) {
        return (r.hasEndPosition() ? r.getEndPosition() + 1 : SIZE) - r.getStartPosition();
    }

    static boolean isReadAhead(FetchSegmentRequest r) {
        return asked(r) == MIB || (!r.hasEndPosition() && asked(r) < MIB);
    }

    /**
     * The requests from index {@code first} on, copied: background read-aheads may add more while
     * a test looks at them.
     */
    static List<FetchSegmentRequest> from(List<FetchSegmentRequest> requests, int first) {
        List<FetchSegmentRequest> copy = List.copyOf(requests);
        return copy.subList(first, copy.size());
    }

    /** Each of {@code requests} asked for one plain window (well under a read-ahead window). */
    static void assertPlainWindows(List<FetchSegmentRequest> requests) {
        for (FetchSegmentRequest r : requests) {
            assertTrue(asked(r) < MIB / 2, "a plain window, not a read-ahead: " + r);
        }
    }

    /** Waits until the sidecar has had {@code n} requests (background read-ahead is asynchronous). */
    static void awaitRequests(HandoffSidecar sidecar, int n) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        while (sidecar.requests.size() < n && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        assertEquals(n, sidecar.requests.size(), "requests");
    }

    @Test
    void aSequentialReaderIsServedFromReadAheadFilesAskedForInTheBackground(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            // the broker's way: each fetch starts one "batch" (10,000 bytes here) before where the last one stopped
            int position = brokerRead(h, md, 0, 200_000);
            assertEquals(1, sidecar.requests.size(), "the first read of a partition: one plain window");
            assertEquals(262_143, sidecar.requests.get(0).getEndPosition());
            position = brokerRead(h, md, position - 10_000, 200_000);
            // the second continues the first: one plain window, and the read-ahead from its end at once
            awaitRequests(sidecar, 3);
            assertFalse(isReadAhead(sidecar.requests.get(1)), "the reader waits for one window only");
            assertEquals(sidecar.requests.get(1).getEndPosition() + 1, sidecar.requests.get(2).getStartPosition());
            assertTrue(isReadAhead(sidecar.requests.get(2)));
            while (position < SIZE - 250_000) {
                position = brokerRead(h, md, position - 10_000, 200_000);
            }
            // 3 MiB in 200 kB fetches: every later window was read ahead, none waited for
            assertTrue(sidecar.requests.size() <= 2 + 3, "calls: " + sidecar.requests.size());
            for (FetchSegmentRequest r : from(sidecar.requests, 2)) {
                assertTrue(isReadAhead(r), "a read-ahead window: " + r);
                assertTrue(r.getAcceptHandoff());
            }
            // reads crossing a kept window's end continue seamlessly into the next
            brokerRead(h, md, sidecar.requests.get(2).getStartPosition() + MIB - 100, 300_000);
            brokerRead(h, md, 0, SIZE);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (handoffFilesWaiting(sidecar.dir) > 0 && System.nanoTime() < deadline) {
                Thread.sleep(5); // the last read's read-ahead may still be under way
            }
            assertEquals(0, handoffFilesWaiting(sidecar.dir), "every handed-off file was deleted once open");
        }
        assertEquals(0, openHandoffFiles(sidecar.dir), "close() released every kept file");
    }

    @Test
    void aSequentialReadAtASegmentsTailKeepsTheWindowToItsEnd(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata md = md();
        // the default first window (1 MiB + 64 KiB) reaches the end of the segment from here on
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(tmp.resolve("rsm.sock"),
                ShimConfig.FETCH_READAHEAD_BYTES, String.valueOf(MIB)))) {
            int position = brokerRead(h, md, SIZE - 900_000, 100_000);
            position = brokerRead(h, md, position - 1000, 100_000); // sequential: its window is kept
            assertEquals(2, sidecar.requests.size());
            assertFalse(sidecar.requests.get(1).hasEndPosition(), "open-ended to the segment's end");
            while (position < SIZE - 100_000) {
                position = brokerRead(h, md, position - 1000, 100_000);
            }
            brokerRead(h, md, SIZE - 500, 500);
            assertEquals(2, sidecar.requests.size(), "the rest of the segment came from the kept window");
        }
    }

    @Test
    void theNextSegmentsFirstWindowIsReadAheadWhileTheBrokerLoadsItsIndexes(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata first = md();
        RemoteLogSegmentMetadata next = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            brokerRead(h, first, SIZE - 100_000, 100_000); // a read that reaches its segment's end
            int calls = sidecar.requests.size();
            // the broker's first use of the next segment: its indexes (offset first), then a read from 0
            try (InputStream in = h.rsm.fetchIndex(next, IndexType.OFFSET)) {
                assertArrayEquals(HandoffSidecar.INDEX, in.readAllBytes());
            }
            awaitRequests(sidecar, calls + 1);
            FetchSegmentRequest ahead = sidecar.requests.get(calls);
            assertEquals(next.remoteLogSegmentId().id().toString(), ahead.getMetadata().getSegmentId());
            assertEquals(0, ahead.getStartPosition());
            assertTrue(isReadAhead(ahead) && ahead.getAcceptHandoff(), "a read-ahead window: " + ahead);
            try (InputStream in = h.rsm.fetchIndex(next, IndexType.TIMESTAMP)) {
                assertArrayEquals(HandoffSidecar.INDEX, in.readAllBytes());
            }
            int position = brokerRead(h, next, 0, 200_000);
            brokerRead(h, next, position - 10_000, 200_000);
            // the reads made no call: what followed is the read-ahead of the window after this one
            for (FetchSegmentRequest r : from(sidecar.requests, calls)) {
                assertTrue(isReadAhead(r), "the reads came from the window read ahead: " + r);
            }
        }
    }

    /** Segment {@code id} of the fixtures' partition, offsets {@code first..last}, {@link #SIZE} bytes. */
    static RemoteLogSegmentMetadata segment(Uuid id, long first, long last) {
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(Fixtures.TIP, id), first, last,
                1_700_000_000_000L, 7, 1_700_000_001_000L, SIZE, Optional.empty(),
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(0, first));
    }

    /** Reads {@code md} from 0 to its end as a sequential consumer does, in 200,000-byte fetches. */
    static void readToTheEnd(Fixtures.Harness h, RemoteLogSegmentMetadata md) throws Exception {
        int position = brokerRead(h, md, 0, 200_000);
        while (position < SIZE) {
            int from = position - 10_000;
            position = brokerRead(h, md, from, Math.min(200_000, SIZE - from));
        }
    }

    /** The requests for segment {@code id}, copied. */
    static List<FetchSegmentRequest> requestsFor(HandoffSidecar sidecar, Uuid id) {
        return List.copyOf(sidecar.requests).stream()
                .filter(r -> r.getMetadata().getSegmentId().equals(id.toString())).toList();
    }

    @Test
    void theNextSegmentsFirstWindowIsReadAheadFromTheLastWindowOfTheSegmentBefore(@TempDir Path tmp)
            throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata first = segment(Uuid.randomUuid(), 0, 99);
        RemoteLogSegmentMetadata next = segment(Uuid.randomUuid(), 100, 199);
        sidecar.nextSegment = MetadataMapper.toProto(next);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            readToTheEnd(h, first);
            // the read-ahead of the last window asked the sidecar to name the next segment, and a
            // read inside that window read the named segment's first window ahead
            List<FetchSegmentRequest> toTheEnd = requestsFor(sidecar, first.remoteLogSegmentId().id()).stream()
                    .filter(r -> !r.hasEndPosition()).toList();
            assertEquals(1, toTheEnd.size(), "one window reached the end: " + toTheEnd);
            assertTrue(toTheEnd.get(0).getWantNextSegment() && isReadAhead(toTheEnd.get(0)));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (requestsFor(sidecar, next.remoteLogSegmentId().id()).isEmpty() && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            List<FetchSegmentRequest> ahead = requestsFor(sidecar, next.remoteLogSegmentId().id());
            assertEquals(1, ahead.size(), "the next segment's first window: " + ahead);
            assertEquals(0, ahead.get(0).getStartPosition());
            assertEquals(MIB - 1, ahead.get(0).getEndPosition());
            assertTrue(ahead.get(0).getAcceptHandoff() && !ahead.get(0).getWantNextSegment());

            // the broker moves on to the next segment (no index call: its index cache had them)
            int calls = sidecar.requests.size();
            int position = brokerRead(h, next, 0, 200_000);
            brokerRead(h, next, position - 10_000, 200_000);
            for (FetchSegmentRequest r : from(sidecar.requests, calls)) {
                assertTrue(isReadAhead(r) && r.getStartPosition() >= MIB, "only the window after it: " + r);
            }
        }
    }

    @Test
    void aNextSegmentNamedWithOtherOffsetsThanTheBrokersIsNeverServed(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata first = segment(Uuid.randomUuid(), 0, 99);
        RemoteLogSegmentMetadata next = segment(Uuid.randomUuid(), 100, 199);
        // what storage holds under that id claims other offsets than the broker's metadata says
        sidecar.nextSegment = MetadataMapper.toProto(next).toBuilder().setEndOffset(150).build();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            readToTheEnd(h, first);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (requestsFor(sidecar, next.remoteLogSegmentId().id()).isEmpty() && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            assertEquals(1, requestsFor(sidecar, next.remoteLogSegmentId().id()).size(), "read ahead as named");
            brokerRead(h, next, 0, 200_000);
            List<FetchSegmentRequest> asked = requestsFor(sidecar, next.remoteLogSegmentId().id());
            assertTrue(asked.size() >= 2, "the broker's read asked for its own window: " + asked);
            assertEquals(199, asked.get(1).getMetadata().getEndOffset(), "with the broker's metadata");

            // a name for another partition, or one that does not start right after, is not read at all
            for (SegmentMetadata wrong : new SegmentMetadata[] {
                MetadataMapper.toProto(segment(Uuid.randomUuid(), 100, 199)).toBuilder().setPartition(5).build(),
                MetadataMapper.toProto(segment(Uuid.randomUuid(), 101, 199)),
            }) {
                sidecar.nextSegment = wrong;
                readToTheEnd(h, segment(Uuid.randomUuid(), 0, 99));
                Thread.sleep(100); // a read-ahead, if one were started, would have been asked for by now
                assertTrue(requestsFor(sidecar, Uuid.fromString(wrong.getSegmentId())).isEmpty(), "read: " + wrong);
            }
        }
    }

    @Test
    void loadingASegmentsIndexesReadsNothingAheadUnlessTheLastReadReachedItsSegmentsEnd(@TempDir Path tmp)
            throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata first = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            h.rsm.fetchIndex(md(), IndexType.OFFSET).close(); // no read of the partition yet
            brokerRead(h, first, 100_000, 100_000); // stops in the middle of its segment
            int calls = sidecar.requests.size();
            h.rsm.fetchIndex(md(), IndexType.OFFSET).close(); // e.g. a timestamp lookup elsewhere
            brokerRead(h, first, SIZE - 100_000, 100_000); // a seek to the end
            h.rsm.fetchIndex(md(), IndexType.TIMESTAMP).close(); // only the offset index starts it
            Thread.sleep(100); // a read-ahead, if one were started, would have been asked for by now
            assertEquals(calls + 1, sidecar.requests.size(), "only the seek's own window: " + sidecar.requests);
        }
    }

    @Test
    void aReaderInterruptedInsideAKeptWindowDoesNotBreakItForTheNextReader(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            brokerRead(h, md, brokerRead(h, md, 0, 100_000), 100_000); // the second read's window is kept
            awaitRequests(sidecar, 3); // and the window after it is read ahead
            int calls = sidecar.requests.size();
            // Kafka cancels remote reads with Future.cancel(true): the reader thread is interrupted
            Thread.currentThread().interrupt();
            try (InputStream in = h.rsm.fetchLogSegment(md, 150_000)) {
                assertArrayEquals(range(150_000, 1000), in.readNBytes(1000));
                assertTrue(Thread.currentThread().isInterrupted(), "the reader keeps its interrupt status");
            } finally {
                Thread.interrupted();
            }
            assertEquals(calls, sidecar.requests.size(), "served from the kept window");
            brokerRead(h, md, 160_000, 100_000); // failed with ClosedChannelException before the fix
            assertEquals(calls, sidecar.requests.size(), "still served from the kept window");
        }
    }

    @Test
    void aStreamStillReadingADroppedWindowKeepsItsBytesUntilItCloses(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            int ahead = sequentialReadWithAWindowAhead(h, sidecar, md);
            int calls = sidecar.requests.size();
            try (InputStream in = h.rsm.fetchLogSegment(md, ahead)) {
                assertArrayEquals(range(ahead, 1000), in.readNBytes(1000));
                for (FetchSegmentRequest r : from(sidecar.requests, calls)) {
                    assertTrue(isReadAhead(r), "served from the kept window, reading the next one ahead: " + r);
                }
                // the window is dropped while the stream reads it (a delete; the LRU bound alike):
                // the stream's own reference keeps the mapping, and the bytes are the right ones
                h.rsm.deleteLogSegmentData(md);
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
                while (openHandoffFiles(sidecar.dir) > 1 && System.nanoTime() < deadline) {
                    Thread.sleep(5); // a read-ahead under way at the delete lets go of its file
                }
                assertEquals(1, openHandoffFiles(sidecar.dir), "only the reading stream holds the file");
                assertArrayEquals(range(ahead + 1000, 200_000), in.readNBytes(200_000));
            }
            assertEquals(0, openHandoffFiles(sidecar.dir), "unmapped when the last reader closed");
        }
    }

    @Test
    void aReaderThatSeeksAsksForOneWindowNotARead_ahead(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            brokerRead(h, md, 3 * MIB - 200_000, 100_000); // the segment's tail
            brokerRead(h, md, 10_000, 100_000);            // far back: a seek
            brokerRead(h, md, 5 * MIB / 2, 100_000);       // far ahead: a seek
            Thread.sleep(100); // a read-ahead, if one were started, would have been asked for by now
        }
        assertEquals(3, sidecar.requests.size());
        assertFalse(sidecar.requests.get(0).hasEndPosition(), "the tail: open-ended to the segment's end");
        assertPlainWindows(List.copyOf(sidecar.requests).subList(1, 3));
    }

    @Test
    void readingTheSamePositionAgainReadsNothingAhead(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            // a retry, or a second consumer at the same offset: it ends near where the last read
            // ended, but does not continue it
            for (int i = 0; i < 3; i++) {
                brokerRead(h, md, 500_000, 200_000);
            }
            brokerRead(h, md, 400_000, 200_000); // before the last read's start: not forward either
            brokerRead(h, md, 400_000, 200_000);
            Thread.sleep(100); // a read-ahead, if one were started, would have been asked for by now
        }
        assertEquals(5, sidecar.requests.size());
        assertPlainWindows(sidecar.requests);
    }

    @Test
    void aDeletedSegmentIsNeverServedFromItsReadAheadFile(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            long ahead = sequentialReadWithAWindowAhead(h, sidecar, md);
            brokerRead(h, md, (int) ahead + 1000, 100_000);
            awaitRequests(sidecar, 4); // inside the read-ahead window: no call but the next read-ahead
            assertTrue(isReadAhead(sidecar.requests.get(3)), "the window after: " + sidecar.requests.get(3));
            assertEquals(ahead + MIB, sidecar.requests.get(3).getStartPosition());
            h.rsm.deleteLogSegmentData(md);
            // (a read-ahead still under way when the delete came keeps nothing and lets go of its file)
            assertEquals(0, eventuallyNoHandoffFiles(sidecar.dir), "the deleted segment's kept files are closed");
            try (InputStream in = h.rsm.fetchLogSegment(md, (int) ahead + 200_000)) {
                in.readNBytes(1000);
            }
            assertTrue(sidecar.requests.size() > 4, "after the delete the fetch asks the sidecar");
            assertEquals(ahead + 200_000, sidecar.requests.get(4).getStartPosition());
        }
    }

    @Test
    void readAheadWindowsKeptAreBoundedAndDroppedLeastRecentlyUsedFirst(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar,
                readAheadConfig(tmp, ShimConfig.FETCH_READAHEAD_MAX_BYTES, String.valueOf(3 * MIB)))) {
            List<RemoteLogSegmentMetadata> partitions = List.of(partitionSegment(0), partitionSegment(1),
                    partitionSegment(2));
            // each partition's second read keeps its plain window (256 KiB) and reads ahead from its
            // end (1 MiB), while that fits: the third partition's read-ahead would not
            int[] requests = {3, 6, 8};
            for (int i = 0; i < 3; i++) {
                RemoteLogSegmentMetadata p = partitions.get(i);
                brokerRead(h, p, brokerRead(h, p, 0, 100_000), 100_000);
                awaitRequests(sidecar, requests[i]);
            }
            Thread.sleep(100);
            assertEquals(8, sidecar.requests.size(), "no read-ahead beyond the bound");
            assertPlainWindows(List.copyOf(sidecar.requests).subList(6, 8));
            assertEquals(5, openHandoffFiles(sidecar.dir), "2 + 2 + 1 windows kept");
            brokerRead(h, partitions.get(0), 400_000, 100_000); // inside kept windows: no call
            brokerRead(h, partitions.get(1), 400_000, 100_000);
            assertEquals(8, sidecar.requests.size());
            // partition 2 reads on: a second plain window, 3 MiB kept in all
            brokerRead(h, partitions.get(2), 400_000, 100_000);
            assertEquals(9, sidecar.requests.size());
            // a fourth partition's first kept window overflows the bound: the least recently read
            // partition (0) loses its oldest window, and only that
            RemoteLogSegmentMetadata p3 = partitionSegment(3);
            brokerRead(h, p3, brokerRead(h, p3, 0, 100_000), 100_000);
            assertEquals(11, sidecar.requests.size());
            brokerRead(h, partitions.get(1), 150_000, 100_000);
            brokerRead(h, partitions.get(0), 1_000_000, 100_000);
            assertEquals(11, sidecar.requests.size(), "partition 1's windows and 0's read-ahead were kept");
            brokerRead(h, partitions.get(0), 150_000, 100_000);
            assertEquals(12, sidecar.requests.size(), "partition 0's plain window was dropped");
        }
        assertEquals(0, openHandoffFiles(sidecar.dir), "close() released every kept file");
    }

    /** Two sequential reads of {@code md}; the second reads ahead. Returns where the window read ahead starts. */
    static int sequentialReadWithAWindowAhead(Fixtures.Harness h, HandoffSidecar sidecar, RemoteLogSegmentMetadata md)
            throws Exception {
        brokerRead(h, md, brokerRead(h, md, 0, 100_000), 100_000);
        awaitRequests(sidecar, 3);
        return (int) sidecar.requests.get(2).getStartPosition();
    }

    /** {@link #openHandoffFiles} once it is 0, or after 5 s. */
    static long eventuallyNoHandoffFiles(Path dir) throws IOException, InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        long n;
        while ((n = openHandoffFiles(dir)) > 0 && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
        return n;
    }

    /** A segment of partition {@code p} of the fixtures' topic. */
    static RemoteLogSegmentMetadata partitionSegment(int p) {
        TopicIdPartition tip = new TopicIdPartition(Fixtures.TIP.topicId(), p, Fixtures.TIP.topic());
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(tip, Uuid.randomUuid()), 100L, 199L,
                1_700_000_000_000L, 7, 1_700_000_001_000L, SIZE, Optional.empty(),
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, Map.of(0, 100L));
    }

    static long handoffFilesWaiting(Path dir) throws IOException {
        try (var files = Files.list(dir)) {
            return files.count();
        }
    }

    /**
     * Files of {@code dir} this process holds (mapped, deleted or not), from /proc/self/maps; a
     * released file is unmapped at once, so this also shows that nothing waits for a GC.
     */
    static long openHandoffFiles(Path dir) throws IOException {
        String prefix = dir + "/";
        return Files.readAllLines(Path.of("/proc/self/maps")).stream()
                .map(line -> line.split("\\s+", 6))
                .filter(f -> f.length == 6 && f[5].startsWith(prefix))
                .count();
    }

    @Test
    void aSidecarThatStreamsTheReadAheadWindowMakesReadAheadRestButServesTheRightBytes(@TempDir Path tmp)
            throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        sidecar.handoffMaxBytes = 512 * 1024; // smaller than the read-ahead window: streamed
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            int position = brokerRead(h, md, 0, 200_000);
            position = brokerRead(h, md, position - 10_000, 200_000);
            awaitRequests(sidecar, 3); // the read-ahead: streamed, so cancelled
            Thread.sleep(100);
            for (int i = 0; i < 4; i++) {
                position = brokerRead(h, md, position - 10_000, 200_000);
            }
        }
        // reads 1 and 2: plain windows, then the read-ahead; reads 3-6: plain windows (read-ahead rests)
        assertEquals(7, sidecar.requests.size());
        assertTrue(isReadAhead(sidecar.requests.get(2)));
        assertPlainWindows(List.copyOf(sidecar.requests).subList(3, 7)); // resting
    }

    @Test
    void aHandedOffReadAheadFileOfAnotherLengthIsNotKept(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, readAheadConfig(tmp))) {
            int position = brokerRead(h, md, 0, 100_000);
            sidecar.shortBy = 1000; // lies: hands off (and announces) 1000 bytes less than asked for
            try (InputStream in = h.rsm.fetchLogSegment(md, position)) {
                IOException e = assertThrows(IOException.class, () -> in.readNBytes(MIB));
                assertTrue(e.getMessage().contains("short stream"), e.getMessage());
            }
            awaitRequests(sidecar, 3);
            long ahead = sidecar.requests.get(2).getStartPosition();
            sidecar.shortBy = 0;
            Thread.sleep(100);
            assertEquals(0, openHandoffFiles(sidecar.dir), "the short read-ahead file was not kept");
            brokerRead(h, md, (int) ahead + 1000, 100_000);
            assertTrue(sidecar.requests.size() > 3, "asked again, not served from the short file");
        }
    }

    // ---- read-ahead over gRPC (a sidecar reached over TCP: no hand-off directory) ----------------

    static Map<String, String> tcpReadAheadConfig(String... more) {
        Map<String, String> c = Fixtures.config(ShimConfig.SIDECAR_TARGET, "10.0.0.5:9095",
                ShimConfig.FETCH_WINDOW_BYTES, "262144", ShimConfig.FETCH_READAHEAD_BYTES, String.valueOf(MIB));
        for (int i = 0; i < more.length; i += 2) {
            c.put(more[i], more[i + 1]);
        }
        return c;
    }

    @Test
    void overTcpASequentialReaderIsServedFromReadAheadWindowsReceivedInTheBackground(@TempDir Path tmp)
            throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcpReadAheadConfig())) {
            int position = brokerRead(h, md, 0, 200_000);
            position = brokerRead(h, md, position - 10_000, 200_000);
            awaitRequests(sidecar, 3);
            assertTrue(isReadAhead(sidecar.requests.get(2)));
            while (position < SIZE - 250_000) {
                position = brokerRead(h, md, position - 10_000, 200_000);
            }
            // every later window was read ahead, none waited for; the second plain window is not kept
            // (its bytes were streamed to the reader), so the third read asks for one more plain window
            List<String> asked = sidecar.requests.stream().map(r -> r.getStartPosition() + "+" + asked(r)).toList();
            assertTrue(sidecar.requests.size() <= 3 + 3, "calls: " + asked);
            assertFalse(isReadAhead(sidecar.requests.get(3)), asked.toString());
            for (FetchSegmentRequest r : from(sidecar.requests, 4)) {
                assertTrue(isReadAhead(r), "a read-ahead window: " + r);
                assertFalse(r.getAcceptHandoff(), "no hand-off over TCP");
            }
            brokerRead(h, md, sidecar.requests.get(2).getStartPosition() + MIB - 100, 300_000); // across windows
            brokerRead(h, md, 0, SIZE);
        }
    }

    @Test
    void overTcpAStreamedReadAheadWindowOfAnotherLengthIsNotKept(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcpReadAheadConfig())) {
            // every read-ahead window ends 1000 bytes early (cleanly); set before the reads that
            // start one, so no scheduling delay can let a full window through
            sidecar.readAheadStreamShortBy = 1000;
            int position = brokerRead(h, md, 0, 100_000);
            position = brokerRead(h, md, position - 10_000, 100_000);
            awaitRequests(sidecar, 3);
            assertTrue(isReadAhead(sidecar.requests.get(2)), "the third call reads ahead");
            long ahead = sidecar.requests.get(2).getStartPosition();
            Thread.sleep(100);
            int before = sidecar.requests.size();
            brokerRead(h, md, (int) ahead + 1000, 100_000); // right bytes: asked again, not the short window
            assertTrue(sidecar.requests.size() > before, "asked again, not served from the short window");
        }
    }

    @Test
    void overTcpTheNextSegmentsFirstWindowIsReadAheadFromTheLastWindowOfTheSegmentBefore(@TempDir Path tmp)
            throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata first = segment(Uuid.randomUuid(), 0, 99);
        RemoteLogSegmentMetadata next = segment(Uuid.randomUuid(), 100, 199);
        sidecar.nextSegment = MetadataMapper.toProto(next);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcpReadAheadConfig())) {
            readToTheEnd(h, first);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (requestsFor(sidecar, next.remoteLogSegmentId().id()).isEmpty() && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            List<FetchSegmentRequest> ahead = requestsFor(sidecar, next.remoteLogSegmentId().id());
            assertEquals(1, ahead.size(), "the next segment's first window: " + ahead);
            assertEquals(0, ahead.get(0).getStartPosition());
            int calls = sidecar.requests.size();
            int position = brokerRead(h, next, 0, 200_000);
            brokerRead(h, next, position - 10_000, 200_000);
            for (FetchSegmentRequest r : from(sidecar.requests, calls)) {
                assertTrue(isReadAhead(r) && r.getStartPosition() >= MIB, "only the window after it: " + r);
            }
        }
    }

    /** Waits at most 5 s until the sidecar has had {@code n} index requests for segment {@code id}. */
    static void awaitIndexRequests(HandoffSidecar sidecar, Uuid id, int n) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        while (indexRequestsFor(sidecar, id).size() < n && System.nanoTime() < deadline) {
            Thread.sleep(5);
        }
    }

    /** The index requests for segment {@code id}, copied. */
    static List<FetchIndexRequest> indexRequestsFor(HandoffSidecar sidecar, Uuid id) {
        return List.copyOf(sidecar.indexRequests).stream()
                .filter(r -> r.getMetadata().getSegmentId().equals(id.toString())).toList();
    }

    @Test
    void overTcpTheNextSegmentsIndexesAreAskedForWithItsFirstWindowAndAnswerTheBrokersCalls(@TempDir Path tmp)
            throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata first = segment(Uuid.randomUuid(), 0, 99);
        RemoteLogSegmentMetadata next = segment(Uuid.randomUuid(), 100, 199);
        sidecar.nextSegment = MetadataMapper.toProto(next);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcpReadAheadConfig())) {
            readToTheEnd(h, first);
            awaitIndexRequests(sidecar, next.remoteLogSegmentId().id(), 3);
            List<FetchIndexRequest> asked = indexRequestsFor(sidecar, next.remoteLogSegmentId().id());
            assertEquals(Set.of(io.github.rsmsidecar.proto.v1.IndexType.OFFSET,
                            io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP,
                            io.github.rsmsidecar.proto.v1.IndexType.TRANSACTION),
                    asked.stream().map(FetchIndexRequest::getIndexType).collect(java.util.stream.Collectors.toSet()),
                    "the next segment's three indexes, asked for ahead: " + asked);
            // the broker changes segment: it loads the indexes (offset, time, transaction), then reads
            for (IndexType type : List.of(IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.TRANSACTION)) {
                try (InputStream in = h.rsm.fetchIndex(next, type)) {
                    assertArrayEquals(HandoffSidecar.INDEX, in.readAllBytes(), type.toString());
                }
            }
            assertEquals(3, indexRequestsFor(sidecar, next.remoteLogSegmentId().id()).size(),
                    "the broker's index calls made no call of their own");
            brokerRead(h, next, 0, 200_000);
            // each answer serves once: the broker loading them again asks the sidecar
            try (InputStream in = h.rsm.fetchIndex(next, IndexType.OFFSET)) {
                assertArrayEquals(HandoffSidecar.INDEX, in.readAllBytes());
            }
            assertTrue(indexRequestsFor(sidecar, next.remoteLogSegmentId().id()).size() >= 4, "asked again");
        }
    }

    @Test
    void aNextSegmentsIndexesAskedForUnderOtherOffsetsThanTheBrokersAreNeverServed(@TempDir Path tmp)
            throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        RemoteLogSegmentMetadata first = segment(Uuid.randomUuid(), 0, 99);
        RemoteLogSegmentMetadata next = segment(Uuid.randomUuid(), 100, 199);
        // what storage holds under that id claims other offsets than the broker's metadata says
        sidecar.nextSegment = MetadataMapper.toProto(next).toBuilder().setEndOffset(150).build();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcpReadAheadConfig())) {
            readToTheEnd(h, first);
            awaitIndexRequests(sidecar, next.remoteLogSegmentId().id(), 3);
            assertEquals(3, indexRequestsFor(sidecar, next.remoteLogSegmentId().id()).size(), "asked ahead as named");
            try (InputStream in = h.rsm.fetchIndex(next, IndexType.OFFSET)) {
                assertArrayEquals(HandoffSidecar.INDEX, in.readAllBytes());
            }
            List<FetchIndexRequest> asked = indexRequestsFor(sidecar, next.remoteLogSegmentId().id());
            assertEquals(3, asked.stream().filter(r -> r.getMetadata().getEndOffset() == 150).count(), "" + asked);
            assertTrue(asked.stream().anyMatch(r -> r.getMetadata().getEndOffset() == 199
                            && r.getIndexType() == io.github.rsmsidecar.proto.v1.IndexType.OFFSET),
                    "the broker's call asked for itself, with the broker's metadata: " + asked);
        }
    }
}
