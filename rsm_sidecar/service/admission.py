"""Keeping the sidecar responsive under load and against stalled clients.

* ``Slots``: at most N calls of a kind at once; the next one is refused at once with
  ``RESOURCE_EXHAUSTED`` instead of waiting for a gRPC worker thread, so copies that stall
  can never take the threads that health checks, fetches and deletes need.
* ``IdleWatchdog``: a call that makes no progress for its idle timeout (a copy stream
  that sends nothing, a fetch stream whose client reads nothing) is cancelled, which
  frees its slot and its thread; the handler then reports why.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import grpc

from rsm_sidecar.errors import ResourceExhausted


class Slots:
    def __init__(self, kind: str, limit: int, setting: str):
        self.kind = kind
        self.limit = limit
        self.setting = setting
        self._sem = threading.BoundedSemaphore(limit)

    @contextlib.contextmanager
    def take(self) -> Iterator[None]:
        if not self._sem.acquire(blocking=False):
            raise ResourceExhausted(
                f"all {self.limit} {self.kind} slots are busy ({self.setting}); retry later"
            )
        try:
            yield
        finally:
            self._sem.release()


class Watch:
    """One watched call: ``touch()`` on progress; ``expired`` once the watchdog cancelled it."""

    def __init__(self, context: grpc.ServicerContext, timeout: float):
        self.context = context
        self.timeout = timeout
        self.last = time.monotonic()
        self.expired = False

    def touch(self) -> None:
        self.last = time.monotonic()


class IdleWatchdog:
    def __init__(self, tick: float = 1.0):
        self._tick = tick
        self._watches: set[Watch] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idle-watchdog", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def watch(self, context: grpc.ServicerContext, timeout: float) -> Iterator[Watch]:
        w = Watch(context, timeout)
        if timeout > 0:
            with self._lock:
                self._watches.add(w)
        try:
            yield w
        finally:
            with self._lock:
                self._watches.discard(w)

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            now = time.monotonic()
            with self._lock:
                expired = [w for w in self._watches if now - w.last > w.timeout]
                for w in expired:
                    self._watches.discard(w)
            for w in expired:
                w.expired = True
                w.context.cancel()

    def close(self) -> None:
        self._stop.set()
