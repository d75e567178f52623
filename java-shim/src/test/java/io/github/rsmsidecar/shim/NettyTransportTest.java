package io.github.rsmsidecar.shim;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import io.github.rsmsidecar.proto.v1.CopySegmentRequest;
import io.github.rsmsidecar.proto.v1.CopySegmentResponse;
import io.github.rsmsidecar.proto.v1.DeleteSegmentRequest;
import io.github.rsmsidecar.proto.v1.DeleteSegmentResponse;
import io.github.rsmsidecar.proto.v1.FetchSegmentRequest;
import io.github.rsmsidecar.proto.v1.FetchSegmentResponse;
import io.github.rsmsidecar.proto.v1.RemoteStorageGrpc;
import io.grpc.Grpc;
import io.grpc.InsecureServerCredentials;
import io.grpc.Metadata;
import io.grpc.Server;
import io.grpc.ServerCall;
import io.grpc.ServerCallHandler;
import io.grpc.ServerInterceptor;
import io.grpc.ServerInterceptors;
import io.grpc.TlsServerCredentials;
import io.grpc.netty.shaded.io.grpc.netty.NettyServerBuilder;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import io.grpc.netty.shaded.io.netty.channel.MultiThreadIoEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollIoHandler;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollServerDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import io.grpc.stub.StreamObserver;
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import javax.net.ssl.SSLSession;
import org.apache.kafka.server.log.remote.storage.LogSegmentData;
import org.apache.kafka.server.log.remote.storage.RemoteStorageException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/** The production channel (grpc-netty-shaded) over a Unix domain socket and over TCP with mutual TLS. */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
class NettyTransportTest {

    @TempDir
    Path dir;

    /** Stores one copied log file; serves it back; deletes. */
    static final class MiniSidecar extends RemoteStorageGrpc.RemoteStorageImplBase {
        final ByteArrayOutputStream log = new ByteArrayOutputStream();

        @Override
        public StreamObserver<CopySegmentRequest> copySegment(StreamObserver<CopySegmentResponse> observer) {
            return new StreamObserver<>() {
                public void onNext(CopySegmentRequest v) {
                    if (v.hasData() && v.getData().getFile() == io.github.rsmsidecar.proto.v1.FileKind.LOG) {
                        synchronized (log) {
                            log.writeBytes(v.getData().getData().toByteArray());
                        }
                    }
                }

                public void onError(Throwable t) {
                }

                public void onCompleted() {
                    observer.onNext(CopySegmentResponse.newBuilder().setStoredBytes(log.size()).build());
                    observer.onCompleted();
                }
            };
        }

        @Override
        public void fetchSegment(FetchSegmentRequest request, StreamObserver<FetchSegmentResponse> observer) {
            byte[] all;
            synchronized (log) {
                all = log.toByteArray();
            }
            for (int off = request.getStartPosition(); off < all.length; off += 1 << 20) {
                observer.onNext(FetchSegmentResponse.newBuilder()
                        .setData(ByteString.copyFrom(all, off, Math.min(1 << 20, all.length - off))).build());
            }
            observer.onCompleted();
        }

        @Override
        public void deleteSegment(DeleteSegmentRequest request, StreamObserver<DeleteSegmentResponse> observer) {
            observer.onNext(DeleteSegmentResponse.getDefaultInstance());
            observer.onCompleted();
        }
    }

    @Test
    void unixDomainSocket() throws Exception {
        assertTrue(Epoll.isAvailable(), "epoll is needed for Unix sockets: " + Epoll.unavailabilityCause());
        // characters a URI may not hold unencoded: the shim encodes them, gRPC decodes them
        Path socket = Files.createDirectories(dir.resolve("run dir %#")).resolve("rsm?.sock");
        EventLoopGroup group = new MultiThreadIoEventLoopGroup(1, EpollIoHandler.newFactory());
        MiniSidecar sidecar = new MiniSidecar();
        Server server = NettyServerBuilder.forAddress(new DomainSocketAddress(socket.toString()),
                        InsecureServerCredentials.create())
                .channelType(EpollServerDomainSocketChannel.class)
                .bossEventLoopGroup(group).workerEventLoopGroup(group)
                .addService(sidecar).build().start();
        SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager();
        try {
            rsm.configure(Map.of("sidecar.target", "unix://" + socket, "broker.id", "1"));
            LogSegmentData data = Fixtures.segmentData(dir, 3 * (1 << 20) + 5, 10, 10, 10, null,
                    Fixtures.leaderEpochCheckpoint());
            rsm.copyLogSegmentData(Fixtures.metadata(), data);
            try (InputStream in = rsm.fetchLogSegment(Fixtures.metadata(), 0)) {
                assertArrayEquals(Files.readAllBytes(data.logSegment()), in.readAllBytes());
            }
            rsm.deleteLogSegmentData(Fixtures.metadata());
        } finally {
            rsm.close();
            server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
            group.shutdownGracefully(0, 1, TimeUnit.SECONDS).await(5, TimeUnit.SECONDS);
        }
    }

    // ---- TLS ---------------------------------------------------------------------------------

