package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.github.luben.zstd.Zstd;
import com.github.luben.zstd.ZstdCompressCtx;
import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.ZstdSlice;
import io.grpc.stub.StreamObserver;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.BiFunction;
import java.util.function.UnaryOperator;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * zstd frames in fetches (rsm.config.fetch.zstd.max.chunk.bytes, rsm.proto {@code ZstdSlice}): the
 * sidecar here cuts the segment into stored chunks and sends each chunk's part of a range as the
 * chunk's zstd frame (made with the real zstd-jni) and the slice of it, as the real one does; and
 * it lies on demand.
 */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class FetchZstdTest {

    /** The stored chunks' original size: no multiple of the 256 KiB pieces. */
    static final int CHUNK = 300_000;
    static final int SIZE = 10 * CHUNK + 12_345;
    static final byte[] SEGMENT = segment();
    /** Each chunk's zstd frame. */
    static final byte[][] FRAMES = new byte[(SIZE + CHUNK - 1) / CHUNK][];
    /** What these tests turn {@code fetch.zstd.max.chunk.bytes} on with (its default is 0: off). */
    static final int ACCEPT = 8 * 1024 * 1024;

    /** The shim's configuration for these tests: zstd frames accepted ({@link #ACCEPT}), and {@code keyValues}. */
    static Map<String, String> zstdConfig(String... keyValues) {
        Map<String, String> c = Fixtures.config(keyValues);
        c.putIfAbsent(ShimConfig.FETCH_ZSTD_MAX_CHUNK_BYTES, String.valueOf(ACCEPT));
        return c;
    }

    static {
        for (int k = 0; k < FRAMES.length; k++) {
            FRAMES[k] = Zstd.compress(chunk(k));
        }
    }

    /** Compressible (about 4x, like record batches), not trivially. */
    static byte[] segment() {
        byte[] b = new byte[SIZE];
        Random r = new Random(17);
        for (int i = 0; i < SIZE; i += 64) {
            byte[] line = ("offset " + i + " key-" + r.nextInt(1000) + " value " + r.nextInt(50) + "\n")
                    .getBytes(java.nio.charset.StandardCharsets.US_ASCII);
            System.arraycopy(line, 0, b, i, Math.min(line.length, SIZE - i));
        }
        return b;
    }

    static byte[] chunk(int k) {
        return Arrays.copyOfRange(SEGMENT, k * CHUNK, Math.min((k + 1) * CHUNK, SIZE));
    }

    /** How the sidecar sends each chunk's part of a range. */
    enum Mode { ZSTD, ALTERNATE }

    /**
     * Sends a range chunk by chunk: the chunk's frame and the slice of it that is in the range when
     * the request accepts the chunk's size (every other chunk with {@link Mode#ALTERNATE}), else
     * the slice's bytes in {@code data}. {@code lie} may change the message of chunk k.
     */
    static final class ZstdSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final List<FetchSegmentRequest> requests = new CopyOnWriteArrayList<>();
        volatile Mode mode = Mode.ZSTD;
        volatile BiFunction<Integer, FetchSegmentResponse, FetchSegmentResponse> lie = (k, m) -> m;
        /** Sends frames whatever the request accepted. */
        volatile boolean ignoreAccept;

        @Override
        public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
            requests.add(req);
            int start = req.getStartPosition();
            int end = req.hasEndPosition() ? Math.min(req.getEndPosition() + 1, SIZE) : SIZE;
            for (int k = start / CHUNK; k * CHUNK < end; k++) {
                int chunkStart = k * CHUNK;
                int chunkSize = Math.min(CHUNK, SIZE - chunkStart);
                int from = Math.max(start, chunkStart);
                int to = Math.min(end, chunkStart + chunkSize);
                boolean zstd = (ignoreAccept || chunkSize <= req.getAcceptZstdMaxBytes())
                        && (mode == Mode.ZSTD || k % 2 == 1);
                FetchSegmentResponse m = zstd
                        ? FetchSegmentResponse.newBuilder().setZstd(ZstdSlice.newBuilder()
                                .setFrame(ByteString.copyFrom(FRAMES[k])).setSize(chunkSize)
                                .setOffset(from - chunkStart).setLength(to - from)).build()
                        : FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(SEGMENT, from, to - from)).build();
                observer.onNext(lie.apply(k, m));
            }
            observer.onCompleted();
        }
    }

    static byte[] range(int start, int endInclusive) {
        return Arrays.copyOfRange(SEGMENT, start, endInclusive + 1);
    }

    static RemoteLogSegmentMetadata md() {
        return WindowedFetchTest.metadata(SIZE);
    }

    static long frameBytes(int fromChunk, int toChunk) {
        long n = 0;
        for (int k = fromChunk; k <= toChunk; k++) {
            n += FRAMES[k].length;
        }
        return n;
    }

    @Test
    void aRangeServedAsZstdSlicesGivesExactlyItsBytes() throws Exception {
        ZstdSidecar sidecar = new ZstdSidecar();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, zstdConfig())) {
            RemoteLogSegmentMetadata md = md();
            int[][] ranges = {
                {0, 3 * CHUNK - 1},                       // whole chunks
                {CHUNK + 1000, CHUNK + 5000},             // inside one chunk
                {CHUNK - 7, 4 * CHUNK + 7},               // from the end of one chunk to the start of another
                {9 * CHUNK + 100, SIZE - 1},              // the short last chunk
            };
            long delivered = 0;
            for (int[] r : ranges) {
                try (InputStream in = h.rsm.fetchLogSegment(md, r[0], r[1])) {
                    assertArrayEquals(range(r[0], r[1]), in.readAllBytes(), r[0] + ".." + r[1]);
                }
                delivered += r[1] - r[0] + 1;
            }
            assertEquals(delivered, h.rsm.metrics.fetchZstdSliceBytes.sum());
            assertEquals(delivered, h.rsm.metrics.fetchGrpcBytes.sum());
            assertEquals(frameBytes(0, 2) + frameBytes(1, 1) + frameBytes(0, 4) + frameBytes(9, 10),
                    h.rsm.metrics.fetchZstdFrameBytes.sum());
            assertTrue(h.rsm.metrics.fetchZstdFrameBytes.sum() * 3 < delivered, "frames are smaller than their slices");
            // the broker's way: no end, read in windows
            try (InputStream in = h.rsm.fetchLogSegment(md, 123_456)) {
                assertArrayEquals(range(123_456, 123_456 + 700_000 - 1), in.readNBytes(700_000));
            }
        }
    }

    @Test
    void aRangeMixingDataAndZstdMessagesGivesExactlyItsBytes() throws Exception {
        ZstdSidecar sidecar = new ZstdSidecar();
        sidecar.mode = Mode.ALTERNATE;
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, zstdConfig())) {
            RemoteLogSegmentMetadata md = md();
            try (InputStream in = h.rsm.fetchLogSegment(md, 10, SIZE - 11)) {
                assertArrayEquals(range(10, SIZE - 11), in.readAllBytes());
            }
            try (InputStream in = h.rsm.fetchLogSegment(md, 0)) {
                assertArrayEquals(SEGMENT, in.readAllBytes());
            }
            assertTrue(h.rsm.metrics.fetchZstdSliceBytes.sum() > 0);
            assertTrue(h.rsm.metrics.fetchZstdSliceBytes.sum() < h.rsm.metrics.fetchGrpcBytes.sum());
        }
    }

    @Test
    void theRequestCarriesTheConfiguredMaximumAndZeroWhenItIsOff() throws Exception {
        for (String configured : new String[] {null, "65536", "8388608", "0"}) {
            ZstdSidecar sidecar = new ZstdSidecar();
            Map<String, String> config = configured == null ? Fixtures.config() // the default: off
                    : Fixtures.config(ShimConfig.FETCH_ZSTD_MAX_CHUNK_BYTES, configured);
            try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config)) {
                try (InputStream in = h.rsm.fetchLogSegment(md(), 5, 2 * CHUNK)) {
                    assertArrayEquals(range(5, 2 * CHUNK), in.readAllBytes());
                }
                int expected = configured == null ? 0 : Integer.parseInt(configured);
                assertEquals(expected, sidecar.requests.get(0).getAcceptZstdMaxBytes(), "configured " + configured);
                // chunks larger than accepted come as data
                assertEquals("8388608".equals(configured) ? 2 * CHUNK - 4 : 0, h.rsm.metrics.fetchZstdSliceBytes.sum());
            }
        }
    }

    /** The read-ahead over gRPC (a sidecar reached over TCP), of windows that come as zstd slices. */
    static Map<String, String> tcpReadAheadConfig() {
        return zstdConfig(ShimConfig.SIDECAR_TARGET, "10.0.0.5:9095", ShimConfig.FETCH_WINDOW_BYTES, "262144",
                ShimConfig.FETCH_READAHEAD_BYTES, String.valueOf(HandoffTest.MIB));
    }

    /** Reads {@code n} bytes from {@code start} as the broker does; the bytes delivered, also on a failure. */
    static ByteArrayOutputStream brokerRead(Fixtures.Harness h, RemoteLogSegmentMetadata md, int start, int n)
            throws Exception {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try (InputStream in = h.rsm.fetchLogSegment(md, start)) {
            byte[] b = new byte[64 * 1024];
            while (out.size() < n) {
                int got = in.read(b, 0, Math.min(b.length, n - out.size()));
                if (got < 0) {
                    break;
                }
                out.write(b, 0, got);
            }
        }
        return out;
    }

    @Test
    void overTcpReadAheadWindowsOfZstdSlicesServeASequentialReader() throws Exception {
        ZstdSidecar sidecar = new ZstdSidecar();
        sidecar.mode = Mode.ALTERNATE;
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcpReadAheadConfig())) {
            int reads = 0;
            for (int position = 0; position < SIZE - 250_000; position += 190_000, reads++) {
                assertArrayEquals(range(position, position + 200_000 - 1), brokerRead(h, md, position, 200_000)
                        .toByteArray(), "bytes at " + position);
            }
            List<String> asked = sidecar.requests.stream()
                    .map(r -> r.getStartPosition() + "+" + (r.hasEndPosition() ? r.getEndPosition() + 1 - r.getStartPosition()
                            : SIZE - r.getStartPosition())).toList();
            assertTrue(sidecar.requests.size() <= 3 + 3, reads + " reads, calls: " + asked);
            for (FetchSegmentRequest r : sidecar.requests) {
                assertEquals(ACCEPT, r.getAcceptZstdMaxBytes(), "read-ahead requests accept frames too");
            }
            assertTrue(h.rsm.metrics.of(ShimMetrics.Op.BACKGROUND).calls.sum() >= 2, asked.toString());
            assertTrue(h.rsm.metrics.fetchZstdSliceBytes.sum() > HandoffTest.MIB, "windows came as zstd slices");
        }
    }

    @Test
    void aReadAheadWindowKeepsItsLastChunksTailSoTheNextOneStartsAtAChunkBoundary() throws Exception {
        ZstdSidecar sidecar = new ZstdSidecar(); // every chunk as a frame; windows of 1 MiB, chunks of 300,000
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcpReadAheadConfig())) {
            for (int position = 0; position < SIZE - 250_000; position += 190_000) {
                assertArrayEquals(range(position, position + 200_000 - 1), brokerRead(h, md, position, 200_000)
                        .toByteArray(), "bytes at " + position);
            }
            List<FetchSegmentRequest> readAheads = sidecar.requests.stream().filter(HandoffTest::isReadAhead).toList();
            assertTrue(readAheads.size() >= 2, sidecar.requests.toString());
            // the first window ends inside a chunk and keeps the rest of it, so every later one starts
            // at a chunk boundary: no chunk is decompressed for two windows
            for (FetchSegmentRequest r : readAheads.subList(1, readAheads.size())) {
                assertEquals(0, r.getStartPosition() % CHUNK, "read-ahead from " + r.getStartPosition());
            }
        }
    }

    @Test
    void overTcpAReadAheadWindowWithABadFrameIsNotKeptAndTheReaderGetsTheError() throws Exception {
        ZstdSidecar sidecar = new ZstdSidecar();
        int bad = 6; // every message of this chunk decompresses short
        sidecar.lie = (k, m) -> k != bad ? m : m.toBuilder().setZstd(m.getZstd().toBuilder()
                .setFrame(ByteString.copyFrom(Zstd.compress(Arrays.copyOf(chunk(k), CHUNK - 100))))).build();
        RemoteLogSegmentMetadata md = md();
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcpReadAheadConfig())) {
            int position = 0;
            Exception failure = null;
            for (; position < SIZE - 250_000 && failure == null; position += 190_000) {
                try {
                    assertArrayEquals(range(position, position + 200_000 - 1),
                            brokerRead(h, md, position, 200_000).toByteArray(), "bytes at " + position);
                } catch (IOException | RemoteStorageException e) {
                    failure = e;
                }
            }
            assertTrue(failure != null, "the bad chunk was served");
            int failed = position - 190_000;
            assertTrue(failed + 200_000 > bad * CHUNK && failed <= bad * CHUNK, "failed at " + failed);
            assertTrue(failure.getMessage().contains("the sidecar's zstd frame decompressed to " + (CHUNK - 100)
                    + " bytes, the message declared " + CHUNK), failure.getMessage());
            long readAheadsOfIt = sidecar.requests.stream().filter(r -> HandoffTest.isReadAhead(r)
                    && r.getStartPosition() <= bad * CHUNK + CHUNK - 1 && r.getEndPosition() >= bad * CHUNK).count();
            assertTrue(readAheadsOfIt >= 1, "a read-ahead window held the bad chunk");
            // nothing of it was kept: the reader asked for it itself, and does again
            int before = sidecar.requests.size();
            Exception again = assertThrows(Exception.class, () -> brokerRead(h, md, bad * CHUNK, 1000));
            assertTrue(again.getMessage().contains("decompressed to " + (CHUNK - 100)), again.getMessage());
            assertTrue(sidecar.requests.size() > before, "asked the sidecar again");
        }
    }

    // ---- a sidecar that lies ------------------------------------------------------------------

    static FetchSegmentResponse withSlice(FetchSegmentResponse m, UnaryOperator<ZstdSlice.Builder> change) {
        return m.toBuilder().setZstd(change.apply(m.getZstd().toBuilder())).build();
    }

    static ByteString bytes(byte[]... parts) {
        ByteString b = ByteString.EMPTY;
        for (byte[] p : parts) {
            b = b.concat(ByteString.copyFrom(p));
        }
        return b;
    }

    /** One frame of one block that is no zstd: its headers are right, its content is not. */
    static final ByteString GARBAGE_BLOCK = handMadeFrame(17, block(2, 4, true, (byte) 0xff, (byte) 0xff,
            (byte) 0xff, (byte) 0xff));

    /** The lies (on the second chunk of a three-chunk range) and what the read must say about each. */
    static Map<String, UnaryOperator<FetchSegmentResponse>> lies() {
        byte[] frame = FRAMES[1];
        return Map.ofEntries(
                Map.entry("the sidecar's zstd frame (" + (frame.length - 10) + " bytes) is cut short",
                        m -> withSlice(m, s -> s.setFrame(ByteString.copyFrom(frame, 0, frame.length - 10)))),
                Map.entry("the sidecar's zstd frame (1000 bytes) does not start with zstd's magic number",
                        m -> withSlice(m, s -> s.setFrame(ByteString.copyFrom(Fixtures.content(1000, 3))))),
                Map.entry("the sidecar's zstd frame (" + (frame.length + 3) + " bytes) has 3 bytes after its end",
                        m -> withSlice(m, s -> s.setFrame(bytes(frame, new byte[] {1, 2, 3})))),
                Map.entry("the sidecar's zstd frame (" + (2 * frame.length) + " bytes) has " + frame.length
                        + " bytes after its end", m -> withSlice(m, s -> s.setFrame(bytes(frame, frame)))),
                Map.entry("the sidecar's zstd frame (13 bytes, declared to decompress to " + CHUNK
                        + ") cannot be decompressed: ", m -> withSlice(m, s -> s.setFrame(GARBAGE_BLOCK))),
                Map.entry("the sidecar's zstd frame decompressed to " + (CHUNK - 1000) + " bytes, the message declared "
                        + CHUNK, m -> withSlice(m,
                        s -> s.setFrame(ByteString.copyFrom(Zstd.compress(Arrays.copyOf(chunk(1), CHUNK - 1000)))))),
                Map.entry("the sidecar's zstd frame decompressed to more than the " + CHUNK
                        + " bytes the message declared", m -> withSlice(m,
                        s -> s.setFrame(ByteString.copyFrom(Zstd.compress(bytes(chunk(1), chunk(2)).toByteArray()))))),
                Map.entry("the sidecar's zstd slice declares 9000000 decompressed bytes; the request accepts 1 to "
                        + ACCEPT, m -> withSlice(m, s -> s.setSize(9_000_000))),
                Map.entry("the sidecar's zstd slice declares 0 decompressed bytes", m -> withSlice(m, s -> s.setSize(0))),
                Map.entry("the sidecar's zstd slice of offset " + CHUNK + " and length 1 is not a non-empty range "
                        + "within its " + CHUNK + " bytes", m -> withSlice(m, s -> s.setOffset(CHUNK).setLength(1))),
                Map.entry("of offset 0 and length 0 is not", m -> withSlice(m, s -> s.setLength(0))),
                Map.entry("of offset -1 and length 10 is not", m -> withSlice(m, s -> s.setOffset(-1).setLength(10))),
                Map.entry("of offset 1 and length " + CHUNK + " is not", m -> withSlice(m, s -> s.setOffset(1))),
                Map.entry("the sidecar sent 5 bytes of data and a zstd frame in one message",
                        m -> m.toBuilder().setData(ByteString.copyFromUtf8("bytes")).build()));
    }

    @Test
    void aSliceThatBreaksTheContractFailsTheReadAfterTheBytesBeforeIt() throws Exception {
        for (Map.Entry<String, UnaryOperator<FetchSegmentResponse>> lie : lies().entrySet()) {
            ZstdSidecar sidecar = new ZstdSidecar();
            sidecar.lie = (k, m) -> k == 1 ? lie.getValue().apply(m) : m;
            try (Fixtures.Harness h = new Fixtures.Harness(sidecar, zstdConfig());
                 InputStream in = h.rsm.fetchLogSegment(md(), 0, 3 * CHUNK - 1)) {
                ByteArrayOutputStream delivered = new ByteArrayOutputStream();
                IOException e = assertThrows(IOException.class, () -> {
                    byte[] b = new byte[100_000];
                    for (int n; (n = in.read(b)) >= 0; ) {
                        delivered.write(b, 0, n);
                    }
                }, lie.getKey());
                assertTrue(e.getMessage().contains(lie.getKey()), e.getMessage());
                assertTrue(e.getMessage().startsWith("fetchLogSegment("), e.getMessage());
                assertArrayEquals(chunk(0), delivered.toByteArray(), "the first chunk, nothing of the second: "
                        + lie.getKey());
                assertThrows(IOException.class, in::read, "still an error, never a late EOF");
            }
        }
    }

    @Test
    void aBadFirstMessageFailsTheFetchItself() throws Exception {
        ZstdSidecar sidecar = new ZstdSidecar();
        sidecar.lie = (k, m) -> withSlice(m, s -> s.setSize(CHUNK + 1));
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, zstdConfig())) {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.fetchLogSegment(md(), 0, 2 * CHUNK));
            assertTrue(e.getMessage().contains("fetchLogSegment("), e.getMessage());
            assertTrue(e.getMessage().contains("the sidecar's zstd frame decompressed to " + CHUNK
                    + " bytes, the message declared " + (CHUNK + 1)), e.getMessage());
        }
    }

    @Test
    void aFrameTheRequestDidNotAcceptIsRefused() throws Exception {
        ZstdSidecar sidecar = new ZstdSidecar();
        sidecar.ignoreAccept = true;
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar,
                Fixtures.config(ShimConfig.FETCH_ZSTD_MAX_CHUNK_BYTES, "0"))) {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.fetchLogSegment(md(), 0, 2 * CHUNK));
            assertTrue(e.getMessage().contains("the sidecar sent a zstd frame, which the request did not accept"),
                    e.getMessage());
        }
    }

    // ---- ZstdSlices itself, with frames made by hand -------------------------------------------

    /** A zstd frame with no content size and a window of 2^{@code windowLog}, of {@code blocks}. */
    static ByteString handMadeFrame(int windowLog, byte[]... blocks) {
        ByteString.Output out = ByteString.newOutput();
        out.write(new byte[] {0x28, (byte) 0xb5, 0x2f, (byte) 0xfd, 0, (byte) ((windowLog - 10) << 3)}, 0, 6);
        for (byte[] b : blocks) {
            out.write(b, 0, b.length);
        }
        return out.toByteString();
    }

    /** A block header (type 0 raw, 1 RLE, 3 reserved: invalid) and its content. */
    static byte[] block(int type, int size, boolean last, byte... content) {
        int header = size << 3 | type << 1 | (last ? 1 : 0);
        ByteBuffer b = ByteBuffer.allocate(3 + content.length);
        b.put((byte) header).put((byte) (header >>> 8)).put((byte) (header >>> 16)).put(content);
        return b.array();
    }

    static ZstdSlice slice(ByteString frame, int size, int offset, int length) {
        return ZstdSlice.newBuilder().setFrame(frame).setSize(size).setOffset(offset).setLength(length).build();
    }

    @Test
    void aFrameThatExpandsPastItsSizeIsRefusedWithoutDecompressingTheRest() throws Exception {
        // 1000 'a', then 1000 'b', then a block zstd cannot decompress: reaching it would fail otherwise
        ByteString frame = handMadeFrame(16, block(1, 1000, false, (byte) 'a'), block(1, 1000, false, (byte) 'b'),
                block(2, 4, true, (byte) 0xff, (byte) 0xff, (byte) 0xff, (byte) 0xff));
        assertEquals(null, ZstdSlices.notOneFrame(frame));
        IOException e = assertThrows(IOException.class, () -> ZstdSlices.decode(slice(frame, 1000, 10, 20), 65536, false).slice());
        assertEquals("the sidecar's zstd frame decompressed to more than the 1000 bytes the message declared",
                e.getMessage());
        // the frame is what it says: decompressing on reaches the bad block
        e = assertThrows(IOException.class, () -> ZstdSlices.decode(slice(frame, 3000, 0, 3000), 65536, false).slice());
        assertTrue(e.getMessage().startsWith("the sidecar's zstd frame (" + frame.size()
                + " bytes, declared to decompress to 3000) cannot be decompressed: "), e.getMessage());
        // a frame of 64 GiB (2 MiB of RLE blocks), declared as 128 KiB: refused after its first block
        byte[][] blocks = new byte[524_288][];
        Arrays.fill(blocks, block(1, 131_072, false, (byte) 'z'));
        blocks[blocks.length - 1] = block(1, 131_072, true, (byte) 'z');
        ByteString huge = handMadeFrame(17, blocks);
        assertEquals(null, ZstdSlices.notOneFrame(huge));
        long started = System.nanoTime();
        e = assertThrows(IOException.class, () -> ZstdSlices.decode(slice(huge, 131_072, 0, 1), 131_072, false).slice());
        assertTrue(e.getMessage().contains("more than the 131072 bytes"), e.getMessage());
        assertTrue(System.nanoTime() - started < TimeUnit.SECONDS.toNanos(1), "64 GiB were not decompressed");
    }

    @Test
    void theFramesHeadersMustMakeOneWholeFrame() {
        assertEquals(null, ZstdSlices.notOneFrame(ByteString.copyFrom(FRAMES[0]))); // with its content size
        assertEquals(null, ZstdSlices.notOneFrame(handMadeFrame(17, block(0, 3, true, (byte) 1, (byte) 2, (byte) 3))));
        byte[] checksummed;
        try (ZstdCompressCtx c = new ZstdCompressCtx()) {
            checksummed = c.setChecksum(true).setContentSize(false).compress(chunk(0));
        }
        assertEquals(null, ZstdSlices.notOneFrame(ByteString.copyFrom(checksummed)));
        assertEquals("is cut short: its headers need " + checksummed.length + " bytes",
                ZstdSlices.notOneFrame(ByteString.copyFrom(checksummed, 0, checksummed.length - 1)));
        assertEquals("does not start with zstd's magic number", ZstdSlices.notOneFrame(ByteString.EMPTY));
        assertEquals("does not start with zstd's magic number",
                ZstdSlices.notOneFrame(ByteString.copyFrom(checksummed, 0, 4)));
        assertEquals("does not start with zstd's magic number",
                ZstdSlices.notOneFrame(ByteString.copyFrom(checksummed, 1, 100)));
        assertEquals("is cut short: its headers need at least 9 bytes",
                ZstdSlices.notOneFrame(handMadeFrame(17, new byte[] {1, 0})));
        assertEquals("is cut short: its headers need 14 bytes",
                ZstdSlices.notOneFrame(handMadeFrame(17, block(0, 5, true, (byte) 1, (byte) 2, (byte) 3))));
        assertEquals("has a block of zstd's reserved type at byte 6",
                ZstdSlices.notOneFrame(handMadeFrame(17, block(3, 0, true))));
    }

    @Test
    void aFrameMayNotAskForALargerWindowThanTheRequestAccepts() throws Exception {
        ByteString frame = handMadeFrame(24, block(1, 1000, true, (byte) 'x')); // a 16 MiB window for 1000 bytes
        IOException e = assertThrows(IOException.class,
                () -> ZstdSlices.decode(slice(frame, 1000, 0, 1000), 8 * 1024 * 1024, false).slice());
        assertTrue(e.getMessage().contains("cannot be decompressed"), e.getMessage());
        byte[] x = new byte[1000];
        Arrays.fill(x, (byte) 'x');
        assertArrayEquals(x, ZstdSlices.decode(slice(frame, 1000, 0, 1000), 16 * 1024 * 1024, false).slice().toByteArray());
    }

    @Test
    void aSliceComesInPiecesOfAtMost256KiB() throws Exception {
        byte[] chunk = Arrays.copyOf(SEGMENT, 2 * 1024 * 1024 + 5);
        ByteString frame = ByteString.copyFrom(Zstd.compress(chunk));
        ByteString slice = ZstdSlices.decode(slice(frame, chunk.length, 3, chunk.length - 4), ACCEPT, false).slice();
        assertArrayEquals(Arrays.copyOfRange(chunk, 3, chunk.length - 1), slice.toByteArray());
        for (ByteBuffer piece : slice.asReadOnlyByteBufferList()) {
            assertTrue(piece.remaining() <= FetchResponseMarshaller.PIECE_BYTES, "piece of " + piece.remaining());
        }
    }

    /**
     * Outside a broker zstd-jni may be missing: {@link ZstdSlices} loads (the JVM's verifier does
     * not need zstd-jni's classes) and fetches accept no frames. Here it is loaded by a class loader
     * that cannot see zstd-jni.
     */
    @Test
    void withoutZstdJniFetchesAcceptNoFrames() throws Exception {
        ClassLoader parent = FetchZstdTest.class.getClassLoader();
        ClassLoader withoutZstd = new ClassLoader(parent) {
            @Override
            protected Class<?> loadClass(String name, boolean resolve) throws ClassNotFoundException {
                if (name.startsWith("com.github.luben.")) {
                    throw new ClassNotFoundException(name);
                }
                if (!name.startsWith(ZstdSlices.class.getName())) {
                    return super.loadClass(name, resolve);
                }
                synchronized (getClassLoadingLock(name)) { // ZstdSlices and its nested classes: defined here
                    Class<?> c = findLoadedClass(name);
                    if (c == null) {
                        try (InputStream in = parent.getResourceAsStream(name.replace('.', '/') + ".class")) {
                            byte[] b = in.readAllBytes();
                            c = defineClass(name, b, 0, b.length);
                        } catch (IOException e) {
                            throw new ClassNotFoundException(name, e);
                        }
                    }
                    return c;
                }
            }
        };
        Class<?> slices = withoutZstd.loadClass(ZstdSlices.class.getName());
        assertEquals(withoutZstd, slices.getClassLoader());
        Method accept = slices.getDeclaredMethod("acceptMaxBytes", int.class);
        accept.setAccessible(true);
        assertEquals(0, accept.invoke(null, ACCEPT));
        Method bytes = slices.getDeclaredMethod("bytes", FetchSegmentResponse.class, int.class, boolean.class);
        bytes.setAccessible(true);
        FetchSegmentResponse data = FetchSegmentResponse.newBuilder().setData(ByteString.copyFromUtf8("abc")).build();
        Object decoded = bytes.invoke(null, data, 0, false);
        Method slice = decoded.getClass().getDeclaredMethod("slice");
        slice.setAccessible(true);
        assertEquals(ByteString.copyFromUtf8("abc"), slice.invoke(decoded));
        assertEquals(ACCEPT, ZstdSlices.acceptMaxBytes(ACCEPT), "here zstd-jni is there");
        assertEquals(0, ZstdSlices.acceptMaxBytes(0));
    }
}
