package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.CopyBegin;
import io.github.rsmsidecar.proto.v1.CopySegmentRequest;
import io.github.rsmsidecar.proto.v1.CopySegmentResponse;
import io.github.rsmsidecar.proto.v1.FileKind;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.github.rsmsidecar.proto.v1.SegmentState;
import io.github.rsmsidecar.proto.v1.TransferMode;
import io.grpc.CallOptions;
import io.grpc.Channel;
import io.grpc.ClientCall;
import io.grpc.ClientInterceptor;
import io.grpc.ForwardingClientCall;
import io.grpc.MethodDescriptor;
import io.grpc.Status;
import io.grpc.stub.ServerCallStreamObserver;
import io.grpc.stub.StreamObserver;
import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.EnumMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

@Timeout(value = 60, unit = TimeUnit.SECONDS)
class CopyTest {

    static final int MIB = 1 << 20;

    @TempDir
    Path dir;

    /** Records every request message; answers with {@code response} or fails with {@code failure}. */
    static class RecordingSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final List<CopySegmentRequest> received = new CopyOnWriteArrayList<>();
        final AtomicInteger calls = new AtomicInteger();
        volatile CopySegmentResponse response = CopySegmentResponse.newBuilder().setStoredBytes(42)
                .setObjectKeyBase("orders-x/3/00000000000000000100-id").build();
        volatile Status failAfterFirstData;

