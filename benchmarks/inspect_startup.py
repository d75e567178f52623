"""Start-up cost of `rsm-sidecar inspect ls` on a local-directory store: the modules the
command imports (counted with `python -X importtime`) and the wall time of the whole
process (median of --runs).

    .venv/bin/python -m benchmarks.inspect_startup [--segments 4] [--runs 10] [--keep DIR]

The store holds --segments copies of a real broker segment (tests/fixtures/kafka/producer-zstd),
copied by the sidecar's copier. With --keep DIR the store and its `sidecar.toml` stay in DIR,
so the command can be timed by other tools too. The machine is shared and noisy: compare
against a baseline measured in the same run, not against seconds from another day.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.settings import CopySettings
from rsm_sidecar.storage.local import LocalObjectStore

REPO = Path(__file__).resolve().parents[1]
SEGMENT = REPO / "tests" / "fixtures" / "kafka" / "producer-zstd" / "00000000000000000000.log"
HEAVY = ("boto3", "botocore", "google.cloud.storage", "pyspark", "pyiceberg", "pyarrow")


class FileSource:
    """A segment file read in 1 MiB pieces; empty indexes."""

    def __init__(self, path: Path):
        self.path = path
        self.log_size = path.stat().st_size

    def log_pieces(self, size: int) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            while data := f.read(1024 * 1024):
                yield data

    def index_files(self) -> dict[str, bytes | None]:
        return {"offset": b"", "timestamp": b"", "producerSnapshot": b"", "transaction": None}


def make_store(work: Path, segments: int) -> Path:
    """A local store holding ``segments`` segments; returns its configuration file."""
    root = work / "store"
    store = LocalObjectStore(root, fsync=False)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        copier = SegmentCopier(store, KeyLayout(""), None, CopySettings(), pool)
        for n in range(segments):
            md = SegmentMetadata(
                "MWJ6FHTfRYy67jzwZdeqSQ",
                "bench",
                n % 2,
                f"B{n:021d}",
                n * 1000,
                n * 1000 + 39,
                segment_size=SEGMENT.stat().st_size,
            )
            copier.copy(md, FileSource(SEGMENT), b"0\n0\n")
    config = work / "sidecar.toml"
    config.write_text(f'[storage]\nbackend = "local"\n\n[storage.local]\nroot = "{root}"\n')
    return config


def command(config: Path) -> list[str]:
    return [sys.executable, "-m", "rsm_sidecar.cli.main", "inspect", "ls", "--quiet", "--config", str(config)]


def imported_modules(config: Path) -> tuple[int, list[str]]:
    """How many modules the command imports, and which of the heavy ones."""
    cmd = [sys.executable, "-X", "importtime", *command(config)[1:]]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    names = [
        line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")
    ]
    names = [n for n in names if n and n != "package"]
    heavy = sorted({h for h in HEAVY for n in names if n.strip() == h or n.strip().startswith(h + ".")})
    return len(names), heavy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--keep", type=Path, help="build the store here and keep it")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="rsm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    config = make_store(work, args.segments)
    listing = subprocess.run(command(config), capture_output=True, text=True, check=True).stdout
    modules, heavy = imported_modules(config)
    times = []
    for _ in range(args.runs + 1):
        t0 = time.perf_counter()
        subprocess.run(command(config), capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    times = times[1:]  # the first run warms the page cache
    print(listing)
    print(f"`rsm-sidecar inspect ls` on a local store of {args.segments} segments ({config}):")
    print(f"  modules imported: {modules}; heavy ones among them: {', '.join(heavy) or 'none'}")
    print(
        f"  wall time: median {statistics.median(times) * 1000:.0f} ms "
        f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}; {args.runs} runs)"
    )


if __name__ == "__main__":
    main()
