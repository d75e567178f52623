"""`make test`'s pytest run in two lanes at once: the container modules (podman: the compose
cluster and the remote topology, ``podman_images.CONTAINER_MODULES``) in one pytest process,
everything else in another.

Run after everything else, as `pytest` alone runs them, they added 5 minutes to a 40-minute
suite. In their own lane their images build and their containers run at a lower CPU priority
(``podman_images.NICE``: the podman service, and with it every container, inherits it), beside
the main lane's brokers and Spark, which wait on timers and I/O for much of their time. The main
lane's output streams; the container lane's is printed in one piece after it, then the exit
status is the worse of the two. Arguments go to both lanes (``python -m tests.lanes -x``);
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


def main(
    argv: list[str], side: tuple[str, ...] = CONTAINER_MODULES, cwd: Path = REPO, work: Path | None = None
) -> int:
    """Runs pytest with ``argv`` on the modules ``side`` (paths relative to ``cwd``) and, at the
    same time, on everything else; the exit status is the worse of the two. The side lane's log
    and base temp go to ``work`` (a new temp directory by default, removed when that lane passed)."""
    pytest = [sys.executable, "-m", "pytest", *argv]
    if work is None:
        work = Path(tempfile.mkdtemp(prefix="rsm-test-lanes-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "containers.log"
    with log.open("wb") as out:
        containers = subprocess.Popen(
            # its own base temp and no cache writes: two pytest processes share neither
            [*pytest, "-p", "no:cacheprovider", f"--basetemp={work / 'tmp'}", *side],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            main_lane = subprocess.call([*pytest, *(f"--ignore={m}" for m in side)], cwd=cwd)
        except BaseException:  # interrupted: the container lane ends with it
            containers.terminate()
            containers.wait()
            raise
        container_lane = containers.wait()
    print(f"\n{'=' * 24} the container lane: {' '.join(side)} {'=' * 24}", flush=True)
    sys.stdout.buffer.write(log.read_bytes())
    sys.stdout.flush()
    print(f"lanes: the main lane exited {main_lane}, the container lane {container_lane}")
    if container_lane == 0:
        shutil.rmtree(work, ignore_errors=True)
    return main_lane or container_lane


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
