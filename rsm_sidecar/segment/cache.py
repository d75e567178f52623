"""A thread-safe LRU cache bounded by bytes, and single-flight loading so concurrent
readers of the same item share one storage request."""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable, Hashable, Sized
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteBounded:
    """What a cache bounded by bytes reports (the memory cache and the disk cache alike): the bytes
    and the entries it holds (its ``_size`` and ``_items``, read under its ``_lock``)."""

    _lock: threading.Lock
    _size: int
    _items: Sized

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._size

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class ByteLRU(ByteBounded, Generic[K, V]):
    """Least-recently-used map whose values' declared sizes sum to at most ``capacity``
    bytes. An item larger than the capacity is not cached. ``on_event(name)`` receives
    "hit", "miss" and "eviction" for metrics. With ``group`` (a function of the key), the
    keys of a group are indexed so that :meth:`discard_group` costs what the group holds, not
    what the cache holds (a segment's entries dropped at each copy and delete)."""

    def __init__(
        self,
        capacity: int,
        on_event: Callable[[str], None] = lambda e: None,
        group: Callable[[K], Hashable] | None = None,
    ):
        self.capacity = capacity
        self._items: collections.OrderedDict[K, tuple[V, int]] = collections.OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self._on_event = on_event
        self._group = group
        self._members: dict[Hashable, set[K]] = {}

    def get(self, key: K) -> V | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self._on_event("miss")
                return None
            self._items.move_to_end(key)
            self._on_event("hit")
            return item[0]

    def contains(self, key: K) -> bool:
        with self._lock:
            return key in self._items

    def _pop_locked(self, key: K) -> tuple[V, int] | None:
        item = self._items.pop(key, None)
        if item is not None:
            self._size -= item[1]
            if self._group is not None:
                g = self._group(key)
                members = self._members.get(g)
                if members is not None:
                    members.discard(key)
                    if not members:
                        del self._members[g]
        return item

    def put(self, key: K, value: V, size: int) -> None:
        if size > self.capacity:
            return
        with self._lock:
            self._pop_locked(key)
            self._items[key] = (value, size)
            self._size += size
            if self._group is not None:
                self._members.setdefault(self._group(key), set()).add(key)
            while self._size > self.capacity:
                self._pop_locked(next(iter(self._items)))
                self._on_event("eviction")

    def replace(self, key: K, old: V, new: V, size: int) -> None:
        """Puts ``new`` in place of ``key``'s value if that is still ``old`` (the same object):
        nothing when the entry was evicted or dropped meanwhile."""
        with self._lock:
            item = self._items.get(key)
            if item is None or item[0] is not old:
                return
        self.put(key, new, size)

    def discard(self, key: K) -> None:
        with self._lock:
            self._pop_locked(key)

    def discard_group(self, group: Hashable) -> None:
        """Drop every entry of ``group`` (needs ``group`` given to the constructor)."""
        assert self._group is not None, "discard_group needs a cache built with group="
        with self._lock:
            for k in list(self._members.get(group, ())):
                self._pop_locked(k)


class SingleFlight(Generic[K, V]):
    """Runs at most one loader per key at a time; other callers wait for its result."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[K, concurrent.futures.Future[V]] = {}

    def claim(self, keys: list[K]) -> tuple[list[K], dict[K, concurrent.futures.Future[V]]]:
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

    def resolve(self, key: K, value: V) -> None:
        """The loader of ``key`` got ``value``."""
        fut = self._release(key)
        if fut is not None:
            fut.set_result(value)

    def fail(self, key: K, error: BaseException) -> None:
        """The loader of ``key`` failed with ``error``."""
        fut = self._release(key)
        if fut is not None:
            fut.set_exception(error)

    def _release(self, key: K) -> concurrent.futures.Future[V] | None:
        with self._lock:
            return self._inflight.pop(key, None)

    def in_flight(self, key: K) -> bool:
        with self._lock:
            return key in self._inflight
