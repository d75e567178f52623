"""Loopback ports for the servers devstack starts, and starting a server again when one was taken.

A port the kernel picks for ``bind(("127.0.0.1", 0))`` comes from its ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), the range every outgoing connection takes its
local port from. Released and handed to a server a moment later, such a port can be taken by any
connection in between: with the three lanes of ``make test`` connecting brokers, clients and
Spark at once, ``weed server`` once found one of its eight ports taken (``bind: address already
in use``) and four tests failed. So:

* :func:`free_ports` hands out ports from a block *outside* the ephemeral range
  (:func:`port_block`: the 12,768 ports below it, 20000-32767 with Linux's default
  32768-60999), where no outgoing connection takes its port.
* Every process of the user (the lanes, other checkouts' runs, ``make up``) takes them through
  one registry (:class:`PortRegistry`, a JSON file under a file lock in ``/tmp``): it hands the
  block out in turn, from where the last process stopped, and records each port with the process
  it was handed to; a port leased to a living process is not handed out again, and every port is
  checked with a bind before it is (a server that does not use the registry may listen there).
* :func:`start_retrying` is what a launcher's first start does if a server still finds a port
  taken (a program outside the registry bound it between the check and the server's own bind):
  it starts the server again on new ports, up to :data:`START_ATTEMPTS` times, and notes each
  failed attempt (the ports, the server's own words) in the server's log. Later starts (a
  restart) keep their ports: clients know them.

Standard library only (imported through ``devstack.common`` before the virtualenv exists).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from rsm_sidecar.local_cache import file_lock

__all__ = [
    "START_ATTEMPTS",
    "PortRegistry",
    "address_in_use",
    "ephemeral_range",
    "free_port",
    "free_ports",
    "port_block",
    "port_pair",
    "registry",
    "start_retrying",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: the lowest port handed out: below it sit the services people start by hand (Kafka's 9092,
#: 8080, databases)
LOWEST_PORT = 10000
#: the most ports in the block (a lane of ``make test`` leases a few thousand in a run)
BLOCK_SIZE = 12768
#: a block smaller than this beside the ephemeral range is not worth it: the range is used
MIN_BLOCK = 1024
#: how many times :func:`start_retrying` starts a server in all
START_ATTEMPTS = 5
#: what servers say when a port is taken: Go (``bind: address already in use``), Java
#: (``java.net.BindException: Address already in use``; Spark's and Jetty's ``Failed to bind
#: to /0.0.0.0:<port>``; Quarkus' ``Port <port> seems to be in use by another process``), Node
#: (``EADDRINUSE``), Python (``[Errno 98] Address already in use``), gRPC core (``Failed to bind
#: to address``)
_IN_USE = re.compile(
    r"address already in use|EADDRINUSE|Failed to bind to|BindException|in use by another process",
    re.IGNORECASE,
)


# -- where ports come from ----------------------------------------------------------------------
def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), in this network namespace; Linux's
    default when the file cannot be read."""
    try:
        first, last = (int(v) for v in path.read_text().split())
        return first, last
    except (OSError, ValueError):
        return 32768, 60999


def port_block(ephemeral: tuple[int, int] | None = None) -> range:
    """The ports handed out: up to :data:`BLOCK_SIZE` just below the ephemeral range, else just
    above it; when neither side has :data:`MIN_BLOCK` ports, all ports from
    :data:`LOWEST_PORT` (the leases, the bind check and the retries still apply)."""
    first, last = ephemeral or ephemeral_range()
    if first - LOWEST_PORT >= MIN_BLOCK:
        return range(max(LOWEST_PORT, first - BLOCK_SIZE), first)
    if 65535 - last >= MIN_BLOCK:
        return range(last + 1, min(65536, last + 1 + BLOCK_SIZE))
    return range(LOWEST_PORT, 65536)


