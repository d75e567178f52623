package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.rsmsidecar.proto.v1.IndexType;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.github.rsmsidecar.proto.v1.SegmentState;
import java.util.Map;
import java.util.Optional;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;
import org.junit.jupiter.api.Test;

class MetadataMapperTest {

    /** Stands in for Kafka 4.0+, where RemoteLogSegmentMetadata has isTxnIdxEmpty(). */
    static final class Kafka40Metadata extends RemoteLogSegmentMetadata {
        private final boolean txnIdxEmpty;

        Kafka40Metadata(RemoteLogSegmentId id, boolean txnIdxEmpty) {
            super(id, 0L, 9L, 5L, 1, 6L, 100, Map.of(0, 0L));
            this.txnIdxEmpty = txnIdxEmpty;
        }

        public boolean isTxnIdxEmpty() {
            return txnIdxEmpty;
        }
    }

    @Test
    void everyFieldIsMapped() {
        Uuid segment = Uuid.fromString("h0sD7QyHSyalPq9JrSgHKQ");
        RemoteLogSegmentMetadata md = new RemoteLogSegmentMetadata(new RemoteLogSegmentId(Fixtures.TIP, segment),
                100L, 199L, 1_700_000_000_123L, 7, 1_700_000_001_456L, 4096,
                Optional.of(new RemoteLogSegmentMetadata.CustomMetadata(new byte[] {1, 2, 3})),
                RemoteLogSegmentState.DELETE_SEGMENT_STARTED, Map.of(0, 100L, 2, 150L, 5, 190L));
        SegmentMetadata p = MetadataMapper.toProto(md);
        assertEquals("f9T6yUyYRTiFbrzrTEOxkw", p.getTopicId());
        assertEquals("orders", p.getTopicName());
        assertEquals(3, p.getPartition());
        assertEquals("h0sD7QyHSyalPq9JrSgHKQ", p.getSegmentId());
        assertEquals(100L, p.getStartOffset());
        assertEquals(199L, p.getEndOffset());
        assertEquals(1_700_000_000_123L, p.getMaxTimestampMs());
        assertEquals(7, p.getBrokerId());
        assertEquals(1_700_000_001_456L, p.getEventTimestampMs());
        assertEquals(Map.of(0, 100L, 2, 150L, 5, 190L), p.getSegmentLeaderEpochsMap());
        assertEquals(4096, p.getSegmentSizeInBytes());
        assertTrue(p.hasCustomMetadata());
        assertArrayEquals(new byte[] {1, 2, 3}, p.getCustomMetadata().toByteArray());
        assertEquals(SegmentState.DELETE_SEGMENT_STARTED, p.getState());
        assertFalse(p.hasTxnIndexEmpty(), "Kafka 3.6 metadata has no isTxnIdxEmpty()");
    }

    @Test
    void absentCustomMetadataStaysAbsent() {
        RemoteLogSegmentMetadata md = new RemoteLogSegmentMetadata(new RemoteLogSegmentId(Fixtures.TIP, Uuid.randomUuid()),
                0L, 0L, 0L, 0, 0L, 0, Map.of(0, 0L));
        SegmentMetadata p = MetadataMapper.toProto(md);
        assertFalse(p.hasCustomMetadata());
        assertEquals(SegmentState.COPY_SEGMENT_STARTED, p.getState());
    }

    @Test
    void txnIdxEmptyIsReadByReflectionWhenPresent() {
        RemoteLogSegmentId id = new RemoteLogSegmentId(Fixtures.TIP, Uuid.randomUuid());
        assertTrue(MetadataMapper.toProto(new Kafka40Metadata(id, true)).getTxnIndexEmpty());
        SegmentMetadata p = MetadataMapper.toProto(new Kafka40Metadata(id, false));
        assertTrue(p.hasTxnIndexEmpty());
        assertFalse(p.getTxnIndexEmpty());
        assertNull(MetadataMapper.txnIdxEmpty(Fixtures.metadata()));
    }

    @Test
    void statesAndIndexTypesMapByName() {
        assertEquals(SegmentState.COPY_SEGMENT_STARTED, MetadataMapper.state("COPY_SEGMENT_STARTED"));
        assertEquals(SegmentState.COPY_SEGMENT_FINISHED, MetadataMapper.state("COPY_SEGMENT_FINISHED"));
        assertEquals(SegmentState.DELETE_SEGMENT_STARTED, MetadataMapper.state("DELETE_SEGMENT_STARTED"));
        assertEquals(SegmentState.DELETE_SEGMENT_FINISHED, MetadataMapper.state("DELETE_SEGMENT_FINISHED"));
        assertEquals(SegmentState.SEGMENT_STATE_UNSPECIFIED, MetadataMapper.state("SOME_FUTURE_STATE"));
        for (RemoteLogSegmentState s : RemoteLogSegmentState.values()) {
            assertEquals(s.name(), MetadataMapper.state(s.name()).name());
        }
        for (RemoteStorageManager.IndexType t : RemoteStorageManager.IndexType.values()) {
            IndexType p = MetadataMapper.indexType(t);
            assertEquals(t.name(), p.name());
        }
    }

    @Test
    void describeIsShortAndHasNoPayload() {
        RemoteLogSegmentMetadata md = Fixtures.metadata();
        String d = MetadataMapper.describe(md);
        assertEquals("orders-3 segment " + md.remoteLogSegmentId().id() + " [100..199]", d);
    }
}
