package io.github.rsmsidecar.shim.read;

import java.io.Closeable;
import java.io.EOFException;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.SocketTimeoutException;
import java.net.StandardSocketOptions;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLEngineResult;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLSession;
import jdk.net.ExtendedSocketOptions;

/**
 * One connection of the fetch channel: a socket (TCP or a Unix socket) read and written in blocking
 * style with timeouts, through a TLS engine when there is one. No framework: the broker runs a
 * socket read, BoringSSL's decryption (netty-tcnative's {@code SSLEngine}, or the JDK's) and one
 * copy into the caller's array per read, and the JIT has little to compile.
 *
 * <p>Not thread-safe: one exchange at a time (the fetch channel's protocol), closed from any thread.
 */
final class ChannelConnection implements Closeable {

    /** Where the sidecar listens: a TCP host and port, or a Unix socket path. */
    record Endpoint(String host, int port, String socketPath) {
        SocketAddress address() {
            return socketPath != null ? UnixDomainSocketAddress.of(socketPath) : new InetSocketAddress(host, port);
        }

        @Override
        public String toString() {
            return socketPath != null ? "unix://" + socketPath : host + ":" + port;
        }
    }

    private static final ByteBuffer EMPTY = ByteBuffer.allocate(0);
    /** The most room a TLS engine is given for one unwrap. */
    private static final int MAX_APP_BUFFER = 1024 * 1024;

    private final SocketChannel socket;
    private final Selector selector;
    private final SSLEngine tls;
    /** Bytes received and not yet decrypted (TLS) or not yet read (plain), in read mode. */
    private final ByteBuffer netIn;
    /** Decrypted bytes not yet read (TLS only, direct), in read mode; grows if an engine wants more room. */
    private ByteBuffer appIn;
    private final ByteBuffer netOut;
    private final Endpoint endpoint;
    private volatile boolean closed;

    private ChannelConnection(SocketChannel socket, SSLEngine tls, Endpoint endpoint) throws IOException {
        this.socket = socket;
        this.tls = tls;
        this.endpoint = endpoint;
        this.selector = Selector.open();
        int packet = tls == null ? 64 * 1024 : Math.max(tls.getSession().getPacketBufferSize(), 32 * 1024);
        int app = tls == null ? 0 : tls.getSession().getApplicationBufferSize();
        this.netIn = ByteBuffer.allocateDirect(4 * packet).flip();
        this.appIn = (tls == null ? ByteBuffer.allocate(1) : ByteBuffer.allocateDirect(4 * Math.max(app, packet))).flip();
        this.netOut = ByteBuffer.allocateDirect(tls == null ? 1 : packet + 1024);
    }

    /**
     * Connects to {@code endpoint} within {@code connectTimeoutMs} and, with {@code tls}, completes
     * its handshake (its deadline too).
     */
    static ChannelConnection open(Endpoint endpoint, SSLEngine tls, long connectTimeoutMs) throws IOException {
        return open(endpoint, tls, connectTimeoutMs, 0, 0);
    }

    /**
     * As {@link #open(Endpoint, SSLEngine, long)}, and over TCP with the kernel's keepalive probes
     * after {@code keepaliveTimeMs} without a packet from the sidecar, one a second, the connection
     * taken for dead when {@code keepaliveTimeoutMs} of them go unanswered (0: the system's
     * defaults): a stream whose sidecar vanished (its pod replaced, nothing answers, not even a
     * reset) fails within seconds, as the gRPC channel's does (ChannelFactory#tcpOptions). The
     * JDK has no {@code TCP_USER_TIMEOUT}; while the shim only reads, the probes are enough.
     */
    static ChannelConnection open(Endpoint endpoint, SSLEngine tls, long connectTimeoutMs, long keepaliveTimeMs,
                                  long keepaliveTimeoutMs) throws IOException {
        SocketChannel ch = endpoint.socketPath() != null
                ? SocketChannel.open(java.net.StandardProtocolFamily.UNIX) : SocketChannel.open();
        ChannelConnection c = null;
        try {
            if (endpoint.socketPath() == null) {
                ch.setOption(StandardSocketOptions.TCP_NODELAY, true);
                ch.setOption(StandardSocketOptions.SO_KEEPALIVE, true);
                if (keepaliveTimeMs > 0 && ch.supportedOptions().contains(ExtendedSocketOptions.TCP_KEEPIDLE)) {
                    ch.setOption(ExtendedSocketOptions.TCP_KEEPIDLE, (int) ((keepaliveTimeMs + 999) / 1000));
                    ch.setOption(ExtendedSocketOptions.TCP_KEEPINTERVAL, 1);
                    ch.setOption(ExtendedSocketOptions.TCP_KEEPCOUNT,
                            (int) Math.max(1, (keepaliveTimeoutMs + 999) / 1000));
                }
            }
            ch.configureBlocking(false);
            c = new ChannelConnection(ch, tls, endpoint);
            long deadline = System.nanoTime() + connectTimeoutMs * 1_000_000L;
            if (!ch.connect(endpoint.address())) {
                // await may return a moment before the deadline with nothing ready (its wait is
                // rounded down to whole milliseconds): wait again until connected or timed out
                do {
                    c.await(SelectionKey.OP_CONNECT, deadline, "connecting");
                } while (!ch.finishConnect());
            }
            if (tls != null) {
                c.handshake(deadline);
            }
            return c;
        } catch (IOException | RuntimeException e) {
            if (c != null) {
                c.close();
            } else {
                ch.close();
            }
            throw e;
        }
    }

