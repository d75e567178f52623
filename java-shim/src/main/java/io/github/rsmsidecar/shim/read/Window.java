package io.github.rsmsidecar.shim.read;

import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;

/**
 * Bytes {@code [start, end)} of one segment, received whole and held in the broker's heap in
 * pieces of at most {@link #PIECE_BYTES} (G1 treats an array of half a region or more, 0.5-2 MiB on
 * heaps up to 8 GiB, as a humongous object; pieces of 256 KiB never are), with the partition's next
 * segment when the sidecar named it. Immutable once made, so any number of streams may read it at
 * once and nothing needs releasing: dropping the last reference frees it.
 */
final class Window {

    static final int PIECE_BYTES = 256 * 1024;

    private final long start;
    private final long end;
    private final byte[][] pieces;
    private final SegmentMetadata next;

    private Window(long start, long end, byte[][] pieces, SegmentMetadata next) {
        this.start = start;
        this.end = end;
        this.pieces = pieces;
        this.next = next;
    }

    /**
     * Reads exactly {@code length} bytes of {@code in} (the range from {@code start}) and then its
     * end; {@link EOFException} if it ends early, an {@link IOException} if it has more.
     */
    static Window read(RangeStream in, long start, long length) throws IOException {
        int count = (int) ((length + PIECE_BYTES - 1) / PIECE_BYTES);
        byte[][] pieces = new byte[count][];
        long left = length;
        for (int i = 0; i < count; i++) {
            byte[] piece = new byte[(int) Math.min(PIECE_BYTES, left)];
            int off = 0;
            while (off < piece.length) {
                int n = in.read(piece, off, piece.length - off);
                if (n < 0) {
                    throw new EOFException("the range from " + start + " ended after " + (length - left + off)
                            + " of " + length + " bytes");
                }
                off += n;
            }
            pieces[i] = piece;
            left -= piece.length;
        }
        if (in.read() >= 0) {
            throw new IOException("the range from " + start + " holds more than the " + length + " bytes asked for");
        }
        return new Window(start, start + length, pieces, in.nextSegment());
    }

    long start() {
        return start;
    }

    long end() {
        return end;
    }

    long length() {
        return end - start;
    }

    boolean contains(long position) {
        return position >= start && position < end;
    }

    /** The partition's next segment, as the sidecar named it with a window that ends its segment; or null. */
    SegmentMetadata next() {
        return next;
    }

    /** A stream of bytes {@code [from, end)}. */
    InputStream stream(long from) {
        if (from < start || from > end) {
            throw new IllegalArgumentException(from + " is outside [" + start + ", " + end + ")");
        }
        return new InputStream() {
            private long position = from;

            @Override
            public int read() {
                if (position >= end) {
                    return -1;
                }
                long at = position++ - start;
                return pieces[(int) (at / PIECE_BYTES)][(int) (at % PIECE_BYTES)] & 0xff;
            }

            @Override
            public int read(byte[] b, int off, int len) {
                if (len == 0) {
                    return 0;
                }
                if (position >= end) {
                    return -1;
                }
                int done = 0;
                while (done < len && position < end) {
                    long at = position - start;
                    byte[] piece = pieces[(int) (at / PIECE_BYTES)];
                    int inPiece = (int) (at % PIECE_BYTES);
                    int n = (int) Math.min(Math.min(len - done, piece.length - inPiece), end - position);
                    System.arraycopy(piece, inPiece, b, off + done, n);
                    done += n;
                    position += n;
                }
                return done;
            }

            @Override
            public long skip(long n) {
                long k = Math.max(0, Math.min(n, end - position));
                position += k;
                return k;
            }

            @Override
            public int available() {
                return (int) Math.min(Integer.MAX_VALUE, end - position);
            }
        };
    }
}
