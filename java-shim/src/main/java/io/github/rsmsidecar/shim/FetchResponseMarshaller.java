package io.github.rsmsidecar.shim;

import com.google.protobuf.ByteString;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.UnsafeByteOperations;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.ZstdSlice;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;

/**
 * Parses {@code FetchSegmentResponse} (one {@code bytes data = 1} field of up to 1 MiB) with one
 * copy: the payload is read from gRPC's buffers straight into the arrays the {@link ByteString}
 * wraps (not through {@code InputStream.readNBytes}, which copies twice). The generated parser
 * copies it twice (into a message buffer, then into the field), which a JFR profile of the
 * broker's remote reads showed as its largest allocation (0.8 GB for 382 MiB read). The payload
 * goes into arrays of at most {@link #PIECE_BYTES} (a rope of them): a 1 MiB array is a humongous
 * object for G1 with the 1-2 MiB regions of a broker's heap up to 8 GiB, and over TCP (every
 * fetched byte in messages) those allocations started a G1 collection every second or two, "G1
 * Humongous Allocation", concurrent cycles included (JFR of benchmarks/remote_read.py ours-tcp;
 * design.md, "Remote reads over TCP + mTLS"). A message that is one {@code ZstdSlice zstd = 4}
 * field is read the same way, its {@code frame} a part of that rope (see {@link #zstdSlice}). A
 * message of any other shape (other fields, unknown fields, a field twice) is parsed by the
 * generated parser, so the contract stays the proto's.
 */
final class FetchResponseMarshaller implements MethodDescriptor.Marshaller<FetchSegmentResponse> {

    /** {@code data}: field 1, wire type 2 (length-delimited). */
    private static final int DATA_TAG = (1 << 3) | 2;
    /** {@code zstd}: field 4, wire type 2 (length-delimited). */
    private static final int ZSTD_TAG = (4 << 3) | 2;
    /** Under half of G1's smallest region (1 MiB): never a humongous object. */
    static final int PIECE_BYTES = 256 * 1024;

    static final FetchResponseMarshaller INSTANCE = new FetchResponseMarshaller();

    /** FetchSegment with this marshaller for its responses. */
    static final MethodDescriptor<FetchSegmentRequest, FetchSegmentResponse> FETCH_SEGMENT =
            RemoteStorageGrpc.getFetchSegmentMethod().toBuilder(
                    RemoteStorageGrpc.getFetchSegmentMethod().getRequestMarshaller(), INSTANCE).build();

    private final MethodDescriptor.Marshaller<FetchSegmentResponse> generated =
            RemoteStorageGrpc.getFetchSegmentMethod().getResponseMarshaller();

    private FetchResponseMarshaller() {
    }

    @Override
    public InputStream stream(FetchSegmentResponse value) {
        return generated.stream(value);
    }

    @Override
    public FetchSegmentResponse parse(InputStream in) {
        try {
            int first = in.read();
            if (first < 0) {
                return FetchSegmentResponse.getDefaultInstance();
            }
            if (first != DATA_TAG && first != ZSTD_TAG) {
                return fallback(new byte[] {(byte) first}, in);
            }
            int length = readVarint(in);
            ByteString field = readPieces(in, length, first == DATA_TAG ? "data" : "zstd");
            int next = in.read();
            if (next < 0 && first == DATA_TAG) {
                return FetchSegmentResponse.newBuilder().setData(field).build();
            }
            ZstdSlice zstd = next < 0 ? zstdSlice(field) : null;
            if (zstd != null) {
                return FetchSegmentResponse.newBuilder().setZstd(zstd).build();
            }
            // more than one field, or a ZstdSlice of another shape: let the generated parser decide
            ByteArrayOutputStream head = new ByteArrayOutputStream(length + 16);
            head.write(first);
            writeVarint(head, length);
            field.writeTo(head);
            if (next >= 0) {
                head.write(next);
            }
            return fallback(head.toByteArray(), in);
        } catch (IOException e) {
            throw Status.INTERNAL.withDescription("FetchSegmentResponse: " + e.getMessage()).withCause(e)
                    .asRuntimeException();
        }
    }

