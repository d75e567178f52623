"""Fault hooks for tests, set through environment variables; with none set (any deployment)
they do nothing.

``RSM_TEST_HOLD_COPY_DIR=<dir>``: a copy that has stored its whole segment (manifest written,
journal entry settled) takes the file ``<dir>/hold`` if there is one, by renaming it to
``<dir>/held-<segment id>`` (so one hold file holds exactly one copy), and then, before it
answers, waits until the caller has gone away or ``<dir>/release`` exists. The orphans
cross-check test kills the broker meanwhile: the segment is complete in storage and the broker
never records COPY_SEGMENT_FINISHED (tests/e2e/test_orphans_kafka.py). No real server can be
made to die at that instant otherwise.

``RSM_TEST_FETCH_SLOT_HOLD_MS=<ms>``: every fetch and index fetch holds its slot that long before
it reads anything, so concurrent calls surely meet a full ``fetch.max_concurrent`` (the busy-sidecar
test, tests/e2e/test_remote_sidecar.py: on a fast machine a broker's parallel remote reads of small
segments overlapped in the sidecar only 0-2 times, too few to test back-pressure every run).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

HOLD_COPY_DIR = "RSM_TEST_HOLD_COPY_DIR"
FETCH_SLOT_HOLD_MS = "RSM_TEST_FETCH_SLOT_HOLD_MS"
POLL_SECONDS = 0.05


def hold_after_copy(segment_id: str, is_active: Callable[[], bool], touch: Callable[[], None]) -> None:
    directory = os.environ.get(HOLD_COPY_DIR)
    if not directory:
        return
    try:
        os.rename(os.path.join(directory, "hold"), os.path.join(directory, f"held-{segment_id}"))
    except FileNotFoundError:
        return
    release = os.path.join(directory, "release")
    while is_active() and not os.path.exists(release):
        touch()  # no idle timeout while held
        time.sleep(POLL_SECONDS)


def hold_fetch_slot() -> None:
    hold = os.environ.get(FETCH_SLOT_HOLD_MS)
    if hold:
        time.sleep(int(hold) / 1000)
