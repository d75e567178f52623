"""Storage round trips in parallel, results in input order, with a bounded backlog (so
a listing of a million segments never becomes a million pending futures)."""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], workers: int = 8, window: int | None = None
) -> Iterator[R]:
    """``map(fn, items)`` on ``workers`` threads; at most ``window`` (default 4 x workers)
    items are in flight or waiting to be consumed. ``fn`` should return its errors rather
    than raise them; an exception raised by ``fn`` is re-raised here, in order."""
    if workers <= 1:
        yield from map(fn, items)
        return
    window = window or 4 * workers
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="inspect") as pool:
        pending: collections.deque[concurrent.futures.Future] = collections.deque()
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
