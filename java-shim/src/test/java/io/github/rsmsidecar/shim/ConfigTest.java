package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.stub.StreamObserver;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;

class ConfigTest {

    @TempDir
    Path dir;

    static ConfigException configureFails(Map<String, String> configs) {
        return assertThrows(ConfigException.class, () -> new SidecarRemoteStorageManager().configure(configs));
    }

    @ParameterizedTest
    @CsvSource(delimiter = ';', value = {
        "sidecar.target; ''; must not be empty",
        "sidecar.target; localhost; expected host:port",
        "sidecar.target; localhost:0; between 1 and 65535",
        "sidecar.target; localhost:99999; between 1 and 65535",
        "sidecar.target; localhost:http; not a number",
        "sidecar.target; :9095; the host is empty",
        "sidecar.target; http://localhost:9095; expected host:port or unix",
        "sidecar.target; unix:relative.sock; absolute path",
        "sidecar.target; ::1:9095; [addr]:port",
        "transfer.mode; copy; must be stream or path",
        "copy.deadline.ms; 0; must be > 0",
        "copy.deadline.ms; ten; not an integer",
        "fetch.deadline.ms; -5; must be > 0",
        "fetch.read.timeout.ms; 0; must be > 0",
        "fetch.idle.timeout.ms; -1; must be >= 0",
        "fetch.index.deadline.ms; 1.5; not an integer",
        "delete.deadline.ms; 0; must be > 0",
        "retry.max.attempts; 0; between 1 and 10",
        "retry.max.attempts; 11; between 1 and 10",
        "retry.initial.backoff.ms; -1; must be >= 0",
        "retry.max.backoff.ms; 50; must be >= retry.initial.backoff.ms",
        "tls.enabled; yes; must be true or false",
        "close.timeout.ms; -1; must be >= 0",
        "fetch.window.bytes; 100; must be 0 (off) or between 4096 and 33554432",
        "fetch.window.bytes; 40000000; must be 0 (off) or between 4096 and 33554432",
        "connect.timeout.ms; 0; must be > 0",
        "keepalive.time.ms; 500; must be 0 (off) or between 1000 and 3600000",
        "keepalive.timeout.ms; 0; must be > 0",
        "channel.idle.timeout.ms; 500; must be 0 (never) or at least 1000",
        "channel.idle.timeout.ms; -1; must be >= 0",
    })
    void invalidValuesNameTheKey(String key, String value, String reason) {
        ConfigException e = configureFails(Map.of(key, value));
        assertTrue(e.getMessage().contains("rsm.config." + key), e.getMessage());
        assertTrue(e.getMessage().contains(reason), e.getMessage());
        assertTrue(e.getMessage().contains("'" + value + "'"), e.getMessage());
    }

    @ParameterizedTest
    @CsvSource(delimiter = ';', value = {
        "127.0.0.1:9095; dns:///127.0.0.1:9095",
        "sidecar.local:1; dns:///sidecar.local:1",
        "[::1]:9095; dns:///[::1]:9095",
        "unix:///run/rsm/rsm.sock; unix:///run/rsm/rsm.sock",
        "unix:/run/rsm/rsm.sock; unix:///run/rsm/rsm.sock",
        "unix:///run/my rsm/%rsm#1?.sock; unix:///run/my%20rsm/%25rsm%231%3F.sock",
    })
    void validTargets(String target, String grpcTarget) {
        ShimConfig c = ShimConfig.parse(Map.of(ShimConfig.SIDECAR_TARGET, target));
        assertEquals(grpcTarget, c.grpcTarget());
        assertEquals(target.startsWith("unix:"), c.isUnixSocket());
    }

    @Test
    void rawStringsAreTrimmedAndNonStringsAccepted() {
        Map<String, Object> m = new HashMap<>();
        m.put(ShimConfig.RETRY_MAX_ATTEMPTS, " 5 ");
        m.put(ShimConfig.TRANSFER_MODE, "PATH");
        m.put(ShimConfig.DELETE_DEADLINE_MS, 1234L);
        m.put("broker.id", 7);
        m.put("node.id", 8);
        m.put("sidecar.targte", "typo");
        ShimConfig c = ShimConfig.parse(m);
        assertEquals(5, c.retryMaxAttempts());
        assertEquals(ShimConfig.TransferMode.PATH, c.transferMode());
        assertEquals(1234L, c.deleteDeadlineMs());
        assertEquals("8", c.brokerId(), "node.id wins (Kafka 4.4)");
        assertEquals(List.of("sidecar.targte"), c.unknownKeys());
    }

