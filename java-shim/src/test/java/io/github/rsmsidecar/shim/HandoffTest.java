package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.HandoffFile;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * Fetch hand-off (rsm.config.fetch.handoff): over a Unix socket the sidecar may answer with a file
 * in {@code <socket>.handoff/}. The sidecar here is in-process; the shim's target names a socket
 * path in a temp directory, so the hand-off directory is real and the shim reads real files.
 */
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class HandoffTest {

    static final int SIZE = 3 * 1024 * 1024 + 777;
    static final byte[] SEGMENT = Fixtures.content(SIZE, 11);

    /** What the sidecar writes into the hand-off file and what it announces. */
    enum Behaviour { HONEST, PATH_IN_NAME, SYMLINK, LONGER_THAN_ANNOUNCED, MISSING, UNASKED }

    /** Hands off [start, end] when asked (as the real sidecar does), else streams 64 KiB messages. */
    static final class HandoffSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final Path dir;
        final List<FetchSegmentRequest> requests = new CopyOnWriteArrayList<>();
        volatile Behaviour behaviour = Behaviour.HONEST;

        HandoffSidecar(Path dir) {
            this.dir = dir;
        }

        @Override
        public void fetchSegment(FetchSegmentRequest req, StreamObserver<FetchSegmentResponse> observer) {
            requests.add(req);
            int start = req.getStartPosition();
            int end = req.hasEndPosition() ? Math.min(req.getEndPosition() + 1, SIZE) : SIZE;
            byte[] range = Arrays.copyOfRange(SEGMENT, start, end);
            if (req.getAcceptHandoff() || behaviour == Behaviour.UNASKED) {
                try {
                    String name = UUID.randomUUID().toString().replace("-", "");
                    Path file = dir.resolve(name);
                    String announced = name;
                    long length = range.length;
                    switch (behaviour) {
                        case PATH_IN_NAME:
                            Files.write(dir.getParent().resolve("outside"), range);
                            announced = "../outside";
                            break;
                        case SYMLINK:
                            Path target = dir.getParent().resolve("target-" + name);
                            Files.write(target, range);
                            Files.createSymbolicLink(file, target);
                            break;
                        case LONGER_THAN_ANNOUNCED:
                            Files.write(file, Arrays.copyOfRange(SEGMENT, start, end + 1));
                            break;
                        case MISSING:
                            break;
                        default:
                            Files.write(file, range);
                    }
                    observer.onNext(FetchSegmentResponse.newBuilder()
                            .setHandoff(HandoffFile.newBuilder().setName(announced).setLength(length)).build());
                    observer.onCompleted();
                    return;
                } catch (IOException e) {
                    throw new UncheckedIOException(e);
                }
            }
            for (int p = 0; p < range.length; p += 64 * 1024) {
                int n = Math.min(64 * 1024, range.length - p);
                observer.onNext(FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(range, p, n)).build());
            }
            observer.onCompleted();
        }
    }

    static RemoteLogSegmentMetadata md() {
        return WindowedFetchTest.metadata(SIZE);
    }

    static Map<String, String> config(Path socket, String... more) {
        Map<String, String> c = Fixtures.config(more);
        c.put(ShimConfig.SIDECAR_TARGET, "unix://" + socket);
        return c;
    }

    static HandoffSidecar sidecar(Path tmp) throws IOException {
        Path dir = Files.createDirectories(tmp.resolve("rsm.sock.handoff"));
        return new HandoffSidecar(dir);
    }

    static byte[] range(int start, int length) {
        return Arrays.copyOfRange(SEGMENT, start, start + length);
    }

    @Test
    void aFetchOverAUnixSocketReadsTheHandedOffFileAndDeletesIt(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(tmp.resolve("rsm.sock")))) {
            for (int start : new int[] {0, 123_456, SIZE - 5000}) {
                try (InputStream in = h.rsm.fetchLogSegment(md(), start)) {
                    int want = Math.min(1024 * 1024, SIZE - start);
                    assertArrayEquals(range(start, want), in.readNBytes(want));
                }
            }
            try (InputStream in = h.rsm.fetchLogSegment(md(), 1000, 9999)) {
                assertArrayEquals(range(1000, 9000), in.readAllBytes());
            }
        }
        assertEquals(4, sidecar.requests.size(), "one call per fetch");
        assertTrue(sidecar.requests.stream().allMatch(FetchSegmentRequest::getAcceptHandoff));
        try (var files = Files.list(sidecar.dir)) {
            assertEquals(0, files.count(), "every handed-off file was deleted once open");
        }
    }

    @Test
    void aWindowedReadPastTheFirstWindowContinuesWithMoreHandOffs(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar,
                config(tmp.resolve("rsm.sock"), ShimConfig.FETCH_WINDOW_BYTES, "65536"));
             InputStream in = h.rsm.fetchLogSegment(md(), 10)) {
            assertArrayEquals(range(10, SIZE - 10), in.readAllBytes());
            assertEquals(-1, in.read());
        }
        assertTrue(sidecar.requests.size() > 3, "several windows");
        assertTrue(sidecar.requests.stream().allMatch(FetchSegmentRequest::getAcceptHandoff));
    }

    @Test
    void aFileTheShimMustNotReadTurnsHandOffOffAndTheFetchIsAskedAgainWithoutIt(@TempDir Path tmp) throws Exception {
        for (Behaviour b : List.of(Behaviour.PATH_IN_NAME, Behaviour.SYMLINK, Behaviour.LONGER_THAN_ANNOUNCED,
                Behaviour.MISSING)) {
            Path root = Files.createDirectories(tmp.resolve(b.name()));
            HandoffSidecar sidecar = sidecar(root);
            sidecar.behaviour = b;
            try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config(root.resolve("rsm.sock")))) {
                for (int start : new int[] {5000, 600_000}) {
                    try (InputStream in = h.rsm.fetchLogSegment(md(), start)) {
                        assertArrayEquals(range(start, 500_000), in.readNBytes(500_000), b.name());
                    }
                }
            }
            // the first fetch: offered, failed, asked again without; the second: not offered (off for 60 s)
            assertEquals(3, sidecar.requests.size(), b.name());
            assertTrue(sidecar.requests.get(0).getAcceptHandoff(), b.name());
            assertFalse(sidecar.requests.get(1).getAcceptHandoff(), b.name());
            assertFalse(sidecar.requests.get(2).getAcceptHandoff(), b.name());
        }
    }

    @Test
    void handOffIsNeverOfferedWhenTurnedOffOrOverTcp(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar,
                config(tmp.resolve("rsm.sock"), ShimConfig.FETCH_HANDOFF, "false"));
             InputStream in = h.rsm.fetchLogSegment(md(), 0)) {
            assertArrayEquals(range(0, 300_000), in.readNBytes(300_000));
        }
        Map<String, String> tcp = Fixtures.config(ShimConfig.SIDECAR_TARGET, "127.0.0.1:9095");
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcp);
             InputStream in = h.rsm.fetchLogSegment(md(), 0)) {
            assertArrayEquals(range(0, 300_000), in.readNBytes(300_000));
        }
        assertEquals(2, sidecar.requests.size());
        assertFalse(sidecar.requests.get(0).getAcceptHandoff());
        assertFalse(sidecar.requests.get(1).getAcceptHandoff());
        assertNull(ShimConfig.parse(tcp).handoffDir());
        assertEquals(tmp.resolve("rsm.sock.handoff"), ShimConfig.parse(config(tmp.resolve("rsm.sock"))).handoffDir());
    }

    @Test
    void aHandOffNobodyAskedForIsAnErrorNotSilence(@TempDir Path tmp) throws Exception {
        HandoffSidecar sidecar = sidecar(tmp);
        sidecar.behaviour = Behaviour.UNASKED;
        Map<String, String> tcp = Fixtures.config(ShimConfig.SIDECAR_TARGET, "127.0.0.1:9095");
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, tcp)) {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> h.rsm.fetchLogSegment(md(), 0, 999).close());
            assertTrue(e.getMessage().contains("hand-off file that was not asked for"), e.getMessage());
        }
    }
}