def _bindable(port: int) -> bool:
    """Nobody holds ``port`` on any local IPv4 address (no listener, no connection, no
    TIME_WAIT: no ``SO_REUSEADDR``, the strictest check)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), None if there is no such process:
    with the pid, it names one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


# -- the registry -------------------------------------------------------------------------------
class PortRegistry:
    """The ports handed out from ``block``, shared by every process that uses ``directory``.

    ``leases.json`` holds where the next search starts and, per port handed out, the process
    it went to (pid and start time); ``leases.lock`` serialises the processes. A lease ends
    when its process does; a port whose owner is gone is still checked with a bind before it
    is handed out again (a server that outlived its launcher holds it)."""

    def __init__(self, directory: Path, block: range | None = None):
        self.directory = Path(directory)
        self.block = block if block is not None else port_block()
        self.path = self.directory / "leases.json"
        self.lock = self.directory / "leases.lock"

    def lease(self, count: int, offsets: tuple[int, ...] = (0,)) -> list[list[int]]:
        """``count`` groups of ports ``[p + o for o in offsets]``, every port in the block, free
        (bind check) and leased to no living process; leased to this process now."""
        if count == 0:
            return []
        span = len(self.block)
        if any(o >= span for o in offsets) or span == 0:
            raise RuntimeError(f"the port block {self._describe()} is too small for offsets {offsets}")
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with file_lock(self.lock):
            nxt, leases = self._load()
            owner = [os.getpid(), _process_start(os.getpid())]
            start = self.block.index(nxt) if nxt in self.block else 0
            groups = self._search(count, offsets, start, leases)
            if groups is None:
                # every free port is leased to a living process: take leased ones that pass the
                # bind check (their owners keep ports they serve on: the check sees those)
                log.warning(
                    "every port of %s is leased; handing out leased ports that are free", self._describe()
                )
                groups = self._search(count, offsets, start, {})
            if groups is None:
                raise RuntimeError(
                    f"no {count} free port(s) in {self._describe()} (registry {self.path}): "
                    "is something else listening on all of them?"
                )
            for group in groups:
                for port in group:
                    leases[port] = owner
            last = self.block.index(groups[-1][0])
            self._save(self.block[(last + 1) % span], leases)
        return groups

    def _search(
        self, count: int, offsets: tuple[int, ...], start: int, leases: Mapping[int, object]
    ) -> list[list[int]] | None:
        span = len(self.block)
        taken = set(leases)
        found: list[list[int]] = []
        for step in range(span):
            group = [self.block[(start + step) % span] + o for o in offsets]
            if any(p in taken or p not in self.block for p in group) or not all(map(_bindable, group)):
                continue
            found.append(group)
            taken.update(group)
            if len(found) == count:
                return found
        return None

    def _load(self) -> tuple[int, dict[int, list[int | None]]]:
        """Where to start, and the leases of living processes."""
        try:
            state = json.loads(self.path.read_text())
            nxt = int(state["next"])
            recorded = {int(port): (int(pid), started) for port, (pid, started) in state["leases"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none yet, or damaged
            return self.block.start, {}
        alive: dict[tuple[int, int | None], bool] = {}
        leases: dict[int, list[int | None]] = {}
        for port, owner in recorded.items():
            if owner not in alive:
                alive[owner] = owner[1] is not None and _process_start(owner[0]) == owner[1]
            if alive[owner]:
                leases[port] = list(owner)
        return nxt, leases

    def _save(self, nxt: int, leases: Mapping[int, list[int | None]]) -> None:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"next": nxt, "leases": {str(p): o for p, o in sorted(leases.items())}}))
        os.replace(tmp, self.path)

    def _describe(self) -> str:
        return f"ports {self.block.start}-{self.block.stop - 1}"


def _user_id() -> int:
    """This process's user id outside any user namespace (``unshare --map-root-user`` makes it
    0 inside): the namespace's processes share the user's registry."""
    uid = os.getuid()
    try:
        for line in Path("/proc/self/uid_map").read_text().splitlines():
            inside, outside, count = (int(v) for v in line.split())
            if inside <= uid < inside + count:
                return outside + uid - inside
    except (OSError, ValueError):
        pass
    return uid


def _registry_dir() -> Path:
    """One registry per user and machine: ``/tmp`` whatever ``$TMPDIR`` a process has."""
    return Path("/tmp") / f"rsm-devstack-ports-{_user_id()}"


_registry: PortRegistry | None = None


def registry() -> PortRegistry:
    """This machine's registry for this user (the block of this network namespace)."""
    global _registry
    if _registry is None:
        _registry = PortRegistry(_registry_dir())
    return _registry


def free_port() -> int:
    """A loopback port for a server to listen on: from the block outside the ephemeral range,
    free, and leased to this process (see the module's description)."""
    return registry().lease(1)[0][0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports as :func:`free_port` gives them."""
    return [group[0] for group in registry().lease(n)]


def port_pair(offset: int) -> tuple[int, int]:
    """Ports ``p`` and ``p + offset``, both as :func:`free_port` gives them (a server that derives
    one port from the other: ``weed mini``'s admin and its worker's gRPC port)."""
    p, q = registry().lease(1, (0, offset))[0]
    return p, q


# -- a start that finds a port taken ------------------------------------------------------------
def address_in_use(text: str) -> str | None:
    """The first line of a server's output that says a port it wanted was taken, else None."""
    for line in text.splitlines():
        if _IN_USE.search(line):
            return line.strip()
    return None


def _since(path: Path, offset: int, limit: int = 8 * 1024 * 1024) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def start_retrying(
    start: Callable[[], T],
    *,
    what: str,
    log_file: Path,
    ports: Callable[[], Mapping[str, int | None]],
    choose_new_ports: Callable[[], None] | None,
    attempts: int = START_ATTEMPTS,
) -> T:
    """``start()``; when it fails and what the server wrote to ``log_file`` during that attempt
    says a port was taken, ``choose_new_ports()`` and ``start()`` again, up to ``attempts`` times
    in all, each failed attempt noted in ``log_file`` (``devstack: ...``: the ports, the server's
    line). ``choose_new_ports`` None (ports given, or a restart): one attempt. ``start`` must
    leave no server running when it fails."""
    for attempt in range(1, attempts + 1):
        offset = log_file.stat().st_size if log_file.exists() else 0
        try:
            return start()
        except Exception:
            taken = address_in_use(_since(log_file, offset))
            if taken is None or choose_new_ports is None or attempt == attempts:
                raise
            before = dict(ports())
            choose_new_ports()
            note = (
                f"devstack: {what} start-up attempt {attempt} of {attempts} on ports {_ports(before)} "
                f"failed, a port was taken: {taken[:300]}; starting again on ports {_ports(ports())}"
            )
            log.warning("%s (log %s)", note, log_file)
            with open(log_file, "a") as f:
                f.write(note + "\n")
    raise AssertionError("unreachable")  # pragma: no cover


def _ports(ports: Mapping[str, int | None]) -> str:
    return ", ".join(f"{name} {port}" for name, port in ports.items() if port is not None)
