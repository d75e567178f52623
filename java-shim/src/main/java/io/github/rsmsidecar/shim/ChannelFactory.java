package io.github.rsmsidecar.shim;

import io.grpc.ChannelCredentials;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.TlsChannelCredentials;
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
     * The production factory: grpc-netty-shaded through the channel/name-resolver registries, so
     * {@code dns:///host:port} uses TCP and {@code unix:///path} uses an epoll Unix domain socket.
     */
    ChannelFactory NETTY = config -> {
        ManagedChannelBuilder<?> builder = Grpc.newChannelBuilder(config.grpcTarget(), credentials(config));
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
    };

    /** Channel credentials for {@code config}; reads the TLS files (errors name the key). */
    static ChannelCredentials credentials(ShimConfig config) throws IOException {
        if (!config.tlsEnabled()) {
            return InsecureChannelCredentials.create();
        }
        TlsChannelCredentials.Builder tls = TlsChannelCredentials.newBuilder();
        if (config.tlsCaFile() != null) {
            try {
                tls.trustManager(config.tlsCaFile().toFile());
            } catch (IOException | RuntimeException e) {
                throw new IOException("rsm.config." + ShimConfig.TLS_CA_FILE + "=" + config.tlsCaFile()
                        + ": cannot load the CA certificates: " + e.getMessage(), e);
            }
        }
        if (config.tlsCertFile() != null) {
            try {
                tls.keyManager(config.tlsCertFile().toFile(), config.tlsKeyFile().toFile());
            } catch (IOException | RuntimeException e) {
                throw new IOException("rsm.config." + ShimConfig.TLS_CERT_FILE + "=" + config.tlsCertFile()
                        + " / rsm.config." + ShimConfig.TLS_KEY_FILE + "=" + config.tlsKeyFile()
                        + ": cannot load the client certificate and key: " + e.getMessage(), e);
            }
        }
        return tls.build();
    }
}
