package io.github.rsmsidecar.shim;

import io.grpc.ChannelCredentials;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.ChannelOption;
import java.io.IOException;

/**
 * Creates the gRPC channel to the sidecar. Package-private seam so tests can use an in-process
 * channel. Creating a channel does not connect: grpc-java connects on the first call.
 */
@FunctionalInterface
interface ChannelFactory {

    ManagedChannel create(ShimConfig config) throws IOException;

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
            }
            if (!config.tlsAuthorityOverride().isEmpty()) {
                builder.overrideAuthority(config.tlsAuthorityOverride());
            }
            // The shim retries idempotent calls itself (see Retrier): grpc's own retry buffers at most
            // 1 MiB per call, so it cannot replay a streamed copy, and two layers would multiply attempts.
            builder.disableRetry();
            builder.userAgent("rsm-sidecar-shim/" + Version.get());
            return builder.build();
        }
    };

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
