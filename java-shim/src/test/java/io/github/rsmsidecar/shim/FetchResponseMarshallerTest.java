package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import com.google.protobuf.CodedOutputStream;
import com.google.protobuf.UnknownFieldSet;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.github.rsmsidecar.proto.v1.ZstdSlice;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The one-copy parser of fetch responses gives what the generated parser gives, for every shape. */
class FetchResponseMarshallerTest {

    static FetchSegmentResponse parse(byte[] wire) {
        return FetchResponseMarshaller.INSTANCE.parse(new ByteArrayInputStream(wire));
    }

    @Test
    void dataOfEverySizeParsesLikeTheGeneratedParser() throws Exception {
        for (int size : new int[] {0, 1, 127, 128, 16_383, 16_384, 1 << 20}) {
            FetchSegmentResponse m = FetchSegmentResponse.newBuilder()
                    .setData(ByteString.copyFrom(Fixtures.content(size, size))).build();
            byte[] wire = m.toByteArray();
            assertEquals(FetchSegmentResponse.parseFrom(wire), parse(wire), "size " + size);
            assertArrayEquals(Fixtures.content(size, size), parse(wire).getData().toByteArray());
        }
    }

    /** gRPC's stream hands out a message's bytes buffer by buffer: short reads, never a short payload. */
    @Test
    void aStreamOfShortReadsGivesTheWholePayload() throws Exception {
        int size = 3 * FetchResponseMarshaller.PIECE_BYTES + 12_345;
        byte[] wire = FetchSegmentResponse.newBuilder()
                .setData(ByteString.copyFrom(Fixtures.content(size, 7))).build().toByteArray();
        FetchSegmentResponse parsed = FetchResponseMarshaller.INSTANCE.parse(new ByteArrayInputStream(wire) {
            @Override
            public synchronized int read(byte[] b, int off, int len) {
                return super.read(b, off, Math.min(len, 1000)); // at most 1000 bytes a call
            }
        });
        assertArrayEquals(Fixtures.content(size, 7), parsed.getData().toByteArray());
    }

    @Test
    void otherShapesFallBackToTheGeneratedParser() throws Exception {
        FetchSegmentResponse withUnknown = FetchSegmentResponse.newBuilder()
                .setData(ByteString.copyFromUtf8("abc"))
                .setUnknownFields(UnknownFieldSet.newBuilder()
                        .addField(7, UnknownFieldSet.Field.newBuilder().addVarint(42).build()).build())
                .build();
        byte[] wire = withUnknown.toByteArray();
        assertEquals(FetchSegmentResponse.parseFrom(wire), parse(wire));
        // the unknown field first, then data
        byte[] reversed = new byte[] {0x38, 42, 0x0a, 3, 'x', 'y', 'z'};
        assertEquals(FetchSegmentResponse.parseFrom(reversed), parse(reversed));
        // data twice: the last one wins, as protobuf says
        byte[] twice = new byte[] {0x0a, 1, 'a', 0x0a, 2, 'b', 'c'};
        assertEquals(ByteString.copyFromUtf8("bc"), parse(twice).getData());
    }

