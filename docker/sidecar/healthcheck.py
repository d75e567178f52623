#!/usr/bin/env python3
"""rsm-healthcheck [TARGET] [--service NAME] [--timeout SECONDS] [--ca FILE [--cert FILE --key FILE]
[--authority NAME]]

Asks the sidecar's gRPC health service (grpc.health.v1.Health) for the status of
``rsm.v1.RemoteStorage``; exits 0 when it is SERVING, 1 otherwise (NOT_SERVING while
draining, not reachable, timeout, TLS refused). TARGET is what the shim's
``rsm.config.sidecar.target`` takes: ``host:port`` or ``unix:///path.sock`` (default
``127.0.0.1:9095``). With ``--ca`` it connects over TLS, verifying the sidecar's certificate
against that CA bundle (as the shim's ``tls.ca.file``); ``--cert``/``--key`` present a client
certificate (mTLS, ``tls.cert.file``/``tls.key.file``); ``--authority`` is the name the
certificate must carry when TARGET's host is not in it (``tls.authority.override``). The files
are read at every run, so a renewed certificate is used at the next check. Used as the Docker
health check of the sidecar image and as the Helm chart's probes; needs only grpcio and
grpcio-health-checking.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SERVICE = "rsm.v1.RemoteStorage"


def _channel(target: str, ca: str | None, cert: str | None, key: str | None, authority: str | None):
    import grpc

    if ca is None:
        return grpc.insecure_channel(target)
    creds = grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(),
        private_key=Path(key).read_bytes() if key else None,
        certificate_chain=Path(cert).read_bytes() if cert else None,
    )
    options = [("grpc.ssl_target_name_override", authority)] if authority else []
    return grpc.secure_channel(target, creds, options=options)


def check(
    target: str,
    service: str = SERVICE,
    timeout: float = 3.0,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    authority: str | None = None,
) -> tuple[bool, str]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        channel = _channel(target, ca, cert, key, authority)
    except OSError as e:
        return False, f"{target}: cannot read {e.filename}: {e.strerror}"
    with channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as e:
            return False, f"{target}: {e.code().name}: {e.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return resp.status == health_pb2.HealthCheckResponse.SERVING, f"{target}: {service} {status}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rsm-healthcheck", description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?", default="127.0.0.1:9095")
    ap.add_argument("--service", default=SERVICE)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--ca", help="PEM CA bundle that signed the sidecar's certificate: connect over TLS")
    ap.add_argument("--cert", help="PEM client certificate chain (mutual TLS); needs --key")
    ap.add_argument("--key", help="PEM private key of --cert")
    ap.add_argument("--authority", help="name to verify the sidecar's certificate against")
    args = ap.parse_args(argv)
    if (args.cert is None) != (args.key is None):
        ap.error("--cert and --key go together")
    if args.ca is None and (args.cert or args.authority):
        ap.error("--cert, --key and --authority need --ca (TLS)")
    ok, message = check(args.target, args.service, args.timeout, args.ca, args.cert, args.key, args.authority)
    print(message)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
