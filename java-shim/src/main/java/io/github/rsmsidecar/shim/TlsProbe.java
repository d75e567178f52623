package io.github.rsmsidecar.shim;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketException;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.Principal;
import java.security.PrivateKey;
import java.security.cert.X509Certificate;
import java.util.List;
import javax.net.ssl.KeyManager;
import javax.net.ssl.SNIHostName;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.X509ExtendedKeyManager;

/**
 * One TLS connection to the sidecar with the shim's files, made only to see whether and how the
 * sidecar refuses them (see {@link TlsRefusal}): a TLS 1.3 server checks the client's certificate
 * after the client's side of the handshake is over, and the sidecar (gRPC core) then closes the
 * connection without an alert, so the failed call cannot tell a refused certificate from a crashed
 * sidecar. The probe does the handshake with the JDK's TLS, the same trust (host name included)
 * and the same client certificate, sends the HTTP/2 connection preface and reads: the sidecar's
 * first HTTP/2 frame means TLS works; an alert, or the connection closed right after the
 * handshake in two probes {@link #CONFIRM_AFTER_MS} apart (a sidecar that is stopping or starting
 * may close one connection, and then refuses the next or serves it), means it refused the client
 * certificate. A connection reset or closed during the handshake without an alert is not taken for
 * a refusal: that is how a sidecar dies. Over TCP only; bounded by {@code connect.timeout.ms} (at
 * most {@link #MAX_WAIT_MS}) per step.
 */
final class TlsProbe {

    /** The longest the probe waits to connect, and then for each read. */
    static final long MAX_WAIT_MS = 3_000;
    /** The wait before the second probe that confirms a connection closed after the handshake. */
    static final long CONFIRM_AFTER_MS = 200;
    /** What {@link #once} found when the sidecar closed the connection right after the handshake. */
    private static final String CLOSED = "it closed the connection right after the TLS handshake";

    /** HTTP/2's client connection preface and an empty SETTINGS frame (RFC 9113 §3.4). */
    private static final byte[] PREFACE;

    static {
        byte[] magic = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".getBytes(StandardCharsets.US_ASCII);
        byte[] settings = {0, 0, 0, 4, 0, 0, 0, 0, 0};
        PREFACE = new byte[magic.length + settings.length];
        System.arraycopy(magic, 0, PREFACE, 0, magic.length);
        System.arraycopy(settings, 0, PREFACE, magic.length, settings.length);
    }

    private TlsProbe() {
    }

