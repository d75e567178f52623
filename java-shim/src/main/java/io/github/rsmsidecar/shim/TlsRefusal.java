package io.github.rsmsidecar.shim;

import io.grpc.Status;
import java.io.IOException;
import java.net.ConnectException;
import java.net.NoRouteToHostException;
import java.net.Socket;
import java.net.UnknownHostException;
import java.security.KeyStore;
import java.security.cert.CertPathBuilderException;
import java.security.cert.CertificateException;
import java.security.cert.X509Certificate;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Locale;
import java.util.function.Supplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.TrustManager;
import javax.net.ssl.TrustManagerFactory;
import javax.net.ssl.X509ExtendedTrustManager;
import javax.security.auth.x500.X500Principal;

/**
 * Why TLS between the shim and the sidecar failed, as one line that says who refused what and
 * names the file or setting to fix: the shim not trusting the sidecar's certificate (unknown CA,
 * expired, not yet valid, issued for another name) or the sidecar refusing the shim's client
 * certificate (none, unknown CA, expired, not yet valid). Without it an operator reads
 * {@code UNAVAILABLE: Network closed for unknown reason} (the words of a crashed sidecar) or
 * {@code General OpenSslEngine problem}, with the reason deep in a stack trace.
 *
 * <p>Where the reason comes from:
 * <ul>
 *   <li>The shim's own verdict on the sidecar's certificate: {@link #trustManager} checks it and
 *       throws {@link NotTrusted} with the reason, which travels in the failed call's cause chain.
 *   <li>The sidecar's verdict on the shim's certificate: with TLS 1.3 the shim's side of the
 *       handshake is over before the sidecar checks the client certificate, and the sidecar
 *       (gRPC core) then closes the connection without a word: the call fails as if the sidecar
 *       had crashed. An alert the sidecar did send (a TLS server that sends them:
 *       {@code unknown_ca}, {@code certificate_required}, ...) may be in the cause chain. When
 *       the chain says nothing, a {@link TlsProbe} connects once more with the same files and
 *       watches what the sidecar does after the handshake; the shim's certificate is then checked
 *       locally (set? expired? not yet valid?) to say why.
 * </ul>
 */
final class TlsRefusal {

    /** How every reason starts, so that a reader (and a log search) knows TLS refused. */
    static final String PREFIX = "TLS refused: ";

    /** The shim refused the sidecar's certificate; the message is the reason. */
    static final class NotTrusted extends CertificateException {
        private static final long serialVersionUID = 1L;

        NotTrusted(String reason, Throwable cause) {
            super(reason, cause);
        }
    }

    /** A probe's result: how long it is reused (one probe for a burst of failing calls). */
    static final long PROBE_REUSE_MS = 5_000;

    private final ShimConfig config;
    private final Supplier<TlsFiles> files;
    private String probed; // guarded by this: the last probe's reason ("" for none)
    private long probedAtNanos; // guarded by this
    private TlsFiles probedFiles; // guarded by this

    /**
     * @param files the TLS files the channel uses now (they change when renewed in place)
     */
    TlsRefusal(ShimConfig config, Supplier<TlsFiles> files) {
        this.config = config;
        this.files = files;
    }

    /**
     * The reason, starting with {@link #PREFIX}, why a call that ended with {@code status} could
     * not get through TLS, or null when TLS is not the reason (or TLS is off). May probe the
     * sidecar (a connection of its own, at most every {@link #PROBE_REUSE_MS} ms).
     */
    String reason(Status status) {
        if (!config.tlsEnabled() || status.getCode() != Status.Code.UNAVAILABLE) {
            return null;
        }
        TlsFiles tls = files.get();
        String inChain = fromChain(status.getCause(), config, tls);
        if (inChain != null) {
            return inChain;
        }
        if (unreachable(status.getCause()) || config.isUnixSocket() || tls == null) {
            return null; // no connection was made: not a matter of TLS (the status says what happened)
        }
        return probe(tls);
    }

    private synchronized String probe(TlsFiles tls) {
        long now = System.nanoTime();
        if (probed == null || tls != probedFiles || now - probedAtNanos > PROBE_REUSE_MS * 1_000_000L) {
            String found = TlsProbe.run(config, tls);
            probed = found == null ? "" : found;
            probedAtNanos = System.nanoTime();
            probedFiles = tls;
        }
        return probed.isEmpty() ? null : probed;
    }

