"""Helpers every devstack launcher uses: where downloads go, a cross-process lock for
set-up steps (both shared with the Iceberg jar resolver), and free loopback ports."""

from __future__ import annotations

import socket
from pathlib import Path

from rsm_sidecar.iceberg.jars import cache_dir, file_lock

__all__ = ["HOST", "REPO_ROOT", "default_cache_dir", "file_lock", "free_port"]

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parent.parent


def default_cache_dir() -> Path:
    """``$RSM_CACHE_DIR`` if set, else ``.cache`` at the repository root."""
    return cache_dir()


def free_port(host: str = HOST) -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