    /**
     * Why the sidecar refuses TLS with {@code tls} (starting with {@link TlsRefusal#PREFIX}), or
     * null when it accepts it or could not be asked (not reachable, not over TCP, no answer in time).
     */
    static String run(ShimConfig config, TlsFiles tls) {
        if (config.isUnixSocket()) {
            return null;
        }
        String found = once(config, tls);
        if (!CLOSED.equals(found)) {
            return found;
        }
        try {
            Thread.sleep(CONFIRM_AFTER_MS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return null;
        }
        return CLOSED.equals(once(config, tls)) ? TlsRefusal.clientRefused(CLOSED, config, tls) : null;
    }

    /** One probe: a reason, {@link #CLOSED}, or null. */
    private static String once(ShimConfig config, TlsFiles tls) {
        String target = config.target();
        int colon = target.lastIndexOf(':');
        String host = target.substring(0, colon).replace("[", "").replace("]", "");
        int port = Integer.parseInt(target.substring(colon + 1));
        String authority = config.tlsAuthorityOverride().isEmpty() ? host
                : config.tlsAuthorityOverride().replaceFirst(":[0-9]+$", "").replace("[", "").replace("]", "");
        int waitMs = (int) Math.min(config.connectTimeoutMs(), MAX_WAIT_MS);
        SSLContext context;
        try {
            context = context(config, tls);
        } catch (IOException | GeneralSecurityException e) {
            return null; // the channel was made of these files: the same failure is reported there
        }
        try (Socket raw = new Socket()) {
            try {
                raw.connect(new InetSocketAddress(host, port), waitMs);
            } catch (IOException e) {
                return null; // nothing to ask: the call's own status says it
            }
            raw.setSoTimeout(waitMs);
            SSLSocket s = (SSLSocket) context.getSocketFactory().createSocket(raw, authority, port, true);
            SSLParameters p = s.getSSLParameters();
            p.setEndpointIdentificationAlgorithm("HTTPS");
            if (!authority.matches("[0-9.]+|.*:.*")) {
                p.setServerNames(List.of(new SNIHostName(authority)));
            }
            p.setApplicationProtocols(new String[] {"h2"});
            s.setSSLParameters(p);
            try {
                s.startHandshake();
            } catch (IOException e) {
                String why = TlsRefusal.fromChain(e, config, tls);
                if (why != null) {
                    return why;
                }
                if (e instanceof SSLException && String.valueOf(e.getMessage()).contains("Unsupported or unrecognized")) {
                    return TlsRefusal.PREFIX + "the sidecar at " + target + " does not answer in TLS (" + StatusText
                            .oneLine(String.valueOf(e.getMessage())) + "): it serves without TLS (no server.tls."
                            + "cert_file), or rsm.config." + ShimConfig.TLS_ENABLED + " should be false";
                }
                return null; // closed or reset without a word: a sidecar stopping or starting, not a refusal
            }
            try {
                OutputStream out = s.getOutputStream();
                out.write(PREFACE);
                out.flush();
                InputStream in = s.getInputStream();
                if (in.read() >= 0) {
                    return null; // its first HTTP/2 frame: TLS works
                }
                return CLOSED;
            } catch (SSLException e) {
                String why = TlsRefusal.fromChain(e, config, tls); // the alert it sent
                return why != null ? why : CLOSED;
            } catch (SocketException e) { // a reset: closed with the preface unread
                return CLOSED;
            } catch (IOException e) {
                return null; // no answer in time: nothing to say
            }
        } catch (IOException e) {
            return null;
        }
    }

    /** The JDK's TLS with the shim's files: their trust (with reasons) and their client certificate. */
    private static SSLContext context(ShimConfig config, TlsFiles tls) throws IOException, GeneralSecurityException {
        List<X509Certificate> chain = tls.clientChain();
        KeyManager[] keys = null;
        if (!chain.isEmpty()) {
            keys = new KeyManager[] {new OneKey(tls.clientKey(config), chain.toArray(new X509Certificate[0]))};
        }
        SSLContext context = SSLContext.getInstance("TLS");
        context.init(keys, new javax.net.ssl.TrustManager[] {
            TlsRefusal.trustManager(config, tls.caCertificates())}, null);
        return context;
    }

    /**
     * Presents the one client certificate whatever the server asks for, as gRPC's TLS does (the
     * JDK's own key manager would present none when the server's list of CAs lacks its issuer,
     * and the probe would then see another refusal than the shim's calls).
     */
    private static final class OneKey extends X509ExtendedKeyManager {
        private final PrivateKey key;
        private final X509Certificate[] chain;

        OneKey(PrivateKey key, X509Certificate[] chain) {
            this.key = key;
            this.chain = chain;
        }

        @Override
        public String chooseClientAlias(String[] keyType, Principal[] issuers, Socket socket) {
            return "client";
        }

        @Override
        public String chooseEngineClientAlias(String[] keyType, Principal[] issuers, SSLEngine engine) {
            return "client";
        }

        @Override
        public X509Certificate[] getCertificateChain(String alias) {
            return chain;
        }

        @Override
        public PrivateKey getPrivateKey(String alias) {
            return key;
        }

        @Override
        public String[] getClientAliases(String keyType, Principal[] issuers) {
            return new String[] {"client"};
        }

        @Override
        public String[] getServerAliases(String keyType, Principal[] issuers) {
            return null;
        }

        @Override
        public String chooseServerAlias(String keyType, Principal[] issuers, Socket socket) {
            return null;
        }
    }
}
