package io.github.rsmsidecar.shim.read;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.IndexType;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.grpc.Status;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The index prefetch's accounting of the bytes it holds ({@link IndexPrefetch#heldBytes}). */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class IndexPrefetchBoundTest {

    static byte[] bytesOf(IndexType type) {
        return new byte[] {(byte) type.getNumber(), 42, 43, (byte) type.getNumber()};
    }

    @Test
    void heldBytesAreCountedUntilTakenOrDropped() throws Exception {
        // the sidecar, as the fetch channel answers: the time index's bytes, NOT_FOUND for the transaction index
        AtomicInteger timestamps = new AtomicInteger();
        IndexPrefetch.Fetcher sidecar = req -> {
            if (req.getIndexType() == IndexType.TRANSACTION) {
                throw Status.NOT_FOUND.withDescription("no transaction index").asException();
            }
            timestamps.incrementAndGet();
            return bytesOf(req.getIndexType());
        };
        ExecutorService executor = Executors.newFixedThreadPool(2);
        TopicIdPartition tip = new TopicIdPartition(Uuid.randomUuid(), 3, "orders");
        ReadAhead.SegmentRef seg = new ReadAhead.SegmentRef(new RemoteLogSegmentId(tip, Uuid.randomUuid()),
                100, 199, 4096);
        FetchIndexRequest request = FetchIndexRequest.newBuilder()
                .setMetadata(SegmentMetadata.newBuilder().setTopicId(tip.topicId().toString()).setTopicName("orders")
                        .setPartition(3).setSegmentId(seg.id().id().toString()).setStartOffset(100).setEndOffset(199))
                .build();
        try {
            IndexPrefetch prefetch = new IndexPrefetch();
            prefetch.start(sidecar, executor, seg, request, IndexType.TIMESTAMP, IndexType.TRANSACTION);
            prefetch.start(sidecar, executor, seg, request, IndexType.TIMESTAMP); // already under way: not again
            IndexPrefetch.Answer ts = prefetch.take(seg, IndexType.TIMESTAMP, 5000);
            assertArrayEquals(bytesOf(IndexType.TIMESTAMP), ts.data());
            IndexPrefetch.Answer txn = prefetch.take(seg, IndexType.TRANSACTION, 5000);
            assertEquals(Status.Code.NOT_FOUND, txn.notFound().getCode());
            assertEquals(0, prefetch.heldBytes(), "taken answers are no longer held");
            assertEquals(0, prefetch.size());
            assertEquals(1, timestamps.get());

            prefetch.start(sidecar, executor, seg, request, IndexType.TIMESTAMP);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (prefetch.heldBytes() == 0 && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            assertEquals(4, prefetch.heldBytes(), "an answer nobody took yet is held");
            prefetch.forget(seg.id());
            assertEquals(0, prefetch.heldBytes(), "dropped with its segment");
            assertEquals(0, prefetch.size());
        } finally {
            executor.shutdownNow();
        }
    }
}
