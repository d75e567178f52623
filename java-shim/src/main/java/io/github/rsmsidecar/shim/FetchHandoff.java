package io.github.rsmsidecar.shim;

import io.github.rsmsidecar.proto.v1.HandoffFile;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.AsynchronousFileChannel;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads the files of fetch hand-off: over a Unix socket the sidecar may answer a fetch with the
 * name of a file in its hand-off directory ({@code <socket path>.handoff}) holding the whole
 * requested range, instead of streaming the bytes over gRPC (rsm.proto {@code HandoffFile};
 * {@code rsm_sidecar/service/handoff.py}). Streaming a window through gRPC and Netty cost the
 * broker more CPU than the data itself (docs/operations.md, remote reads).
 *
 * <ul>
 *   <li>Only a plain file name inside the directory the shim derives from its own socket path is
 *       read (no directory part, no symbolic link, a regular file of exactly the announced size):
 *       a sidecar cannot make the broker read anything else.
 *   <li>The file is deleted as soon as it is open; the broker reads it through the open channel
 *       (nothing of the window's size is held in the heap).
 *   <li>A failure (the directory is not readable by the broker's user, the file vanished, ...)
 *       turns hand-off off for {@link #RETRY_AFTER_MS} with one warning; the fetch is asked again
 *       without hand-off, so it costs the reader nothing but time.
 * </ul>
 */
final class FetchHandoff {

    private static final Logger LOG = LoggerFactory.getLogger(FetchHandoff.class);

    /** After a failure, fetches stream over gRPC for this long before hand-off is tried again. */
    static final long RETRY_AFTER_MS = 60_000;
    /** Larger than the sidecar's largest {@code fetch.handoff_max_bytes}: a bigger file is refused. */
    static final long MAX_FILE_BYTES = 64L * 1024 * 1024;

    /** Reading a hand-off file failed; the fetch is asked again without hand-off. */
    static final class HandoffException extends UncheckedIOException {
        HandoffException(String message, IOException cause) {
            super(message, cause);
        }
    }

    private final Path dir;
    /** Hand-off is offered again from this {@link System#nanoTime()} on (now: from the start). */
    private volatile long offUntilNanos = System.nanoTime();

    FetchHandoff(Path dir) {
        this.dir = dir;
    }

    /** True when fetches should offer hand-off now. */
    boolean active() {
        return System.nanoTime() - offUntilNanos >= 0;
    }

    /** Turns hand-off off for {@link #RETRY_AFTER_MS} after {@code failure}, with a warning. */
    void turnOff(String operation, RuntimeException failure) {
        offUntilNanos = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(RETRY_AFTER_MS);
        LOG.warn("{}: fetch hand-off failed ({}); fetches stream over gRPC for the next {} s "
                        + "(rsm.config.{}=false turns hand-off off)", operation, failure.getMessage(),
                RETRY_AFTER_MS / 1000, ShimConfig.FETCH_HANDOFF);
    }

    /**
     * The handed-off {@code file}, open and already deleted (the open channel keeps it readable),
     * holding one reference for the caller (see {@link OpenFile}). The broker's reads copy straight
     * from the page cache into its buffer, as {@code LocalTieredStorage}'s file reads do: no
     * window-sized array in between.
     *
     * <p>{@code shared}: the file may be kept for other readers (read-ahead). It is then read
     * through an {@link AsynchronousFileChannel}, which a reader's interrupt cannot close: Kafka
     * cancels remote reads with {@code Future.cancel(true)}, and an interrupted thread inside
     * {@link FileChannel#read} closes that channel for every reader of the file. A file read by
     * one fetch only keeps the plain channel (its interrupt ends only the read being cancelled).
     *
     * @throws HandoffException the name is not a plain file name, the file is missing, not a
     *                          regular file, not of the announced size, or cannot be opened
     */
    OpenFile open(HandoffFile file, boolean shared) {
        String name = file.getName();
        long length = file.getLength();
        if (name.isEmpty() || name.equals(".") || name.equals("..") || name.indexOf('/') >= 0
                || name.indexOf('\\') >= 0 || name.indexOf('\0') >= 0) {
            throw failure("the sidecar named hand-off file '" + name + "', not a plain file name", null);
        }
        if (length < 0 || length > MAX_FILE_BYTES) {
            throw failure("the sidecar announced a hand-off file of " + length + " bytes (at most "
                    + MAX_FILE_BYTES + ")", null);
        }
        Path path = dir.resolve(name);
        java.io.Closeable ch = null;
        try {
            BasicFileAttributes attrs = Files.readAttributes(path, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
            if (!attrs.isRegularFile()) {
                throw failure(path + " is not a regular file", null);
            }
            FileChannel plain = null;
            AsynchronousFileChannel async = null;
            if (shared) {
                ch = async = AsynchronousFileChannel.open(path,
                        Set.of(StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS), null);
            } else {
                ch = plain = FileChannel.open(path, StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS);
            }
            Files.deleteIfExists(path); // open: the bytes stay readable, nothing is left behind
            long size = shared ? async.size() : plain.size();
            if (size != length) {
                throw failure(path + " has " + size + " bytes, the sidecar announced " + length, null);
            }
            OpenFile open = new OpenFile(plain, async, length, path);
            ch = null;
            return open;
        } catch (IOException e) {
            throw failure("cannot open hand-off file " + path + ": " + e, e);
        } finally {
            if (ch != null) {
                try {
                    ch.close();
                } catch (IOException ignored) {
                    // the failure above is what matters
                }
            }
        }
    }

    /**
     * An open, deleted hand-off file, shared by reference count: the one who opened it holds one
     * reference, every {@link #stream} holds one until it is closed, and the channel closes with
     * the last. (The read-ahead keeps a file for later fetches while a stream still reads it.)
     */
    static final class OpenFile {
        /** One of the two is set (see {@link FetchHandoff#open}). */
        private final FileChannel plain;
        private final AsynchronousFileChannel shared;
        private final long length;
        private final Path path;
        private final AtomicInteger refs = new AtomicInteger(1);

        OpenFile(FileChannel plain, AsynchronousFileChannel shared, long length, Path path) {
            this.plain = plain;
            this.shared = shared;
            this.length = length;
            this.path = path;
        }

        /**
         * Reads into {@code dst} from {@code position}. On the shared channel the calling thread
         * waits for the read even if interrupted (the read writes into the caller's buffer), then
         * keeps its interrupt status; the channel stays open for the other readers.
         */
        int read(ByteBuffer dst, long position) throws IOException {
            if (shared == null) {
                return plain.read(dst, position);
            }
            Future<Integer> f = shared.read(dst, position);
            boolean interrupted = false;
            try {
                while (true) {
                    try {
                        return f.get();
                    } catch (InterruptedException e) {
                        interrupted = true;
                    } catch (ExecutionException e) {
                        throw e.getCause() instanceof IOException io ? io : new IOException(e.getCause());
                    }
                }
            } finally {
                if (interrupted) {
                    Thread.currentThread().interrupt();
                }
            }
        }

        long length() {
            return length;
        }

        /**
         * Bytes {@code [from, to)} of the file as a stream that holds a reference until closed;
         * null if the file was already released by everyone.
         */
        InputStream stream(long from, long to) {
            if (from < 0 || to < from || to > length) {
                throw new IllegalArgumentException("[" + from + ", " + to + ") is not within the " + length
                        + " bytes of " + path);
            }
            return retain() ? new FileStream(this, from, to) : null;
        }

        /** Takes one more reference; false (and none taken) if the file was already released by everyone. */
        boolean retain() {
            while (true) {
                int r = refs.get();
                if (r == 0) {
                    return false;
                }
                if (refs.compareAndSet(r, r + 1)) {
                    return true;
                }
            }
        }

        /** Drops one reference; the last one closes the channel. */
        void release() {
            if (refs.decrementAndGet() == 0) {
                try {
                    if (shared != null) {
                        shared.close();
                    } else {
                        plain.close();
                    }
                } catch (IOException ignored) {
                    // nothing was written; the descriptor is gone either way
                }
            }
        }
    }

    /** Exactly {@code [from, to)} of an open (deleted) hand-off file; ending early is an error. */
    private static final class FileStream extends InputStream {
        private final OpenFile file;
        private final long end;
        private long position;
        private boolean closed;

        FileStream(OpenFile file, long from, long to) {
            this.file = file;
            this.position = from;
            this.end = to;
        }

        @Override
        public int read() throws IOException {
            byte[] one = new byte[1];
            int n = read(one, 0, 1);
            return n < 0 ? -1 : one[0] & 0xff;
        }

        @Override
        public int read(byte[] b, int off, int len) throws IOException {
            java.util.Objects.checkFromIndexSize(off, len, b.length);
            if (closed) {
                throw new IOException("hand-off file " + file.path + ": the stream is closed");
            }
            if (position >= end) {
                return -1;
            }
            if (len == 0) {
                return 0;
            }
            int n = file.read(ByteBuffer.wrap(b, off, (int) Math.min(len, end - position)), position);
            if (n < 0) {
                throw new IOException("hand-off file " + file.path + " ended after " + position + " of "
                        + file.length + " bytes");
            }
            position += n;
            return n;
        }

        @Override
        public int available() {
            return closed ? 0 : (int) Math.min(Integer.MAX_VALUE, end - position);
        }

        @Override
        public void close() {
            if (!closed) {
                closed = true;
                file.release();
            }
        }
    }

    private static HandoffException failure(String message, IOException cause) {
        return new HandoffException(message, cause != null ? cause : new IOException(message));
    }
}
