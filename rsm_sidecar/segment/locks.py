"""One operation at a time per segment key inside a sidecar.

Copies, deletes and journal sweeps of the same segment (same object keys) are
serialised: a second copy of a segment id waits until the first one has finished,
including its cleanup, so an older attempt can never delete what a newer one wrote,
and a sweep never runs while a copy of that segment is in flight. Waiting stops when
the caller goes away (``is_cancelled``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from rsm_sidecar.errors import Cancelled

POLL_SECONDS = 0.05


class SegmentLocks:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: set[str] = set()

    @contextlib.contextmanager
    def hold(
        self, base: str, is_cancelled: Callable[[], bool] = lambda: False, what: str = "operation"
    ) -> Iterator[None]:
        """Hold ``base``; waits for the current holder, raising ``Cancelled`` if the caller
        goes away meanwhile."""
        with self._cond:
            while base in self._held:
                if is_cancelled():
                    raise Cancelled(
                        f"{what} cancelled by the caller while waiting for another operation on {base}"
                    )
                self._cond.wait(POLL_SECONDS)
            self._held.add(base)
        try:
            yield
        finally:
            self._release(base)

    @contextlib.contextmanager
    def try_hold(self, base: str) -> Iterator[bool]:
        """Hold ``base`` if nobody does; yields whether it is held."""
        with self._cond:
            taken = base not in self._held
            if taken:
                self._held.add(base)
        try:
            yield taken
        finally:
            if taken:
                self._release(base)

    def _release(self, base: str) -> None:
        with self._cond:
            self._held.discard(base)
            self._cond.notify_all()
