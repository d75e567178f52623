package io.github.rsmsidecar.shim.read;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.FetchIndexResponse;
import io.github.rsmsidecar.proto.v1.IndexType;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.SegmentMetadata;
import io.grpc.ManagedChannel;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.stub.StreamObserver;
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

    /** Answers the time index with 4 bytes and the transaction index with NOT_FOUND. */
    static final class Sidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final AtomicInteger timestamps = new AtomicInteger();

        @Override
        public void fetchIndex(FetchIndexRequest req, StreamObserver<FetchIndexResponse> observer) {
            if (req.getIndexType() == IndexType.TRANSACTION) {
                observer.onError(Status.NOT_FOUND.withDescription("no transaction index").asRuntimeException());
                return;
            }
            timestamps.incrementAndGet();
            observer.onNext(FetchIndexResponse.newBuilder()
                    .setData(ByteString.copyFrom(bytesOf(req.getIndexType()))).build());
            observer.onCompleted();
        }
    }

    @Test
    void heldBytesAreCountedUntilTakenOrDropped() throws Exception {
        String name = InProcessServerBuilder.generateName();
        Sidecar sidecar = new Sidecar();
        Server server = InProcessServerBuilder.forName(name).addService(sidecar).build().start();
        ManagedChannel ch = InProcessChannelBuilder.forName(name).build();
        TopicIdPartition tip = new TopicIdPartition(Uuid.randomUuid(), 3, "orders");
        ReadAhead.SegmentRef seg = new ReadAhead.SegmentRef(new RemoteLogSegmentId(tip, Uuid.randomUuid()),
                100, 199, 4096);
        FetchIndexRequest request = FetchIndexRequest.newBuilder()
                .setMetadata(SegmentMetadata.newBuilder().setTopicId(tip.topicId().toString()).setTopicName("orders")
                        .setPartition(3).setSegmentId(seg.id().id().toString()).setStartOffset(100).setEndOffset(199))
                .build();
        try {
            IndexPrefetch prefetch = new IndexPrefetch();
            prefetch.start(ch, seg, request, 5000, IndexType.TIMESTAMP, IndexType.TRANSACTION);
            prefetch.start(ch, seg, request, 5000, IndexType.TIMESTAMP); // already under way: no second call
            IndexPrefetch.Answer ts = prefetch.take(seg, IndexType.TIMESTAMP, 5000);
            assertArrayEquals(bytesOf(IndexType.TIMESTAMP), ts.data());
            IndexPrefetch.Answer txn = prefetch.take(seg, IndexType.TRANSACTION, 5000);
            assertEquals(Status.Code.NOT_FOUND, txn.notFound().getCode());
            assertEquals(0, prefetch.heldBytes(), "taken answers are no longer held");
            assertEquals(0, prefetch.size());
            assertEquals(1, sidecar.timestamps.get());

            prefetch.start(ch, seg, request, 5000, IndexType.TIMESTAMP);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (prefetch.heldBytes() == 0 && System.nanoTime() < deadline) {
                Thread.sleep(5);
            }
            assertEquals(4, prefetch.heldBytes(), "an answer nobody took yet is held");
            prefetch.forget(seg.id());
            assertEquals(0, prefetch.heldBytes(), "dropped with its segment");
            assertEquals(0, prefetch.size());
        } finally {
            ch.shutdownNow();
            server.shutdownNow();
        }
    }
}
