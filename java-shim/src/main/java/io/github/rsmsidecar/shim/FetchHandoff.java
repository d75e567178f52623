package io.github.rsmsidecar.shim;

import com.google.protobuf.ByteString;
import com.google.protobuf.UnsafeByteOperations;
import io.github.rsmsidecar.proto.v1.HandoffFile;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Reads the files of fetch hand-off: over a Unix socket the sidecar may answer a fetch with the
 * name of a file in its hand-off directory ({@code <socket path>.handoff}) holding the whole
 * requested range, instead of streaming the bytes over gRPC (rsm.proto {@code HandoffFile};
 * {@code rsm_sidecar/service/handoff.py}). Moving a MiB through gRPC and Netty cost the broker
 * several times the CPU of reading it from a file, and most of a remote read's time.
 *
 * <ul>
 *   <li>Only a plain file name inside the directory the shim derives from its own socket path is
 *       read (no directory part, no symbolic link, a regular file of exactly the announced size):
 *       a sidecar cannot make the broker read anything else.
 *   <li>The file is deleted as soon as it is open; the bytes are read into one array of the
 *       window's size (at most the sidecar's {@code fetch.handoff_max_bytes}, 8 MiB by default;
 *       about 1.1 MiB for a consumer's default fetch).
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
    private volatile long offUntilNanos;
    private volatile boolean everOff;

    FetchHandoff(Path dir) {
        this.dir = dir;
    }

    /** True when fetches should offer hand-off now. */
    boolean active() {
        return !everOff || System.nanoTime() - offUntilNanos >= 0;
    }

    /** Turns hand-off off for {@link #RETRY_AFTER_MS} after {@code failure}, with a warning. */
    void turnOff(String operation, RuntimeException failure) {
        offUntilNanos = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(RETRY_AFTER_MS);
        everOff = true;
        LOG.warn("{}: fetch hand-off failed ({}); fetches stream over gRPC for the next {} s "
                        + "(rsm.config.{}=false turns hand-off off)", operation, failure.getMessage(),
                RETRY_AFTER_MS / 1000, ShimConfig.FETCH_HANDOFF);
    }

    /**
     * The bytes of {@code file}; the file is deleted.
     *
     * @throws HandoffException the name is not a plain file name, the file is missing, not a
     *                          regular file, not of the announced size, or cannot be read
     */
    ByteString read(HandoffFile file) {
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
                byte[] bytes = new byte[(int) length];
                ByteBuffer buf = ByteBuffer.wrap(bytes);
                while (buf.hasRemaining()) {
                    if (ch.read(buf) < 0) {
                        throw failure(path + " ended after " + buf.position() + " of " + length + " bytes", null);
                    }
                }
                return UnsafeByteOperations.unsafeWrap(bytes);
            }
        } catch (IOException e) {
            throw failure("cannot read hand-off file " + path + ": " + e, e);
        }
    }

    private static HandoffException failure(String message, IOException cause) {
        return new HandoffException(message, cause != null ? cause : new IOException(message));
    }
}
