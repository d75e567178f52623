"""`make test`'s pytest run in three lanes at once, each a pytest process of its own:

* **containers**: the container modules (podman: the compose cluster and the remote topology,
  ``podman_images.CONTAINER_MODULES``), the three-broker cluster tests (``tests/cluster``), the
  service's (but its memory-bound measurements, ``MEMORY_MODULES``) and the storage backends'
  tests (``tests/service``, ``tests/storage``). The images
  build in a background thread at a lower CPU priority (``podman_images.NICE``: the podman
  service, and with it every container, inherits it) while the other tests of the lane run.
* **brokers**: the end-to-end modules on one broker (``tests/e2e``), the inspection tools
  (``tests/inspect``) and Kafka's formats (``tests/kafka``).
* **main**: everything else (Spark and Iceberg, the shim, formats, segments). Spark slows the
  most when the cores are shared, so this lane got the least besides it: with the service and
  storage tests here it ended 10-14 minutes after the other two.

Why: in one lane the suite kept the 2 cores about half busy (vmstat every 10 s through a run:
user + system 30-60 %, often under 10 %): brokers, Kafka's tiering timers, Spark and the
containers wait on timers and I/O for much of their time. `make test` on clean clones took
47.3 min in one lane, 40.9-41.8 in two (the container lane beside the rest); three: README.

The main lane's output streams; each side lane's is printed in one piece after it, then the
exit status is the worst of them. Arguments go to every lane (``python -m tests.lanes -x``);
``pytest`` alone still runs everything in one process, the container modules last.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.podman_images import CONTAINER_MODULES

REPO = Path(__file__).resolve().parents[1]

#: the service's memory-bound measurements (RSS of a sidecar process while it copies 1 GiB) stay
#: in the main lane, away from the container builds: under that load gRPC's own flow-control
#: window once let a stream-mode copy grow RSS by 67.6 MiB (bound 64); the window is now fixed
#: (server.stream_window_bytes, operations.md "Memory"), and the quieter lane keeps the figures comparable
MEMORY_MODULES = ("tests/service/test_resources.py",)
SERVICE_MODULES = tuple(
    str(p.relative_to(REPO))
    for p in sorted((REPO / "tests" / "service").glob("test_*.py"))
    if str(p.relative_to(REPO)) not in MEMORY_MODULES
)

#: (name, paths) of each lane beside the main one; a path is a module or a directory
SIDE_LANES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("containers", ("tests/cluster", *SERVICE_MODULES, "tests/storage", *CONTAINER_MODULES)),
    ("brokers", ("tests/e2e", "tests/inspect", "tests/kafka")),
)


def main(
    argv: list[str],
    side: tuple[tuple[str, tuple[str, ...]], ...] = SIDE_LANES,
    cwd: Path = REPO,
    work: Path | None = None,
) -> int:
    """Runs pytest with ``argv`` on each side lane's paths (relative to ``cwd``) and, at the
    same time, on everything else; the exit status is the worst of them. Each side lane's log
    and base temp go to ``work`` (a new temp directory by default, removed when every side lane
    passed)."""
    pytest = [sys.executable, "-m", "pytest", *argv]
    if work is None:
        work = Path(tempfile.mkdtemp(prefix="rsm-test-lanes-"))
    work.mkdir(parents=True, exist_ok=True)
    lanes: list[tuple[str, tuple[str, ...], Path, subprocess.Popen[bytes]]] = []
    try:
        for name, paths in side:
            log = work / f"{name}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    # its own base temp and no cache writes: the pytest processes share neither
                    [*pytest, "-p", "no:cacheprovider", f"--basetemp={work / name}", *paths],
                    cwd=cwd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            lanes.append((name, paths, log, proc))
        ignored = [f"--ignore={p}" for _, paths in side for p in paths]
        main_lane = subprocess.call([*pytest, *ignored], cwd=cwd)
    except BaseException:  # interrupted: the side lanes end with it
        for *_, proc in lanes:
            proc.terminate()
        for *_, proc in lanes:
            proc.wait()
        raise
    statuses = [("main", main_lane)]
    for name, paths, log, proc in lanes:
        status = proc.wait()
        print(f"\n{'=' * 24} the {name} lane: {' '.join(paths)} {'=' * 24}", flush=True)
        sys.stdout.buffer.write(log.read_bytes())
        sys.stdout.flush()
        statuses.append((name, status))
    print("lanes: " + ", ".join(f"the {name} lane exited {status}" for name, status in statuses))
    if all(status == 0 for _, status in statuses[1:]):
        shutil.rmtree(work, ignore_errors=True)
    return next((status for _, status in statuses if status != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
