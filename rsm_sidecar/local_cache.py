"""Where set-up keeps its downloads: ``$RSM_CACHE_DIR`` (default ``<repo>/.cache``), and the file
lock that keeps concurrent set-ups (``make -j``, pytest workers) from racing on it.

Standard library only: the set-up's tool builds (``devstack.compose_tools``, ``devstack.k8s_tools``,
the storage servers) import it through ``devstack.common`` with the machine's ``python3``, before
the virtualenv exists, so they can start at once beside ``pip install``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def cache_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``explicit``, else ``$RSM_CACHE_DIR``, else ``<repo>/.cache``."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get("RSM_CACHE_DIR", "").strip()
    return Path(env) if env else REPO_ROOT / ".cache"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` so that concurrent set-ups (pytest workers, make -j) do not race."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
