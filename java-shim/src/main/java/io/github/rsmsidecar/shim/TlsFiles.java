package io.github.rsmsidecar.shim;

import io.grpc.ChannelCredentials;
import io.grpc.TlsChannelCredentials;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.PrivateKey;
import java.security.Signature;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Arrays;
import java.util.Base64;
import java.util.Collection;
import java.util.List;

/**
 * The bytes of the shim's TLS files ({@code tls.ca.file}, {@code tls.cert.file},
 * {@code tls.key.file}) as read at one moment, and the channel credentials made of exactly those
 * bytes.
 *
 * <p>Certificates are renewed in place (cert-manager rewrites the same Secret; Kubernetes swaps the
 * files of a Secret volume at once through its {@code ..data} symlink; other tools may write one
 * file after the other). The shim reads the files again every {@code tls.reload.interval.ms}; when
 * their bytes changed and form a usable set ({@link #check}: the CA and the certificate parse, the
 * key is the certificate's), new connections use them, while calls in flight finish on the
 * connection they started on. A set caught half-written is not used; the next check reads it again.
 */
final class TlsFiles {

    private final byte[] ca;
    private final byte[] cert;
    private final byte[] key;

    private TlsFiles(byte[] ca, byte[] cert, byte[] key) {
        this.ca = ca;
        this.cert = cert;
        this.key = key;
    }

    /** Reads the configured files (null entries for those not set). */
    static TlsFiles read(ShimConfig c) throws IOException {
        return new TlsFiles(read(c.tlsCaFile(), ShimConfig.TLS_CA_FILE), read(c.tlsCertFile(), ShimConfig.TLS_CERT_FILE),
                read(c.tlsKeyFile(), ShimConfig.TLS_KEY_FILE));
    }

    private static byte[] read(Path p, String key) throws IOException {
        if (p == null) {
            return null;
        }
        try {
            return Files.readAllBytes(p);
        } catch (IOException e) {
            throw new IOException("rsm.config." + key + "=" + p + ": cannot read: " + e, e);
        }
    }

    boolean sameAs(TlsFiles other) {
        return other != null && Arrays.equals(ca, other.ca) && Arrays.equals(cert, other.cert)
                && Arrays.equals(key, other.key);
    }

    /**
     * Checks that the set is usable: the CA file holds certificates, the certificate file a chain,
     * and the key signs what the chain's first certificate verifies (a key and a certificate from
     * two different renewals are refused).
     *
     * @throws IOException naming the file at fault
     */
    TlsFiles check(ShimConfig c) throws IOException {
        if (ca != null) {
            certificates(ca, ShimConfig.TLS_CA_FILE, c.tlsCaFile());
        }
        if (cert != null) {
            List<X509Certificate> chain = certificates(cert, ShimConfig.TLS_CERT_FILE, c.tlsCertFile());
            PrivateKey k = privateKey(key, c.tlsKeyFile());
            if (!signsFor(k, chain.get(0))) {
                throw new IOException("rsm.config." + ShimConfig.TLS_KEY_FILE + "=" + c.tlsKeyFile()
                        + " is not the key of the certificate in rsm.config." + ShimConfig.TLS_CERT_FILE + "="
                        + c.tlsCertFile() + " (" + chain.get(0).getSubjectX500Principal() + ")");
            }
        }
        return this;
    }

    /** Channel credentials of exactly these bytes. */
    ChannelCredentials credentials(ShimConfig c) throws IOException {
        TlsChannelCredentials.Builder tls = TlsChannelCredentials.newBuilder();
        // the JDK's PKIX checks of the sidecar's certificate, which say why they refuse (TlsRefusal)
        tls.trustManager(TlsRefusal.trustManager(c, caCertificates()));
        if (cert != null) {
            try {
                tls.keyManager(new ByteArrayInputStream(cert), new ByteArrayInputStream(key));
            } catch (IOException | RuntimeException e) {
                throw new IOException("rsm.config." + ShimConfig.TLS_CERT_FILE + "=" + c.tlsCertFile()
                        + " / rsm.config." + ShimConfig.TLS_KEY_FILE + "=" + c.tlsKeyFile()
                        + ": cannot load the client certificate and key: " + e.getMessage(), e);
            }
        }
        return tls.build();
    }