    private void keytool(String... args) throws Exception {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "keytool").toString());
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).directory(dir.toFile()).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertEquals(0, p.waitFor(), "keytool " + String.join(" ", args) + "\n" + out);
    }

    /** A key pair in {@code name}.p12, its private key as PKCS#8 PEM in {@code name}.key. */
    private void keyPair(String name, String dn, String... ext) throws Exception {
        List<String> args = new ArrayList<>(List.of("-genkeypair", "-keystore", name + ".p12", "-storetype", "PKCS12",
                "-storepass", "changeit", "-alias", name, "-dname", dn, "-keyalg", "EC", "-groupname", "secp256r1",
                "-validity", "2"));
        for (String e : ext) {
            args.add("-ext");
            args.add(e);
        }
        keytool(args.toArray(new String[0]));
        KeyStore ks = KeyStore.getInstance("PKCS12");
        try (InputStream in = Files.newInputStream(dir.resolve(name + ".p12"))) {
            ks.load(in, "changeit".toCharArray());
        }
        PrivateKey key = (PrivateKey) ks.getKey(name, "changeit".toCharArray());
        Files.writeString(dir.resolve(name + ".key"), "-----BEGIN PRIVATE KEY-----\n"
                + Base64.getMimeEncoder(64, new byte[] {'\n'}).encodeToString(key.getEncoded())
                + "\n-----END PRIVATE KEY-----\n");
    }

    /** Certificate of {@code name} signed by the CA, as PEM in {@code name}.pem. */
    private void signed(String name, String... ext) throws Exception {
        keytool("-certreq", "-keystore", name + ".p12", "-storepass", "changeit", "-alias", name, "-file", name + ".csr");
        List<String> args = new ArrayList<>(List.of("-gencert", "-keystore", "ca.p12", "-storepass", "changeit",
                "-alias", "ca", "-infile", name + ".csr", "-outfile", name + ".pem", "-rfc", "-validity", "2"));
        for (String e : ext) {
            args.add("-ext");
            args.add(e);
        }
        keytool(args.toArray(new String[0]));
    }

    @Test
    void mutualTls() throws Exception {
        keyPair("ca", "CN=rsm test CA", "bc:c");
        keytool("-exportcert", "-rfc", "-keystore", "ca.p12", "-storepass", "changeit", "-alias", "ca", "-file", "ca.pem");
        keyPair("server", "CN=sidecar.test");
        signed("server", "SAN=dns:sidecar.test");
        keyPair("client", "CN=broker-1");
        signed("client");

        AtomicReference<String> peer = new AtomicReference<>();
        ServerInterceptor whoIsCalling = new ServerInterceptor() {
            @Override
            public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
                                                               ServerCallHandler<Q, R> next) {
                SSLSession session = call.getAttributes().get(Grpc.TRANSPORT_ATTR_SSL_SESSION);
                try {
                    peer.set(session.getPeerPrincipal().getName());
                } catch (Exception e) {
                    peer.set("none: " + e);
                }
                return next.startCall(call, headers);
            }
        };
        TlsServerCredentials creds = (TlsServerCredentials) TlsServerCredentials.newBuilder()
                .keyManager(dir.resolve("server.pem").toFile(), dir.resolve("server.key").toFile())
                .trustManager(dir.resolve("ca.pem").toFile())
                .clientAuth(TlsServerCredentials.ClientAuth.REQUIRE)
                .build();
        Server server = NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0), creds)
                .addService(ServerInterceptors.intercept(new MiniSidecar(), whoIsCalling)).build().start();
        String target = "127.0.0.1:" + server.getPort();
        String ca = dir.resolve("ca.pem").toString();
        try {
            SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager();
            rsm.configure(Map.of("sidecar.target", target, "tls.enabled", "true", "tls.ca.file", ca,
                    "tls.cert.file", dir.resolve("client.pem").toString(),
                    "tls.key.file", dir.resolve("client.key").toString(),
                    "tls.authority.override", "sidecar.test"));
            try {
                rsm.deleteLogSegmentData(Fixtures.metadata());
                assertEquals("CN=broker-1", peer.get());
            } finally {
                rsm.close();
            }

            // The server requires a client certificate.
            assertRefused(Map.of("sidecar.target", target, "tls.enabled", "true", "tls.ca.file", ca,
                    "tls.authority.override", "sidecar.test", "retry.max.attempts", "1"));
            // The certificate is for sidecar.test, not 127.0.0.1.
            assertRefused(Map.of("sidecar.target", target, "tls.enabled", "true", "tls.ca.file", ca,
                    "tls.cert.file", dir.resolve("client.pem").toString(),
                    "tls.key.file", dir.resolve("client.key").toString(), "retry.max.attempts", "1"));
        } finally {
            server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
        }
    }

    /** A shim configured with {@code config} cannot reach the TLS sidecar: UNAVAILABLE. */
    private static void assertRefused(Map<String, String> config) throws Exception {
        SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager();
        rsm.configure(config);
        try {
            RemoteStorageException e = assertThrows(RemoteStorageException.class,
                    () -> rsm.deleteLogSegmentData(Fixtures.metadata()));
            assertTrue(e.getMessage().contains("UNAVAILABLE"), e.getMessage());
        } finally {
            rsm.close();
        }
    }
}