    /** Whether {@code cause} says no connection could be opened at all (refused, no route, no such host, timeout). */
    static boolean unreachable(Throwable cause) {
        for (Throwable t = cause; t != null; t = t.getCause()) {
            if (t instanceof ConnectException || t instanceof NoRouteToHostException
                    || t instanceof UnknownHostException) {
                return true;
            }
            if (t.getClass().getSimpleName().equals("ConnectTimeoutException")) { // netty's
                return true;
            }
        }
        return false;
    }

    /** The reason found in a failed call's cause chain (the shim's verdict, or the sidecar's alert), or null. */
    static String fromChain(Throwable cause, ShimConfig config, TlsFiles tls) {
        for (Throwable t = cause; t != null; t = t.getCause()) {
            if (t instanceof NotTrusted) {
                return t.getMessage();
            }
        }
        for (Throwable t = cause; t != null; t = t.getCause()) {
            String alert = alert(t.getMessage());
            if (alert != null) {
                return fromAlert(alert, config, tls);
            }
        }
        return null;
    }

    private static final Pattern JDK_ALERT = Pattern.compile("Received fatal alert: ([a-z_]+)");
    private static final Pattern OPENSSL_ALERT = Pattern.compile("(?:SSLV3|TLSV1|TLSV13)_ALERT_([A-Z_]+)");

    /** The name of the TLS alert the peer sent, as the JDK or BoringSSL word it, or null. */
    static String alert(String message) {
        if (message == null) {
            return null;
        }
        Matcher m = JDK_ALERT.matcher(message);
        if (m.find()) {
            return m.group(1);
        }
        m = OPENSSL_ALERT.matcher(message);
        return m.find() ? m.group(1).toLowerCase(Locale.ROOT) : null;
    }

    /** The reason for a fatal alert {@code alert} from the sidecar. */
    static String fromAlert(String alert, ShimConfig config, TlsFiles tls) {
        switch (alert) {
            case "bad_certificate", "unsupported_certificate", "certificate_revoked", "certificate_expired",
                    "certificate_unknown", "unknown_ca", "access_denied", "certificate_required", "decrypt_error":
                return clientRefused("alert " + alert, config, tls);
            default:
                return PREFIX + "the sidecar at " + config.target() + " ended the TLS handshake with alert " + alert;
        }
    }

    /**
     * The sidecar refused the shim's client certificate ({@code how}: the alert it sent, or what
     * it did instead); why, as far as the shim can tell from its own files.
     */
    static String clientRefused(String how, ShimConfig config, TlsFiles tls) {
        List<X509Certificate> chain = tls == null ? List.of() : tls.clientChain();
        if (config.tlsCertFile() == null || chain.isEmpty()) {
            return PREFIX + "the sidecar at " + config.target() + " requires a client certificate and the shim has "
                    + "none (" + how + "): set rsm.config." + ShimConfig.TLS_CERT_FILE + " and rsm.config."
                    + ShimConfig.TLS_KEY_FILE;
        }
        X509Certificate cert = chain.get(0);
        String which = "the shim's client certificate rsm.config." + ShimConfig.TLS_CERT_FILE + "=" + config.tlsCertFile()
                + " (" + subject(cert) + ", issued by " + name(cert.getIssuerX500Principal()) + ")";
        String dates = validity(cert, "it");
        if (dates != null) {
            return PREFIX + "the sidecar at " + config.target() + " refused " + which + " (" + how + "): " + dates
                    + ": " + renew(dates) + " rsm.config." + ShimConfig.TLS_CERT_FILE + " and rsm.config."
                    + ShimConfig.TLS_KEY_FILE;
        }
        if (how.equals("alert certificate_required")) {
            // TLS clients present a certificate only when its issuer is among the CAs the server names
            how = "it asked for a certificate from another CA: alert certificate_required";
        }
        return PREFIX + "the sidecar at " + config.target() + " refused " + which + " (" + how + "): the sidecar's "
                + "server.tls.client_ca_file must hold the CA that issued it";
    }

