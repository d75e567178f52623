"""The ports devstack's servers listen on (devstack/ports.py): a block outside the kernel's
ephemeral range, handed out through a registry every process shares, and a first start that
tries again on new ports when a server finds one taken anyway.

The race itself (tests/port_race.py): in a network namespace of their own, outgoing connections
hold every port of the ephemeral range and take back any that comes free, as the brokers,
clients and Spark of three test lanes did when ``weed server`` lost one of its eight ports on a
clean clone's CI run; the launchers still start."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from devstack import ports
from devstack.ports import PortRegistry, address_in_use, port_block
from tests import port_race

# -- the block -----------------------------------------------------------------------------------


def test_the_block_lies_beside_the_ephemeral_range_never_in_it():
    assert port_block((32768, 60999)) == range(20000, 32768)  # Linux's default range
    assert port_block((15000, 60999)) == range(10000, 15000)
    assert port_block((1024, 60999)) == range(61000, 65536)  # nothing below: above it
    assert port_block((1024, 65535)) == range(10000, 65536)  # no room at all: the leases still apply
    first, last = ports.ephemeral_range()
    block = ports.registry().block
    assert block.stop <= first or block.start > last
    assert all(block.start <= p < block.stop for p in ports.free_ports(3))
    assert ports.free_ports(0) == []  # a stack with nothing over TCP


def _registry(tmp_path: Path, size: int = 400) -> PortRegistry:
    """A registry of its own over ``size`` ports of the real block (free ones: bind-checked)."""
    block = ports.registry().block
    return PortRegistry(tmp_path / "registry", range(block.stop - size, block.stop))


def _script(registry: PortRegistry, then: str) -> str:
    """Python code that opens ``registry`` as ``r`` in another process, then runs ``then``."""
    block = f"range({registry.block.start}, {registry.block.stop})"
    return (
        "import json, sys; from devstack.ports import PortRegistry; "
        f"r = PortRegistry({str(registry.directory)!r}, {block}); {then}"
    )


def test_processes_leasing_at_once_never_get_the_same_port(tmp_path):
    registry = _registry(tmp_path)
    script = _script(registry, "print(json.dumps([p for _ in range(20) for g in r.lease(3) for p in g]))")
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(4)
    ]
    leased = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    every = [port for one in leased for port in one]
    assert len(every) == 4 * 60 == len(set(every))
    assert all(port in registry.block for port in every)


def _lease_in_child(registry: PortRegistry, n: int) -> tuple[subprocess.Popen[str], list[int]]:
    """Another process that leases ``n`` ports of ``registry`` and lives until its stdin closes."""
    then = f"print(json.dumps([g[0] for g in r.lease({n})]), flush=True); sys.stdin.read()"
    script = _script(registry, then)
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    return child, json.loads(child.stdout.readline())


def _end(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.close()
    child.wait(30)


def test_a_port_in_use_or_leased_to_a_living_process_is_not_handed_out(tmp_path):
    registry = _registry(tmp_path, size=8)
    p = registry.block.start
    with socket.socket() as other:  # a program that does not use the registry listens on the first port
        other.bind(("127.0.0.1", p))
        other.listen()
        holder, held = _lease_in_child(registry, 2)
        assert held == [p + 1, p + 2]
        gone, had = _lease_in_child(registry, 5)
        assert had == [p + 3, p + 4, p + 5, p + 6, p + 7]
        _end(gone)
        # round the block again: the port in use and the living holder's are passed over, the
        # ports of the process that is gone are handed out again
        assert registry.lease(2) == [[p + 3], [p + 4]]
        _end(holder)
        assert registry.lease(4) == [[p + 5], [p + 6], [p + 7], [p + 1]]


def test_when_every_free_port_is_leased_leased_ones_that_are_free_are_handed_out(tmp_path, caplog):
    registry = _registry(tmp_path, size=2)
    p = registry.block.start
    assert registry.lease(2) == [[p], [p + 1]]
    assert registry.lease(1) == [[p]]  # this process leased both, and listens on neither
    assert f"every port of ports {p}-{p + 1} is leased" in caplog.text
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", p))
        b.bind(("127.0.0.1", p + 1))
        with pytest.raises(RuntimeError, match=rf"no 1 free port\(s\) in ports {p}-{p + 1} \(registry "):
            registry.lease(1)


@pytest.mark.parametrize(
    "line",
    [
        "F1207 15:39:44.765044 volume.go:629 Volume server listener error:listen tcp 127.0.0.1:42951: "
        "bind: address already in use",
        "java.net.BindException: Address already in use",
        "java.net.BindException: Failed to bind to /0.0.0.0:20007: Service 'MasterUI' failed after 0 retries",
        "ERROR [io.quarkus.runtime.ApplicationLifecycleManager] (main) Port 20229 seems to be in use by "
        "another process. Quarkus may already be running or the port is used by another application.",
        "Error: listen EADDRINUSE: address already in use 127.0.0.1:20001",
        "server.listen: cannot listen on 127.0.0.1:20001: Failed to bind to address 127.0.0.1:20001",
        "metrics.listen: cannot serve metrics on 127.0.0.1:20002: [Errno 98] Address already in use",
    ],
)
def test_what_each_server_says_of_a_taken_port_is_recognised(line):
    assert address_in_use(f"starting\n{line}\nexiting") == line
    assert address_in_use("Connection refused\nno such bucket") is None


# -- the race -------------------------------------------------------------------------------------


@pytest.mark.integration
def test_the_launchers_start_while_outgoing_connections_hold_every_ephemeral_port(tmp_path):
    """SeaweedFS (eight ports), fake-gcs-server, Azurite and a sidecar over TCP start, serve and
    listen outside the ephemeral range while outgoing connections hold all of it (the broker:
    tests/kafka/test_kafka_e2e.py). Before devstack/ports.py each of them failed here: the
    ports came from the range the connections hold."""
    from devstack.azurite import ensure_azurite
    from devstack.gcsserver import ensure_fake_gcs_server
    from devstack.s3server import ensure_seaweedfs

    ensure_seaweedfs(), ensure_fake_gcs_server(), ensure_azurite()  # the namespace has no network
    port_race.assert_all_started(port_race.run(tmp_path, ["s3", "gcs", "azure", "sidecar"]))


# -- a port taken anyway: the first start tries again ------------------------------------------


def _s3(tmp_path: Path):
    from devstack.s3server import SeaweedS3Server

    server = SeaweedS3Server(tmp_path / "s3")
    return server, "volume", lambda: server.create_bucket("again")  # the port the CI run lost


def _gcs(tmp_path: Path):
    from devstack.gcsserver import FakeGcsServer

    server = FakeGcsServer(tmp_path / "gcs")
    return server, "port", lambda: server.create_bucket("again")


def _azure(tmp_path: Path):
    from devstack.azurite import AzuriteServer

    server = AzuriteServer(tmp_path / "azure", in_memory=True)
    return server, "port", lambda: server.create_bucket("again")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("make", "restart"), [(_s3, False), (_gcs, True), (_azure, False)], ids=["s3", "gcs", "azure"]
)
def test_a_server_whose_port_was_taken_starts_again_on_new_ports(tmp_path, make: Callable, restart: bool):
    """Another program listens on a port the server was given, between the choice and the
    server's own bind (a program that does not lease its ports): the first start fails, the
    second runs on new ports, and the server's log says which port was taken and what the
    server said. A restart keeps the new ports (checked on the quickest server to start)."""
    server, name, use = make(tmp_path)
    taken = getattr(server, name)
    before = server.ports()
    with socket.socket() as other:
        other.bind(("127.0.0.1", taken))
        other.listen()
        with server:
            use()
            assert getattr(server, name) != taken
            assert not set(server.ports().values()) & set(before.values())
            restarted = server.ports()
            if restart:
                server.restart()  # later starts keep their ports: clients know them
                assert server.ports() == restarted
                use()
    log = server.log_file.read_text(errors="replace")
    note = next(line for line in log.splitlines() if line.startswith("devstack: "))
    shown = ", ".join(f"{n} {p}" for n, p in before.items())
    assert note.startswith(
        f"devstack: {server.name} start-up attempt 1 of 5 on ports {shown} failed, a port was taken: "
    )
    assert address_in_use(note.split("a port was taken: ", 1)[1]), note
    assert note.endswith("starting again on ports " + ", ".join(f"{n} {p}" for n, p in restarted.items()))


@pytest.mark.integration
@pytest.mark.parametrize("which", ["sidecar_port", "metrics_port"])
def test_a_sidecar_whose_port_was_taken_starts_again_on_new_ports(tmp_path, which):
    """The same for the sidecar of the local stack over TCP: its gRPC port (gRPC reports "Failed
    to bind to address") or its metrics port."""
    import urllib.request

    from devstack.stack import LocalStack

    stack = LocalStack(tmp_path / "stack", sidecar_tcp=True, metrics=True, encryption=False)
    taken = getattr(stack, which)
    try:
        with socket.socket() as other:
            other.bind(("127.0.0.1", taken))
            other.listen()
            sidecar = stack.start_sidecar()  # serving: its health check answered
            assert getattr(stack, which) != taken
            assert sidecar.target == stack.sidecar_target
            with urllib.request.urlopen(stack.metrics_url, timeout=10) as r:
                assert b"rsm_" in r.read()
        notes = [line for line in sidecar.log_file.read_text().splitlines() if line.startswith("devstack: ")]
        assert len(notes) == 1 and f" {taken}" in notes[0].split("failed")[0], notes
        assert "rsm-sidecar start-up attempt 1 of 5" in notes[0]
        port = stack.sidecar_port
        stack.restart_sidecar()  # the broker dials the same address
        assert stack.sidecar_port == port
    finally:
        stack.stop()


def test_a_start_that_fails_for_another_reason_is_not_retried(tmp_path):
    log = tmp_path / "server.log"
    attempts = []

    def start() -> None:
        attempts.append(1)
        log.write_text("FATAL: no such directory /data\n")
        raise RuntimeError("exited with status 1")

    with pytest.raises(RuntimeError, match="status 1"):
        ports.start_retrying(start, what="x", log_file=log, ports=dict, choose_new_ports=lambda: None)
    assert len(attempts) == 1


def test_a_port_taken_at_every_attempt_fails_after_the_last(tmp_path):
    log = tmp_path / "server.log"
    current = {"port": 1}

    def start() -> None:
        with open(log, "a") as f:
            f.write(f"listen tcp 127.0.0.1:{current['port']}: bind: address already in use\n")
        raise RuntimeError("exited with status 255")

    def choose() -> None:
        current["port"] += 1

    with pytest.raises(RuntimeError, match="status 255"):
        ports.start_retrying(
            start, what="weed", log_file=log, ports=lambda: dict(current), choose_new_ports=choose
        )
    notes = [line for line in log.read_text().splitlines() if line.startswith("devstack: ")]
    assert notes == [
        f"devstack: weed start-up attempt {i} of 5 on ports port {i} failed, a port was taken: "
        f"listen tcp 127.0.0.1:{i}: bind: address already in use; starting again on ports port {i + 1}"
        for i in range(1, 5)
    ]