    Endpoint endpoint() {
        return endpoint;
    }

    /** The negotiated ALPN protocol, or null (no TLS, or none negotiated). */
    String applicationProtocol() {
        if (tls == null) {
            return null;
        }
        String p = tls.getApplicationProtocol();
        return p == null || p.isEmpty() ? null : p;
    }

    SSLSession session() {
        return tls == null ? null : tls.getSession();
    }

    // ---- writing -----------------------------------------------------------------------------

    /** Writes all of {@code src} within {@code timeoutMs}. */
    void write(ByteBuffer src, long timeoutMs) throws IOException {
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        if (tls == null) {
            while (src.hasRemaining()) {
                if (socket.write(src) == 0) {
                    await(SelectionKey.OP_WRITE, deadline, "writing");
                }
            }
            return;
        }
        while (src.hasRemaining()) {
            netOut.clear();
            SSLEngineResult r = tls.wrap(src, netOut);
            if (r.getStatus() == SSLEngineResult.Status.CLOSED) {
                throw new EOFException("the TLS session with " + endpoint + " was closed");
            }
            flush(deadline);
        }
    }

    private void flush(long deadline) throws IOException {
        netOut.flip();
        while (netOut.hasRemaining()) {
            if (socket.write(netOut) == 0) {
                await(SelectionKey.OP_WRITE, deadline, "writing");
            }
        }
    }

    // ---- reading -----------------------------------------------------------------------------

    /**
     * Reads at least one byte into {@code b[off, off + len)} ({@code len > 0}), waiting at most
     * {@code timeoutMs} for it; -1 at the end of the stream.
     */
    int read(byte[] b, int off, int len, long timeoutMs) throws IOException {
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        if (tls == null) {
            if (netIn.hasRemaining()) {
                int n = Math.min(len, netIn.remaining());
                netIn.get(b, off, n);
                return n;
            }
            ByteBuffer dst = ByteBuffer.wrap(b, off, len);
            while (true) {
                int n = socket.read(dst);
                if (n != 0) {
                    return n;
                }
                await(SelectionKey.OP_READ, deadline, "reading");
            }
        }
        if (!appIn.hasRemaining()) {
            if (decrypt(deadline) < 0) {
                return -1;
            }
        }
        int n = Math.min(len, appIn.remaining());
        appIn.get(b, off, n);
        return n;
    }

    /**
     * Decrypts into {@code appIn} (empty on entry) every whole record there is room for, reading
     * the socket until at least one byte is decrypted; -1 at the end of the stream. The engine
     * decrypts into a direct buffer of ours: into a heap array, netty's engine would take a
     * direct buffer from its allocator for each record and copy it over, which costs the broker
     * the allocator's code, its JIT compilation and a copy.
     */
    private int decrypt(long deadline) throws IOException {
        appIn.clear();
        try {
            while (true) {
                SSLEngineResult r = tls.unwrap(netIn, appIn);
                switch (r.getStatus()) {
                    case OK:
                        if (r.getHandshakeStatus() == SSLEngineResult.HandshakeStatus.NEED_WRAP
                                || r.getHandshakeStatus() == SSLEngineResult.HandshakeStatus.NEED_TASK) {
                            continueHandshake(deadline); // TLS 1.3 key updates
                        }
                        if (appIn.position() > 0 && (!netIn.hasRemaining()
                                || appIn.remaining() < tls.getSession().getApplicationBufferSize())) {
                            return appIn.position(); // what is there; the rest at the next read
                        }
                        break;
                    case BUFFER_UNDERFLOW:
                        if (appIn.position() > 0) {
                            return appIn.position();
                        }
                        if (fill(deadline) < 0) {
                            return -1;
                        }
                        break;
                    case BUFFER_OVERFLOW:
                        if (appIn.position() > 0) {
                            return appIn.position();
                        }
                        if (appIn.capacity() >= MAX_APP_BUFFER) {
                            throw new IOException("TLS record from " + endpoint + " needs more than "
                                    + MAX_APP_BUFFER + " bytes");
                        }
                        appIn = ByteBuffer.allocateDirect(appIn.capacity() * 2);
                        break;
                    case CLOSED:
                    default:
                        return appIn.position() > 0 ? appIn.position() : -1;
                }
            }
        } finally {
            appIn.flip();
        }
    }

