"""A thread-safe LRU cache bounded by bytes, and single-flight loading so concurrent
readers of the same item share one storage request."""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable, Hashable
from typing import Any


class ByteLRU:
    """Least-recently-used map whose values' declared sizes sum to at most ``capacity``
    bytes. An item larger than the capacity is not cached. ``on_event(name)`` receives
    "hit", "miss" and "eviction" for metrics."""

    def __init__(self, capacity: int, on_event: Callable[[str], None] = lambda e: None):
        self.capacity = capacity
        self._items: collections.OrderedDict[Hashable, tuple[Any, int]] = collections.OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self._on_event = on_event

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self._on_event("miss")
                return None
            self._items.move_to_end(key)
            self._on_event("hit")
            return item[0]

    def contains(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def put(self, key: Hashable, value: Any, size: int) -> None:
        if size > self.capacity:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._size -= old[1]
            self._items[key] = (value, size)
            self._size += size
            while self._size > self.capacity:
                _, (_, s) = self._items.popitem(last=False)
                self._size -= s
                self._on_event("eviction")

    def discard_where(self, predicate: Callable[[Hashable], bool]) -> None:
        """Drop every entry whose key satisfies ``predicate``."""
        with self._lock:
            for k in [k for k in self._items if predicate(k)]:
                self._size -= self._items.pop(k)[1]

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._size

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class SingleFlight:
    """Runs at most one loader per key at a time; other callers wait for its result."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[Hashable, concurrent.futures.Future] = {}

    def claim(self, keys: list[Hashable]) -> tuple[list[Hashable], dict[Hashable, concurrent.futures.Future]]:
        """Claim the longest prefix of ``keys`` nobody is loading. Returns the claimed
        keys (possibly none) and, for the first key if it is taken, the future to wait on."""
        with self._lock:
            if keys and keys[0] in self._inflight:
                return [], {keys[0]: self._inflight[keys[0]]}
            claimed = []
            for k in keys:
                if k in self._inflight:
                    break
                self._inflight[k] = concurrent.futures.Future()
                claimed.append(k)
            return claimed, {}

    def resolve(self, key: Hashable, value: Any = None, error: BaseException | None = None) -> None:
        with self._lock:
            fut = self._inflight.pop(key, None)
        if fut is not None:
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(value)

    def in_flight(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._inflight