    /**
     * A TLS context of exactly these bytes for the sidecar's fetch channel: BoringSSL through
     * netty-tcnative where it loads (as gRPC's channel uses), else the JDK's provider. It offers
     * the ALPN protocols {@code rsm-fetch/1} and {@code h2}: a sidecar with the fetch channel
     * chooses the first, an older one (gRPC's own TLS) the second, which tells the shim to fetch
     * over gRPC, where offering the first alone would make it refuse the handshake. Each
     * connection takes a new engine of it ({@link #newEngine}).
     */
    io.grpc.netty.shaded.io.netty.handler.ssl.SslContext fetchChannelContext(ShimConfig c) throws IOException {
        io.grpc.netty.shaded.io.netty.handler.ssl.SslContextBuilder b =
                io.grpc.netty.shaded.io.netty.handler.ssl.SslContextBuilder.forClient()
                        .sslProvider(io.grpc.netty.shaded.io.netty.handler.ssl.OpenSsl.isAvailable()
                                ? io.grpc.netty.shaded.io.netty.handler.ssl.SslProvider.OPENSSL
                                : io.grpc.netty.shaded.io.netty.handler.ssl.SslProvider.JDK)
                        .applicationProtocolConfig(new io.grpc.netty.shaded.io.netty.handler.ssl.ApplicationProtocolConfig(
                                io.grpc.netty.shaded.io.netty.handler.ssl.ApplicationProtocolConfig.Protocol.ALPN,
                                io.grpc.netty.shaded.io.netty.handler.ssl.ApplicationProtocolConfig
                                        .SelectorFailureBehavior.NO_ADVERTISE,
                                io.grpc.netty.shaded.io.netty.handler.ssl.ApplicationProtocolConfig
                                        .SelectedListenerFailureBehavior.ACCEPT,
                                "rsm-fetch/1", "h2"));
        try {
            // the trust manager gRPC's channel uses: a certificate refused says why (TlsRefusal)
            b.trustManager(TlsRefusal.trustManager(c, caCertificates()));
            if (cert != null) {
                b.keyManager(new ByteArrayInputStream(cert), new ByteArrayInputStream(key));
            }
            return b.build();
        } catch (IOException | RuntimeException e) {
            throw new IOException("the fetch channel's TLS context from rsm.config." + ShimConfig.TLS_CA_FILE + ", "
                    + ShimConfig.TLS_CERT_FILE + " and " + ShimConfig.TLS_KEY_FILE + ": " + e.getMessage(), e);
        }
    }

    /** The CA certificates of {@code tls.ca.file}, or null when it is not set (the JDK's default trust store). */
    List<X509Certificate> caCertificates() {
        return ca == null ? null : parsed(ca);
    }

    /** The client certificate chain of {@code tls.cert.file} (empty when it is not set or does not parse). */
    List<X509Certificate> clientChain() {
        List<X509Certificate> chain = cert == null ? null : parsed(cert);
        return chain == null ? List.of() : chain;
    }

    /** The private key of {@code tls.key.file}. */
    PrivateKey clientKey(ShimConfig c) throws IOException {
        return privateKey(key, c.tlsKeyFile());
    }

    private static List<X509Certificate> parsed(byte[] pem) {
        try {
            return CertificateFactory.getInstance("X.509").generateCertificates(new ByteArrayInputStream(pem))
                    .stream().map(X509Certificate.class::cast).toList();
        } catch (GeneralSecurityException e) {
            return null; // check() refused such files before they were used
        }
    }

    /**
     * A client engine of {@code context} for the sidecar at {@code host} (checked against its
     * certificate, as gRPC checks it: {@code tls.authority.override} when set).
     */
    static javax.net.ssl.SSLEngine newEngine(io.grpc.netty.shaded.io.netty.handler.ssl.SslContext context,
                                            String host, int port) {
        javax.net.ssl.SSLEngine engine = context.newEngine(
                io.grpc.netty.shaded.io.netty.buffer.ByteBufAllocator.DEFAULT, host, port);
        javax.net.ssl.SSLParameters p = engine.getSSLParameters();
        p.setEndpointIdentificationAlgorithm("HTTPS");
        engine.setSSLParameters(p);
        return engine;
    }

