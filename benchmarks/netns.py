"""A network namespace joined to this one by a veth pair: a sidecar started in it is reached
over a real (virtual) Ethernet link with its own TCP stack, as a sidecar in another pod is,
instead of over the loopback interface or a Unix socket. Needs root (``ip netns``, ``ip link``).

    with NetNs("tcp-mtls-bench") as ns:
        subprocess.run([*ns.exec_prefix, "python", ...])   # runs inside, listens on ns.inner_ip
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zlib


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
    (a /30 in 10.231.0.0/16 derived from the name, so two benchmarks do not collide)."""

    def __init__(self, name: str):
        self.name = name
        n = zlib.crc32(name.encode()) % 16000
        base = 4 * n
        self.outer_ip = f"10.231.{base // 256}.{base % 256 + 1}"
        self.inner_ip = f"10.231.{base // 256}.{base % 256 + 2}"
        tag = f"{n:04x}"
        self.outer_if, self.inner_if = f"rsmh{tag}", f"rsms{tag}"

    @property
    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def __enter__(self) -> NetNs:
        why = available()
        if why:
            raise RuntimeError(f"cannot make a network namespace: {why}")
        self.close()  # a leftover of a killed run
        _ip("netns", "add", self.name)
        try:
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

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.outer_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)

    def __exit__(self, *exc: object) -> None:
        self.close()
