"""`rsm-sidecar serve --config FILE`."""

from __future__ import annotations

import logging
import os

from rsm_sidecar.config import Config


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="run the gRPC sidecar next to a Kafka broker",
        description="Run the sidecar next to a Kafka broker: the gRPC service its shim calls to copy, "
        "fetch and delete tiered segments, until SIGTERM (running calls get "
        "server.shutdown_grace_seconds). Everything is checked at start-up; a problem stops it with "
        "one line naming the key. Guides: docs/operations.md (running it), docs/configuration.md "
        "(every key).",
    )
    p.add_argument(
        "--config", "-c", help="TOML configuration file (environment variables RSM__... override it)"
    )
    p.set_defaults(func=run)


def limit_malloc_arenas(arenas: int = 1) -> None:
    """glibc gives every thread that allocates its own malloc arena; with gRPC, transform
    and prefetch threads handing multi-MiB buffers to each other, each arena keeps its own
    high-water mark of freed chunks (a 1 GiB stream-mode copy grew RSS by 56 MiB with the
    default, 33-44 MiB with 4 arenas, 36 MiB with one; six concurrent fetch streams with a
    64 MiB chunk cache grew it by 160 MiB with 4 arenas, 108-122 MiB with one, at the same
    throughput: tests/service/test_resources.py). Same effect as MALLOC_ARENA_MAX; must run
    before threads start."""
    import ctypes
    import ctypes.util

    if "MALLOC_ARENA_MAX" in os.environ:
        return
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        ctypes.CDLL(name).mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def run(args) -> int:
    limit_malloc_arenas()
    from rsm_sidecar.service import logs
    from rsm_sidecar.service.server import SidecarServer
    from rsm_sidecar.service.settings import ServiceSettings

    cfg = Config.load(args.config)
    log = ServiceSettings.from_config(cfg).log
    logs.setup(log.level, log.format)
    for path, why in cfg.removed.items():
        logging.getLogger("rsm_sidecar.config").warning("%s is no longer used (%s); remove it", path, why)
    SidecarServer(cfg).serve_forever()
    return 0
