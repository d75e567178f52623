package io.github.rsmsidecar.shim.read;

import java.io.IOException;
import java.io.InputStream;
import java.util.Objects;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A fetch without an end position, read as a series of bounded {@code FetchSegment} calls
 * ("windows") so that the sidecar sends little more than the broker reads.
 *
 * <p>The broker's remote read ({@code RemoteLogManager.read}) opens a stream at a position, reads
 * one fetch's worth (the consumer's {@code max.partition.fetch.bytes}, 1 MiB by default) and
 * closes it. An open-ended call makes the sidecar send ahead of the reader: the message being
 * read, the one requested ahead and gRPC's flow-control window, about 3 bytes sent for every byte
 * the broker read (measured in {@code benchmarks/remote_read.py}). Here the first call asks for
 * {@code firstWindow} bytes; a read past its end opens the next call where it stopped, first
 * {@link #CONTINUATION_WINDOW} bytes, then each window twice the last up to {@code maxWindow}; the
 * reader sees one continuous stream. (The broker starts a read at the batch before the one it
 * wants, because Kafka's offset index maps each batch's last offset, so it reads one fetch plus one
 * producer batch: the caller sizes {@code firstWindow} from what the last read of the partition
 * took, and the small first continuation keeps a miss cheap.)
 *
 * <ul>
 *   <li>The last window (reaching the segment's size from its metadata) is open-ended, as a plain
 *       fetch is, so its clean end is the end of the segment.
 *   <li>A window that ends cleanly before its end position is a short stream: {@code read} throws
 *       {@link IOException} instead of returning -1 (never a silent early EOF).
 *   <li>A window that sends more than it was asked for is an {@link IOException} too.
 *   <li>Opening a later window may fail like any call (retried as the first one is); the failure
 *       reaches the reader as an {@link IOException} from {@code read}.
 *   <li>A window whose call breaks with {@code UNAVAILABLE} (the sidecar killed or restarted, its
 *       connection lost) is opened again where the reader stopped, up to the same end, at most
 *       {@link #MAX_RESUMES} times per stream: the reader sees one continuous stream, and the
 *       broker's remote read rides out the restart (the new call waits for the sidecar as any
 *       fetch does, {@code retry.fetch.max.ms}).
 * </ul>
 */
final class WindowedFetchStream extends BulkInputStream {

    private static final Logger LOG = LoggerFactory.getLogger(WindowedFetchStream.class);

    /**
     * An open window: a stream of exactly the bytes {@code [its start, end)} of the segment, or to
     * the end of the segment when {@code end} is the segment's size (the open-ended last window).
     */
    record Opened(InputStream in, long end) {
        Opened {
            Objects.requireNonNull(in);
        }
    }

    /**
     * Opens the window at {@code start}. {@code suggestedSize} is what a plain continuation asks
     * for; the opener may return another size (a window kept by {@link ReadAhead} ends where it
     * ends, a read-ahead window is larger), and the stream checks the bytes against the end it
     * returns.
     */
    @FunctionalInterface
    interface Opener {
        Opened open(long start, int suggestedSize) throws IOException;
    }

    /** The first window after the first one. */
    static final int CONTINUATION_WINDOW = 256 * 1024;
    /** Broken windows opened again per stream, at most. */
    static final int MAX_RESUMES = 3;

    private final Opener opener;
    private final java.util.function.LongConsumer onClose;
    private final String operation;
    private final long segmentSize;
    private final int maxWindow;
    private int nextWindow;
    private InputStream current;
    private long windowStart;
    /** Exclusive end of the current window; {@code segmentSize} for the open-ended last one. */
    private long windowEnd;
    private long position;
    private final long start;
    private int windows = 1;
    private int resumes;
    private boolean closed;

    /**
     * @param first the first window, from {@code start}, already open
     * @param onClose receives the position the reader reached when it closes the stream
     */
    WindowedFetchStream(Opened first, long start, int maxWindow, long segmentSize, Opener opener,
                        java.util.function.LongConsumer onClose, String operation) {
        this.current = first.in();
        this.opener = opener;
        this.onClose = onClose;
        this.operation = operation;
        this.segmentSize = segmentSize;
        this.maxWindow = Math.max(CONTINUATION_WINDOW, maxWindow);
        this.nextWindow = CONTINUATION_WINDOW;
        this.windowStart = start;
        this.windowEnd = Math.min(first.end(), segmentSize);
        this.position = start;
        this.start = start;
    }

    /** The end position (inclusive) to ask for a window of {@code size} bytes from {@code start}: null if it reaches the end. */
    static Integer windowEnd(long start, long size, long segmentSize) {
        return start + size >= segmentSize ? null : (int) (start + size - 1);
    }

    @Override
    public int read(byte[] b, int off, int len) throws IOException {
        Objects.checkFromIndexSize(off, len, b.length);
        if (closed) {
            throw new IOException(operation + ": the stream is closed");
        }
        if (len == 0) {
            return 0;
        }
        while (true) {
            int n;
            try {
                n = current.read(b, off, len);
            } catch (IOException e) {
                if (resumes >= MAX_RESUMES || position >= windowEnd || !brokenConnection(e)) {
                    throw e;
                }
                resumes++;
                LOG.info("{}: the window broke at {} ({}); reading on from there in a new call", operation, position,
                        e.getMessage());
                current.close();
                Opened again = opener.open(position, (int) Math.min(Integer.MAX_VALUE, windowEnd - position));
                if (again.end() <= position) {
                    again.in().close();
                    throw new IOException(operation + ": the window opened again at " + position + " ends at "
                            + again.end(), e);
                }
                windowStart = position;
                windowEnd = Math.min(again.end(), segmentSize);
                current = again.in();
                windows++;
                continue;
            }
            if (n > 0) {
                position += n;
                if (windowEnd < segmentSize && position > windowEnd) {
                    throw new IOException(operation + ": the sidecar sent " + (position - windowStart)
                            + " bytes for the window [" + windowStart + ", " + windowEnd + ") it was asked for");
                }
                return n;
            }
            if (windowEnd >= segmentSize) {
                return -1; // the open-ended last window ended cleanly: the end of the segment
            }
            if (position < windowEnd) {
                throw new IOException(operation + ": the sidecar ended the window [" + windowStart + ", " + windowEnd
                        + ") after " + (position - windowStart) + " bytes; a short stream is not the end of the segment");
            }
            current.close();
            int window = nextWindow;
            nextWindow = (int) Math.min((long) window * 2, maxWindow);
            Opened next = opener.open(position, window);
            if (next.end() <= position) {
                next.in().close();
                throw new IOException(operation + ": the window opened at " + position + " ends at " + next.end());
            }
            windowStart = position;
            windowEnd = Math.min(next.end(), segmentSize);
            current = next.in();
            windows++;
        }
    }

    /** Whether {@code e} says the window's call lost its connection ({@code UNAVAILABLE}). */
    static boolean brokenConnection(IOException e) {
        if (e instanceof java.io.InterruptedIOException) {
            return false;
        }
        for (Throwable t = e.getCause(); t != null; t = t.getCause()) {
            if (t instanceof io.grpc.StatusException se) {
                return se.getStatus().getCode() == io.grpc.Status.Code.UNAVAILABLE;
            }
        }
        return false;
    }

    @Override
    public int available() throws IOException {
        return closed ? 0 : current.available();
    }

    @Override
    public void close() throws IOException {
        if (closed) {
            return;
        }
        closed = true;
        LOG.debug("{}: closed after {} bytes in {} window(s)", operation, position - start, windows);
        onClose.accept(position);
        current.close();
    }
}
