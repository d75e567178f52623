package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import com.google.protobuf.UnknownFieldSet;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.ByteArrayInputStream;
import java.util.Arrays;
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
}
