package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.FetchIndexRequest;
import io.github.rsmsidecar.proto.v1.FetchIndexResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.grpc.Status;
import io.grpc.stub.StreamObserver;
import java.io.InputStream;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager.IndexType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The broker loads a segment's indexes one after the other (offset, time, transaction;
 * {@code RemoteIndexCache.createCacheEntry}). The shim asks for the time and transaction indexes
 * beside the offset index, so the broker's later calls are answered without a round trip each.
 */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class IndexPrefetchTest {

    /** Answers each index type with its own bytes; no transaction index (NOT_FOUND), as for most segments. */
    static final class IndexSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final List<io.github.rsmsidecar.proto.v1.IndexType> requests = new CopyOnWriteArrayList<>();
        /** Types whose requests had all arrived when the offset index was answered. */
        final Set<io.github.rsmsidecar.proto.v1.IndexType> seenByOffsetAnswer = ConcurrentHashMap.newKeySet();
        /** The offset index is answered once the other two were asked for (or after 2 s). */
        final CountDownLatch othersAsked = new CountDownLatch(2);
        /** The first this many time-index requests fail with INTERNAL. */
        final AtomicInteger failTimestamp = new AtomicInteger();

        static byte[] bytesOf(io.github.rsmsidecar.proto.v1.IndexType type) {
            return new byte[] {(byte) type.getNumber(), 42, 43, (byte) type.getNumber()};
        }

        @Override
        public void fetchIndex(FetchIndexRequest req, StreamObserver<FetchIndexResponse> observer) {
            io.github.rsmsidecar.proto.v1.IndexType type = req.getIndexType();
            requests.add(type);
            switch (type) {
                case OFFSET -> {
                    try {
                        othersAsked.await(2, TimeUnit.SECONDS);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                    seenByOffsetAnswer.addAll(requests);
                }
                case TRANSACTION -> {
                    othersAsked.countDown();
                    observer.onError(Status.NOT_FOUND.withDescription("no transaction index").asRuntimeException());
                    return;
                }
                case TIMESTAMP -> {
                    othersAsked.countDown();
                    if (failTimestamp.getAndDecrement() > 0) {
                        observer.onError(Status.INTERNAL.withDescription("boom").asRuntimeException());
                        return;
                    }
                }
                default -> { }
            }
            observer.onNext(FetchIndexResponse.newBuilder().setData(ByteString.copyFrom(bytesOf(type))).build());
            observer.onCompleted();
        }

        @Override
        public void deleteSegment(DeleteSegmentRequest req, StreamObserver<DeleteSegmentResponse> observer) {
            observer.onNext(DeleteSegmentResponse.getDefaultInstance());
            observer.onCompleted();
        }

        long count(io.github.rsmsidecar.proto.v1.IndexType type) {
            return requests.stream().filter(t -> t == type).count();
        }
    }

    private static final Map<String, String> CONFIG = Fixtures.config();

    /** What RemoteIndexCache does on a miss: the three indexes in order, the transaction one optional. */
    static byte[][] loadIndexes(SidecarRemoteStorageManager rsm, RemoteLogSegmentMetadata md) throws Exception {
        byte[][] out = new byte[2][];
        try (InputStream in = rsm.fetchIndex(md, IndexType.OFFSET)) {
            out[0] = in.readAllBytes();
        }
        try (InputStream in = rsm.fetchIndex(md, IndexType.TIMESTAMP)) {
            out[1] = in.readAllBytes();
        }
        assertThrows(RemoteResourceNotFoundException.class, () -> rsm.fetchIndex(md, IndexType.TRANSACTION),
                "no transaction index: the broker expects RemoteResourceNotFoundException");
        return out;
    }

    /** Each test's sidecar (a new one per test) and the segment it asks for. */
    final IndexSidecar sidecar = new IndexSidecar();
    final RemoteLogSegmentMetadata md = Fixtures.metadata();

    @Test
    void theTimeAndTransactionIndexesAreAskedForBesideTheOffsetIndexAndAnsweredOnce() throws Exception {
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, CONFIG)) {
            byte[][] got = loadIndexes(h.rsm, md);
            assertArrayEquals(IndexSidecar.bytesOf(io.github.rsmsidecar.proto.v1.IndexType.OFFSET), got[0]);
            assertArrayEquals(IndexSidecar.bytesOf(io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP), got[1]);
            assertTrue(sidecar.seenByOffsetAnswer.containsAll(Set.of(io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP,
                            io.github.rsmsidecar.proto.v1.IndexType.TRANSACTION)),
                    "all three were under way before the offset index was answered: " + sidecar.seenByOffsetAnswer);
            assertEquals(3, sidecar.requests.size(), "one request per index: " + sidecar.requests);
            // a second load (the broker's cache evicted the entry) asks again: answers are used once
            loadIndexes(h.rsm, md);
            assertEquals(6, sidecar.requests.size(), "answers are used once: " + sidecar.requests);
        }
    }

    @Test
    void aPrefetchThatFailedIsAskedForAgainByTheBrokersOwnCall() throws Exception {
        sidecar.failTimestamp.set(1);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, CONFIG)) {
            byte[][] got = loadIndexes(h.rsm, md);
            assertArrayEquals(IndexSidecar.bytesOf(io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP), got[1],
                    "the broker's call got the index although the prefetch failed");
            assertEquals(2, sidecar.count(io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP));
        }
    }

    @Test
    void aTimeIndexAskedForAloneIsOneCall() throws Exception {
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, CONFIG)) {
            try (InputStream in = h.rsm.fetchIndex(md, IndexType.TIMESTAMP)) {
                assertArrayEquals(IndexSidecar.bytesOf(io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP),
                        in.readAllBytes());
            }
            assertEquals(List.of(io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP), sidecar.requests);
        }
    }

    @Test
    void prefetchedIndexesOfADeletedSegmentAreDropped() throws Exception {
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, CONFIG)) {
            try (InputStream in = h.rsm.fetchIndex(md, IndexType.OFFSET)) {
                in.readAllBytes();
            }
            h.rsm.deleteLogSegmentData(md);
            // after the delete the broker's call asks the sidecar itself (the real one answers
            // NOT_FOUND for a deleted segment; this one still answers: a second request shows it)
            try (InputStream in = h.rsm.fetchIndex(md, IndexType.TIMESTAMP)) {
                in.readAllBytes();
            }
            assertEquals(2, sidecar.count(io.github.rsmsidecar.proto.v1.IndexType.TIMESTAMP), sidecar.requests.toString());
        }
    }
}
