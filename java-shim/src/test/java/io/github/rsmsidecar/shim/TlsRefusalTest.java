package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.grpc.Server;
import io.grpc.TlsServerCredentials;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.X509Certificate;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManager;
import javax.net.ssl.X509TrustManager;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * Each way TLS between the shim and a sidecar can refuse, over real TLS on loopback: the shim's
 * exception (what the broker logs) and its connectivity check ({@link Diagnose}) each say in one
 * line who refused what and the file or setting to fix, and a TLS refusal is not retried. The
 * sidecar here is grpc-java's netty server, which tells the client why with an alert; how the
 * real sidecar (gRPC core, which closes the connection without one) is told apart is
 * {@link #aSidecarThatClosesWithoutAWordIsProbed} here and tests/e2e/test_tls_refusals.py with the
 * real one.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class TlsRefusalTest {

    @TempDir
    Path dir;

    private TestCerts.Issued ca;
    private TestCerts.Issued other;
    private final List<Server> servers = new ArrayList<>();

    @BeforeEach
    void certificates() throws Exception {
        ca = TestCerts.ca("CN=rsm test CA").write(dir, "ca");
        other = TestCerts.ca("CN=other CA").write(dir, "other-ca");
        TestCerts.server(ca, "CN=sidecar.test", "sidecar.test").write(dir, "server");
        TestCerts.client(ca, "CN=broker-1").write(dir, "client");
    }

    @AfterEach
    void stop() throws Exception {
        for (Server s : servers) {
            s.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
        }
    }

    /** A sidecar with {@code <cert>.pem}/{@code .key}, requiring clients that {@code clientCa} issued; its target. */
    private String sidecar(String cert, String clientCa) throws Exception {
        TlsServerCredentials creds = (TlsServerCredentials) TlsServerCredentials.newBuilder()
                .keyManager(dir.resolve(cert + ".pem").toFile(), dir.resolve(cert + ".key").toFile())
                .trustManager(dir.resolve(clientCa + ".pem").toFile())
                .clientAuth(TlsServerCredentials.ClientAuth.REQUIRE)
                .build();
        Server server = NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0), creds)
                .addService(new NettyTransportTest.MiniSidecar()).build().start();
        servers.add(server);
        return "127.0.0.1:" + server.getPort();
    }

    /** The shim's settings: the CA file, {@code client} as its certificate (null: none), sidecar.test. */
    private Map<String, String> shim(String target, String client) {
        Map<String, String> c = new LinkedHashMap<>();
        c.put("sidecar.target", target);
        c.put("tls.enabled", "true");
        c.put("tls.ca.file", file("ca.pem"));
        if (client != null) {
            c.put("tls.cert.file", file(client + ".pem"));
            c.put("tls.key.file", file(client + ".key"));
        }
        c.put("tls.authority.override", "sidecar.test");
        return c;
    }

    private String file(String name) {
        return dir.resolve(name).toString();
    }

    /**
     * A remote read fails at once (no retry of a TLS refusal, though reads wait for a sidecar that
     * is away) with {@code reason} in its message, and the connectivity check prints it.
     */
    private void assertRefused(Map<String, String> shim, String reason) throws Exception {
        assertTrue(reason.startsWith(TlsRefusal.PREFIX), reason);
        Map<String, String> config = new LinkedHashMap<>(shim);
        config.put("broker.id", "1");
        config.put("retry.fetch.max.ms", "10000");
        SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager();
        rsm.configure(config);
        try {
            long t0 = System.nanoTime();
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> rsm.fetchLogSegment(Fixtures.metadata(), 0));
            long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
            assertEquals("fetchLogSegment(" + MetadataMapper.describe(Fixtures.metadata()).replaceAll("segment \\S+",
                    "segment X") + ", start=0) failed: sidecar status UNAVAILABLE: " + reason,
                    e.getMessage().replaceAll("segment \\S+", "segment X"));
            assertTrue(ms < 8000, "a TLS refusal is not retried: failed after " + ms + " ms");
        } finally {
            rsm.close();
        }
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        int exit = Diagnose.run(diagnoseArgs(shim), new PrintStream(out, true, StandardCharsets.UTF_8),
                new PrintStream(err, true, StandardCharsets.UTF_8));
        assertEquals("FetchIndex to the sidecar at " + shim.get("sidecar.target") + " ended with UNAVAILABLE: "
                + reason + "\n", out.toString(StandardCharsets.UTF_8), err.toString(StandardCharsets.UTF_8));
        assertEquals(2, exit);
    }

    /** The reason when the sidecar at {@code target} refused {@code <client>.pem} (CN=broker-1, by {@code issuer}). */
    private String clientRefused(String target, String client, String issuer, String how, String why) {
        return "TLS refused: the sidecar at " + target + " refused the shim's client certificate "
                + "rsm.config.tls.cert.file=" + file(client + ".pem") + " (CN=broker-1, issued by " + issuer + ") (" + how
                + "): " + why;
    }

    /** The connectivity check's arguments for the shim's settings {@code config}: the target, then key=value. */
    private static String[] diagnoseArgs(Map<String, String> config) {
        List<String> args = new ArrayList<>(List.of(config.get("sidecar.target")));
        config.forEach((k, v) -> {
            if (!k.equals("sidecar.target")) {
                args.add(k + "=" + v);
            }
        });
        return args.toArray(new String[0]);
    }

    private static String instant(java.util.Date d) {
        return d.toInstant().truncatedTo(ChronoUnit.SECONDS).toString();
    }

    // ---- the shim does not trust the sidecar -------------------------------------------------

    @Test
    void theSidecarsCertificateFromAnotherCa() throws Exception {
        TestCerts.server(other, "CN=sidecar.test", "sidecar.test").write(dir, "server-other");
        assertRefused(shim(sidecar("server-other", "ca"), "client"),
                "TLS refused: the shim refused the sidecar's certificate (CN=sidecar.test, issued by CN=other CA): "
                        + "no CA it trusts issued it; rsm.config.tls.ca.file=" + file("ca.pem") + " holds CN=rsm test CA: "
                        + "add the CA that issued the sidecar's certificate");
    }

    @Test
    void theSidecarsCertificateExpired() throws Exception {
        X509Certificate cert = TestCerts.expired(ca, "CN=sidecar.test", "sidecar.test").write(dir, "server-expired").cert();
        assertRefused(shim(sidecar("server-expired", "ca"), "client"),
                "TLS refused: the shim refused the sidecar's certificate (CN=sidecar.test, issued by CN=rsm test CA): "
                        + "it expired at " + instant(cert.getNotAfter()) + ": renew the sidecar's certificate "
                        + "(its server.tls.cert_file)");
    }

    @Test
    void theSidecarsCertificateIsNotValidYet() throws Exception {
        X509Certificate cert = TestCerts.notYetValid(ca, "CN=sidecar.test", "sidecar.test").write(dir, "server-early")
                .cert();
        assertRefused(shim(sidecar("server-early", "ca"), "client"),
                "TLS refused: the shim refused the sidecar's certificate (CN=sidecar.test, issued by CN=rsm test CA): "
                        + "it is not valid before " + instant(cert.getNotBefore()) + " (or the clock of this host is "
                        + "behind): reissue the sidecar's certificate (its server.tls.cert_file)");
    }

    @Test
    void theSidecarsCertificateIsForAnotherName() throws Exception {
        TestCerts.server(ca, "CN=other.test", "other.test", "10.0.0.9").write(dir, "server-other-name");
        assertRefused(shim(sidecar("server-other-name", "ca"), "client"),
                "TLS refused: the shim refused the sidecar's certificate (CN=other.test, issued by CN=rsm test CA): "
                        + "it is for DNS:other.test, IP:10.0.0.9, not for 'sidecar.test', the name the shim checks "
                        + "(rsm.config.tls.authority.override, or the host of rsm.config.sidecar.target when it is not "
                        + "set): set rsm.config.tls.authority.override to one of its names, or reissue it for that name");
    }

    // ---- the sidecar does not accept the shim's client certificate ----------------------------

    @Test
    void noClientCertificate() throws Exception {
        String target = sidecar("server", "ca");
        assertRefused(shim(target, null), "TLS refused: the sidecar at " + target + " requires a client certificate "
                + "and the shim has none (alert certificate_required): set rsm.config.tls.cert.file and "
                + "rsm.config.tls.key.file");
    }

    @Test
    void aClientCertificateFromAnotherCa() throws Exception {
        TestCerts.client(other, "CN=broker-1").write(dir, "client-other");
        String target = sidecar("server", "ca");
        assertRefused(shim(target, "client-other"), clientRefused(target, "client-other", "CN=other CA",
                "it asked for a certificate from another CA: alert certificate_required",
                "the sidecar's server.tls.client_ca_file must hold the CA that issued it"));
    }

    @Test
    void anExpiredClientCertificate() throws Exception {
        X509Certificate cert = TestCerts.expired(ca, "CN=broker-1").write(dir, "client-expired").cert();
        String target = sidecar("server", "ca");
        assertRefused(shim(target, "client-expired"), clientRefused(target, "client-expired", "CN=rsm test CA",
                "alert certificate_expired", "it expired at " + instant(cert.getNotAfter())
                        + ": renew rsm.config.tls.cert.file and rsm.config.tls.key.file"));
    }

    @Test
    void aClientCertificateNotValidYet() throws Exception {
        X509Certificate cert = TestCerts.notYetValid(ca, "CN=broker-1").write(dir, "client-early").cert();
        String target = sidecar("server", "ca");
        assertRefused(shim(target, "client-early"), clientRefused(target, "client-early", "CN=rsm test CA",
                "alert certificate_expired", "it is not valid before " + instant(cert.getNotBefore())
                        + " (or the clock of this host is behind): reissue rsm.config.tls.cert.file and "
                        + "rsm.config.tls.key.file"));
    }

    /** A key that is not its certificate's is refused before any connection, naming both files. */
    @Test
    void aKeyThatIsNotTheCertificates() throws Exception {
        TestCerts.client(ca, "CN=broker-2").write(dir, "client-2");
        Map<String, String> config = shim(sidecar("server", "ca"), "client");
        config.put("tls.key.file", file("client-2.key"));
        String reason = "rsm.config.tls.key.file=" + file("client-2.key") + " is not the key of the certificate in "
                + "rsm.config.tls.cert.file=" + file("client.pem") + " (CN=broker-1)";
        SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager();
        ConfigException e = assertThrows(ConfigException.class, () -> rsm.configure(config));
        assertEquals(reason, e.getMessage());
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        assertEquals(64, Diagnose.run(diagnoseArgs(config), new PrintStream(out, true, StandardCharsets.UTF_8),
                new PrintStream(err, true, StandardCharsets.UTF_8)));
        assertEquals(reason + "\n", err.toString(StandardCharsets.UTF_8));
    }

    /**
     * The real sidecar (gRPC core) refuses a client certificate by closing the connection after
     * the handshake, without an alert, so the failed call reads like a crashed sidecar
     * ({@code Network closed for unknown reason}). This stand-in does the same (a JDK TLS server
     * that completes the handshake and closes the socket: gRPC core's behaviour, which netty's
     * server does not have); the shim's probe tells it apart.
     */
    @Test
    void aSidecarThatClosesWithoutAWordIsProbed() throws Exception {
        TestCerts.client(other, "CN=broker-1").write(dir, "client-other");
        KeyStore ks = KeyStore.getInstance("PKCS12");
        ks.load(null, null);
        TestCerts.Issued server = TestCerts.server(ca, "CN=sidecar.test", "sidecar.test");
        ks.setKeyEntry("server", server.keys().getPrivate(), new char[0], new X509Certificate[] {server.cert()});
        KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        kmf.init(ks, new char[0]);
        TrustManager anyClient = new X509TrustManager() {
            public void checkClientTrusted(X509Certificate[] chain, String authType) {
            }

            public void checkServerTrusted(X509Certificate[] chain, String authType) {
            }

            public X509Certificate[] getAcceptedIssuers() {
                return new X509Certificate[0];
            }
        };
        SSLContext tls = SSLContext.getInstance("TLSv1.3");
        tls.init(kmf.getKeyManagers(), new TrustManager[] {anyClient}, null);
        try (ServerSocket listener = new ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress())) {
            Thread acceptor = new Thread(() -> {
                while (!listener.isClosed()) {
                    try {
                        Socket raw = listener.accept();
                        SSLSocket s = (SSLSocket) tls.getSocketFactory().createSocket(raw, null, raw.getPort(), false);
                        s.setUseClientMode(false);
                        s.setWantClientAuth(true);
                        javax.net.ssl.SSLParameters p = s.getSSLParameters();
                        p.setApplicationProtocols(new String[] {"h2"});
                        s.setSSLParameters(p);
                        try {
                            s.startHandshake();
                        } catch (java.io.IOException e) {
                            // the client gave up
                        }
                        raw.close(); // no alert, no close_notify: as gRPC core refuses
                    } catch (java.io.IOException e) {
                        // closed
                    }
                }
            }, "closing-sidecar");
            acceptor.setDaemon(true);
            acceptor.start();
            String target = "127.0.0.1:" + listener.getLocalPort();
            assertRefused(shim(target, "client-other"), clientRefused(target, "client-other", "CN=other CA",
                    "it closed the connection right after the TLS handshake",
                    "the sidecar's server.tls.client_ca_file must hold the CA that issued it"));
        }
    }

    /** A sidecar that serves without TLS (no server.tls.cert_file) while the shim speaks TLS. */
    @Test
    void aSidecarWithoutTls() throws Exception {
        Server server = NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0),
                        io.grpc.InsecureServerCredentials.create())
                .addService(new NettyTransportTest.MiniSidecar()).build().start();
        servers.add(server);
        String target = "127.0.0.1:" + server.getPort();
        assertRefused(shim(target, "client"), "TLS refused: the sidecar at " + target + " does not answer in TLS "
                + "(Unsupported or unrecognized SSL message): it serves without TLS (no server.tls.cert_file), or "
                + "rsm.config.tls.enabled should be false");
    }

    /**
     * A connection closed before the TLS handshake ends, without an alert, is how a sidecar that
     * is stopping or starting behaves (the socket of a killed one going away): not a refusal.
     */
    @Test
    void aConnectionClosedDuringTheHandshakeIsNotARefusal() throws Exception {
        try (ServerSocket listener = new ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress())) {
            Thread closer = new Thread(() -> {
                while (!listener.isClosed()) {
                    try {
                        listener.accept().close();
                    } catch (java.io.IOException e) {
                        // closed
                    }
                }
            }, "closing-at-once");
            closer.setDaemon(true);
            closer.start();
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            assertEquals(2, Diagnose.run(diagnoseArgs(shim("127.0.0.1:" + listener.getLocalPort(), "client")),
                    new PrintStream(out, true, StandardCharsets.UTF_8), System.err));
            String line = out.toString(StandardCharsets.UTF_8);
            assertTrue(line.contains(" ended with UNAVAILABLE: "), line);
            assertFalse(line.contains("TLS refused"), line);
        }
    }

    /** A sidecar that is down is not a TLS matter: the status says so, and nothing says TLS. */
    @Test
    void aSidecarThatIsNotThereIsNotATlsRefusal() throws Exception {
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort();
        }
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        Map<String, String> config = shim("127.0.0.1:" + port, "client");
        assertEquals(2, Diagnose.run(diagnoseArgs(config), new PrintStream(out, true, StandardCharsets.UTF_8),
                System.err));
        String line = out.toString(StandardCharsets.UTF_8);
        assertTrue(line.startsWith("FetchIndex to the sidecar at 127.0.0.1:" + port + " ended with UNAVAILABLE: "), line);
        assertFalse(line.contains("TLS refused"), line);
        assertEquals(1, line.split("\n").length, "one line: " + line);
    }

    /** The files the shim trusts and presents are the sidecar's match: no refusal, and the read works. */
    @Test
    void matchingFilesAreNotRefused() throws Exception {
        Map<String, String> config = shim(sidecar("server", "ca"), "client");
        config.put("broker.id", "1");
        SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager();
        rsm.configure(config);
        try {
            rsm.deleteLogSegmentData(Fixtures.metadata());
        } finally {
            rsm.close();
        }
    }
}