    @ParameterizedTest
    @ValueSource(strings = {"tls.ca.file", "tls.cert.file", "tls.key.file", "tls.authority.override"})
    void tlsKeysNeedTlsEnabled(String key) throws Exception {
        Path f = Files.writeString(dir.resolve("x.pem"), "-----BEGIN CERTIFICATE-----\n");
        ConfigException e = configureFails(Map.of(key, key.endsWith(".file") ? f.toString() : "sidecar.test"));
        assertTrue(e.getMessage().contains("rsm.config." + key), e.getMessage());
        assertTrue(e.getMessage().contains("tls.enabled=true"), e.getMessage());
    }

    @Test
    void tlsFilesAreChecked() throws Exception {
        Path cert = Files.writeString(dir.resolve("c.pem"), "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
        Path rsaKey = Files.writeString(dir.resolve("k1.pem"), "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n");
        ConfigException e;

        e = configureFails(Map.of("tls.enabled", "true", "tls.ca.file", dir.resolve("missing.pem").toString()));
        assertTrue(e.getMessage().contains("rsm.config.tls.ca.file") && e.getMessage().contains("no such file"),
                e.getMessage());

        e = configureFails(Map.of("tls.enabled", "true", "tls.ca.file", rsaKey.toString()));
        assertTrue(e.getMessage().contains("rsm.config.tls.ca.file") && e.getMessage().contains("BEGIN CERTIFICATE"),
                e.getMessage());

        e = configureFails(Map.of("tls.enabled", "true", "tls.cert.file", cert.toString()));
        assertTrue(e.getMessage().contains("rsm.config.tls.key.file") && e.getMessage().contains("tls.cert.file"),
                e.getMessage());

        e = configureFails(Map.of("tls.enabled", "true", "tls.key.file", rsaKey.toString()));
        assertTrue(e.getMessage().contains("rsm.config.tls.cert.file"), e.getMessage());

        e = configureFails(Map.of("tls.enabled", "true", "tls.cert.file", cert.toString(), "tls.key.file", rsaKey.toString()));
        assertTrue(e.getMessage().contains("rsm.config.tls.key.file") && e.getMessage().contains("PKCS#8"),
                e.getMessage());

        e = configureFails(Map.of("tls.enabled", "true", "tls.authority.override", "bad host/name"));
        assertTrue(e.getMessage().contains("rsm.config.tls.authority.override"), e.getMessage());
    }

    @Test
    void configureDoesNotConnectAndTheChannelIsCreatedOnFirstUse() throws Exception {
        AtomicInteger created = new AtomicInteger();
        String name = InProcessServerBuilder.generateName();
        var server = InProcessServerBuilder.forName(name).addService(new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public void deleteSegment(DeleteSegmentRequest request, StreamObserver<DeleteSegmentResponse> observer) {
                observer.onNext(DeleteSegmentResponse.getDefaultInstance());
                observer.onCompleted();
            }
        }).build().start();
        SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager(c -> {
            created.incrementAndGet();
            return InProcessChannelBuilder.forName(name).build();
        }, null);
        try {
            rsm.configure(Fixtures.config());
            assertEquals(0, created.get(), "configure() must not create the channel");
            rsm.deleteLogSegmentData(Fixtures.metadata());
            rsm.deleteLogSegmentData(Fixtures.metadata());
            assertEquals(1, created.get());
        } finally {
            rsm.close();
            server.shutdownNow();
        }
        assertThrows(RemoteStorageException.class, () -> rsm.deleteLogSegmentData(Fixtures.metadata()),
                "calls after close() fail");
        rsm.close(); // idempotent
    }

    @Test
    void theRealShimConfiguresInstantlyWithNoSidecar() throws Exception {
        SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager();
        long t0 = System.nanoTime();
        rsm.configure(Map.of("sidecar.target", "127.0.0.1:1", "broker.id", "1"));
        assertTrue(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0) < 2000);
        rsm.close();
    }

    @Test
    void callsBeforeConfigureFail() {
        SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager();
        RemoteStorageException e = assertThrows(RemoteStorageException.class,
                () -> rsm.deleteLogSegmentData(Fixtures.metadata()));
        assertTrue(e.getMessage().contains("configure()"), e.getMessage());
    }
}
