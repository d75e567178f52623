"""The sidecar with the end-to-end tests' faults: run as the stack's sidecar prefix
(``LocalStack(sidecar_prefix=FAULT_SIDECAR)``), it puts into :mod:`rsm_sidecar.service.hooks`
the faults its environment asks for, then runs the command that follows it
(``python -m rsm_sidecar.cli.main serve ...``) in its own process. With none asked, the sidecar
runs as it ships. No real server can be made to reach these instants otherwise.

``RSM_TEST_HOLD_COPY_DIR=<dir>``: a copy that has stored its whole segment (manifest written,
journal entry settled) takes the file ``<dir>/hold`` if there is one, by renaming it to
``<dir>/held-<segment id>`` (so one hold file holds exactly one copy), and then, before it
answers, waits until the caller has gone away or ``<dir>/release`` exists. The orphans
cross-check test kills the broker meanwhile: the segment is complete in storage and the broker
never records COPY_SEGMENT_FINISHED (tests/e2e/test_orphans_kafka.py).

``RSM_TEST_FETCH_SLOT_HOLD_MS=<ms>``: every fetch and index fetch holds its slot that long before
it reads anything, so concurrent calls surely meet a full ``fetch.max_concurrent`` (the
busy-sidecar test, tests/e2e/test_remote_sidecar.py: on a fast machine a broker's parallel remote
reads of small segments overlapped in the sidecar only 0-2 times, too few to test back-pressure
every run).
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from collections.abc import Callable

from rsm_sidecar.service import hooks

HOLD_COPY_DIR = "RSM_TEST_HOLD_COPY_DIR"
FETCH_SLOT_HOLD_MS = "RSM_TEST_FETCH_SLOT_HOLD_MS"
POLL_SECONDS = 0.05
#: the prefix of the sidecar's command that runs it with these faults
FAULT_SIDECAR = (sys.executable, "-m", "tests.e2e.fault_sidecar")


def hold_after_copy(
    directory: str, segment_id: str, is_active: Callable[[], bool], touch: Callable[[], None]
) -> None:
    try:
        os.rename(os.path.join(directory, "hold"), os.path.join(directory, f"held-{segment_id}"))
    except FileNotFoundError:
        return
    release = os.path.join(directory, "release")
    while is_active() and not os.path.exists(release):
        touch()  # no idle timeout while held
        time.sleep(POLL_SECONDS)


def install(environ: dict[str, str]) -> None:
    """The faults ``environ`` asks for, into the service's hooks."""
    directory = environ.get(HOLD_COPY_DIR)
    if directory:
        hooks.after_copy = lambda segment_id, is_active, touch: hold_after_copy(
            directory, segment_id, is_active, touch
        )
    hold_ms = environ.get(FETCH_SLOT_HOLD_MS)
    if hold_ms:
        hooks.before_fetch = lambda: time.sleep(int(hold_ms) / 1000)


def main(command: list[str]) -> None:
    """Run ``command`` (``<python> -m <module> <args>``) here, with the faults installed."""
    if len(command) < 3 or command[1] != "-m":
        raise SystemExit(
            f"usage: python -m tests.e2e.fault_sidecar <python> -m <module> [args]; got {command}"
        )
    install(dict(os.environ))
    sys.argv = [command[2], *command[3:]]
    runpy.run_module(command[2], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
