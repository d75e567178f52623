"""``rsm-sidecar serve`` as its own process (as in production) on port 0, with a client and
its memory figures: the memory tests and ``benchmarks/soak.py``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from tests.service.rsm_client import Client


def write_config(path: Path, root: Path | str, sections: str = "", server: str = "") -> Path:
    """A sidecar configuration file at ``path``: any free port (and the TOML lines ``server`` of
    ``[server]``), no metrics listener, a local store under ``root`` without fsync, then the TOML
    ``sections`` (other tables)."""
    path.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
{server}
[metrics]
listen = ""
[storage.local]
root = "{root}"
fsync = false
"""
        + sections
    )
    return path


class SidecarProcess:
    """``rsm-sidecar serve`` with the given config file; its port, learnt from the start-up
    log line, is ``address``."""

    def __init__(self, cfg_path: Path | str, timeout: float = 30):
        self.client: Client | None = None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rsm_sidecar.cli.main", "serve", "--config", str(cfg_path)],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        address = None
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and address is None:
            line = self.proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if '"listen"' in line:
                address = json.loads(line)["listen"]
        if not address:
            self.stop()
            raise AssertionError("sidecar did not start:\n" + "".join(seen[-20:]))
        stderr = self.proc.stderr
        threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
        self.address: str = address
        self.client = Client(address)
        self.ps = psutil.Process(self.proc.pid)

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        self.proc.terminate()
        self.proc.wait(30)