    /** What to do about a certificate that is not valid now ({@code dates}, {@link #validity}'s words). */
    private static String renew(String dates) {
        return dates.contains(" expired at ") ? "renew" : "reissue";
    }

    /**
     * Why {@code cert} is not valid now ({@code it}: how to call it), or null when it is. Without
     * the time now (the log line has it): the same refusal is worded the same each time.
     */
    static String validity(X509Certificate cert, String it) {
        Instant now = Instant.now();
        if (cert.getNotAfter().toInstant().isBefore(now)) {
            return it + " expired at " + cert.getNotAfter().toInstant().truncatedTo(ChronoUnit.SECONDS);
        }
        if (cert.getNotBefore().toInstant().isAfter(now)) {
            return it + " is not valid before " + cert.getNotBefore().toInstant().truncatedTo(ChronoUnit.SECONDS)
                    + " (or the clock of this host is behind)";
        }
        return null;
    }

    // ---- the shim's check of the sidecar's certificate ------------------------------------------

    /**
     * A trust manager that accepts what the JDK's PKIX trust manager for {@code cas} (null: the
     * JDK's default trust store) accepts, host name check included, and when it refuses says why.
     */
    static TrustManager trustManager(ShimConfig config, List<X509Certificate> cas) throws IOException {
        try {
            TrustManagerFactory f = TrustManagerFactory.getInstance("PKIX");
            if (cas == null) {
                f.init((KeyStore) null);
            } else {
                KeyStore store = KeyStore.getInstance(KeyStore.getDefaultType());
                store.load(null, null);
                for (int i = 0; i < cas.size(); i++) {
                    store.setCertificateEntry("ca-" + i, cas.get(i));
                }
                f.init(store);
            }
            for (TrustManager tm : f.getTrustManagers()) {
                if (tm instanceof X509ExtendedTrustManager x) {
                    return new Checking(x, config, cas);
                }
            }
            throw new IOException("the JDK has no PKIX X509ExtendedTrustManager");
        } catch (java.security.GeneralSecurityException e) {
            throw new IOException("rsm.config." + ShimConfig.TLS_CA_FILE + "=" + config.tlsCaFile()
                    + ": cannot load the CA certificates: " + e.getMessage(), e);
        }
    }

    /** See {@link #trustManager}. A client's: it never checks clients. */
    private static final class Checking extends X509ExtendedTrustManager {
        private final X509ExtendedTrustManager delegate;
        private final ShimConfig config;
        private final List<X509Certificate> cas;

        Checking(X509ExtendedTrustManager delegate, ShimConfig config, List<X509Certificate> cas) {
            this.delegate = delegate;
            this.config = config;
            this.cas = cas;
        }

        @Override
        public void checkServerTrusted(X509Certificate[] chain, String authType, SSLEngine engine)
                throws CertificateException {
            try {
                delegate.checkServerTrusted(chain, authType, engine);
            } catch (CertificateException e) {
                throw refusal(chain, authType, engine == null ? null : engine.getPeerHost(), e);
            }
        }

        @Override
        public void checkServerTrusted(X509Certificate[] chain, String authType, Socket socket)
                throws CertificateException {
            try {
                delegate.checkServerTrusted(chain, authType, socket);
            } catch (CertificateException e) {
                String host = socket instanceof javax.net.ssl.SSLSocket s && s.getHandshakeSession() != null
                        ? s.getHandshakeSession().getPeerHost() : null;
                throw refusal(chain, authType, host, e);
            }
        }

        @Override
        public void checkServerTrusted(X509Certificate[] chain, String authType) throws CertificateException {
            try {
                delegate.checkServerTrusted(chain, authType);
            } catch (CertificateException e) {
                throw refusal(chain, authType, null, e);
            }
        }

        private NotTrusted refusal(X509Certificate[] chain, String authType, String host, CertificateException e) {
            return new NotTrusted(serverRefused(chain, authType, host, e), e);
        }

