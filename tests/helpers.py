"""Small helpers shared by the tests."""

from __future__ import annotations

import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]

#: every test broker's: the JIT's first tier only. A Kafka JVM is ready after about 40 % less
#: CPU (3.7 s instead of 6.2 s per broker, measured), and the tests move tens of megabytes, not
#: gigabytes. (The benchmarks keep the JVM's defaults.)
BROKER_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1",)


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("RSM_CACHE_DIR", REPO / ".cache"))


def require_file(path: pathlib.Path, how: str) -> pathlib.Path:
    """A file the set-up command installs; a missing one fails the test with the fix."""
    if not path.exists():
        raise AssertionError(f"{path} is missing; run `{how}` (make test does it)")
    return path