    @Test
    void aTruncatedMessageIsAnErrorNotShortData() {
        byte[] wire = FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(new byte[1000])).build()
                .toByteArray();
        StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
                () -> parse(Arrays.copyOf(wire, wire.length - 1)));
        assertEquals(Status.Code.INTERNAL, e.getStatus().getCode());
        assertTrue(e.getMessage().contains("truncated"), e.getMessage());
        assertThrows(StatusRuntimeException.class, () -> parse(new byte[] {0x0a, (byte) 0x80}));
    }

    // ---- zstd slices ---------------------------------------------------------------------------

    static ZstdSlice slice(int frameSize) {
        return ZstdSlice.newBuilder().setFrame(ByteString.copyFrom(Fixtures.content(frameSize, frameSize)))
                .setSize(4 * 1024 * 1024).setOffset(12_345).setLength(3_000_000).build();
    }

    /** Every array of {@code frame} is at most {@link FetchResponseMarshaller#PIECE_BYTES}: it was not parsed in one. */
    static void assertPieces(ByteString frame) {
        for (ByteBuffer piece : frame.asReadOnlyByteBufferList()) {
            assertTrue(piece.remaining() <= FetchResponseMarshaller.PIECE_BYTES, "a piece of " + piece.remaining());
        }
    }

    /** A FetchSegmentResponse of one zstd field holding {@code fields} (written by {@code fields}). */
    static byte[] zstdMessage(IoWriter fields) throws IOException {
        ByteArrayOutputStream sub = new ByteArrayOutputStream();
        CodedOutputStream out = CodedOutputStream.newInstance(sub);
        fields.write(out);
        out.flush();
        ByteArrayOutputStream message = new ByteArrayOutputStream();
        CodedOutputStream m = CodedOutputStream.newInstance(message);
        m.writeByteArray(FetchSegmentResponse.ZSTD_FIELD_NUMBER, sub.toByteArray());
        m.flush();
        return message.toByteArray();
    }

    interface IoWriter {
        void write(CodedOutputStream out) throws IOException;
    }

    @Test
    void aZstdSliceParsesLikeTheGeneratedParserWithItsFrameInPieces() throws Exception {
        for (int frameSize : new int[] {0, 1, 300, FetchResponseMarshaller.PIECE_BYTES - 3, 1_500_000}) {
            byte[] wire = FetchSegmentResponse.newBuilder().setZstd(slice(frameSize)).build().toByteArray();
            FetchSegmentResponse parsed = parse(wire);
            assertEquals(FetchSegmentResponse.parseFrom(wire), parsed, "frame of " + frameSize);
            assertPieces(parsed.getZstd().getFrame());
        }
        // the fields in another order, a zero written out, a 1.5 MB frame: still the fast path
        byte[] frame = Fixtures.content(1_500_000, 9);
        byte[] wire = zstdMessage(out -> {
            out.writeInt32(ZstdSlice.LENGTH_FIELD_NUMBER, 1000);
            out.writeByteArray(ZstdSlice.FRAME_FIELD_NUMBER, frame);
            out.writeInt32(ZstdSlice.OFFSET_FIELD_NUMBER, 0);
            out.writeInt32(ZstdSlice.SIZE_FIELD_NUMBER, 4_000_000);
        });
        FetchSegmentResponse parsed = parse(wire);
        assertEquals(FetchSegmentResponse.parseFrom(wire), parsed);
        assertEquals(ZstdSlice.newBuilder().setFrame(ByteString.copyFrom(frame)).setSize(4_000_000).setLength(1000)
                .build(), parsed.getZstd());
        assertPieces(parsed.getZstd().getFrame());
    }

    @Test
    void zstdSlicesOfOtherShapesFallBackToTheGeneratedParser() throws Exception {
        byte[] frame = Fixtures.content(1_100_000, 4);
        List<byte[]> shapes = List.of(
                zstdMessage(out -> { // an unknown field
                    out.writeByteArray(ZstdSlice.FRAME_FIELD_NUMBER, frame);
                    out.writeInt32(9, 7);
                }),
                zstdMessage(out -> { // a field twice: the last one counts
                    out.writeInt32(ZstdSlice.SIZE_FIELD_NUMBER, 5);
                    out.writeByteArray(ZstdSlice.FRAME_FIELD_NUMBER, frame);
                    out.writeInt32(ZstdSlice.SIZE_FIELD_NUMBER, 6);
                }),
                zstdMessage(out -> { // the frame twice
                    out.writeByteArray(ZstdSlice.FRAME_FIELD_NUMBER, new byte[] {1, 2});
                    out.writeByteArray(ZstdSlice.FRAME_FIELD_NUMBER, frame);
                }),
                zstdMessage(out -> { // a negative value (ten bytes)
                    out.writeByteArray(ZstdSlice.FRAME_FIELD_NUMBER, frame);
                    out.writeInt32(ZstdSlice.OFFSET_FIELD_NUMBER, -1);
                }),
                zstdMessage(out -> out.writeUInt64(ZstdSlice.SIZE_FIELD_NUMBER, 1L << 40)), // beyond an int32
                zstdMessage(out -> out.writeFixed32(ZstdSlice.SIZE_FIELD_NUMBER, 3)), // another wire type
                concat(FetchSegmentResponse.newBuilder().setZstd(slice(1000)).build().toByteArray(),
                        FetchSegmentResponse.newBuilder().setData(ByteString.copyFromUtf8("abc")).build().toByteArray()),
                concat(FetchSegmentResponse.newBuilder().setData(ByteString.copyFromUtf8("abc")).build().toByteArray(),
                        FetchSegmentResponse.newBuilder().setZstd(slice(1000)).build().toByteArray()),
                concat(FetchSegmentResponse.newBuilder().setZstd(slice(1000)).build().toByteArray(), // merged
                        zstdMessage(out -> out.writeInt32(ZstdSlice.LENGTH_FIELD_NUMBER, 17))),
                FetchSegmentResponse.newBuilder().setZstd(slice(10))
                        .setNextSegment(SegmentMetadata.newBuilder().setSegmentId("x")).build().toByteArray());
        for (byte[] wire : shapes) {
            FetchSegmentResponse generated = FetchSegmentResponse.parseFrom(wire);
            assertTrue(generated.hasZstd());
            assertEquals(generated, parse(wire));
        }
    }

    static byte[] concat(byte[] a, byte[] b) {
        byte[] all = Arrays.copyOf(a, a.length + b.length);
        System.arraycopy(b, 0, all, a.length, b.length);
        return all;
    }

    @Test
    void aTruncatedZstdSliceIsAnError() throws Exception {
        byte[] wire = FetchSegmentResponse.newBuilder().setZstd(slice(1000)).build().toByteArray();
        StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
                () -> parse(Arrays.copyOf(wire, wire.length - 1)));
        assertEquals(Status.Code.INTERNAL, e.getStatus().getCode());
        assertTrue(e.getMessage().contains("truncated zstd field"), e.getMessage());
        // the frame's length says more than the slice holds
        byte[] inside = zstdMessage(out -> {
            out.writeUInt32NoTag(ZstdSlice.FRAME_FIELD_NUMBER << 3 | 2);
            out.writeUInt32NoTag(50);
            out.writeRawBytes(new byte[10]);
        });
        e = assertThrows(StatusRuntimeException.class, () -> parse(inside));
        assertEquals(Status.Code.INTERNAL, e.getStatus().getCode());
    }
}
