package io.github.rsmsidecar.shim;

import java.math.BigInteger;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.PrivateKey;
import java.security.cert.X509Certificate;
import java.security.spec.ECGenParameterSpec;
import java.util.Base64;
import java.util.Date;
import java.util.concurrent.atomic.AtomicLong;
import org.bouncycastle.asn1.x500.X500Name;
import org.bouncycastle.asn1.x509.BasicConstraints;
import org.bouncycastle.asn1.x509.Extension;
import org.bouncycastle.asn1.x509.GeneralName;
import org.bouncycastle.asn1.x509.GeneralNames;
import org.bouncycastle.cert.jcajce.JcaX509CertificateConverter;
import org.bouncycastle.cert.jcajce.JcaX509v3CertificateBuilder;
import org.bouncycastle.operator.jcajce.JcaContentSignerBuilder;

/** Test certificates (EC P-256), made in-process with BouncyCastle: a CA and the leaves it signs. */
final class TestCerts {

    private static final AtomicLong SERIAL = new AtomicLong(System.currentTimeMillis());

    /** A key pair and its certificate. */
    record Issued(KeyPair keys, X509Certificate cert) {
        /** Writes {@code <name>.pem} (the certificate) and {@code <name>.key} (PKCS#8) into {@code dir}. */
        Issued write(Path dir, String name) throws Exception {
            Files.writeString(dir.resolve(name + ".pem"), pem(cert));
            Files.writeString(dir.resolve(name + ".key"), "-----BEGIN PRIVATE KEY-----\n"
                    + Base64.getMimeEncoder(64, new byte[] {'\n'}).encodeToString(keys.getPrivate().getEncoded())
                    + "\n-----END PRIVATE KEY-----\n");
            return this;
        }
    }

    private TestCerts() {
    }

    static String pem(X509Certificate cert) throws Exception {
        return "-----BEGIN CERTIFICATE-----\n"
                + Base64.getMimeEncoder(64, new byte[] {'\n'}).encodeToString(cert.getEncoded())
                + "\n-----END CERTIFICATE-----\n";
    }

    /** A self-signed CA. */
    static Issued ca(String dn) throws Exception {
        KeyPair keys = keyPair();
        return new Issued(keys, build(dn, keys, dn, keys.getPrivate(), true));
    }

    /** A leaf certificate for {@code dn} signed by {@code ca}, with DNS names {@code sans}. */
    static Issued leaf(Issued ca, String dn, String... sans) throws Exception {
        KeyPair keys = keyPair();
        return new Issued(keys, build(dn, keys, ca.cert().getSubjectX500Principal().getName(), ca.keys().getPrivate(),
                false, sans));
    }

    private static KeyPair keyPair() throws Exception {
        KeyPairGenerator g = KeyPairGenerator.getInstance("EC");
        g.initialize(new ECGenParameterSpec("secp256r1"));
        return g.generateKeyPair();
    }

    private static X509Certificate build(String dn, KeyPair keys, String issuer, PrivateKey issuerKey, boolean ca,
                                         String... sans) throws Exception {
        long now = System.currentTimeMillis();
        JcaX509v3CertificateBuilder b = new JcaX509v3CertificateBuilder(new X500Name(issuer),
                BigInteger.valueOf(SERIAL.incrementAndGet()), new Date(now - 60_000), new Date(now + 86_400_000L),
                new X500Name(dn), keys.getPublic());
        b.addExtension(Extension.basicConstraints, true, new BasicConstraints(ca));
        if (sans.length > 0) {
            GeneralName[] names = new GeneralName[sans.length];
            for (int i = 0; i < sans.length; i++) {
                names[i] = new GeneralName(GeneralName.dNSName, sans[i]);
            }
            b.addExtension(Extension.subjectAlternativeName, false, new GeneralNames(names));
        }
        return new JcaX509CertificateConverter().getCertificate(
                b.build(new JcaContentSignerBuilder("SHA256withECDSA").build(issuerKey)));
    }
}