        /** Why the sidecar's certificate {@code chain} was refused with {@code e} (host: the name checked). */
        private String serverRefused(X509Certificate[] chain, String authType, String host, CertificateException e) {
            if (chain == null || chain.length == 0) {
                return PREFIX + "the sidecar at " + config.target() + " sent no certificate";
            }
            X509Certificate leaf = chain[0];
            String which = "the sidecar's certificate (" + subject(leaf) + ", issued by "
                    + name(leaf.getIssuerX500Principal()) + ")";
            String dates = validity(leaf, "it");
            if (dates != null) {
                return PREFIX + "the shim refused " + which + ": " + dates + ": " + renew(dates)
                        + " the sidecar's certificate (its server.tls.cert_file)";
            }
            boolean chainTrusted;
            try {
                delegate.checkServerTrusted(chain, authType); // the chain alone, without the name
                chainTrusted = true;
            } catch (CertificateException again) {
                chainTrusted = false;
            }
            if (chainTrusted) {
                return PREFIX + "the shim refused " + which + ": it is for " + sans(leaf) + ", not for "
                        + (host == null ? "the name the shim checks" : "'" + host + "', the name the shim checks")
                        + " (rsm.config." + ShimConfig.TLS_AUTHORITY_OVERRIDE + ", or the host of rsm.config."
                        + ShimConfig.SIDECAR_TARGET + " when it is not set): set rsm.config."
                        + ShimConfig.TLS_AUTHORITY_OVERRIDE + " to one of its names, or reissue it for that name";
            }
            if (causedBy(e, CertPathBuilderException.class)) {
                return PREFIX + "the shim refused " + which + ": no CA it trusts issued it; "
                        + (cas == null ? "rsm.config." + ShimConfig.TLS_CA_FILE + " is not set and the JDK's default "
                                + "trust store does not hold that CA: set rsm.config." + ShimConfig.TLS_CA_FILE
                                + " to the CA that issues the sidecar's certificate"
                                : "rsm.config." + ShimConfig.TLS_CA_FILE + "=" + config.tlsCaFile() + " holds "
                                        + names(cas) + ": add the CA that issued the sidecar's certificate");
            }
            return PREFIX + "the shim refused " + which + ": " + StatusText.oneLine(String.valueOf(e.getMessage()));
        }

        @Override
        public void checkClientTrusted(X509Certificate[] chain, String authType, Socket socket)
                throws CertificateException {
            throw new CertificateException("the shim is a TLS client only");
        }

        @Override
        public void checkClientTrusted(X509Certificate[] chain, String authType, SSLEngine engine)
                throws CertificateException {
            throw new CertificateException("the shim is a TLS client only");
        }

        @Override
        public void checkClientTrusted(X509Certificate[] chain, String authType) throws CertificateException {
            throw new CertificateException("the shim is a TLS client only");
        }

        @Override
        public X509Certificate[] getAcceptedIssuers() {
            return delegate.getAcceptedIssuers();
        }
    }

    private static boolean causedBy(Throwable e, Class<? extends Throwable> type) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (type.isInstance(t)) {
                return true;
            }
        }
        return false;
    }

    /** {@code CN=...} of a certificate's subject. */
    static String subject(X509Certificate cert) {
        return name(cert.getSubjectX500Principal());
    }

    static String name(X500Principal p) {
        return p.getName(X500Principal.RFC2253);
    }

    /** The subjects of {@code certs}, for a message. */
    static String names(List<X509Certificate> certs) {
        List<String> out = new ArrayList<>();
        for (X509Certificate c : certs) {
            out.add(subject(c));
        }
        return out.size() == 1 ? out.get(0) : out.toString();
    }

    /** The names a certificate is for: its DNS and IP subject alternative names, or its subject. */
    static String sans(X509Certificate cert) {
        List<String> out = new ArrayList<>();
        try {
            Collection<List<?>> all = cert.getSubjectAlternativeNames();
            if (all != null) {
                for (List<?> san : all) {
                    int type = (Integer) san.get(0);
                    if (type == 2) {
                        out.add("DNS:" + san.get(1));
                    } else if (type == 7) {
                        out.add("IP:" + san.get(1));
                    }
                }
            }
        } catch (java.security.cert.CertificateParsingException e) {
            // no names
        }
        return out.isEmpty() ? "no subject alternative name (" + subject(cert) + ")" : String.join(", ", out);
    }
}
