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
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
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

    @Test
    void mutualTls() throws Exception {
        TestCerts.Issued authority = TestCerts.ca("CN=rsm test CA").write(dir, "ca");
        TestCerts.server(authority, "CN=sidecar.test", "sidecar.test").write(dir, "server");
        TestCerts.client(authority, "CN=broker-1").write(dir, "client");

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
        TlsServerCredentials creds = mutualTlsServer("ca.pem");
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

    /** Replaces {@code target} with {@code source}'s bytes at once (a rename, as a Secret volume's swap). */
    private void replace(String source, Path target) throws Exception {
        Path tmp = target.resolveSibling(target.getFileName() + ".new");
        Files.copy(dir.resolve(source), tmp, java.nio.file.StandardCopyOption.REPLACE_EXISTING);
        Files.move(tmp, target, java.nio.file.StandardCopyOption.ATOMIC_MOVE);
    }

    /**
     * Certificates renewed in place, with a new CA: the shim's files are rewritten one after the
     * other (a moment where the key is not the certificate's), and the shim uses the new set for
     * new connections while a fetch stream started before goes on to its end.
     */
    @Test
    void renewedTlsFilesAreUsedWithoutFailingCallsInFlight() throws Exception {
        TestCerts.Issued ca1 = TestCerts.ca("CN=rsm test CA 1").write(dir, "ca");
        TestCerts.Issued ca2 = TestCerts.ca("CN=rsm test CA 2").write(dir, "ca2");
        Files.writeString(dir.resolve("both.pem"), Files.readString(dir.resolve("ca.pem"))
                + Files.readString(dir.resolve("ca2.pem")));
        TestCerts.server(ca1, "CN=sidecar.test", "sidecar.test").write(dir, "server");
        TestCerts.client(ca1, "CN=broker-old").write(dir, "client");
        TestCerts.client(ca2, "CN=broker-new").write(dir, "client2");

        List<String> peers = new java.util.concurrent.CopyOnWriteArrayList<>();
        ServerInterceptor whoIsCalling = new ServerInterceptor() {
            @Override
            public <Q, R> ServerCall.Listener<Q> interceptCall(ServerCall<Q, R> call, Metadata headers,
                                                               ServerCallHandler<Q, R> next) {
                try {
                    peers.add(call.getAttributes().get(Grpc.TRANSPORT_ATTR_SSL_SESSION).getPeerPrincipal().getName());
                } catch (Exception e) {
                    peers.add("none: " + e);
                }
                return next.startCall(call, headers);
            }
        };
        // A fetch stream that sends 1 MiB, then waits until released, then sends 1 MiB more.
        java.util.concurrent.CountDownLatch release = new java.util.concurrent.CountDownLatch(1);
        RemoteStorageGrpc.RemoteStorageImplBase slow = new RemoteStorageGrpc.RemoteStorageImplBase() {
            @Override
            public void fetchSegment(FetchSegmentRequest request, StreamObserver<FetchSegmentResponse> observer) {
                observer.onNext(FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(new byte[1 << 20])).build());
                try {
                    release.await(60, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                observer.onNext(FetchSegmentResponse.newBuilder().setData(ByteString.copyFrom(new byte[1 << 20])).build());
                observer.onCompleted();
            }

            @Override
            public void deleteSegment(DeleteSegmentRequest request, StreamObserver<DeleteSegmentResponse> observer) {
                observer.onNext(DeleteSegmentResponse.getDefaultInstance());
                observer.onCompleted();
            }
        };
        TlsServerCredentials creds = mutualTlsServer("both.pem"); // the overlap: both CAs trusted
        Server server = NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0), creds)
                .addService(ServerInterceptors.intercept(slow, whoIsCalling)).build().start();
        // the shim's files, as a Secret volume holds them
        Path ca = dir.resolve("mounted-ca.pem");
        Path cert = dir.resolve("mounted-tls.crt");
        Path key = dir.resolve("mounted-tls.key");
        Files.copy(dir.resolve("ca.pem"), ca);
        Files.copy(dir.resolve("client.pem"), cert);
        Files.copy(dir.resolve("client.key"), key);
        SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager();
        try {
            rsm.configure(Map.of("sidecar.target", "127.0.0.1:" + server.getPort(), "tls.enabled", "true",
                    "tls.ca.file", ca.toString(), "tls.cert.file", cert.toString(), "tls.key.file", key.toString(),
                    "tls.authority.override", "sidecar.test", "tls.reload.interval.ms", "100",
                    "fetch.window.bytes", "0"));
            InputStream inFlight = rsm.fetchLogSegment(Fixtures.metadata(), 0);
            assertEquals(List.of("CN=broker-old"), peers);

            replace("client2.pem", cert); // the certificate first: not the key's, not used yet
            Thread.sleep(400);
            assertEquals(0, rsm.metrics.tlsReloads.sum(), "a certificate without its key is not used");
            replace("client2.key", key);
            replace("both.pem", ca);
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (rsm.metrics.tlsReloads.sum() == 0 && System.nanoTime() < deadline) {
                Thread.sleep(20);
            }
            assertTrue(rsm.metrics.tlsReloads.sum() >= 1, "the renewed files were not loaded");
            rsm.deleteLogSegmentData(Fixtures.metadata()); // a new call: a new connection, the new certificate
            assertEquals("CN=broker-new", peers.get(peers.size() - 1), peers.toString());

            release.countDown(); // the stream started before the renewal ends normally
            try (InputStream in = inFlight) {
                assertEquals(2 << 20, in.readAllBytes().length);
            }
        } finally {
            release.countDown();
            rsm.close();
            server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
        }
    }

    /** A shim configured with {@code config} cannot reach the TLS sidecar: UNAVAILABLE. */
    /**
     * The channel's idle timeout: by default (0) the connection stays open between calls however
     * long the broker reads nothing remote, so the next fetch needs no new connection and no TLS
     * handshake; set, the channel closes the connection after that long without a call and the
     * next call opens a new one.
     */
    @Test
    void idleChannelKeepsItsConnectionUnlessTold() throws Exception {
        TestCerts.Issued authority = TestCerts.ca("CN=rsm test CA").write(dir, "ca");
        TestCerts.server(authority, "CN=sidecar.test", "sidecar.test").write(dir, "server");
        TestCerts.client(authority, "CN=broker-1").write(dir, "client");
        java.util.concurrent.atomic.AtomicInteger opened = new java.util.concurrent.atomic.AtomicInteger();
        java.util.concurrent.atomic.AtomicInteger closed = new java.util.concurrent.atomic.AtomicInteger();
        io.grpc.ServerTransportFilter counter = new io.grpc.ServerTransportFilter() {
            @Override
            public io.grpc.Attributes transportReady(io.grpc.Attributes attributes) {
                opened.incrementAndGet();
                return attributes;
            }

            @Override
            public void transportTerminated(io.grpc.Attributes attributes) {
                closed.incrementAndGet();
            }
        };
        TlsServerCredentials creds = mutualTlsServer("ca.pem");
        Server server = NettyServerBuilder.forAddress(new InetSocketAddress("127.0.0.1", 0), creds)
                .addTransportFilter(counter).addService(new MiniSidecar()).build().start();
        Map<String, String> base = Map.of("sidecar.target", "127.0.0.1:" + server.getPort(), "tls.enabled", "true",
                "tls.ca.file", dir.resolve("ca.pem").toString(), "tls.cert.file", dir.resolve("client.pem").toString(),
                "tls.key.file", dir.resolve("client.key").toString(), "tls.authority.override", "sidecar.test");
        try {
            // the default: past grpc-java's 30-day ceiling, which turns its idle mode (30 min by default) off
            ShimConfig defaults = ShimConfig.parse(base);
            assertEquals(0, defaults.channelIdleTimeoutMs());
            assertTrue(ChannelFactory.idleTimeoutMillis(defaults) >= TimeUnit.DAYS.toMillis(30));
            SidecarRemoteStorageManager rsm = new SidecarRemoteStorageManager();
            try {
                rsm.configure(base);
                rsm.deleteLogSegmentData(Fixtures.metadata());
                Thread.sleep(2500); // longer than the 1 s timeout below needs to close it
                rsm.deleteLogSegmentData(Fixtures.metadata());
                assertEquals(1, opened.get(), "one connection for both calls");
                assertEquals(0, closed.get());
            } finally {
                rsm.close();
            }
            waitFor(() -> closed.get() == 1, "the closed shim's connection to end");

            Map<String, String> idle = new java.util.HashMap<>(base);
            idle.put("channel.idle.timeout.ms", "1000");
            SidecarRemoteStorageManager idling = new SidecarRemoteStorageManager();
            try {
                idling.configure(idle);
                idling.deleteLogSegmentData(Fixtures.metadata());
                assertEquals(2, opened.get());
                waitFor(() -> closed.get() == 2, "the idle channel to close its connection");
                idling.deleteLogSegmentData(Fixtures.metadata()); // a new connection, not an error
                assertEquals(3, opened.get());
            } finally {
                idling.close();
            }
        } finally {
            server.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
        }
    }

    /** The sidecar's side of mutual TLS: server.pem/server.key, clients must present a certificate {@code ca} signed. */
    private TlsServerCredentials mutualTlsServer(String ca) throws Exception {
        return (TlsServerCredentials) TlsServerCredentials.newBuilder()
                .keyManager(dir.resolve("server.pem").toFile(), dir.resolve("server.key").toFile())
                .trustManager(dir.resolve(ca).toFile())
                .clientAuth(TlsServerCredentials.ClientAuth.REQUIRE)
                .build();
    }

    private static void waitFor(java.util.function.BooleanSupplier condition, String what) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!condition.getAsBoolean()) {
            assertTrue(System.nanoTime() < deadline, "waited 10 s for " + what);
            Thread.sleep(20);
        }
    }

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
