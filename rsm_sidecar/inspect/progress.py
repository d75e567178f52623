"""Progress lines on stderr for long work (plain lines, rate-limited; no terminal tricks,
so they read well in logs and CI too)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rsm_sidecar.inspect.output import human_bytes


class Progress:
    """``advance()`` after each item; a line at most every ``interval`` seconds and one at
    ``done()`` (only if a line was printed before, so short runs stay quiet)."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        unit: str = "segments",
        *,
        enabled: bool = True,
        interval: float = 2.0,
        stream: TextIO | None = None,
        clock=time.monotonic,
    ):
        self.label = label
        self.total = total
        self.unit = unit
        self.enabled = enabled
        self.interval = interval
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.items = 0
        self.bytes = 0
        self.started = clock()
        self._last = self.started
        self._printed = False

    def advance(self, items: int = 1, nbytes: int = 0) -> None:
        self.items += items
        self.bytes += nbytes
        now = self.clock()
        if self.enabled and now - self._last >= self.interval:
            self._emit(now)

    def add_bytes(self, nbytes: int) -> None:
        self.advance(0, nbytes)

    def _emit(self, now: float, final: bool = False) -> None:
        parts = []
        if self.unit:
            count = f"{self.items}/{self.total}" if self.total is not None else str(self.items)
            parts.append(f"{count} {self.unit}")
        elapsed = now - self.started
        if self.bytes:
            rate = f" ({human_bytes(self.bytes / elapsed)}/s)" if elapsed > 0 else ""
            parts.append(f"{human_bytes(self.bytes)}{rate}")
        print(
            f"{self.label}: {', '.join(parts)}{' done' if final else ''} [{elapsed:.0f}s]",
            file=self.stream,
            flush=True,
        )
        self._last = now
        self._printed = True

    def done(self) -> None:
        if self.enabled and self._printed:
            self._emit(self.clock(), final=True)
