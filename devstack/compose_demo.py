"""The compose demo cluster on podman (``make compose-demo``, ``make compose-down``): the engine
prepared and served by :mod:`devstack.containers`, then docker-compose.yml (or, with
``--topology remote``, docker-compose.remote.yml: :mod:`devstack.remote_topology`) built, started
and summed up; left running until ``down``.

    python -m devstack.compose_demo demo [--topology local|remote]   # build, up, the summary
    python -m devstack.compose_demo down [--topology local|remote]   # down -v, stop the service
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devstack.common import default_cache_dir
from devstack.containers import REPO, ComposeProject, EngineUnavailable, PodmanService, prepare
from devstack.remote_topology import Topology
from devstack.remote_topology import demo as remote_demo

DEMO_PROJECT = "rsm-sidecar-demo"  # the name: in docker-compose.yml


def _service_pid_file(cache: Path) -> Path:
    return cache / "podman" / "serve.pid"


def _running_service(cache: Path) -> PodmanService | None:
    """The service a previous ``demo`` left running, if it still answers."""
    service = PodmanService(cache)
    try:
        pid = int(_service_pid_file(cache).read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return service if service.socket.exists() and service.answers() else None


def demo(cache: Path | None = None, topology: str = "local") -> int:
    """Build every image, start the cluster, print the demo's summary, leave it running.
    ``topology="remote"``: docker-compose.remote.yml instead (devstack.remote_topology)."""
    cache = Path(cache or default_cache_dir())
    for key, value in prepare(cache).items():
        print(f"engine {key}: {value}", flush=True)
    service = _start_service(cache)
    if service is None:
        return 1
    if topology == "remote":
        return remote_demo(service)
    return _local_demo(service)


def _start_service(cache: Path) -> PodmanService | None:
    """The running ``serve`` process's service, or a new one left running in the background."""
    service = _running_service(cache)
    if service is None:
        log = cache / "podman" / "serve.out"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "devstack.containers", "serve"],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        _service_pid_file(cache).write_text(f"{proc.pid}\n")
        service = PodmanService(cache)
        deadline = time.monotonic() + 90
        while not (service.socket.exists() and service.answers()):
            if proc.poll() is not None or time.monotonic() > deadline:
                print(f"the podman service did not start; see {log}", file=sys.stderr)
                return None
            time.sleep(0.5)
    return service


def _local_demo(service: PodmanService) -> int:
    project = ComposeProject(service, DEMO_PROJECT)
    t0 = time.monotonic()
    if project.run("build", check=False, capture=False).returncode != 0:
        return 1
    print(f"images built in {time.monotonic() - t0:.0f}s", flush=True)
    if project.run("up", "-d", check=False, capture=False).returncode != 0:
        return 1
    deadline = time.monotonic() + 1200
    while project.containers().get("iceberg-convert", {}).get("State") != "exited":
        if time.monotonic() > deadline:
            print("the Iceberg job did not finish within 20 minutes", file=sys.stderr)
            return 1
        time.sleep(3)
    for job in ("demo-producer", "iceberg-convert"):
        print(f"\n== {job} ==", flush=True)
        project.run("logs", "--no-color", "--no-log-prefix", job, check=False, capture=False)
    failed = [name for name, row in project.containers().items() if int(row.get("ExitCode") or 0) != 0]
    print(
        f"\nThe cluster keeps running (project {DEMO_PROJECT}, engine: podman at {service.socket}).\n"
        f"  look:  {project.hint} ps | logs -f sidecar-1 kafka-1\n"
        "  metrics: http://127.0.0.1:9096/metrics (sidecar-1; 9097, 9098)   bootstrap: localhost:29092   "
        "S3: http://127.0.0.1:8333   registry: http://127.0.0.1:8081   catalog: http://127.0.0.1:8181\n"
        "  Spark master UI: http://127.0.0.1:8090   Iceberg follower metrics: http://127.0.0.1:9099/metrics\n"
        "  stop:  make compose-down",
        flush=True,
    )
    if failed:
        print(f"failed: {', '.join(sorted(failed))}", file=sys.stderr)
    return 1 if failed else 0


def down(cache: Path | None = None, topology: str = "local") -> int:
    cache = Path(cache or default_cache_dir())
    service = _running_service(cache)
    if service is None:
        print("no compose demo is running")
        return 0
    if topology == "remote":
        project: ComposeProject = Topology(service).compose
    else:
        project = ComposeProject(service, DEMO_PROJECT)
    code = project.run("down", "-v", "--remove-orphans", check=False, capture=False).returncode
    pid = int(_service_pid_file(cache).read_text())
    os.kill(pid, 15)
    _service_pid_file(cache).unlink(missing_ok=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devstack.compose_demo", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    demo_p = sub.add_parser(
        "demo", help="prepare, build, up, print the demo's summary; leaves the cluster running"
    )
    down_p = sub.add_parser("down", help="stop the demo cluster (down -v) and the podman service")
    for p in (demo_p, down_p):
        p.add_argument(
            "--topology",
            choices=("local", "remote"),
            default="local",
            help="local: docker-compose.yml; remote: docker-compose.remote.yml (the sidecar as its own "
            "workload, TCP + mTLS, stream mode)",
        )
    args = ap.parse_args(argv)
    try:
        return {"demo": demo, "down": down}[args.cmd](topology=args.topology)
    except EngineUnavailable as e:
        print(f"devstack.compose_demo: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
