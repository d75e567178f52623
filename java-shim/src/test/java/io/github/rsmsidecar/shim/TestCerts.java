package io.github.rsmsidecar.shim;

import java.math.BigInteger;
import java.net.InetAddress;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.security.PrivateKey;
import java.security.cert.X509Certificate;
import java.security.spec.ECGenParameterSpec;
import java.util.Base64;
import java.util.Date;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.bouncycastle.asn1.x500.X500Name;
import org.bouncycastle.asn1.x509.BasicConstraints;
import org.bouncycastle.asn1.x509.ExtendedKeyUsage;
import org.bouncycastle.asn1.x509.Extension;
import org.bouncycastle.asn1.x509.GeneralName;
import org.bouncycastle.asn1.x509.GeneralNames;
import org.bouncycastle.asn1.x509.KeyPurposeId;
import org.bouncycastle.asn1.x509.KeyUsage;
import org.bouncycastle.cert.jcajce.JcaX509CertificateConverter;
import org.bouncycastle.cert.jcajce.JcaX509v3CertificateBuilder;
import org.bouncycastle.operator.jcajce.JcaContentSignerBuilder;

/**
 * The one builder of the Java tests' certificates (EC P-256, made in-process with BouncyCastle):
 * a CA ({@link #ca}) and what it signs: a server's certificate with its names ({@link #server}),
 * a client's ({@link #client}), and the broken ones a TLS refusal test needs: expired
 * ({@link #expired}), not yet valid ({@link #notYetValid}), for another name (a server
 * certificate for that name), from another CA (another {@link #ca}). The Python tests have the
 * same in {@code devstack/tls.py}.
 */
final class TestCerts {

    private static final AtomicLong SERIAL = new AtomicLong(System.currentTimeMillis());
    private static final long DAY = TimeUnit.DAYS.toMillis(1);

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

    /** What a leaf certificate may be used for. */
    enum Usage {
        SERVER_AND_CLIENT, CLIENT
    }

    private TestCerts() {
    }

    static String pem(X509Certificate cert) throws Exception {
        return "-----BEGIN CERTIFICATE-----\n"
                + Base64.getMimeEncoder(64, new byte[] {'\n'}).encodeToString(cert.getEncoded())
                + "\n-----END CERTIFICATE-----\n";
    }

    /** A self-signed CA, valid from a minute ago for a day. */
    static Issued ca(String dn) throws Exception {
        KeyPair keys = keyPair();
        long now = System.currentTimeMillis();
        return new Issued(keys, build(dn, keys, dn, keys.getPrivate(), true, null, now - 60_000, now + DAY));
    }

    /**
     * A server's certificate for {@code dn} signed by {@code ca}, valid for a day, with these
     * subject alternative names (IP addresses for IP literals, DNS names otherwise), usable by a
     * client too.
     */
    static Issued server(Issued ca, String dn, String... names) throws Exception {
        long now = System.currentTimeMillis();
        return leaf(ca, dn, Usage.SERVER_AND_CLIENT, now - 60_000, now + DAY, names);
    }

    /** A client's certificate for {@code dn} signed by {@code ca}, valid for a day, without names. */
    static Issued client(Issued ca, String dn) throws Exception {
        long now = System.currentTimeMillis();
        return leaf(ca, dn, Usage.CLIENT, now - 60_000, now + DAY);
    }

    /** As {@link #server}, but it expired yesterday (valid from 3 days ago to 1 day ago). */
    static Issued expired(Issued ca, String dn, String... names) throws Exception {
        long now = System.currentTimeMillis();
        return leaf(ca, dn, Usage.SERVER_AND_CLIENT, now - 3 * DAY, now - DAY, names);
    }

    /** As {@link #server}, but valid only from tomorrow (1 to 3 days ahead). */
    static Issued notYetValid(Issued ca, String dn, String... names) throws Exception {
        long now = System.currentTimeMillis();
        return leaf(ca, dn, Usage.SERVER_AND_CLIENT, now + DAY, now + 3 * DAY, names);
    }

    /** A leaf certificate of any validity and usage. */
    static Issued leaf(Issued ca, String dn, Usage usage, long notBefore, long notAfter, String... names)
            throws Exception {
        KeyPair keys = keyPair();
        return new Issued(keys, build(dn, keys, ca.cert().getSubjectX500Principal().getName(),
                ca.keys().getPrivate(), false, usage, notBefore, notAfter, names));
    }

    private static KeyPair keyPair() throws Exception {
        KeyPairGenerator g = KeyPairGenerator.getInstance("EC");
        g.initialize(new ECGenParameterSpec("secp256r1"));
        return g.generateKeyPair();
    }

    private static X509Certificate build(String dn, KeyPair keys, String issuer, PrivateKey issuerKey, boolean ca,
                                         Usage usage, long notBefore, long notAfter, String... names)
            throws Exception {
        JcaX509v3CertificateBuilder b = new JcaX509v3CertificateBuilder(new X500Name(issuer),
                BigInteger.valueOf(SERIAL.incrementAndGet()), new Date(notBefore), new Date(notAfter),
                new X500Name(dn), keys.getPublic());
        b.addExtension(Extension.basicConstraints, true, new BasicConstraints(ca));
        b.addExtension(Extension.keyUsage, true,
                new KeyUsage(ca ? KeyUsage.keyCertSign | KeyUsage.cRLSign : KeyUsage.digitalSignature));
        if (usage != null) {
            b.addExtension(Extension.extendedKeyUsage, false, usage == Usage.CLIENT
                    ? new ExtendedKeyUsage(KeyPurposeId.id_kp_clientAuth)
                    : new ExtendedKeyUsage(new KeyPurposeId[] {KeyPurposeId.id_kp_serverAuth, KeyPurposeId.id_kp_clientAuth}));
        }
        if (names.length > 0) {
            GeneralName[] sans = new GeneralName[names.length];
            for (int i = 0; i < names.length; i++) {
                boolean ip = names[i].matches("[0-9.]+|.*:.*");
                sans[i] = ip ? new GeneralName(GeneralName.iPAddress, InetAddress.getByName(names[i]).getHostAddress())
                        : new GeneralName(GeneralName.dNSName, names[i]);
            }
            b.addExtension(Extension.subjectAlternativeName, false, new GeneralNames(sans));
        }
        return new JcaX509CertificateConverter().getCertificate(
                b.build(new JcaContentSignerBuilder("SHA256withECDSA").build(issuerKey)));
    }
}