    /**
     * The next {@code length} bytes of {@code in}, the payload of field {@code field}, as a rope of
     * arrays of at most {@link #PIECE_BYTES}.
     */
    private static ByteString readPieces(InputStream in, int length, String field) throws IOException {
        ByteString bytes = ByteString.EMPTY;
        for (int read = 0; read < length; ) {
            byte[] piece = new byte[Math.min(PIECE_BYTES, length - read)];
            int filled = readInto(in, piece);
            if (filled < piece.length) {
                throw Status.INTERNAL.withDescription("FetchSegmentResponse: truncated " + field + " field ("
                        + (read + filled) + " of " + length + " bytes)").asRuntimeException();
            }
            read += piece.length;
            bytes = bytes.concat(UnsafeByteOperations.unsafeWrap(piece));
        }
        return bytes;
    }

    /**
     * {@code message} (the bytes of a {@code ZstdSlice}) parsed with its {@code frame} a part of
     * {@code message}'s rope (no copy), when it has the usual shape: each field at most once, in
     * any order, {@code frame} length-delimited and the others varints of a non-negative int32.
     * Null for any other shape (unknown or repeated fields, negative values, malformed bytes): the
     * generated parser then decides.
     */
    private static ZstdSlice zstdSlice(ByteString message) {
        InputStream in = message.newInput();
        ZstdSlice.Builder slice = ZstdSlice.newBuilder();
        int seen = 0; // a bit per field number
        try {
            for (int tag = in.read(); tag >= 0; tag = in.read()) {
                int field = tag >>> 3;
                int wireType = field == ZstdSlice.FRAME_FIELD_NUMBER ? 2 : 0;
                if (field < ZstdSlice.FRAME_FIELD_NUMBER || field > ZstdSlice.LENGTH_FIELD_NUMBER
                        || (tag & 7) != wireType || (seen & (1 << field)) != 0) {
                    return null;
                }
                seen |= 1 << field;
                int value = readVarint(in);
                switch (field) {
                    case ZstdSlice.FRAME_FIELD_NUMBER:
                        int remaining = in.available(); // exact: a ByteString's stream knows what is left
                        if (value > remaining) {
                            return null;
                        }
                        int at = message.size() - remaining;
                        slice.setFrame(message.substring(at, at + value));
                        in.skipNBytes(value);
                        break;
                    case ZstdSlice.SIZE_FIELD_NUMBER:
                        slice.setSize(value);
                        break;
                    case ZstdSlice.OFFSET_FIELD_NUMBER:
                        slice.setOffset(value);
                        break;
                    default:
                        slice.setLength(value);
                }
            }
        } catch (IOException e) {
            return null;
        }
        return slice.build();
    }

    /**
     * Fills {@code piece} from {@code in} with one copy; returns how many bytes it got (fewer only
     * at the end of the stream). {@code InputStream.readNBytes(int)}, which grpc's stream does not
     * override, reads through 8-16 KiB arrays and copies them again into the result.
     */
    private static int readInto(InputStream in, byte[] piece) throws IOException {
        int filled = 0;
        while (filled < piece.length) {
            int n = in.read(piece, filled, piece.length - filled);
            if (n < 0) {
                break;
            }
            filled += n;
        }
        return filled;
    }

    private static FetchSegmentResponse fallback(byte[] head, InputStream rest) throws IOException {
        byte[] tail = rest.readAllBytes();
        byte[] all = new byte[head.length + tail.length];
        System.arraycopy(head, 0, all, 0, head.length);
        System.arraycopy(tail, 0, all, head.length, tail.length);
        return FetchSegmentResponse.parseFrom(CodedInputStream.newInstance(all));
    }

    private static int readVarint(InputStream in) throws IOException {
        int result = 0;
        for (int shift = 0; shift < 32; shift += 7) {
            int b = in.read();
            if (b < 0) {
                throw new InvalidProtocolBufferException("FetchSegmentResponse: truncated length");
            }
            result |= (b & 0x7f) << shift;
            if ((b & 0x80) == 0) {
                if (result < 0) {
                    throw new InvalidProtocolBufferException("FetchSegmentResponse: negative length");
                }
                return result;
            }
        }
        throw new InvalidProtocolBufferException("FetchSegmentResponse: malformed length");
    }

    private static void writeVarint(ByteArrayOutputStream out, int value) {
        while ((value & ~0x7f) != 0) {
            out.write((value & 0x7f) | 0x80);
            value >>>= 7;
        }
        out.write(value);
    }
}