    /** Reads exactly {@code len} bytes; {@link EOFException} if the stream ends first. */
    void readFully(byte[] b, int off, int len, long timeoutMs) throws IOException {
        while (len > 0) {
            int n = read(b, off, len, timeoutMs);
            if (n < 0) {
                throw new EOFException("the connection to " + endpoint + " ended");
            }
            off += n;
            len -= n;
        }
    }

    /** Reads more from the socket into {@code netIn}; -1 at the end of the stream. */
    private int fill(long deadline) throws IOException {
        netIn.compact();
        try {
            while (true) {
                int n = socket.read(netIn);
                if (n != 0) {
                    return n;
                }
                await(SelectionKey.OP_READ, deadline, "reading");
            }
        } finally {
            netIn.flip();
        }
    }

    // ---- TLS handshake -----------------------------------------------------------------------

    private void handshake(long deadline) throws IOException {
        tls.beginHandshake();
        continueHandshake(deadline);
    }

    private void continueHandshake(long deadline) throws IOException {
        while (true) {
            switch (tls.getHandshakeStatus()) {
                case NEED_WRAP: {
                    netOut.clear();
                    SSLEngineResult r = tls.wrap(EMPTY, netOut);
                    flush(deadline);
                    if (r.getStatus() == SSLEngineResult.Status.CLOSED) {
                        throw new SSLException("the TLS handshake with " + endpoint + " was closed");
                    }
                    break;
                }
                case NEED_UNWRAP:
                case NEED_UNWRAP_AGAIN: {
                    ByteBuffer scratch = appIn.compact();
                    SSLEngineResult r;
                    try {
                        r = tls.unwrap(netIn, scratch);
                    } finally {
                        appIn.flip();
                    }
                    if (r.getStatus() == SSLEngineResult.Status.BUFFER_UNDERFLOW && fill(deadline) < 0) {
                        throw new EOFException("the connection to " + endpoint + " ended during the TLS handshake");
                    }
                    if (r.getStatus() == SSLEngineResult.Status.CLOSED) {
                        throw new SSLException("the TLS handshake with " + endpoint + " was closed");
                    }
                    break;
                }
                case NEED_TASK: {
                    Runnable task;
                    while ((task = tls.getDelegatedTask()) != null) {
                        task.run();
                    }
                    break;
                }
                case FINISHED:
                case NOT_HANDSHAKING:
                default:
                    return;
            }
        }
    }

    // ---- waiting -----------------------------------------------------------------------------

    private void await(int op, long deadline, String what) throws IOException {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
            throw new SocketTimeoutException(what + " " + endpoint + " timed out");
        }
        SelectionKey key = socket.register(selector, op);
        try {
            if (selector.select(Math.max(1, left / 1_000_000L)) == 0) {
                if (Thread.interrupted()) {
                    Thread.currentThread().interrupt();
                    throw new java.io.InterruptedIOException(what + " " + endpoint + " interrupted");
                }
                if (deadline - System.nanoTime() <= 0) {
                    throw new SocketTimeoutException(what + " " + endpoint + " timed out");
                }
            }
        } finally {
            key.interestOps(0);
            selector.selectedKeys().clear();
        }
    }

    boolean isOpen() {
        return !closed && socket.isOpen();
    }

    @Override
    public void close() {
        closed = true;
        try {
            socket.close();
        } catch (IOException e) {
            // nothing to do
        }
        try {
            selector.close();
        } catch (IOException e) {
            // nothing to do
        }
        if (tls != null) {
            tls.closeOutbound();
            // netty's engine frees its native state when released
            if (tls instanceof io.grpc.netty.shaded.io.netty.util.ReferenceCounted rc && rc.refCnt() > 0) {
                rc.release(rc.refCnt());
            }
        }
    }
}
