"""A fault injector in front of a real object store (local directory, SeaweedFS S3).

Real servers cannot be made to fail at one chosen request, or to apply a write and then
lose its answer, so the randomized tests put this wrapper in front of them: each request
fails with probability ``rate`` (``StorageUnavailable``), either before it reaches the
store or, for writes and deletes, after the store applied it (a lost answer). Everything
else goes to the real store underneath.
"""

from __future__ import annotations

import random
import threading

from rsm_sidecar.storage.base import ObjectStore, ObjectWriter, StorageUnavailable


class InjectedFault(StorageUnavailable):
    pass


class FaultInjector(ObjectStore):
    def __init__(self, inner: ObjectStore, seed: int, rate: float = 0.0):
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.rate = rate
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.injected = 0

    def _roll(self, what: str, key: str, applied: bool = False) -> None:
        with self._lock:
            hit = self.rate > 0 and self._random.random() < self.rate
            if hit:
                self.injected += 1
        if hit:
            raise InjectedFault(f"injected fault {'after' if applied else 'before'} {what} {key}")

    def _maybe_after(self) -> bool:
        with self._lock:
            return self._random.random() < 0.5

    def open_writer(self, key: str) -> ObjectWriter:
        self._roll("open", key)
        return _Writer(self, key, self.inner.open_writer(key))

    def put(self, key: str, data: bytes) -> None:
        after = self._maybe_after()
        if not after:
            self._roll("put", key)
        self.inner.put(key, data)
        if after:
            self._roll("put", key, applied=True)

    def get(self, key: str) -> bytes:
        self._roll("get", key)
        return self.inner.get(key)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._roll("get_range", key)
        return self.inner.get_range(key, start, end)

    def size(self, key: str) -> int:
        self._roll("size", key)
        return self.inner.size(key)

    def delete(self, key: str) -> None:
        after = self._maybe_after()
        if not after:
            self._roll("delete", key)
        self.inner.delete(key)
        if after:
            self._roll("delete", key, applied=True)

    def list(self, prefix: str = "", start_after: str | None = None):
        self._roll("list", prefix)
        return self.inner.list(prefix, start_after)

    def describe(self) -> str:
        return f"fault injector over {self.inner.describe()}"

    def check(self) -> None:
        self.inner.check()

    def close(self) -> None:
        self.inner.close()


class _Writer(ObjectWriter):
    def __init__(self, owner: FaultInjector, key: str, inner: ObjectWriter):
        self.owner, self.key, self.inner = owner, key, inner

    def write(self, data) -> None:
        try:
            self.owner._roll("write", self.key)
        except InjectedFault:
            self.inner.abort()
            raise
        self.inner.write(data)

    def commit(self) -> int:
        after = self.owner._maybe_after()
        if not after:
            try:
                self.owner._roll("commit", self.key)
            except InjectedFault:
                self.inner.abort()
                raise
        size = self.inner.commit()
        if after:
            self.owner._roll("commit", self.key, applied=True)
        return size

    def abort(self) -> None:
        self.inner.abort()
