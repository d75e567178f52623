package io.github.rsmsidecar.shim;

import io.grpc.ChannelCredentials;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import io.grpc.netty.shaded.io.netty.channel.epoll.Epoll;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollChannelOption;
import java.io.IOException;
import java.util.concurrent.TimeUnit;

/**
 * Creates the gRPC channel to the sidecar. Package-private seam so tests can use an in-process
 * channel. Creating a channel does not connect: grpc-java connects on the first call.
 */
@FunctionalInterface
interface ChannelFactory {

    ManagedChannel create(ShimConfig config) throws IOException;

    /**
     * Whether the sidecar's fetch channel is at the configured target beside the gRPC service (it
     * is for every real transport; an in-process channel of a test has no socket beside it, so its
     * fetches go over gRPC).
     */
    default boolean fetchChannel() {
        return true;
    }

    /**
     * A channel whose TLS uses {@code tls} (read and checked by the caller; null: read the files
     * now). Factories without TLS (tests' in-process channels) ignore it.
     */
    default ManagedChannel create(ShimConfig config, TlsFiles tls) throws IOException {
        return create(config);
    }

    /**
     * The production factory: grpc-netty-shaded through the channel/name-resolver registries, so
     * {@code dns:///host:port} uses TCP and {@code unix:///path} uses an epoll Unix domain socket.
     */
    ChannelFactory NETTY = new ChannelFactory() {
        @Override
        public ManagedChannel create(ShimConfig config) throws IOException {
            return create(config, null);
        }

        @Override
        public ManagedChannel create(ShimConfig config, TlsFiles tls) throws IOException {
            ManagedChannelBuilder<?> builder = Grpc.newChannelBuilder(config.grpcTarget(), credentials(config, tls));
            if (config.isUnixSocket()) {
                // grpc's netty transport sets SO_KEEPALIVE on every connection; a Unix domain socket has
                // no such option, so netty warns once per connection attempt (a line a second while the
                // sidecar is down). A null value removes the option before netty applies it.
                ((NettyChannelBuilder) builder).withOption(ChannelOption.SO_KEEPALIVE, null);
            } else {
                tcpOptions((NettyChannelBuilder) builder, config);
            }
            if (!config.tlsAuthorityOverride().isEmpty()) {
                builder.overrideAuthority(config.tlsAuthorityOverride());
            }
            // The shim retries idempotent calls itself (see Retrier): grpc's own retry buffers at most
            // 1 MiB per call, so it cannot replay a streamed copy, and two layers would multiply attempts.
            builder.disableRetry();
            builder.idleTimeout(idleTimeoutMillis(config), TimeUnit.MILLISECONDS);
            builder.userAgent("rsm-sidecar-shim/" + Version.get());
            return builder.build();
        }
    };

    /**
     * Over TCP the sidecar's address can vanish under an open connection (its pod replaced, its
     * node lost): nothing answers any more, not even with a reset. Without a bound, connection
     * attempts wait for netty's 30 s connect timeout, calls on the open connection for their
     * deadline and a started fetch stream for {@code fetch.read.timeout.ms}. A connect timeout
     * bounds the first; TCP keepalive probes after {@code keepalive.time.ms} without a packet from
     * the sidecar, and {@code TCP_USER_TIMEOUT}, close a connection whose probes or data TCP has
     * not had acknowledged for {@code keepalive.timeout.ms}: its calls fail {@code UNAVAILABLE}
     * and the next one (or the shim's retry) opens a new connection. The probes are the kernel's:
     * they reach no process and need nothing of the sidecar (unlike gRPC's HTTP/2 pings, which a
     * gRPC server limits, and which grpc-java sends no more than every 10 s). Linux (netty's epoll
     * transport) only; elsewhere only the connect timeout applies.
     */
    static void tcpOptions(NettyChannelBuilder builder, ShimConfig config) {
        builder.withOption(ChannelOption.CONNECT_TIMEOUT_MILLIS, (int) config.connectTimeoutMs());
        if (config.keepaliveTimeMs() > 0 && Epoll.isAvailable()) {
            builder.withOption(ChannelOption.SO_KEEPALIVE, true)
                    .withOption(EpollChannelOption.TCP_KEEPIDLE, (int) ((config.keepaliveTimeMs() + 999) / 1000))
                    .withOption(EpollChannelOption.TCP_KEEPINTVL, 1)
                    .withOption(EpollChannelOption.TCP_USER_TIMEOUT, (int) config.keepaliveTimeoutMs());
        }
    }

    /** grpc-java turns idle mode off for a timeout of 30 days or more. */
    long IDLE_OFF_DAYS = 31;

    /**
     * What the channel's idle timeout is given: {@code channel.idle.timeout.ms}, or for 0 a value
     * past gRPC's 30-day ceiling, which turns idle mode off. With grpc-java's own default (30
     * minutes) a broker that read nothing remote for half an hour would lose its connection, and
     * its next remote fetch would wait for a new one and, over TCP, a TLS handshake (docs/shim.md
     * "A connection that carries nothing for long stays open"). An open connection costs
     * nothing to keep: the keepalive probes that watch it are the kernel's (see tcpOptions).
     */
    static long idleTimeoutMillis(ShimConfig config) {
        long configured = config.channelIdleTimeoutMs();
        return configured == 0 ? TimeUnit.DAYS.toMillis(IDLE_OFF_DAYS) : configured;
    }

    /** Why the keepalive settings cannot apply here, or null when they do (or are off). */
    static String keepaliveUnavailable(ShimConfig config) {
        if (config.isUnixSocket() || config.keepaliveTimeMs() == 0 || Epoll.isAvailable()) {
            return null;
        }
        Throwable why = Epoll.unavailabilityCause();
        return "netty's epoll transport is not usable here (" + (why == null ? "unknown" : why.toString()) + ")";
    }

    /**
     * Which TLS implementation a TLS channel uses: BoringSSL through netty-tcnative (bundled for
     * Linux x86_64 and aarch64 with glibc) when it loads, else the JDK's provider.
     */
    static String tlsProvider() {
        try {
            if (io.grpc.netty.shaded.io.netty.handler.ssl.OpenSsl.isAvailable()) {
                return io.grpc.netty.shaded.io.netty.handler.ssl.OpenSsl.versionString() + " (netty-tcnative)";
            }
            Throwable why = io.grpc.netty.shaded.io.netty.handler.ssl.OpenSsl.unavailabilityCause();
            return "the JDK's (netty-tcnative not usable here: " + (why == null ? "unknown" : why.toString()) + ")";
        } catch (LinkageError e) {
            return "the JDK's (netty-tcnative not usable here: " + e + ")";
        }
    }

    /** Channel credentials for {@code config}; reads and checks the TLS files (errors name the key). */
    static ChannelCredentials credentials(ShimConfig config) throws IOException {
        return credentials(config, null);
    }

    /** As above with the TLS files already read and checked ({@code tls}; null: read them now). */
    static ChannelCredentials credentials(ShimConfig config, TlsFiles tls) throws IOException {
        if (!config.tlsEnabled()) {
            return InsecureChannelCredentials.create();
        }
        return (tls != null ? tls : TlsFiles.read(config).check(config)).credentials(config);
    }
}
