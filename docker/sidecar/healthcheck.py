#!/usr/bin/env python3
"""rsm-healthcheck [TARGET] [--service NAME] [--timeout SECONDS]

Asks the sidecar's gRPC health service (grpc.health.v1.Health) for the status of
``rsm.v1.RemoteStorage``; exits 0 when it is SERVING, 1 otherwise (NOT_SERVING while
draining, not reachable, timeout). TARGET is what the shim's ``rsm.config.sidecar.target``
takes: ``host:port`` or ``unix:///path.sock`` (default ``127.0.0.1:9095``). Used as the
Docker health check of the sidecar image; needs only grpcio and grpcio-health-checking.
"""

from __future__ import annotations

import argparse
import sys

SERVICE = "rsm.v1.RemoteStorage"


def check(target: str, service: str = SERVICE, timeout: float = 3.0) -> tuple[bool, str]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
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
    args = ap.parse_args(argv)
    ok, message = check(args.target, args.service, args.timeout)
    print(message)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
