"""`rsm-sidecar serve --config FILE`."""

from __future__ import annotations

from rsm_sidecar.config import Config


def register(sub) -> None:
    p = sub.add_parser("serve", help="run the gRPC sidecar next to a Kafka broker")
    p.add_argument("--config", "-c", help="TOML configuration file (environment variables RSM__... override it)")
    p.set_defaults(func=run)


def run(args) -> int:
    from rsm_sidecar.service import logs
    from rsm_sidecar.service.server import SidecarServer

    cfg = Config.load(args.config)
    logs.setup(cfg["log.level"], cfg["log.format"])
    SidecarServer(cfg).serve_forever()
    return 0
