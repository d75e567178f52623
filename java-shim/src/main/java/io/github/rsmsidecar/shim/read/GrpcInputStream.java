package io.github.rsmsidecar.shim.read;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.shim.ErrorMapper;
import io.github.rsmsidecar.shim.ShimConfig;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.Metadata;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.StatusException;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.nio.ByteBuffer;
import java.util.Objects;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * An {@link InputStream} over a server-streaming gRPC call, pulled as the reader reads.
 *
 * <ul>
 *   <li>Flow control: one message is requested ahead of the one being read, so at most two
 *       messages (2 MiB) are held per stream and the sidecar produces no faster
 *       than the broker reads.
 *   <li>{@link #close()} cancels the call if it has not ended; the sidecar sees the cancellation.
 *   <li>An error after the stream started is an {@link IOException} from {@code read}: the stream
 *       never ends early with a silent EOF. Only a call that ended with {@code OK} returns -1.
 *   <li>A reader blocked longer than the read timeout waiting for the next message gets an
 *       {@link IOException} and the call is cancelled (a stalled sidecar cannot hang a broker
 *       thread).
 *   <li>Optionally (fetch), a stream the reader has not touched for the idle timeout is cancelled,
 *       so a stream the broker forgot to close does not hold the sidecar's resources forever.
 *   <li>An interrupt while blocked cancels the call, keeps the interrupt flag and throws
 *       {@link InterruptedIOException}.
 * </ul>
 *
 * Reads are for one thread at a time; {@link #close()} may come from any thread.
 */
final class GrpcInputStream<RespT> extends RangeStream {

    private static final Logger LOG = LoggerFactory.getLogger(GrpcInputStream.class);
    private static final ByteBuffer EMPTY = ByteBuffer.allocate(0);

    /** The end of the call, queued after the last message. */
    private static final class End {
        final Status status;

        End(Status status) {
            this.status = status;
        }
    }

    private final ClientCall<?, RespT> call;
    private final Function<RespT, ByteString> data;
    private final String operation;
    private final long readTimeoutMs;
    private final String readTimeoutKey;
    private final LinkedBlockingQueue<Object> queue = new LinkedBlockingQueue<>();

    private ByteBuffer current = EMPTY;
    /** The rest of the current message's buffers after {@code current} (a rope of pieces). */
    private java.util.Iterator<ByteBuffer> pieces = java.util.Collections.emptyIterator();
    private Status end;
    private long bytesDelivered;

    private volatile boolean closed;
    private volatile boolean finished;
    private volatile boolean inRead;
    private volatile long lastReadNanos = System.nanoTime();
    private volatile ScheduledFuture<?> idleTask;
    private ScheduledExecutorService scheduler;
    private long idleTimeoutMs;

    private GrpcInputStream(ClientCall<?, RespT> call, Function<RespT, ByteString> data, String operation,
                            long readTimeoutMs, String readTimeoutKey) {
        this.call = call;
        this.data = data;
        this.operation = operation;
        this.readTimeoutMs = readTimeoutMs;
        this.readTimeoutKey = readTimeoutKey;
    }

    /**
     * Starts the call (sends {@code request}, half-closes, asks for the first message).
     *
     * @param readTimeoutMs longest wait for the next message inside {@code read}; 0 = none (rely on
     *                      the call's deadline)
     */
    static <ReqT, RespT> GrpcInputStream<RespT> start(Channel channel, MethodDescriptor<ReqT, RespT> method,
                                                      CallOptions options, ReqT request,
                                                      Function<RespT, ByteString> data, String operation,
                                                      long readTimeoutMs, String readTimeoutKey) {
        ClientCall<ReqT, RespT> call = channel.newCall(method, options);
        GrpcInputStream<RespT> stream = new GrpcInputStream<>(call, data, operation, readTimeoutMs, readTimeoutKey);
        call.start(new ClientCall.Listener<RespT>() {
            @Override
            public void onMessage(RespT message) {
                stream.queue.add(message);
            }

            @Override
            public void onClose(Status status, Metadata trailers) {
                stream.finished = true;
                stream.cancelIdleTask();
                stream.queue.add(new End(status));
            }
        }, new Metadata());
        call.request(1);
        call.sendMessage(request);
        call.halfClose();
        return stream;
    }

    /**
     * Waits for the first message or the end of the call, so that open errors (NOT_FOUND, ...)
     * surface from the method that opened the stream.
     *
     * @param timeoutMs how long to wait; 0 = until the call's own deadline
     * @param timeoutKey the config key behind {@code timeoutMs}, for the message
     * @throws StatusException the call failed before its first message, or no message came in time
     *                         ({@code DEADLINE_EXCEEDED}; the call is cancelled)
     * @throws InterruptedException after cancelling the call
     */
    void awaitFirst(long timeoutMs, String timeoutKey) throws StatusException, InterruptedException {
        Object first;
        try {
            first = timeoutMs > 0 ? queue.poll(timeoutMs, TimeUnit.MILLISECONDS) : queue.take();
        } catch (InterruptedException e) {
            cancel("interrupted while opening the stream", e);
            throw e;
        }
        if (first == null) {
            String why = "no response from the sidecar within " + timeoutMs + " ms (rsm.config." + timeoutKey + ")";
            cancel(why, null);
            throw Status.DEADLINE_EXCEEDED.withDescription(why).asException();
        }
        if (first instanceof End) {
            Status status = ((End) first).status;
            if (!status.isOk()) {
                throw status.asException();
            }
            end = status;
            return;
        }
        accept(first);
    }

    /** Cancels the call when the reader has not read for {@code idleTimeoutMs} (0 = never). */
    @Override
    void armIdleTimeout(ScheduledExecutorService scheduler, long idleTimeoutMs) {
        if (idleTimeoutMs <= 0 || finished) {
            return;
        }
        this.scheduler = scheduler;
        this.idleTimeoutMs = idleTimeoutMs;
        lastReadNanos = System.nanoTime();
        scheduleIdleCheck(idleTimeoutMs);
    }

    private void scheduleIdleCheck(long delayMs) {
        try {
            idleTask = scheduler.schedule(this::checkIdle, delayMs, TimeUnit.MILLISECONDS);
        } catch (RejectedExecutionException e) {
            // The shim is closing; the channel shutdown ends the call.
        }
        if (finished || closed) {
            cancelIdleTask();
        }
    }

    private void checkIdle() {
        if (finished || closed) {
            return;
        }
        long idleMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - lastReadNanos);
        if (!inRead && idleMs >= idleTimeoutMs) {
            LOG.warn("{}: the broker has not read from the stream for {} ms; cancelling the sidecar call "
                    + "(rsm.config.{}={})", operation, idleMs, ShimConfig.FETCH_IDLE_TIMEOUT_MS, idleTimeoutMs);
            call.cancel("the broker did not read for " + idleMs + " ms (rsm.config."
                    + ShimConfig.FETCH_IDLE_TIMEOUT_MS + "=" + idleTimeoutMs + ")", null);
            return;
        }
        scheduleIdleCheck(Math.max(1, idleTimeoutMs - (inRead ? 0 : idleMs)));
    }

    private void cancelIdleTask() {
        ScheduledFuture<?> t = idleTask;
        if (t != null) {
            t.cancel(false);
        }
    }

    /**
     * Takes {@code message} as the current buffer. The data function may throw
     * {@link java.io.UncheckedIOException}; the call is then cancelled and the exception rethrown.
     */
    @SuppressWarnings("unchecked")
    private void accept(Object message) {
        try {
            // a rope's pieces one by one: asReadOnlyByteBuffer() would copy them into one array
            pieces = data.apply((RespT) message).asReadOnlyByteBufferList().iterator();
            current = pieces.hasNext() ? pieces.next() : EMPTY;
        } catch (RuntimeException e) {
            cancel("the response could not be read: " + e.getMessage(), e);
            end = Status.CANCELLED.withDescription(e.getMessage());
            throw e;
        }
        call.request(1);
    }

    private void cancel(String why, Throwable cause) {
        call.cancel(why, cause);
    }

    /** Makes {@code current} non-empty; false at a clean end of stream. */
    private boolean fill() throws IOException {
        if (closed) {
            throw new IOException(operation + ": the stream is closed");
        }
        while (!current.hasRemaining()) {
            if (pieces.hasNext()) {
                current = pieces.next();
                continue;
            }
            if (end != null) {
                if (end.isOk()) {
                    return false;
                }
                throw broken(end);
            }
            Object next;
            try {
                next = readTimeoutMs > 0 ? queue.poll(readTimeoutMs, TimeUnit.MILLISECONDS) : queue.take();
            } catch (InterruptedException e) {
                cancel("interrupted while reading", e);
                end = Status.CANCELLED.withDescription("interrupted while reading");
                Thread.currentThread().interrupt();
                InterruptedIOException ioe = new InterruptedIOException(operation + ": interrupted after "
                        + bytesDelivered + " bytes; the sidecar call was cancelled");
                ioe.initCause(e);
                throw ioe;
            }
            if (next == null) {
                String why = "no data from the sidecar for " + readTimeoutMs + " ms (rsm.config." + readTimeoutKey + ")";
                cancel(why, null);
                end = Status.DEADLINE_EXCEEDED.withDescription(why);
                throw broken(end);
            }
            if (next instanceof End) {
                end = ((End) next).status;
                continue;
            }
            try {
                accept(next);
            } catch (java.io.UncheckedIOException e) {
                throw new IOException(operation + ": " + e.getMessage(), e.getCause());
            }
        }
        return true;
    }

    private IOException broken(Status status) {
        return new IOException(ErrorMapper.describe(operation + " stream (after " + bytesDelivered + " bytes)", status),
                status.asException());
    }

    @Override
    public int read() throws IOException {
        inRead = true;
        try {
            if (!fill()) {
                return -1;
            }
            bytesDelivered++;
            return current.get() & 0xff;
        } finally {
            lastReadNanos = System.nanoTime();
            inRead = false;
        }
    }

    @Override
    public int read(byte[] b, int off, int len) throws IOException {
        Objects.checkFromIndexSize(off, len, b.length);
        if (len == 0) {
            return 0;
        }
        inRead = true;
        try {
            if (!fill()) {
                return -1;
            }
            int n = Math.min(len, current.remaining());
            current.get(b, off, n);
            bytesDelivered += n;
            return n;
        } finally {
            lastReadNanos = System.nanoTime();
            inRead = false;
        }
    }

    @Override
    public int available() throws IOException {
        if (closed) {
            return 0;
        }
        return current.remaining();
    }

    /** Bytes handed to the reader so far. */
    long bytesDelivered() {
        return bytesDelivered;
    }

    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        cancelIdleTask();
        if (!finished) {
            call.cancel("closed by the broker", null);
        }
    }
}
