package io.github.rsmsidecar.shim;

import io.github.rsmsidecar.proto.v1.HandoffFile;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
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
     * The handed-off {@code file}, mapped into memory and already deleted (the mapping keeps the
     * bytes readable; no descriptor stays open), holding one reference for the caller (see
     * {@link OpenFile}). The broker's reads copy straight from the mapped pages into its buffer:
     * no system call per read, no window-sized array in between.
     *
     * <p>A mapping is read with plain memory copies, which neither an interrupt nor another reader
     * can disturb: Kafka cancels remote reads with {@code Future.cancel(true)}, and a thread
     * interrupted inside {@link FileChannel#read} would close a shared channel for every reader of
     * a kept window. The file has no name and no open descriptor once this returns, so nobody
     * (the sidecar included) can change or truncate what is mapped.
     *
     * @throws HandoffException the name is not a plain file name, the file is missing, not a
     *                          regular file, not of the announced size, or cannot be mapped
     */
    OpenFile open(HandoffFile file) {
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
        try {
            BasicFileAttributes attrs = Files.readAttributes(path, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
            if (!attrs.isRegularFile()) {
                throw failure(path + " is not a regular file", null);
            }
            try (FileChannel ch = FileChannel.open(path, StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS)) {
                Files.deleteIfExists(path); // open: the bytes stay readable, nothing is left behind
                long size = ch.size();
                if (size != length) {
                    throw failure(path + " has " + size + " bytes, the sidecar announced " + length, null);
                }
                return new OpenFile(ch.map(FileChannel.MapMode.READ_ONLY, 0, length), length, path);
            }
        } catch (IOException e) {
            throw failure("cannot open hand-off file " + path + ": " + e, e);
        }
    }

    /**
     * A mapped, deleted hand-off file, shared by reference count: the one who opened it holds one
     * reference, every {@link #stream} holds one until it is closed, and the mapping is released
     * with the last (the read-ahead keeps a file for later fetches while a stream still reads
     * it). Released means unmapped at once ({@link Unmapper}), so a file's pages go back to the
     * host when its last reader is done, not at some later garbage collection; a stream reads
     * only while it holds its reference (its reads and its close exclude each other), so no read
     * ever touches an unmapped page.
     */
    static final class OpenFile {
        private final ByteBuffer mapped;
        /** The bytes of a window received over gRPC instead of a mapped file (then {@code mapped} is null). */
        private final com.google.protobuf.ByteString received;
        private final long length;
        private final Path path;
        private final AtomicInteger refs = new AtomicInteger(1);

        OpenFile(ByteBuffer mapped, long length, Path path) {
            this.mapped = mapped;
            this.received = null;
            this.length = length;
            this.path = path;
        }

        private OpenFile(com.google.protobuf.ByteString received, String source) {
            this.mapped = null;
            this.received = received;
            this.length = received.size();
            this.path = Path.of(source);
        }

        /**
         * A read-ahead window received in gRPC messages (a sidecar reached over TCP, where there is
         * no hand-off directory), kept in the heap and shared by reference count like a mapped file:
         * {@code bytes} are the messages' own arrays (concatenated, not copied), which nothing
         * changes once received. {@code source} names it in messages.
         */
        static OpenFile received(com.google.protobuf.ByteString bytes, String source) {
            return new OpenFile(bytes, source);
        }

        /** Copies {@code len} bytes from {@code position} into {@code b}; the caller holds a reference. */
        void read(long position, byte[] b, int off, int len) throws IOException {
            if (received != null) {
                received.copyTo(b, (int) position, off, len);
                return;
            }
            try {
                mapped.get((int) position, b, off, len);
            } catch (InternalError e) {
                // the JVM's answer to SIGBUS: the pages behind the mapping are gone (the file was
                // truncated through a descriptor this process does not hold)
                throw new IOException("hand-off file " + path + ": reading " + len + " bytes at " + position
                        + " failed: " + e.getMessage(), e);
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

        /** Drops one reference; the last one unmaps the file. */
        void release() {
            int r = refs.decrementAndGet();
            if (r == 0) {
                if (mapped != null) {
                    Unmapper.unmap(mapped);
                }
            } else if (r < 0) {
                throw new IllegalStateException("hand-off file " + path + " released once more than it was held");
            }
        }
    }

    /**
     * Exactly {@code [from, to)} of a mapped hand-off file; ending early is an error. Reads and
     * {@link #close} are synchronized: a close from another thread waits for a read in progress,
     * and no read starts after it (the mapping may be gone then).
     */
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
        public synchronized int read(byte[] b, int off, int len) throws IOException {
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
            int n = (int) Math.min(len, end - position);
            file.read(position, b, off, n);
            position += n;
            return n;
        }

        @Override
        public synchronized long skip(long n) {
            if (closed || n <= 0) {
                return 0;
            }
            long skipped = Math.min(n, end - position);
            position += skipped;
            return skipped;
        }

        @Override
        public synchronized int available() {
            return closed ? 0 : (int) Math.min(Integer.MAX_VALUE, end - position);
        }

        @Override
        public synchronized void close() {
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
