package io.github.rsmsidecar.shim;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.IndexType;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.github.rsmsidecar.proto.v1.SegmentState;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.util.Map;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/** KIP-405 types to rsm.v1 messages, field for field. */
public final class MetadataMapper {

    private static final Logger LOG = LoggerFactory.getLogger(MetadataMapper.class);

    /**
     * {@code boolean isTxnIdxEmpty()} exists from Kafka 4.0 (KIP-1058). Looked up once per runtime
     * class, so the shim compiled against 3.6 reads it on 4.x brokers and leaves the field absent
     * before.
     */
    private static final ClassValue<Method> TXN_IDX_EMPTY = new ClassValue<>() {
        @Override
        protected Method computeValue(Class<?> type) {
            try {
                Method m = type.getMethod("isTxnIdxEmpty");
                return m.getReturnType() == boolean.class ? m : null;
            } catch (NoSuchMethodException e) {
                return null;
            }
        }
    };

    private MetadataMapper() {
    }

    public static SegmentMetadata toProto(RemoteLogSegmentMetadata md) {
        TopicIdPartition tip = md.remoteLogSegmentId().topicIdPartition();
        SegmentMetadata.Builder b = SegmentMetadata.newBuilder()
                .setTopicId(tip.topicId().toString())
                .setTopicName(tip.topic())
                .setPartition(tip.partition())
                .setSegmentId(md.remoteLogSegmentId().id().toString())
                .setStartOffset(md.startOffset())
                .setEndOffset(md.endOffset())
                .setMaxTimestampMs(md.maxTimestampMs())
                .setBrokerId(md.brokerId())
                .setEventTimestampMs(md.eventTimestampMs())
                .setSegmentSizeInBytes(md.segmentSizeInBytes())
                .setState(state(md.state() == null ? null : md.state().name()));
        for (Map.Entry<Integer, Long> e : md.segmentLeaderEpochs().entrySet()) {
            b.putSegmentLeaderEpochs(e.getKey(), e.getValue());
        }
        md.customMetadata().ifPresent(cm -> b.setCustomMetadata(ByteString.copyFrom(cm.value())));
        Boolean txnIdxEmpty = txnIdxEmpty(md);
        if (txnIdxEmpty != null) {
            b.setTxnIndexEmpty(txnIdxEmpty);
        }
        return b.build();
    }

    /** {@code md.isTxnIdxEmpty()} on Kafka 4.0+, {@code null} before. */
    static Boolean txnIdxEmpty(Object md) {
        Method m = TXN_IDX_EMPTY.get(md.getClass());
        if (m == null) {
            return null;
        }
        try {
            return (Boolean) m.invoke(md);
        } catch (IllegalAccessException | InvocationTargetException | RuntimeException e) {
            LOG.debug("isTxnIdxEmpty() failed; txn_index_empty left absent: {}", e.toString());
            return null;
        }
    }

    /** By name, so a state added by a later Kafka maps to UNSPECIFIED instead of failing. */
    static SegmentState state(String name) {
        return sameName(SegmentState.class, name, SegmentState.SEGMENT_STATE_UNSPECIFIED);
    }

    /** By name; {@code null} for a type rsm.v1 does not know. */
    public static IndexType indexType(RemoteStorageManager.IndexType type) {
        return sameName(IndexType.class, type.name(), null);
    }

    /** The rsm.v1 constant named like Kafka's {@code name}, or {@code unknown} when rsm.v1 has none
     * (protobuf's own {@code UNRECOGNIZED} and {@code *_UNSPECIFIED} constants are no Kafka names). */
    static <E extends Enum<E>> E sameName(Class<E> type, String name, E unknown) {
        if (name == null || name.equals("UNRECOGNIZED") || name.endsWith("_UNSPECIFIED")) {
            return unknown;
        }
        try {
            return Enum.valueOf(type, name);
        } catch (IllegalArgumentException e) {
            return unknown;
        }
    }

    /** A short, log-safe description of the segment: {@code topic-partition segment <uuid> [start..end]}. */
    public static String describe(RemoteLogSegmentMetadata md) {
        TopicIdPartition tip = md.remoteLogSegmentId().topicIdPartition();
        return tip.topic() + "-" + tip.partition() + " segment " + md.remoteLogSegmentId().id()
                + " [" + md.startOffset() + ".." + md.endOffset() + "]";
    }
}