    /**
     * Why the client certificate is not valid now (expired, or not yet valid: the sidecar will
     * refuse it), for a WARN line before the first refused call says it; null when it is valid.
     */
    String notValidNow(ShimConfig c) {
        List<X509Certificate> chain = clientChain();
        String dates = chain.isEmpty() ? null : TlsRefusal.validity(chain.get(0), "it");
        return dates == null ? null : "rsm.config." + ShimConfig.TLS_CERT_FILE + "=" + c.tlsCertFile() + " ("
                + TlsRefusal.subject(chain.get(0)) + "): " + dates + "; the sidecar will refuse it";
    }

    /** The subject of the certificate (for logs), or "none". */
    String subject() {
        if (cert == null) {
            return "none";
        }
        try {
            X509Certificate x = (X509Certificate) CertificateFactory.getInstance("X.509")
                    .generateCertificate(new ByteArrayInputStream(cert));
            return x.getSubjectX500Principal() + " (serial " + x.getSerialNumber().toString(16) + ")";
        } catch (GeneralSecurityException e) {
            return "unreadable";
        }
    }

    private static List<X509Certificate> certificates(byte[] pem, String key, Path file) throws IOException {
        try {
            Collection<? extends Certificate> all = CertificateFactory.getInstance("X.509")
                    .generateCertificates(new ByteArrayInputStream(pem));
            if (all.isEmpty()) {
                throw new IOException("rsm.config." + key + "=" + file + " holds no certificate");
            }
            return all.stream().map(X509Certificate.class::cast).toList();
        } catch (GeneralSecurityException e) {
            throw new IOException("rsm.config." + key + "=" + file + ": not a PEM certificate file: " + e.getMessage(), e);
        }
    }

    private static PrivateKey privateKey(byte[] pem, Path file) throws IOException {
        String text = new String(pem, StandardCharsets.US_ASCII);
        int begin = text.indexOf("-----BEGIN PRIVATE KEY-----");
        int end = text.indexOf("-----END PRIVATE KEY-----");
        if (begin < 0 || end < begin) {
            throw new IOException("rsm.config." + ShimConfig.TLS_KEY_FILE + "=" + file
                    + " holds no -----BEGIN PRIVATE KEY----- block (PKCS#8)");
        }
        byte[] der = Base64.getMimeDecoder().decode(text.substring(begin + 27, end));
        for (String algorithm : List.of("EC", "RSA", "Ed25519", "Ed448", "RSASSA-PSS")) {
            try {
                return KeyFactory.getInstance(algorithm).generatePrivate(new PKCS8EncodedKeySpec(der));
            } catch (GeneralSecurityException e) {
                // not this algorithm
            }
        }
        throw new IOException("rsm.config." + ShimConfig.TLS_KEY_FILE + "=" + file
                + ": not an EC, RSA or EdDSA PKCS#8 private key");
    }

    private static boolean signsFor(PrivateKey key, X509Certificate cert) throws IOException {
        String algorithm = switch (key.getAlgorithm()) {
            case "EC" -> "SHA256withECDSA";
            case "RSA" -> "SHA256withRSA";
            case "RSASSA-PSS" -> "RSASSA-PSS";
            default -> key.getAlgorithm(); // Ed25519, Ed448
        };
        byte[] probe = "rsm-sidecar shim TLS key check".getBytes(StandardCharsets.US_ASCII);
        try {
            Signature s = Signature.getInstance(algorithm);
            if (algorithm.equals("RSASSA-PSS")) {
                s.setParameter(new java.security.spec.PSSParameterSpec("SHA-256", "MGF1",
                        java.security.spec.MGF1ParameterSpec.SHA256, 32, 1));
            }
            s.initSign(key);
            s.update(probe);
            byte[] signature = s.sign();
            Signature v = Signature.getInstance(algorithm);
            if (algorithm.equals("RSASSA-PSS")) {
                v.setParameter(new java.security.spec.PSSParameterSpec("SHA-256", "MGF1",
                        java.security.spec.MGF1ParameterSpec.SHA256, 32, 1));
            }
            v.initVerify(cert.getPublicKey());
            v.update(probe);
            return v.verify(signature);
        } catch (GeneralSecurityException e) {
            return false; // e.g. an EC key against an RSA certificate
        }
    }
}
