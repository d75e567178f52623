"""The inside of tests/test_devstack_ports.py's race test, run in a network namespace of its own
(``unshare --user --map-root-user --net``), where it may narrow the kernel's ephemeral port range:

1. the range becomes the 64 ports :data:`EPHEMERAL` (the block of devstack/ports.py below it
   stays where it is on a default machine);
2. a squatter process (``--squat``) opens outgoing connections to a listener of its own until
   every port of the range is the local port of one of them, and keeps it so: every 50 ms it
   closes a few and connects again, taking back within a millisecond any port of the range that
   came free (what the brokers, clients and Spark of ``make test``'s lanes do to the range, in
   small). Outgoing connections elsewhere still work: they share local ports with the squatter's,
   to another address;
3. each launcher named on the command line is started, used (a bucket created, a health check),
   and stopped.

Prints one JSON object: the squatter's count of ports held, and per launcher whether it started,
the ports it listened on, and the error if it did not. Only launcher API that main had before
devstack/ports.py is used, so that the same test can be run against the old allocator.

    python -m tests.port_race <work dir> s3 gcs azure sidecar kafka

:func:`run` runs it so from a test (the servers' programs installed beforehand: the namespace
has no network).
"""

from __future__ import annotations

import errno
import json
import random
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: the ephemeral range in the namespace: 64 ports, where Linux's default range starts
EPHEMERAL = (32768, 32831)
#: the squatter's listener: outside the range, and below devstack/ports.py's lowest port
SQUAT_LISTENER = ("127.0.0.1", 9999)


def squat() -> None:
    """Hold every port of the ephemeral range with an outgoing connection, until killed."""
    listener = socket.create_server(SQUAT_LISTENER, backlog=4096)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            conn.close()  # the client side keeps its port (CLOSE_WAIT) until it closes too

    threading.Thread(target=accept, daemon=True).start()
    held: list[socket.socket] = []

    def fill() -> None:
        while True:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close: RST
            try:
                s.connect(SQUAT_LISTENER)
            except OSError as e:
                s.close()
                if e.errno == errno.EADDRNOTAVAIL:  # every port of the range is held
                    return
                raise
            held.append(s)

    fill()
    print(f"holding {len(held)}", flush=True)
    while True:
        time.sleep(0.05)
        for s in random.sample(held, 4):
            held.remove(s)
            s.close()  # the port is free for a moment...
        fill()  # ...and taken again


def _s3(work: Path) -> dict[str, int]:
    from devstack.s3server import SeaweedS3Server

    with SeaweedS3Server(work / "s3") as server:
        server.create_bucket("race")
        server.client().head_bucket(Bucket="race")
        return {"s3": server.s3, "master": server.master, "volume": server.volume, "filer": server.filer}


def _gcs(work: Path) -> dict[str, int]:
    from devstack.gcsserver import FakeGcsServer

    with FakeGcsServer(work / "gcs") as server:
        server.create_bucket("race")
        return {"port": server.port}


def _azure(work: Path) -> dict[str, int]:
    from devstack.azurite import AzuriteServer

    with AzuriteServer(work / "azure", in_memory=True) as server:
        server.create_bucket("race")
        return {"port": server.port}


def _sidecar(work: Path) -> dict[str, int]:
    from devstack.stack import LocalStack

    stack = LocalStack(work / "stack", sidecar_tcp=True, encryption=False)
    try:
        stack.start_sidecar()  # returns once the sidecar answers its health check over TCP
        assert stack.sidecar_port is not None
        return {"grpc": stack.sidecar_port}
    finally:
        stack.stop()


def _kafka(work: Path) -> dict[str, int]:
    from confluent_kafka.admin import AdminClient

    from devstack.kafka import KafkaBroker, KafkaDistribution

    with KafkaBroker(KafkaDistribution.ensure(), work / "kafka", heap_options=("-Xmx256m",)) as broker:
        AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=30)
        return {"broker": int(broker.broker_port), "controller": int(broker.controller_port)}


LAUNCHERS: dict[str, Callable[[Path], dict[str, int]]] = {
    "s3": _s3,
    "gcs": _gcs,
    "azure": _azure,
    "sidecar": _sidecar,
    "kafka": _kafka,
}


def main(argv: list[str]) -> int:
    if argv == ["--squat"]:
        squat()
        return 0
    work, names = Path(argv[0]), argv[1:]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    Path("/proc/sys/net/ipv4/ip_local_port_range").write_text(f"{EPHEMERAL[0]} {EPHEMERAL[1]}")
    squatter = subprocess.Popen(
        [sys.executable, "-m", "tests.port_race", "--squat"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert squatter.stdout is not None
        held = int(squatter.stdout.readline().split()[1])
        results = {}
        for name in names:
            t0 = time.monotonic()
            try:
                ports = LAUNCHERS[name](work)
                results[name] = {"started": True, "ports": ports}
            except Exception:
                results[name] = {"started": False, "error": traceback.format_exc()[-3000:]}
            results[name]["seconds"] = round(time.monotonic() - t0, 1)
        alive = squatter.poll() is None
    finally:
        squatter.kill()
        squatter.wait()
    print(json.dumps({"ephemeral": EPHEMERAL, "held": held, "squatter_alive": alive, "launchers": results}))
    return 0


def run(work: Path, names: list[str], timeout: float = 300) -> dict[str, Any]:
    """This module's JSON result for the launchers ``names``, run in a network namespace of its
    own (AssertionError with the output when it did not finish)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise AssertionError("`unshare` (util-linux) is needed for a network namespace")
    work.mkdir(parents=True, exist_ok=True)
    argv = [unshare, "--user", "--map-root-user", "--net", sys.executable, "-m", "tests.port_race"]
    proc = subprocess.run(
        [*argv, str(work), *names], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    try:
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise AssertionError(
            f"tests.port_race exited with {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        ) from None
    return result


def assert_all_started(result: dict[str, Any]) -> None:
    """Every launcher of ``result`` started and listened outside the ephemeral range, while the
    squatter held all of the range."""
    first, last = result["ephemeral"]
    assert result["held"] == last - first + 1 and result["squatter_alive"], result
    failed = {name: r["error"] for name, r in result["launchers"].items() if not r["started"]}
    assert not failed, "launchers that did not start:\n" + "\n".join(
        f"--- {n}:\n{e}" for n, e in failed.items()
    )
    inside = {
        name: r["ports"]
        for name, r in result["launchers"].items()
        if any(first <= port <= last for port in r["ports"].values())
    }
    assert not inside, f"ports in the ephemeral range {first}-{last}: {inside}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
