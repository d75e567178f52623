package io.github.rsmsidecar.shim;

import io.grpc.BindableService;
import io.grpc.ClientInterceptor;
import io.grpc.ManagedChannel;
import io.grpc.Server;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata.CustomMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentState;

/** Test data and an in-process sidecar harness. */
final class Fixtures {

    private Fixtures() {
    }

    static final TopicIdPartition TIP = new TopicIdPartition(Uuid.fromString("f9T6yUyYRTiFbrzrTEOxkw"),
            new TopicPartition("orders", 3));

    static RemoteLogSegmentMetadata metadata() {
        return new RemoteLogSegmentMetadata(new RemoteLogSegmentId(TIP, Uuid.randomUuid()), 100L, 199L,
                1_700_000_000_000L, 7, 1_700_000_001_000L, 4096,
                Optional.of(new CustomMetadata(new byte[] {1, 2, 3})), RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                Map.of(0, 100L, 2, 150L));
    }

    /** Fast settings for tests; override per test. */
    static Map<String, String> config(String... keyValues) {
        Map<String, String> c = new HashMap<>();
        c.put("broker.id", "1");
        c.put(ShimConfig.RETRY_INITIAL_BACKOFF_MS, "10");
        c.put(ShimConfig.RETRY_MAX_BACKOFF_MS, "40");
        // fetches and index calls keep to retry.max.attempts, as other calls (RetryTest sets it)
        c.put(ShimConfig.RETRY_FETCH_MAX_MS, "0");
        c.put(ShimConfig.FETCH_DEADLINE_MS, "5000");
        c.put(ShimConfig.FETCH_READ_TIMEOUT_MS, "5000");
        c.put(ShimConfig.FETCH_INDEX_DEADLINE_MS, "5000");
        c.put(ShimConfig.DELETE_DEADLINE_MS, "5000");
        c.put(ShimConfig.COPY_DEADLINE_MS, "20000");
        c.put(ShimConfig.CLOSE_TIMEOUT_MS, "1000");
        for (int i = 0; i < keyValues.length; i += 2) {
            c.put(keyValues[i], keyValues[i + 1]);
        }
        return c;
    }

    /** Segment files of the given sizes (deterministic content) in {@code dir}. */
    static LogSegmentData segmentData(Path dir, int logSize, int offsetIndexSize, int timeIndexSize,
                                      int snapshotSize, Integer txnIndexSize, ByteBuffer leaderEpochs)
            throws IOException {
        Path log = write(dir.resolve("00000000000000000100.log"), logSize, 1);
        Path offset = write(dir.resolve("00000000000000000100.index"), offsetIndexSize, 2);
        Path time = write(dir.resolve("00000000000000000100.timeindex"), timeIndexSize, 3);
        Path snapshot = write(dir.resolve("00000000000000000200.snapshot"), snapshotSize, 4);
        Optional<Path> txn = txnIndexSize == null ? Optional.empty()
                : Optional.of(write(dir.resolve("00000000000000000100.txnindex"), txnIndexSize, 5));
        return new LogSegmentData(log, offset, time, txn, snapshot, leaderEpochs);
    }

    static byte[] content(int size, int seed) {
        byte[] b = new byte[size];
        for (int i = 0; i < size; i++) {
            b[i] = (byte) (i * 31 + seed * 7 + (i >> 8));
        }
        return b;
    }

    static Path write(Path p, int size, int seed) throws IOException {
        Files.write(p, content(size, seed));
        return p;
    }

    static ByteBuffer leaderEpochCheckpoint() {
        return ByteBuffer.wrap("0\n2\n0 100\n2 150\n".getBytes(StandardCharsets.US_ASCII));
    }

    /** An in-process sidecar plus a configured shim talking to it. */
    static final class Harness implements AutoCloseable {
        final String name = InProcessServerBuilder.generateName();
        final Server server;
        final SidecarRemoteStorageManager rsm;
        final List<ManagedChannel> channels = new CopyOnWriteArrayList<>();

        Harness(BindableService service, Map<String, String> config, ClientInterceptor... interceptors)
                throws IOException {
            this(service, config, null, interceptors);
        }

        Harness(BindableService service, Map<String, String> config, ErrorMapper mapper,
                ClientInterceptor... interceptors) throws IOException {
            this(service, config, mapper, false, interceptors);
        }

        /** {@code monitorable}: the shim is a {@link MonitorableSidecarRemoteStorageManager}. */
        Harness(BindableService service, Map<String, String> config, ErrorMapper mapper, boolean monitorable,
                ClientInterceptor... interceptors) throws IOException {
            this(service, config, mapper, monitorable, false, interceptors);
        }

        /**
         * A shim whose gRPC calls go to {@code service} in-process while its fetch channel connects to
         * {@code config}'s {@code sidecar.target} (a {@code read.FrameSidecar}): fetches and indexes
         * over the channel, deletes over gRPC, and over gRPC too when the target has no channel.
         */
        static Harness withFetchChannel(BindableService service, Map<String, String> config) throws IOException {
            return new Harness(service, config, null, false, true);
        }

        private Harness(BindableService service, Map<String, String> config, ErrorMapper mapper, boolean monitorable,
                        boolean fetchChannel, ClientInterceptor... interceptors) throws IOException {
            server = InProcessServerBuilder.forName(name).addService(service).build().start();
            ChannelFactory factory = new ChannelFactory() {
                @Override
                public ManagedChannel create(ShimConfig c) {
                    ManagedChannel ch = InProcessChannelBuilder.forName(name).intercept(interceptors).build();
                    channels.add(ch);
                    return ch;
                }

                @Override
                public boolean fetchChannel() {
                    return fetchChannel; // else in-process only: fetches go over gRPC
                }
            };
            rsm = monitorable ? new MonitorableSidecarRemoteStorageManager(factory, mapper)
                    : new SidecarRemoteStorageManager(factory, mapper);
            rsm.configure(config);
        }

        @Override
        public void close() throws IOException {
            rsm.close();
            server.shutdownNow();
            try {
                server.awaitTermination(5, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }
}
