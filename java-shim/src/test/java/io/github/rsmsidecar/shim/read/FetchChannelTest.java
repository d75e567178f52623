package io.github.rsmsidecar.shim.read;

import static io.github.rsmsidecar.shim.read.FrameSidecar.data;
import static io.github.rsmsidecar.shim.read.FrameSidecar.end;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.rsmsidecar.proto.v1.FetchEnd;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.grpc.Status;
import io.grpc.StatusException;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.Arrays;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.BiConsumer;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The fetch channel's client against a sidecar that follows the protocol and against ones that do
 * not: every lie is a failed read (never wrong or short bytes), a refusal before any byte is its
 * status, a sidecar without the channel is told apart from one that is down, and connections are
 * kept only after a clean end.
 */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class FetchChannelTest {

    static final byte[] SEGMENT = new byte[3 * 1024 * 1024 + 777];

    static {
        for (int i = 0; i < SEGMENT.length; i++) {
            SEGMENT[i] = (byte) (i * 31 + (i >> 9));
        }
    }

    /** The honest answer: the range in frames of at most {@code frame} bytes, then OK. */
    static BiConsumer<FetchSegmentRequest, DataOutputStream> honest(int frame) {
        return FrameSidecar.honest(SEGMENT, frame);
    }

    static FetchSegmentRequest request(int start, Integer end) {
        FetchSegmentRequest.Builder b = FetchSegmentRequest.newBuilder()
                .setMetadata(SegmentMetadata.newBuilder().setTopicName("t").setSegmentId("s"))
                .setStartPosition(start);
        if (end != null) {
            b.setEndPosition(end);
        }
        return b.build();
    }

    FrameSidecar sidecar;
    FetchChannel channel;
    final LongAdder bytes = new LongAdder();

    FetchChannel client(FrameSidecar s) {
        channel = new FetchChannel(s.endpoint(), null, 2000, 2000, 2000, bytes);
        return channel;
    }

    @AfterEach
    void closeAll() throws IOException {
        if (channel != null) {
            channel.close();
        }
        if (sidecar != null) {
            sidecar.close();
        }
    }

    static byte[] readAll(InputStream in) throws IOException {
        byte[] out = in.readAllBytes();
        in.close();
        return out;
    }

    @Test
    void rangesArriveByteExactAndExchangesShareOneConnection() throws Exception {
        sidecar = new FrameSidecar(honest(100_000));
        FetchChannel c = client(sidecar);
        assertArrayEquals(Arrays.copyOfRange(SEGMENT, 0, SEGMENT.length),
                readAll(c.open(request(0, null), SEGMENT.length, "all")));
        assertArrayEquals(Arrays.copyOfRange(SEGMENT, 99_999, 1_300_001),
                readAll(c.open(request(99_999, 1_300_000), 1_200_002, "middle")));
        try (InputStream in = c.open(request(5, 5), 1, "one byte")) {
            assertEquals(SEGMENT[5] & 0xff, in.read());
            assertEquals(-1, in.read());
        }
        assertEquals(0, readAll(c.open(request(SEGMENT.length, null), 0, "empty")).length);
        assertEquals(1, sidecar.connections.get(), "one connection for every exchange");
        assertEquals(SEGMENT.length + 1_200_002 + 1, bytes.sum());
    }

    @Test
    void aRefusalBeforeAnyByteIsItsStatusAndTheConnectionServesOn() throws Exception {
        sidecar = new FrameSidecar((req, out) -> {
            if (req.getStartPosition() == 1) {
                end(out, FetchEnd.newBuilder().setCode(Status.Code.NOT_FOUND.value())
                        .setMessage("segment t-0 not found:\nno manifest").build());
            } else {
                honest(1 << 20).accept(req, out);
            }
        });
        FetchChannel c = client(sidecar);
        StatusException e = assertThrows(StatusException.class, () -> c.open(request(1, null), SEGMENT.length - 1, "op"));
        assertEquals(Status.Code.NOT_FOUND, e.getStatus().getCode());
        assertEquals("segment t-0 not found: no manifest", e.getStatus().getDescription(), "one line");
        assertArrayEquals(Arrays.copyOfRange(SEGMENT, 0, 10), readAll(c.open(request(0, 9), 10, "op")));
        assertEquals(1, sidecar.connections.get());
    }

    @Test
    void aFailureAfterBytesIsAnIOExceptionNeverAShortRead() throws Exception {
        sidecar = new FrameSidecar((req, out) -> {
            data(out, SEGMENT, 0, 1000);
            end(out, FetchEnd.newBuilder().setCode(Status.Code.DATA_LOSS.value()).setLength(1000)
                    .setMessage("tiered/x.log chunk 3: authentication failed").build());
        });
        InputStream in = client(sidecar).open(request(0, null), SEGMENT.length, "op");
        IOException e = assertThrows(IOException.class, in::readAllBytes);
        assertTrue(e.getMessage().contains("DATA_LOSS") && e.getMessage().contains("chunk 3"), e.getMessage());
    }

    @Test
    void everyLieIsAFailedRead() throws Exception {
        // more bytes than the range holds
        assertLie((req, out) -> {
            data(out, SEGMENT, 0, 11);
            end(out, FetchEnd.newBuilder().setLength(11).build());
        }, 10, "more than the 10 bytes");
        // an OK end before the range's bytes
        assertLie((req, out) -> {
            data(out, SEGMENT, 0, 5);
            end(out, FetchEnd.newBuilder().setLength(5).build());
        }, 10, "an OK end after 5 bytes");
        // an end that counts other bytes than it sent
        assertLie((req, out) -> {
            data(out, SEGMENT, 0, 10);
            end(out, FetchEnd.newBuilder().setLength(9).build());
        }, 10, "it says 9");
        // a connection that ends inside a frame, and one that ends before the end frame
        assertLie((req, out) -> {
            out.writeByte(FetchChannel.DATA);
            out.writeInt(10);
            out.write(SEGMENT, 0, 4);
            out.flush();
            throw new IllegalStateException("close");
        }, 10, "broke after");
        assertLie((req, out) -> {
            data(out, SEGMENT, 0, 4);
            out.flush();
            throw new IllegalStateException("close");
        }, 10, "broke after 4 of 10");
        // a frame type the protocol does not have, and a data frame larger than it allows
        assertLie((req, out) -> {
            data(out, SEGMENT, 0, 2);
            out.writeByte('X');
            out.writeInt(1);
            out.writeByte(0);
        }, 10, "a frame of type");
        assertLie((req, out) -> {
            data(out, SEGMENT, 0, 2);
            out.writeByte(FetchChannel.DATA);
            out.writeInt(FetchChannel.MAX_DATA_FRAME_BYTES + 1);
        }, 10, "a data frame of");
    }

    /** A sidecar's answer to a fetch that may fail writing it. */
    @FunctionalInterface
    interface Lie {
        void write(FetchSegmentRequest req, DataOutputStream out) throws IOException;
    }

    private void assertLie(Lie lie, int length, String says) throws Exception {
        BiConsumer<FetchSegmentRequest, DataOutputStream> answer = (req, out) -> {
            try {
                lie.write(req, out);
            } catch (IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
        };
        try (FrameSidecar s = new FrameSidecar(answer)) {
            FetchChannel c = new FetchChannel(s.endpoint(), null, 2000, 2000, 2000, new LongAdder());
            try {
                // refused at the first frame (INTERNAL, not retried) or by a read: never a clean end
                Exception e = assertThrows(Exception.class, () -> c.open(request(0, length - 1), length, "lie")
                        .readAllBytes());
                if (e instanceof StatusException se) {
                    assertEquals(Status.Code.INTERNAL, se.getStatus().getCode());
                } else {
                    assertTrue(e instanceof IOException, e.toString());
                }
                assertTrue(e.getMessage().contains(says), says + " not in: " + e.getMessage());
            } finally {
                c.close();
            }
        }
    }

    @Test
    void aProtocolViolationOnTheFirstFrameIsInternalAndNotRetried() throws Exception {
        sidecar = new FrameSidecar((req, out) -> {
            try {
                out.writeByte('?');
                out.writeInt(0);
            } catch (IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
        });
        StatusException e = assertThrows(StatusException.class, () -> client(sidecar).open(request(0, 9), 10, "op"));
        assertEquals(Status.Code.INTERNAL, e.getStatus().getCode());
    }

    /**
     * A sidecar address that answers nothing (a listener whose accept queue is full: Linux drops
     * the SYNs, as a vanished pod's address does): every attempt ends in a timeout at the connect
     * timeout, never in a connection returned unconnected (its first write then threw
     * NotYetConnectedException, an unchecked exception, into the broker's fetchIndex: CI saw it).
     */
    @Test
    void aConnectionAttemptNobodyAnswersTimesOutEveryTime() throws Exception {
        try (ServerSocket full = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            java.util.List<Socket> queued = new java.util.ArrayList<>();
            try {
                ChannelConnection.Endpoint endpoint =
                        new ChannelConnection.Endpoint("127.0.0.1", full.getLocalPort(), null);
                // fill the accept queue (backlog 1 holds two): later connection attempts hang
                for (int i = 0; i < 2; i++) {
                    queued.add(new Socket(InetAddress.getLoopbackAddress(), full.getLocalPort()));
                }
                for (int attempt = 0; attempt < 20; attempt++) {
                    long t0 = System.nanoTime();
                    assertThrows(java.net.SocketTimeoutException.class,
                            () -> ChannelConnection.open(endpoint, null, 50).close(), "attempt " + attempt);
                    assertTrue(System.nanoTime() - t0 >= TimeUnit.MILLISECONDS.toNanos(50),
                            "gave up before the connect timeout");
                }
            } finally {
                for (Socket s : queued) {
                    s.close();
                }
            }
        }
    }

    @Test
    void aSidecarWithoutTheChannelIsToldApartFromOneThatIsDown() throws Exception {
        sidecar = new FrameSidecar(honest(1000));
        sidecar.preface = "\0\0\022\004\0\0\0\0".getBytes(java.nio.charset.StandardCharsets.ISO_8859_1); // HTTP/2 SETTINGS
        assertThrows(FetchChannel.NotAvailable.class, () -> client(sidecar).open(request(0, 9), 10, "op"));
        int port;
        try (ServerSocket free = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
            port = free.getLocalPort();
        }
        FetchChannel down = new FetchChannel(new ChannelConnection.Endpoint("127.0.0.1", port, null), null, 2000,
                2000, 2000, new LongAdder());
        StatusException e = assertThrows(StatusException.class, () -> down.open(request(0, 9), 10, "op"));
        assertEquals(Status.Code.UNAVAILABLE, e.getStatus().getCode());
        down.close();
    }

    @Test
    void aKeptConnectionTheSidecarClosedIsReplacedWithoutAFailure() throws Exception {
        sidecar = new FrameSidecar(honest(1 << 20));
        FetchChannel c = client(sidecar);
        assertEquals(10, readAll(c.open(request(0, 9), 10, "op")).length);
        for (Socket s : sidecar.sockets) {
            s.close(); // the sidecar dropped the idle connection (restarted, or its idle limit)
        }
        Thread.sleep(50);
        assertArrayEquals(Arrays.copyOfRange(SEGMENT, 100, 200), readAll(c.open(request(100, 199), 100, "op")));
        assertEquals(2, sidecar.connections.get());
    }

    @Test
    void aStreamClosedBeforeItsEndClosesItsConnection() throws Exception {
        sidecar = new FrameSidecar(honest(64 * 1024));
        FetchChannel c = client(sidecar);
        InputStream in = c.open(request(0, null), SEGMENT.length, "op");
        assertEquals(1000, in.readNBytes(1000).length);
        in.close(); // the broker read one fetch and closed: the sidecar must stop
        Socket server = sidecar.sockets.get(0);
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        boolean closed = false;
        while (!closed && System.nanoTime() < deadline) {
            try {
                server.getOutputStream().write(new byte[64 * 1024]); // the sidecar's writes now fail
                server.getOutputStream().flush();
                Thread.sleep(10);
            } catch (IOException e) {
                closed = true;
            }
        }
        assertTrue(closed, "the connection stayed open after the stream was closed mid-range");
        assertEquals(10, readAll(c.open(request(0, 9), 10, "op")).length);
        assertEquals(2, sidecar.connections.get(), "the abandoned connection was not kept");
    }

    @Test
    void theSegmentAfterTheRangeComesWithItsEnd() throws Exception {
        SegmentMetadata next = SegmentMetadata.newBuilder().setSegmentId("next").setStartOffset(200).build();
        sidecar = new FrameSidecar((req, out) -> {
            data(out, SEGMENT, SEGMENT.length - 10, 10);
            end(out, FetchEnd.newBuilder().setLength(10).setNextSegment(next).build());
        });
        FetchChannel.Stream in = client(sidecar).open(request(SEGMENT.length - 10, null), 10, "op");
        Window w = Window.read(in, SEGMENT.length - 10, 10);
        assertEquals(next, w.next());
        assertArrayEquals(Arrays.copyOfRange(SEGMENT, SEGMENT.length - 10, SEGMENT.length),
                w.stream(SEGMENT.length - 10).readAllBytes());
    }

    @Test
    void aWindowSpansPiecesAndReadsFromAnyPosition() throws Exception {
        sidecar = new FrameSidecar(honest(300_000));
        int len = 3 * Window.PIECE_BYTES + 12_345;
        Window w = Window.read(client(sidecar).open(request(1000, 1000 + len - 1), len, "op"), 1000, len);
        assertEquals(1000 + len, w.end());
        for (int from : new int[] {1000, 1001, 1000 + Window.PIECE_BYTES - 1, 1000 + len - 1}) {
            assertArrayEquals(Arrays.copyOfRange(SEGMENT, from, 1000 + len), w.stream(from).readAllBytes(), "" + from);
        }
        OutputStream sink = OutputStream.nullOutputStream();
        w.stream(1000).transferTo(sink);
    }
}
