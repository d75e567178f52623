"""The upload budget of one sidecar: bytes per second that all its copies together may store.

A token bucket that may go into debt: ``acquire(n)`` takes ``n`` bytes at once and, when the
bucket is short, sleeps until the debt is paid back at ``bytes_per_second``. The bucket holds
at most one second of budget, so an idle sidecar may send one second's worth at once and the
rate over any longer window stays within the limit. Chunks larger than a second's budget are
fine: they wait longer. Copies share one limiter (a lock orders them), so a backlog of copies
cannot saturate the broker's network (Aiven's ``upload.rate.limit.bytes.per.second``; the
broker's own ``remote.log.manager.copy.max.bytes.per.second`` limits per broker instead).

While it waits, ``acquire`` checks ``is_cancelled`` and calls ``heartbeat`` about twice a
second: a copy that waits for its budget is making progress, not idle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rsm_sidecar.errors import Cancelled

#: longest sleep between two cancellation checks and heartbeats
_SLICE_SECONDS = 0.5


class RateLimiter:
    def __init__(self, bytes_per_second: int, clock: Callable[[], float] = time.monotonic):
        if bytes_per_second <= 0:
            raise ValueError(f"bytes_per_second must be positive, not {bytes_per_second}")
        self.rate = float(bytes_per_second)
        self.capacity = float(bytes_per_second)  # one second of budget
        self._clock = clock
        self._tokens = 0.0
        self._last = clock()
        self._lock = threading.Lock()

    def acquire(
        self,
        nbytes: int,
        is_cancelled: Callable[[], bool] = lambda: False,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> float:
        """Take ``nbytes`` of budget, sleeping until it is paid for; returns the seconds slept."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
            self._last = now
            self._tokens -= nbytes
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return wait
            if is_cancelled():
                raise Cancelled("cancelled while waiting for the upload budget (copy.upload_rate_limit)")
            time.sleep(min(left, _SLICE_SECONDS))
            heartbeat()
