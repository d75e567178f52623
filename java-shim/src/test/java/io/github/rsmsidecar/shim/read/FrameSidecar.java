package io.github.rsmsidecar.shim.read;

import io.github.rsmsidecar.proto.v1.FetchEnd;
import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BiConsumer;

/**
 * A loopback TCP server speaking the sidecar's fetch channel (rsm.proto, "The fetch channel"): it
 * answers the preface, records every 'Q' and 'I' request as it arrives, and lets the test write
 * each exchange's answer ({@link #data}, {@link #end}). An answer that throws closes the
 * connection, as a sidecar that breaks does. Shared by the fetch channel's client tests and the
 * read path's tests through the shim.
 */
public final class FrameSidecar implements AutoCloseable {

    /** 64 KiB frames, as the sidecar sends. */
    public static final int FRAME_BYTES = 64 * 1024;

    final ServerSocket server;
    final CopyOnWriteArrayList<Socket> sockets = new CopyOnWriteArrayList<>();
    /** Connections accepted. */
    public final AtomicInteger connections = new AtomicInteger();
    /** Range requests ('Q'), in the order they arrived. */
    public final List<FetchSegmentRequest> requests = new CopyOnWriteArrayList<>();
    /** Index requests ('I'), in the order they arrived. */
    public final List<FetchIndexRequest> indexRequests = new CopyOnWriteArrayList<>();
    /** What the server answers the client's preface with (another value: a sidecar without the channel). */
    public volatile byte[] preface = FetchChannel.PREFACE;
    private final BiConsumer<FetchSegmentRequest, DataOutputStream> answer;
    private final BiConsumer<FetchIndexRequest, DataOutputStream> indexAnswer;

    /** A server answering range requests with {@code answer}; an index request is UNIMPLEMENTED. */
    public FrameSidecar(BiConsumer<FetchSegmentRequest, DataOutputStream> answer) throws IOException {
        this(answer, (req, out) -> end(out, FetchEnd.newBuilder().setCode(io.grpc.Status.Code.UNIMPLEMENTED.value())
                .setMessage("no index here").build()));
    }

    public FrameSidecar(BiConsumer<FetchSegmentRequest, DataOutputStream> answer,
                        BiConsumer<FetchIndexRequest, DataOutputStream> indexAnswer) throws IOException {
        this.answer = answer;
        this.indexAnswer = indexAnswer;
        server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        Thread t = new Thread(() -> {
            while (!server.isClosed()) {
                try {
                    Socket s = server.accept();
                    connections.incrementAndGet();
                    sockets.add(s);
                    Thread c = new Thread(() -> serve(s), "frame-sidecar-connection");
                    c.setDaemon(true);
                    c.start();
                } catch (IOException e) {
                    return;
                }
            }
        }, "frame-sidecar-accept");
        t.setDaemon(true);
        t.start();
    }

    private void serve(Socket s) {
        try (s) {
            DataInputStream in = new DataInputStream(s.getInputStream());
            DataOutputStream out = new DataOutputStream(new BufferedOutputStream(s.getOutputStream(), FRAME_BYTES + 16));
            byte[] p = new byte[FetchChannel.PREFACE.length];
            in.readFully(p);
            out.write(preface);
            out.flush();
            while (true) {
                byte type = in.readByte();
                byte[] payload = new byte[in.readInt()];
                in.readFully(payload);
                if (type == FetchChannel.REQUEST) {
                    FetchSegmentRequest req = FetchSegmentRequest.parseFrom(payload);
                    requests.add(req);
                    answer.accept(req, out);
                } else if (type == FetchChannel.INDEX_REQUEST) {
                    FetchIndexRequest req = FetchIndexRequest.parseFrom(payload);
                    indexRequests.add(req);
                    indexAnswer.accept(req, out);
                } else {
                    return; // not a request: the connection ends, as the sidecar ends it
                }
                out.flush();
            }
        } catch (IOException | RuntimeException e) {
            // the client closed, or the answer closed on purpose
        }
    }

    /** The port it listens on (127.0.0.1). */
    public int port() {
        return server.getLocalPort();
    }

    /** {@code rsm.config.sidecar.target} for a shim that reads from it. */
    public String target() {
        return "127.0.0.1:" + port();
    }

    ChannelConnection.Endpoint endpoint() {
        return new ChannelConnection.Endpoint("127.0.0.1", port(), null);
    }

    /** Writes one 'D' frame of {@code len} bytes of {@code b} from {@code off}. */
    public static void data(DataOutputStream out, byte[] b, int off, int len) {
        try {
            out.writeByte(FetchChannel.DATA);
            out.writeInt(len);
            out.write(b, off, len);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Writes bytes {@code [from, to)} of {@code b} in frames of at most {@code frame} bytes. */
    public static void data(DataOutputStream out, byte[] b, int from, int to, int frame) {
        for (int at = from; at < to; at += frame) {
            data(out, b, at, Math.min(frame, to - at));
        }
    }

    /** Writes the exchange's 'E' frame. */
    public static void end(DataOutputStream out, FetchEnd end) {
        try {
            byte[] p = end.toByteArray();
            out.writeByte(FetchChannel.END);
            out.writeInt(p.length);
            out.write(p);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /**
     * The honest answer for a segment of bytes {@code segment}: the asked-for range (its end
     * clamped to the segment's last byte) in frames of at most {@code frame} bytes, then OK.
     */
    public static BiConsumer<FetchSegmentRequest, DataOutputStream> honest(byte[] segment, int frame) {
        return (req, out) -> {
            int start = req.getStartPosition();
            int end = req.hasEndPosition() ? Math.min(req.getEndPosition() + 1, segment.length) : segment.length;
            data(out, segment, start, end, frame);
            end(out, FetchEnd.newBuilder().setLength(Math.max(0, end - start)).build());
        };
    }

    @Override
    public void close() throws IOException {
        server.close();
        for (Socket s : sockets) {
            s.close();
        }
    }
}
