"""Small helpers shared by the tests."""

from __future__ import annotations

import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("RSM_CACHE_DIR", REPO / ".cache"))


def require_file(path: pathlib.Path, how: str) -> pathlib.Path:
    """A file the set-up command installs; a missing one fails the test with the fix."""
    if not path.exists():
        raise AssertionError(f"{path} is missing; run `{how}` (make test does it)")
    return path
