package io.github.rsmsidecar.shim;

import com.github.luben.zstd.RecyclingBufferPool;
import com.github.luben.zstd.ZstdInputStreamNoFinalizer;
import com.google.protobuf.ByteString;
import com.google.protobuf.UnsafeByteOperations;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.ZstdSlice;
import java.io.IOException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The zstd frames of a fetch (rsm.proto {@code ZstdSlice}). Over TCP + mTLS a remote read is bound
 * by the bytes through both sides' TLS and HTTP/2, and the sidecar's stored chunks compress about
 * 5x: a fetch accepts a chunk's zstd frame (verified and decrypted by the sidecar) instead of its
 * original bytes ({@code accept_zstd_max_bytes}, {@code rsm.config.fetch.zstd.max.chunk.bytes}),
 * and the shim decompresses it with the broker's zstd-jni instead of the sidecar doing it in Python.
 *
 * <ul>
 *   <li>zstd-jni is the broker's (Kafka ships it in its libs; {@code provided}, never bundled), so
 *       only the API of the oldest supported broker's (1.5.5, Kafka 3.6) is used. Where it cannot be
 *       loaded (the jar used outside a broker) fetches accept no frames ({@link #acceptMaxBytes}).
 *       zstd-jni's classes are used only in the nested {@code Decompression} class, which is
 *       loaded only for a request that accepted frames: this class loads, links and verifies
 *       without them.
 *   <li>The slice comes back, like {@code data}, as a rope of arrays of at most
 *       {@link FetchResponseMarshaller#PIECE_BYTES}: never one array of the chunk (a humongous
 *       object for G1; see {@link FetchResponseMarshaller}). Output before and after the slice is
 *       decompressed into zstd-jni's recycled buffer and dropped.
 *   <li>A message is refused (an {@link IOException} saying why; none of its bytes are delivered)
 *       unless its frame is one zstd frame and nothing more ({@link #notOneFrame}) that
 *       decompresses to exactly {@code size} bytes, {@code size} is at most what the request
 *       accepts, and {@code 0 <= offset < offset + length <= size}. Against a sidecar that lies,
 *       decompression stops at the block that holds byte {@code size + 1} (zstd's blocks hold at
 *       most 128 KiB) and the frame's window may not exceed what the request accepts, so a frame
 *       costs at most about that much memory and time.
 * </ul>
 */
final class ZstdSlices {

    private static final Logger LOG = LoggerFactory.getLogger(ZstdSlices.class);

    /** Loading (and initialising: its native library) this class tells whether zstd-jni is usable. */
    private static final String ZSTD_CLASS = "com.github.luben.zstd.ZstdInputStreamNoFinalizer";
    /** zstd's smallest window ({@code ZSTD_WINDOWLOG_ABSOLUTEMIN}). */
    private static final int MIN_WINDOW_LOG = 10;
    /** The first bytes of a zstd frame (RFC 8878 {@code Magic_Number}, little-endian 0xFD2FB528). */
    private static final ByteString MAGIC = ByteString.copyFrom(new byte[] {0x28, (byte) 0xb5, 0x2f, (byte) 0xfd});
    /** {@code Dictionary_ID} bytes by {@code Dictionary_ID_Flag}. */
    private static final int[] DICTIONARY_ID_BYTES = {0, 1, 2, 4};

    private ZstdSlices() {
    }

    /** Whether zstd-jni is usable, found (and, if not, logged) once. */
    private static final class Usable {
        static final boolean YES = check();

        private static boolean check() {
            try {
                Class.forName(ZSTD_CLASS, true, ZstdSlices.class.getClassLoader());
                return true;
            } catch (ClassNotFoundException | LinkageError e) {
                LOG.info("zstd-jni cannot be loaded ({}): fetches accept no zstd frames, the sidecar sends every "
                        + "byte decompressed (rsm.config.{} does not apply)", e, ShimConfig.FETCH_ZSTD_MAX_CHUNK_BYTES);
                return false;
            }
        }
    }

    /** The {@code accept_zstd_max_bytes} of the shim's fetches: {@code configured}, or 0 without zstd-jni. */
    static int acceptMaxBytes(int configured) {
        return configured > 0 && Usable.YES ? configured : 0;
    }

    /**
     * The bytes of a message ({@code slice}) and, for a zstd slice that ends before its chunk does
     * and when {@code keepTail}, the rest of the chunk ({@code tail}: the segment's bytes that
     * follow the slice, decompressed anyway to check the frame's size); otherwise an empty tail.
     */
    record Decoded(ByteString slice, ByteString tail) {
    }

    /**
     * The bytes one message of a {@code FetchSegment} stream carries: its {@code data}, or its
     * {@code zstd} slice decompressed ({@link #decode}), with the chunk's tail after the slice when
     * {@code keepTail} (a read-ahead window keeps it: the next window then starts at a chunk
     * boundary and no chunk is decompressed twice). {@code maxBytes}: the request's
     * {@code accept_zstd_max_bytes}.
     *
     * @throws IOException the message is refused; the message says why
     */
    static Decoded bytes(FetchSegmentResponse response, int maxBytes, boolean keepTail) throws IOException {
        if (!response.hasZstd()) {
            return new Decoded(response.getData(), ByteString.EMPTY);
        }
        if (!response.getData().isEmpty()) {
            throw new IOException("the sidecar sent " + response.getData().size() + " bytes of data and a zstd frame "
                    + "in one message");
        }
        if (maxBytes == 0) {
            throw new IOException("the sidecar sent a zstd frame, which the request did not accept "
                    + "(accept_zstd_max_bytes 0)");
        }
        return decode(response.getZstd(), maxBytes, keepTail);
    }

    /**
     * Bytes {@code [offset, offset + length)} of what {@code slice}'s frame decompresses to, as a
     * rope of arrays of at most {@link FetchResponseMarshaller#PIECE_BYTES}, once the whole frame
     * decompressed to exactly {@code size} bytes; with {@code keepTail} also the chunk's bytes after
     * the slice ({@code [offset + length, size)}, in the same pieces) instead of dropping them. A
     * window that ends inside a chunk costs that chunk's whole decompression, and the window after
     * it would decompress the chunk again for its first bytes: with read-ahead windows of 2.7 MiB
     * over 4 MiB chunks (12 partitions at the default bound) each chunk was decompressed about
     * twice and a half. {@code maxBytes}: the request's {@code accept_zstd_max_bytes} (> 0).
     *
     * @throws IOException the slice is refused (see the class comment); the message says why
     */
    static Decoded decode(ZstdSlice slice, int maxBytes, boolean keepTail) throws IOException {
        int size = slice.getSize();
        int offset = slice.getOffset();
        int length = slice.getLength();
        ByteString frame = slice.getFrame();
        if (size <= 0 || size > maxBytes) {
            throw new IOException("the sidecar's zstd slice declares " + size + " decompressed bytes; the request "
                    + "accepts 1 to " + maxBytes + " (accept_zstd_max_bytes)");
        }
        if (offset < 0 || length <= 0 || offset > size - length) {
            throw new IOException("the sidecar's zstd slice of offset " + offset + " and length " + length
                    + " is not a non-empty range within its " + size + " bytes");
        }
        String notOne = notOneFrame(frame);
        if (notOne != null) {
            throw new IOException("the sidecar's zstd frame (" + frame.size() + " bytes) " + notOne);
        }
        return Decompression.run(frame, size, offset, length, maxBytes, keepTail);
    }

    /**
     * zstd-jni's part of {@link #decode}, in a class of its own: verifying it loads zstd-jni's
     * classes, so it is loaded only by a fetch that accepted frames, never where zstd-jni is missing.
     */
    private static final class Decompression {
        static Decoded run(ByteString frame, int size, int offset, int length, int maxBytes, boolean keepTail)
                throws IOException {
            try (ZstdInputStreamNoFinalizer in = new ZstdInputStreamNoFinalizer(frame.newInput(),
                    RecyclingBufferPool.INSTANCE)) {
                // a frame names the window it needs (native memory; zstd allows up to 128 MiB by
                // default): here at most what the request accepts, which a chunk of that size never exceeds
                in.setLongMax(Math.max(MIN_WINDOW_LOG, 32 - Integer.numberOfLeadingZeros(maxBytes - 1)));
                long produced = in.skip(offset);
                if (produced < offset) {
                    throw shorter(produced, size);
                }
                ByteString kept = read(in, length, produced, size);
                produced += length;
                ByteString tail = ByteString.EMPTY;
                if (keepTail) {
                    tail = read(in, size - (int) produced, produced, size);
                    produced = size;
                }
                produced += in.skip(size - produced);
                if (produced < size) {
                    throw shorter(produced, size);
                }
                if (in.read() >= 0) { // one byte more is enough to refuse it: the rest is never decompressed
                    throw new Refused("the sidecar's zstd frame decompressed to more than the " + size
                            + " bytes the message declared");
                }
                return new Decoded(kept, tail);
            } catch (Refused e) {
                throw e;
            } catch (IOException e) {
                throw new IOException("the sidecar's zstd frame (" + frame.size() + " bytes, declared to decompress to "
                        + size + ") cannot be decompressed: " + e.getMessage(), e);
            }
        }
    }

    /**
     * The next {@code length} bytes of {@code in} ({@code produced} of the frame's {@code size} so far)
     * as a rope of arrays of at most {@link FetchResponseMarshaller#PIECE_BYTES}.
     */
    private static ByteString read(java.io.InputStream in, int length, long produced, int size)
            throws IOException {
        ByteString kept = ByteString.EMPTY;
        while (kept.size() < length) {
            byte[] piece = new byte[Math.min(FetchResponseMarshaller.PIECE_BYTES, length - kept.size())];
            for (int filled = 0; filled < piece.length; ) {
                int n = in.read(piece, filled, piece.length - filled);
                if (n < 0) {
                    throw shorter(produced, size);
                }
                filled += n;
                produced += n;
            }
            kept = kept.concat(UnsafeByteOperations.unsafeWrap(piece));
        }
        return kept;
    }

    /**
     * Why {@code frame} is not one zstd frame and nothing more, judged by its frame header and
     * block headers (RFC 8878: they say where the frame ends); null when it is. zstd-jni's stream
     * takes a frame followed by a few bytes (fewer than a frame header) without a word, so this is
     * checked here; whether the blocks decompress is zstd's to say.
     */
    static String notOneFrame(ByteString frame) {
        int n = frame.size();
        if (n <= MAGIC.size() || !frame.startsWith(MAGIC)) {
            return "does not start with zstd's magic number";
        }
        int descriptor = frame.byteAt(MAGIC.size()) & 0xff; // Frame_Header_Descriptor
        boolean singleSegment = (descriptor & 0x20) != 0;
        int contentSizeFlag = descriptor >>> 6;
        long end = MAGIC.size() + 1 + (singleSegment ? 0 : 1) + DICTIONARY_ID_BYTES[descriptor & 3]
                + (contentSizeFlag == 0 ? (singleSegment ? 1 : 0) : 1 << contentSizeFlag);
        for (boolean last = false; !last; ) {
            if (end + 3 > n) {
                return "is cut short: its headers need at least " + (end + 3) + " bytes";
            }
            int at = (int) end;
            int header = (frame.byteAt(at) & 0xff) | (frame.byteAt(at + 1) & 0xff) << 8
                    | (frame.byteAt(at + 2) & 0xff) << 16;
            last = (header & 1) != 0;
            int type = header >>> 1 & 3;
            if (type == 3) {
                return "has a block of zstd's reserved type at byte " + at;
            }
            end += 3 + (type == 1 ? 1 : header >>> 3); // an RLE block holds one byte, others their size
        }
        end += (descriptor & 0x04) != 0 ? 4 : 0; // Content_Checksum
        if (end > n) {
            return "is cut short: its headers need " + end + " bytes";
        }
        return end < n ? "has " + (n - end) + " bytes after its end" : null;
    }

    /** A refusal of this class, passed on as it is (any other {@link IOException} comes from zstd). */
    private static final class Refused extends IOException {
        private static final long serialVersionUID = 1L;

        Refused(String message) {
            super(message);
        }
    }

    private static Refused shorter(long produced, int size) {
        return new Refused("the sidecar's zstd frame decompressed to " + produced + " bytes, the message declared "
                + size);
    }
}
