package io.github.rsmsidecar.shim.read;

import io.github.rsmsidecar.proto.v1.FetchEnd;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.grpc.Status;
import io.grpc.StatusException;
import java.io.EOFException;
import java.io.IOException;
import java.io.InterruptedIOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Iterator;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The client of the sidecar's fetch channel (rsm.proto, "The fetch channel"): a range's bytes as
 * raw frames on a connection of its own, beside gRPC, on the same address. Connections are kept
 * for the next exchange ({@link #IDLE_MS} at most, fewer than the sidecar's own idle limit) and
 * opened as needed, one exchange at a time each.
 *
 * <p>What a sidecar sends is checked as it arrives: frame types and sizes, never more bytes than
 * the range holds, exactly the range's length before an OK end, the end's own count. An end with
 * another status before any byte is that status (a {@link StatusException}, which the caller's
 * retries and error mapping treat as gRPC's); after bytes, and any broken connection, it is an
 * {@link IOException} from {@code read}: never a short read.
 */
public final class FetchChannel implements AutoCloseable {

    /** The logger, loaded at its first use: the connectivity check runs without slf4j. */
    private static final class Log {
        static final Logger LOG = LoggerFactory.getLogger(FetchChannel.class);
    }

    /** What the client sends first, and the sidecar answers with (rsm.proto). */
    static final byte[] PREFACE = "RSMFv1\r\n".getBytes(StandardCharsets.US_ASCII);
    static final String ALPN_PROTOCOL = "rsm-fetch/1";
    static final byte REQUEST = 'Q';
    static final byte INDEX_REQUEST = 'I';
    static final byte DATA = 'D';
    static final byte END = 'E';
    static final int HEADER_BYTES = 5;
    /** The largest 'D' payload the protocol allows. */
    static final int MAX_DATA_FRAME_BYTES = 4 * 1024 * 1024;
    /** The largest 'E' payload accepted (a FetchEnd: a status message and a segment's metadata). */
    static final int MAX_END_FRAME_BYTES = 64 * 1024;
    /** The largest index accepted (the sidecar's copies take index files of at most 1 GiB). */
    static final long MAX_INDEX_BYTES = 1L << 30;
    /** A connection idle for this long is closed rather than used again (the sidecar keeps them 300 s). */
    static final long IDLE_MS = 60_000;

    /** The sidecar answered, but not as a fetch channel: an older sidecar. */
    static final class NotAvailable extends IOException {
        NotAvailable(String message) {
            super(message);
        }
    }

    /** The sidecar broke the protocol (too many bytes, a bad frame): never retried. */
    static final class ProtocolViolation extends IOException {
        ProtocolViolation(String message) {
            super(message);
        }
    }

    private record Idle(ChannelConnection connection, long sinceNanos) {
    }

    private final ChannelConnection.Endpoint endpoint;
    /** A new TLS engine for each connection (the current certificates), or null for plaintext. */
    private final Supplier<SSLEngine> tls;
    private final long connectTimeoutMs;
    /** keepalive.time.ms and keepalive.timeout.ms for TCP connections (0: the system's defaults) */
    private volatile long keepaliveTimeMs;
    private volatile long keepaliveTimeoutMs;
    private final long deadlineMs;
    private final long readTimeoutMs;
    private final java.util.concurrent.atomic.LongAdder bytes;
    private final ConcurrentLinkedDeque<Idle> idle = new ConcurrentLinkedDeque<>();
    private volatile boolean closed;

    /**
     * @param deadlineMs     longest wait for the first answer to a request (a refusal, or its first bytes)
     * @param readTimeoutMs  longest wait for more bytes once they flow
     * @param bytes          counts the range bytes received
     */
    FetchChannel(ChannelConnection.Endpoint endpoint, Supplier<SSLEngine> tls, long connectTimeoutMs,
                 long deadlineMs, long readTimeoutMs, java.util.concurrent.atomic.LongAdder bytes) {
        this.endpoint = endpoint;
        this.tls = tls;
        this.connectTimeoutMs = connectTimeoutMs;
        this.deadlineMs = deadlineMs;
        this.readTimeoutMs = readTimeoutMs;
        this.bytes = bytes;
    }

    /** Watches its TCP connections with keepalive probes (ChannelConnection#open); returns this. */
    FetchChannel keepalive(long timeMs, long timeoutMs) {
        this.keepaliveTimeMs = timeMs;
        this.keepaliveTimeoutMs = timeoutMs;
        return this;
    }

    ChannelConnection.Endpoint endpoint() {
        return endpoint;
    }

    /**
     * Asks for {@code request}'s range, which holds {@code length} bytes, and returns the stream of
     * them once the sidecar started answering.
     *
     * @throws StatusException the sidecar refused the range (its status), or could not be reached
     *                         ({@code UNAVAILABLE})
     * @throws NotAvailable    the sidecar has no fetch channel
     */
    Stream open(FetchSegmentRequest request, long length, String op)
            throws StatusException, NotAvailable, InterruptedIOException {
        return exchange(REQUEST, request.toByteArray(), length, op);
    }

    /**
     * Asks for the index {@code request} names; its length is not known ahead (the end frame
     * says it, and the stream checks it).
     *
     * @throws StatusException as {@link #open}: NOT_FOUND for a segment without that index
     */
    Stream openIndex(io.github.rsmsidecar.proto.v1.FetchIndexRequest request, String op)
            throws StatusException, NotAvailable, InterruptedIOException {
        return exchange(INDEX_REQUEST, request.toByteArray(), -1, op);
    }

    private Stream exchange(byte type, byte[] payload, long length, String op)
            throws StatusException, NotAvailable, InterruptedIOException {
        ByteBuffer frame = ByteBuffer.allocate(HEADER_BYTES + payload.length);
        frame.put(type).putInt(payload.length).put(payload).flip();
        while (true) {
            ChannelConnection c = pooled();
            boolean reused = c != null;
            // A kept TCP connection may have died while idle with nothing to tell (the sidecar's
            // address vanished: no reset, and the JDK cannot set TCP_USER_TIMEOUT to bound the
            // request's retransmissions): the first answer on it is awaited keepalive.timeout.ms,
            // then the request is asked again on a new connection, whose answer gets the deadline.
            long firstWaitMs = reused && endpoint.socketPath() == null && keepaliveTimeoutMs > 0
                    ? Math.min(deadlineMs, keepaliveTimeoutMs) : deadlineMs;
            try {
                if (c == null) {
                    c = connect(op);
                }
                c.write(frame.duplicate(), readTimeoutMs);
                Stream s = new Stream(c, length, op);
                s.first(firstWaitMs); // the first frame: bytes, or the end (a status)
                return s;
            } catch (StatusException | NotAvailable e) {
                throw e;
            } catch (java.net.SocketTimeoutException e) {
                close(c);
                if (reused && firstWaitMs < deadlineMs) {
                    Log.LOG.debug("{}: no answer within {} ms on a kept fetch channel connection; asking on a new one",
                            op, firstWaitMs);
                    continue;
                }
                throw e;
            } catch (ProtocolViolation e) {
                close(c);
                throw Status.INTERNAL.withDescription(e.getMessage()).withCause(e).asException();
            } catch (InterruptedIOException e) {
                close(c);
                throw e;
            } catch (IOException e) {
                close(c);
                if (reused) {
                    Log.LOG.debug("{}: a kept fetch channel connection had ended ({}); asking on a new one", op, e.toString());
                    continue; // the sidecar closed it while it was idle: nothing was read yet
                }
                throw Status.UNAVAILABLE.withDescription("fetch channel to " + endpoint + ": " + e)
                        .withCause(e).asException();
            }
        }
    }

    private ChannelConnection pooled() {
        long now = System.nanoTime();
        Idle i;
        while ((i = idle.pollFirst()) != null) {
            if (now - i.sinceNanos() < TimeUnit.MILLISECONDS.toNanos(IDLE_MS) && i.connection().isOpen()) {
                return i.connection();
            }
            i.connection().close();
        }
        return null;
    }

    private ChannelConnection connect(String op) throws IOException, StatusException {
        SSLEngine engine = tls == null ? null : tls.get();
        ChannelConnection c;
        try {
            c = ChannelConnection.open(endpoint, engine, connectTimeoutMs, keepaliveTimeMs, keepaliveTimeoutMs);
        } catch (SSLException e) {
            throw Status.UNAVAILABLE.withDescription("fetch channel: TLS handshake with " + endpoint + " failed: "
                    + e.getMessage()).withCause(e).asException();
        } catch (IOException e) {
            // refused, timed out, or (a Unix socket) no socket file at the path
            String why = e.getMessage() != null ? e.getMessage() : e.getClass().getSimpleName();
            if (endpoint.socketPath() != null && !java.nio.file.Files.exists(java.nio.file.Path.of(endpoint.socketPath()))) {
                why = "no socket file at " + endpoint.socketPath() + " (is the sidecar running?)";
            }
            throw Status.UNAVAILABLE.withDescription("fetch channel: cannot connect to " + endpoint + ": " + why)
                    .asException();
        }
        try {
            if (engine != null && !ALPN_PROTOCOL.equals(c.applicationProtocol())) {
                throw new NotAvailable("the sidecar at " + endpoint + " did not accept the TLS protocol "
                        + ALPN_PROTOCOL + " (it chose " + c.applicationProtocol() + "): it has no fetch channel");
            }
            c.write(ByteBuffer.wrap(PREFACE), connectTimeoutMs);
            byte[] answer = new byte[PREFACE.length];
            try {
                c.readFully(answer, 0, answer.length, connectTimeoutMs);
            } catch (EOFException e) {
                throw new NotAvailable("the sidecar at " + endpoint + " closed the connection after the fetch "
                        + "channel's preface: it has no fetch channel");
            }
            if (!Arrays.equals(answer, PREFACE)) {
                throw new NotAvailable("the sidecar at " + endpoint + " answered the fetch channel's preface with "
                        + printable(answer) + ": it has no fetch channel");
            }
            return c;
        } catch (IOException | RuntimeException e) {
            c.close();
            throw e;
        }
    }

    /**
     * One line saying whether the sidecar at {@code config}'s target has its fetch channel: one
     * connection and the prefaces exchanged, as the first fetch would (the connectivity check,
     * {@code Diagnose}, which runs without Kafka's classes).
     */
    public static String probe(io.github.rsmsidecar.shim.ShimConfig config, Supplier<SSLEngine> tls) {
        String[] address = config.fetchChannelAddress();
        ChannelConnection.Endpoint endpoint = address.length == 1
                ? new ChannelConnection.Endpoint(null, 0, address[0])
                : new ChannelConnection.Endpoint(address[0], Integer.parseInt(address[1]), null);
        try (FetchChannel c = new FetchChannel(endpoint, tls, config.connectTimeoutMs(), config.fetchDeadlineMs(),
                config.fetchReadTimeoutMs(), new java.util.concurrent.atomic.LongAdder())) {
            return c.probe();
        }
    }

    private String probe() {
        try {
            connect("the connectivity check").close();
            return "fetch channel: ready (" + endpoint + (tls != null ? ", TLS" : "") + ")";
        } catch (NotAvailable e) {
            return "fetch channel: not offered (" + e.getMessage() + "); fetches go over gRPC";
        } catch (StatusException e) {
            return "fetch channel: unreachable (" + oneLine(e.getStatus().getDescription()) + ")";
        } catch (IOException e) {
            return "fetch channel: failed (" + oneLine(e.toString()) + ")";
        }
    }

    private static String printable(byte[] b) {
        StringBuilder s = new StringBuilder();
        for (byte x : b) {
            s.append(x >= 0x20 && x < 0x7f ? String.valueOf((char) x) : String.format("\\x%02x", x & 0xff));
        }
        return "'" + s + "'";
    }

    private void release(ChannelConnection c) {
        if (closed || !c.isOpen()) {
            c.close();
            return;
        }
        idle.addFirst(new Idle(c, System.nanoTime()));
    }

    private static void close(ChannelConnection c) {
        if (c != null) {
            c.close();
        }
    }

    /** Closes the idle connections and every connection handed back later. */
    @Override
    public void close() {
        closed = true;
        Iterator<Idle> it = idle.iterator();
        while (it.hasNext()) {
            it.next().connection().close();
            it.remove();
        }
    }

    /**
     * The bytes of one exchange as they arrive. Closing it before its end closes the connection
     * (the sidecar stops); at its end the connection goes back for the next exchange.
     */
    final class Stream extends RangeStream {
        private final ChannelConnection connection;
        private final long length;
        private final String op;
        private final byte[] header = new byte[HEADER_BYTES];
        /** Bytes left in the current 'D' frame. */
        private int frameLeft;
        private long received;
        private boolean ended;
        private boolean closed;
        private SegmentMetadata next;
        private volatile long lastReadNanos = System.nanoTime();
        private volatile java.util.concurrent.ScheduledFuture<?> idleCheck;

        private Stream(ChannelConnection connection, long length, String op) {
            this.connection = connection;
            this.length = length;
            this.op = op;
        }

        /**
         * Reads the exchange's first frame header: bytes follow, or the end came at once (an empty
         * range, or a refusal, which throws its status); either way the connection goes back.
         */
        private void first(long timeoutMs) throws IOException, StatusException {
            FetchEnd end = nextFrame(timeoutMs);
            if (end == null) {
                return;
            }
            ended = true;
            release(connection);
            if (end.getCode() != 0) {
                throw Status.fromCodeValue(end.getCode()).withDescription(oneLine(end.getMessage())).asException();
            }
        }

        /** Reads a frame header; for a 'D' sets {@code frameLeft}; an 'E' is checked and returned. */
        private FetchEnd nextFrame(long timeoutMs) throws IOException {
            connection.readFully(header, 0, HEADER_BYTES, timeoutMs);
            int size = ByteBuffer.wrap(header, 1, 4).getInt();
            byte type = header[0];
            if (type == DATA) {
                if (size <= 0 || size > MAX_DATA_FRAME_BYTES) {
                    throw protocol("a data frame of " + size + " bytes (1.." + MAX_DATA_FRAME_BYTES + " allowed)");
                }
                if (length >= 0 && received + size > length) {
                    throw protocol("more than the " + length + " bytes of the range (" + (received + size) + ")");
                }
                if (received + size > MAX_INDEX_BYTES) {
                    throw protocol("more than " + MAX_INDEX_BYTES + " bytes");
                }
                frameLeft = size;
                return null;
            }
            if (type != END) {
                throw protocol("a frame of type " + (type & 0xff) + " (expected 'D' or 'E')");
            }
            if (size < 0 || size > MAX_END_FRAME_BYTES) {
                throw protocol("an end frame of " + size + " bytes");
            }
            byte[] payload = new byte[size];
            connection.readFully(payload, 0, size, readTimeoutMs);
            FetchEnd end;
            try {
                end = FetchEnd.parseFrom(payload);
            } catch (com.google.protobuf.InvalidProtocolBufferException e) {
                throw protocol("an end frame that does not parse (" + e.getMessage() + ")");
            }
            if (end.getCode() == 0) {
                if (end.getLength() != received || (length >= 0 && received != length)) {
                    throw protocol("an OK end after " + received + " bytes (it says " + end.getLength()
                            + ") of a range of " + length);
                }
                if (end.hasNextSegment()) {
                    next = end.getNextSegment();
                }
            }
            return end;
        }

        private ProtocolViolation protocol(String what) {
            return new ProtocolViolation(op + ": the sidecar's fetch channel sent " + what + "; the read fails");
        }

        @Override
        public int read(byte[] b, int off, int len) throws IOException {
            if (closed) {
                throw new IOException(op + ": stream closed");
            }
            if (len == 0) {
                return 0;
            }
            if (ended) {
                return -1;
            }
            try {
                while (frameLeft == 0) {
                    FetchEnd end = nextFrame(readTimeoutMs);
                    if (end != null) {
                        ended = true;
                        if (end.getCode() != 0) {
                            release(connection); // a clean end: the connection serves on
                            Status status = Status.fromCodeValue(end.getCode()).withDescription(oneLine(end.getMessage()));
                            throw new IOException(op + ": the sidecar failed the read after " + received + " bytes: "
                                    + status.getCode() + ": " + status.getDescription(), status.asException());
                        }
                        release(connection);
                        return -1;
                    }
                }
                int n = connection.read(b, off, Math.min(len, frameLeft), readTimeoutMs);
                if (n < 0) {
                    throw new EOFException("the connection ended inside a data frame");
                }
                frameLeft -= n;
                received += n;
                bytes.add(n);
                lastReadNanos = System.nanoTime();
                return n;
            } catch (IOException e) {
                if (!ended) {
                    ended = true;
                    connection.close();
                }
                if (e.getMessage() != null && e.getMessage().startsWith(op)) {
                    throw e;
                }
                // UNAVAILABLE, as gRPC says of a broken connection: a window may be asked for again
                // from where the reader stopped (WindowedFetchStream)
                throw new IOException(op + ": UNAVAILABLE: the fetch channel to " + connection.endpoint() + " broke after "
                        + received + " of " + length + " bytes: " + e, Status.UNAVAILABLE.withCause(e)
                        .withDescription(e.toString()).asException());
            }
        }

        @Override
        SegmentMetadata nextSegment() {
            return next;
        }

        long received() {
            return received;
        }

        /**
         * Closes the stream (and its connection) once the reader has not read for {@code idleMs}
         * (0: never): a stream the broker forgot to close holds no connection for ever.
         */
        @Override
        void armIdleTimeout(java.util.concurrent.ScheduledExecutorService scheduler, long idleMs) {
            if (idleMs <= 0 || ended) {
                return;
            }
            try {
                idleCheck = scheduler.schedule(() -> {
                    long idle = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - lastReadNanos);
                    if (idle >= idleMs) {
                        Log.LOG.warn("{}: the broker has not read from the stream for {} ms; closing it (rsm.config."
                                + "fetch.idle.timeout.ms={})", op, idle, idleMs);
                        abandon();
                    } else {
                        armIdleTimeout(scheduler, idleMs - idle);
                    }
                }, idleMs, TimeUnit.MILLISECONDS);
            } catch (java.util.concurrent.RejectedExecutionException e) {
                // the shim is closing
            }
        }

        private synchronized void abandon() {
            if (!ended) {
                ended = true;
                connection.close();
            }
        }

        @Override
        public void close() {
            if (closed) {
                return;
            }
            closed = true;
            java.util.concurrent.ScheduledFuture<?> t = idleCheck;
            if (t != null) {
                t.cancel(false);
            }
            if (!ended) {
                ended = true;
                connection.close(); // mid-range: the sidecar's next write fails and it stops
            }
        }
    }

    static String oneLine(String s) {
        return s == null ? "" : s.replace('\n', ' ').replace('\r', ' ');
    }
}