        @Override
        public StreamObserver<CopySegmentRequest> copySegment(StreamObserver<CopySegmentResponse> observer) {
            calls.incrementAndGet();
            return new StreamObserver<>() {
                boolean failed;

                @Override
                public void onNext(CopySegmentRequest value) {
                    received.add(value);
                    if (value.hasData() && failAfterFirstData != null && !failed) {
                        failed = true;
                        observer.onError(failAfterFirstData.asRuntimeException());
                    }
                }

                @Override
                public void onError(Throwable t) {
                }

                @Override
                public void onCompleted() {
                    if (!failed) {
                        observer.onNext(response);
                        observer.onCompleted();
                    }
                }
            };
        }
    }

    static Map<FileKind, byte[]> reassemble(List<CopySegmentRequest> messages) {
        Map<FileKind, ByteArrayOutputStream> files = new EnumMap<>(FileKind.class);
        for (CopySegmentRequest m : messages) {
            if (m.hasData()) {
                files.computeIfAbsent(m.getData().getFile(), k -> new ByteArrayOutputStream())
                        .writeBytes(m.getData().getData().toByteArray());
            }
        }
        Map<FileKind, byte[]> out = new EnumMap<>(FileKind.class);
        files.forEach((k, v) -> out.put(k, v.toByteArray()));
        return out;
    }

    @Test
    void streamModeSendsBeginThenFilesInProtoOrderInChunksOfAtMostOneMiB() throws Exception {
        RecordingSidecar sidecar = new RecordingSidecar();
        // A direct buffer whose checkpoint starts at position 5: no array, not at 0.
        byte[] checkpoint = Fixtures.leaderEpochCheckpoint().array();
        ByteBuffer epochs = ByteBuffer.allocateDirect(5 + checkpoint.length + 7);
        epochs.put("junk!".getBytes(StandardCharsets.US_ASCII)).put(checkpoint).put("trailer".getBytes(StandardCharsets.US_ASCII));
        epochs.position(5).limit(5 + checkpoint.length);
        LogSegmentData data = Fixtures.segmentData(dir, 2 * MIB + 123, 10_000, 0, 777, 3 * MIB, epochs);
        RemoteLogSegmentMetadata md = Fixtures.metadata();

        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            Optional<CustomMetadata> custom = h.rsm.copyLogSegmentData(md, data);
            assertFalse(custom.isPresent(), "no custom metadata in the response");
        }
        assertEquals(5, epochs.position(), "the broker's buffer must not move");
        assertEquals(5 + checkpoint.length, epochs.limit());

        List<CopySegmentRequest> msgs = sidecar.received;
        assertTrue(msgs.get(0).hasBegin(), "first message is CopyBegin");
        CopyBegin begin = msgs.get(0).getBegin();
        assertEquals(TransferMode.STREAM, begin.getMode());
        assertEquals(MetadataMapper.toProto(md), begin.getMetadata());
        assertEquals(SegmentState.COPY_SEGMENT_FINISHED, begin.getMetadata().getState());
        assertArrayEquals(checkpoint, begin.getLeaderEpochCheckpoint().toByteArray());
        assertEquals(2 * MIB + 123, begin.getFiles().getLogSize());
        assertEquals(10_000, begin.getFiles().getOffsetIndexSize());
        assertEquals(0, begin.getFiles().getTimeIndexSize());
        assertEquals(777, begin.getFiles().getProducerSnapshotSize());
        assertTrue(begin.getFiles().hasTransactionIndexSize());
        assertEquals(3 * MIB, begin.getFiles().getTransactionIndexSize());
        assertEquals("", begin.getFiles().getLogPath(), "stream mode sends no paths");

        List<FileKind> order = new ArrayList<>();
        for (CopySegmentRequest m : msgs.subList(1, msgs.size())) {
            assertTrue(m.hasData(), "only CopyData after CopyBegin");
            assertTrue(m.getData().getData().size() <= MIB, "message of " + m.getData().getData().size() + " bytes");
            assertTrue(m.getData().getData().size() > 0, "no empty messages");
            if (order.isEmpty() || order.get(order.size() - 1) != m.getData().getFile()) {
                order.add(m.getData().getFile());
            }
        }
        // TIME_INDEX is empty: no message for it.
        assertEquals(List.of(FileKind.LOG, FileKind.OFFSET_INDEX, FileKind.PRODUCER_SNAPSHOT_FILE,
                FileKind.TRANSACTION_INDEX), order);
        Map<FileKind, byte[]> files = reassemble(msgs);
        assertArrayEquals(Files.readAllBytes(data.logSegment()), files.get(FileKind.LOG));
        assertArrayEquals(Files.readAllBytes(data.offsetIndex()), files.get(FileKind.OFFSET_INDEX));
        assertArrayEquals(Files.readAllBytes(data.producerSnapshotIndex()), files.get(FileKind.PRODUCER_SNAPSHOT_FILE));
        assertArrayEquals(Files.readAllBytes(data.transactionIndex().get()), files.get(FileKind.TRANSACTION_INDEX));
        assertEquals(1 + 3 + 1 + 1 + 3, msgs.size(), "LOG 3 chunks, OFFSET 1, SNAPSHOT 1, TXN 3");
    }

    @Test
    void streamModeWithoutTransactionIndexOmitsIt() throws Exception {
        RecordingSidecar sidecar = new RecordingSidecar();
        LogSegmentData data = Fixtures.segmentData(dir, 1000, 16, 24, 10, null, Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            h.rsm.copyLogSegmentData(Fixtures.metadata(), data);
        }
        CopyBegin begin = sidecar.received.get(0).getBegin();
        assertFalse(begin.getFiles().hasTransactionIndexSize());
        assertFalse(begin.getFiles().hasTransactionIndexPath());
        assertFalse(reassemble(sidecar.received).containsKey(FileKind.TRANSACTION_INDEX));
        assertEquals(5, sidecar.received.size(), "begin + LOG, OFFSET, TIME, SNAPSHOT");
    }

    @Test
    void pathModeSendsPathsOnly() throws Exception {
        RecordingSidecar sidecar = new RecordingSidecar();
        LogSegmentData data = Fixtures.segmentData(dir, 5000, 16, 24, 10, 48, Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config(ShimConfig.TRANSFER_MODE, "path"))) {
            h.rsm.copyLogSegmentData(Fixtures.metadata(), data);
        }
        assertEquals(1, sidecar.received.size(), "CopyBegin only");
        CopyBegin begin = sidecar.received.get(0).getBegin();
        assertEquals(TransferMode.PATH, begin.getMode());
        assertEquals(data.logSegment().toAbsolutePath().toString(), begin.getFiles().getLogPath());
        assertEquals(data.offsetIndex().toAbsolutePath().toString(), begin.getFiles().getOffsetIndexPath());
        assertEquals(data.timeIndex().toAbsolutePath().toString(), begin.getFiles().getTimeIndexPath());
        assertEquals(data.producerSnapshotIndex().toAbsolutePath().toString(), begin.getFiles().getProducerSnapshotPath());
        assertEquals(data.transactionIndex().get().toAbsolutePath().toString(), begin.getFiles().getTransactionIndexPath());
        assertEquals(0, begin.getFiles().getLogSize(), "path mode sends no sizes");
        assertFalse(begin.getFiles().hasTransactionIndexSize());
        assertArrayEquals(Fixtures.leaderEpochCheckpoint().array(), begin.getLeaderEpochCheckpoint().toByteArray());

        RecordingSidecar noTxn = new RecordingSidecar();
        LogSegmentData data2 = Fixtures.segmentData(Files.createDirectory(dir.resolve("b")), 5, 1, 1, 1, null,
                Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(noTxn, Fixtures.config(ShimConfig.TRANSFER_MODE, "path"))) {
            h.rsm.copyLogSegmentData(Fixtures.metadata(), data2);
        }
        assertFalse(noTxn.received.get(0).getBegin().getFiles().hasTransactionIndexPath());
    }

    @Test
    void customMetadataFromTheResponseIsReturned() throws Exception {
        RecordingSidecar sidecar = new RecordingSidecar();
        sidecar.response = sidecar.response.toBuilder().setCustomMetadata(ByteString.copyFrom(new byte[] {9, 8, 7})).build();
        LogSegmentData data = Fixtures.segmentData(dir, 10, 1, 1, 1, null, Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            Optional<CustomMetadata> custom = h.rsm.copyLogSegmentData(Fixtures.metadata(), data);
            assertTrue(custom.isPresent());
            assertArrayEquals(new byte[] {9, 8, 7}, custom.get().value());
        }
    }

    @Test
    void aSidecarErrorMidStreamStopsTheUploadAndIsNotRetried() throws Exception {
        RecordingSidecar sidecar = new RecordingSidecar();
        sidecar.failAfterFirstData = Status.INVALID_ARGUMENT.withDescription("oversized copy message");
        LogSegmentData data = Fixtures.segmentData(dir, 20 * MIB, 1, 1, 1, null, Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.copyLogSegmentData(Fixtures.metadata(), data));
            assertEquals(RemoteStorageException.class, e.getClass());
            assertTrue(e.getMessage().contains("INVALID_ARGUMENT: oversized copy message"), e.getMessage());
        }
        assertEquals(1, sidecar.calls.get());
        assertTrue(sidecar.received.size() < 10, "kept sending after the error: " + sidecar.received.size());
    }

    @Test
    void aMissingFileFailsBeforeAnyCall() throws Exception {
        RecordingSidecar sidecar = new RecordingSidecar();
        LogSegmentData data = Fixtures.segmentData(dir, 10, 1, 1, 1, null, Fixtures.leaderEpochCheckpoint());
        Files.delete(data.offsetIndex());
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, Fixtures.config())) {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.copyLogSegmentData(Fixtures.metadata(), data));
            assertFalse(e instanceof RemoteResourceNotFoundException);
            assertTrue(e.getMessage().contains("OFFSET_INDEX"), e.getMessage());
        }
        assertEquals(0, sidecar.calls.get());
    }

    @Test
    void copyDeadlineApplies() throws Exception {
        RemoteStorageGrpc.RemoteStorageImplBase silent = new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public StreamObserver<CopySegmentRequest> copySegment(StreamObserver<CopySegmentResponse> observer) {
                return new StreamObserver<>() {
                    public void onNext(CopySegmentRequest v) {
                    }

                    public void onError(Throwable t) {
                    }

                    public void onCompleted() {
                        // never answers
                    }
                };
            }
        };
        LogSegmentData data = Fixtures.segmentData(dir, 10, 1, 1, 1, null, Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(silent, Fixtures.config(ShimConfig.COPY_DEADLINE_MS, "300"))) {
            long t0 = System.nanoTime();
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.copyLogSegmentData(Fixtures.metadata(), data));
            long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
            assertTrue(e.getMessage().contains("DEADLINE_EXCEEDED"), e.getMessage());
            assertTrue(ms >= 250 && ms < 5000, "took " + ms + " ms");
        }
    }

    /**
     * The sidecar asks for one message at a time, slowly. A client honouring flow control never has
     * more than a message or two sent but not yet taken by the server; one that ignores
     * {@code isReady()} would push the whole 8 MiB segment into the transport at once.
     */
    @Test
    void streamModeHonoursFlowControl() throws Exception {
        AtomicInteger clientSent = new AtomicInteger();
        AtomicInteger maxOutstanding = new AtomicInteger();
        List<CopySegmentRequest> received = new CopyOnWriteArrayList<>();
        RemoteStorageGrpc.RemoteStorageImplBase slow = new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public StreamObserver<CopySegmentRequest> copySegment(StreamObserver<CopySegmentResponse> observer) {
                ServerCallStreamObserver<CopySegmentResponse> s = (ServerCallStreamObserver<CopySegmentResponse>) observer;
                s.disableAutoRequest();
                Thread pacer = new Thread(() -> {
                    try {
                        while (!s.isCancelled()) {
                            Thread.sleep(40);
                            s.request(1);
                        }
                    } catch (InterruptedException ignored) {
                        // done
                    }
                });
                pacer.setDaemon(true);
                pacer.start();
                return new StreamObserver<>() {
                    public void onNext(CopySegmentRequest v) {
                        received.add(v);
                        int outstanding = clientSent.get() - received.size();
                        maxOutstanding.accumulateAndGet(outstanding, Math::max);
                    }

                    public void onError(Throwable t) {
                        pacer.interrupt();
                    }

                    public void onCompleted() {
                        pacer.interrupt();
                        observer.onNext(CopySegmentResponse.getDefaultInstance());
                        observer.onCompleted();
                    }
                };
            }
        };
        ClientInterceptor counter = new ClientInterceptor() {
            @Override
            public <Q, R> ClientCall<Q, R> interceptCall(MethodDescriptor<Q, R> method, CallOptions options, Channel next) {
                return new ForwardingClientCall.SimpleForwardingClientCall<>(next.newCall(method, options)) {
                    @Override
                    public void sendMessage(Q message) {
                        clientSent.incrementAndGet();
                        super.sendMessage(message);
                    }
                };
            }
        };
        LogSegmentData data = Fixtures.segmentData(dir, 8 * MIB, 1, 1, 1, null, Fixtures.leaderEpochCheckpoint());
        try (Fixtures.Harness h = new Fixtures.Harness(slow, Fixtures.config(), counter)) {
            h.rsm.copyLogSegmentData(Fixtures.metadata(), data);
        }
        assertEquals(1 + 8 + 3, received.size());
        assertEquals(received.size(), clientSent.get());
        assertTrue(maxOutstanding.get() <= 2, "messages sent ahead of the sidecar's demand: " + maxOutstanding.get());
        assertNotNull(received.get(0).getBegin());
    }
}
