"""A network namespace joined to this one by a veth pair: a sidecar started in it is reached
over a real (virtual) Ethernet link with its own TCP stack, as a sidecar in another pod is,
instead of over the loopback interface or a Unix socket. Needs root (``ip netns``, ``ip link``).

    with NetNs("tcp-mtls-bench") as ns:
        subprocess.run([*ns.exec_prefix, "python", ...])   # runs inside, listens on ns.inner_ip
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root (ip netns needs CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    return None


class NetNs:
    """Namespace ``name`` with ``inner_ip`` on its end of a veth pair, ``outer_ip`` on ours
    (a /30 in 10.231.0.0/16 derived from the name, so two benchmarks do not collide).

    One process at a time holds a name (an ``flock`` while the namespace lives): a second run of
    the same benchmark is refused, rather than deleting the namespace and veth pair of the one
    running, whose broker then lost its sidecar. A namespace left by a killed run holds no lock
    and is removed.
    """

    def __init__(self, name: str):
        self.name = name
        n = zlib.crc32(name.encode()) % 16000
        base = 4 * n
        self.outer_ip = f"10.231.{base // 256}.{base % 256 + 1}"
        self.inner_ip = f"10.231.{base // 256}.{base % 256 + 2}"
        tag = f"{n:04x}"
        self.outer_if, self.inner_if = f"rsmh{tag}", f"rsms{tag}"
        self._lock: int | None = None

    @property
    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def __enter__(self) -> NetNs:
        why = available()
        if why:
            raise RuntimeError(f"cannot make a network namespace: {why}")
        self._hold_name()
        self._remove()  # a leftover of a killed run
        try:
            _ip("netns", "add", self.name)
            _ip("link", "add", self.outer_if, "type", "veth", "peer", "name", self.inner_if)
            _ip("link", "set", self.inner_if, "netns", self.name)
            _ip("addr", "add", f"{self.outer_ip}/30", "dev", self.outer_if)
            _ip("link", "set", self.outer_if, "up")
            inside = ["netns", "exec", self.name, "ip"]
            _ip(*inside, "addr", "add", f"{self.inner_ip}/30", "dev", self.inner_if)
            _ip(*inside, "link", "set", self.inner_if, "up")
            _ip(*inside, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _hold_name(self) -> None:
        path = Path(tempfile.gettempdir()) / f"rsm-netns-{self.name}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(
                f"network namespace {self.name} is in use by another run (it holds {path}): "
                "wait for that run to end; two runs would share its addresses"
            ) from None
        self._lock = fd

    def _remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.outer_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)

    def close(self) -> None:
        """Remove the namespace and its veth pair, if this object made them."""
        if self._lock is None:
            return
        try:
            self._remove()
        finally:
            os.close(self._lock)  # releases the name
            self._lock = None

    def __exit__(self, *exc: object) -> None:
        self.close()
