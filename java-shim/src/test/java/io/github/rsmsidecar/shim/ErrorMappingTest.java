package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.Status;
import io.grpc.StatusException;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteResourceNotFoundException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageManager;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/** Every non-OK status code, for every operation, with a broker that has no RetriableRemoteStorageException (3.6). */
@Timeout(value = 60, unit = TimeUnit.SECONDS)
class ErrorMappingTest {

    @TempDir
    Path dir;

    static Class<? extends RemoteStorageException> expectedType(Status.Code code) {
        return code == Status.Code.NOT_FOUND ? RemoteResourceNotFoundException.class : RemoteStorageException.class;
    }

    static void assertCarriesStatus(RemoteStorageException e, Status status) {
        assertTrue(e.getMessage().contains("sidecar status " + status.getCode() + ": " + status.getDescription()),
                e.getMessage());
        StatusException cause = assertInstanceOf(StatusException.class, e.getCause());
        assertEquals(status.getCode(), cause.getStatus().getCode());
    }

    @ParameterizedTest
    @EnumSource(value = Status.Code.class, mode = EnumSource.Mode.EXCLUDE, names = "OK")
    void everyStatusForEveryOperation(Status.Code code) throws Exception {
        Status status = Status.fromCode(code).withDescription("sidecar says " + code.name().toLowerCase());
        LogSegmentData data = Fixtures.segmentData(dir, 100, 8, 12, 4, null, Fixtures.leaderEpochCheckpoint());
        Map<String, String> config = Fixtures.config(ShimConfig.RETRY_MAX_ATTEMPTS, "1");
        // RetryTest's sidecar, never recovering: every call fails with the status
        RetryTest.FlakySidecar sidecar = new RetryTest.FlakySidecar(Integer.MAX_VALUE, status);
        try (Fixtures.Harness h = new Fixtures.Harness(sidecar, config)) {
            RemoteStorageException e;

            e = assertThrows(RemoteStorageException.class, () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 0));
            assertEquals(expectedType(code), e.getClass(), "fetchLogSegment " + code);
            assertCarriesStatus(e, status);

            e = assertThrows(RemoteStorageException.class, () -> h.rsm.fetchLogSegment(Fixtures.metadata(), 0, 10));
            assertEquals(expectedType(code), e.getClass(), "fetchLogSegment(3) " + code);

            for (RemoteStorageManager.IndexType type : RemoteStorageManager.IndexType.values()) {
                e = assertThrows(RemoteStorageException.class, () -> h.rsm.fetchIndex(Fixtures.metadata(), type));
                assertEquals(expectedType(code), e.getClass(), "fetchIndex " + type + " " + code);
                assertCarriesStatus(e, status);
            }

            e = assertThrows(RemoteStorageException.class, () -> h.rsm.copyLogSegmentData(Fixtures.metadata(), data));
            assertEquals(expectedType(code), e.getClass(), "copyLogSegmentData " + code);
            assertCarriesStatus(e, status);

            if (code == Status.Code.NOT_FOUND) {
                // Delete never throws RemoteResourceNotFoundException: NOT_FOUND means already gone.
                assertDoesNotThrow(() -> h.rsm.deleteLogSegmentData(Fixtures.metadata()));
            } else {
                e = assertThrows(RemoteStorageException.class, () -> h.rsm.deleteLogSegmentData(Fixtures.metadata()));
                assertEquals(RemoteStorageException.class, e.getClass(), "deleteLogSegmentData " + code);
                assertCarriesStatus(e, status);
            }
        }
    }

    @Test
    void thisBrokerApiHasNoRetriableClass() {
        assertEquals(false, ErrorMapper.forBroker().hasRetriableClass(), "kafka-storage-api 3.6 has no "
                + ErrorMapper.RETRIABLE_CLASS + "; if this fails the test class path has a newer Kafka");
    }

    @Test
    void theMapperPutsCodeDescriptionAndCauseInTheMessage() {
        Status s = Status.UNAVAILABLE.withDescription("io exception").withCause(new java.net.ConnectException("refused"));
        RemoteStorageException e = ErrorMapper.forBroker().map("op(x)", s, false);
        assertEquals("op(x) failed: sidecar status UNAVAILABLE: io exception (cause: java.net.ConnectException: refused)",
                e.getMessage());
    }

    /**
     * gRPC's description of a failed connection is two lines ({@code io exception} and {@code
     * Channel Pipeline: [...]}): the message, and so the broker's log line, says it on one.
     */
    @Test
    void aStatusWithLineBreaksIsOneLine() {
        Status s = Status.UNAVAILABLE.withDescription("io exception\nChannel Pipeline: [SslHandler#0, DefaultChannelPipeline"
                + "$TailContext#0]").withCause(new java.io.IOException("Connection reset\r\n  by peer"));
        RemoteStorageException e = ErrorMapper.forBroker().map("op(x)", s, false);
        assertEquals("op(x) failed: sidecar status UNAVAILABLE: io exception; Channel Pipeline: [SslHandler#0, "
                + "DefaultChannelPipeline$TailContext#0] (cause: java.io.IOException: Connection reset; by peer)",
                e.getMessage());
    }
}
