"""The local object store, counting what its ranged reads return: what a remote store would
transfer and bill, for tests and benchmarks of how much a read path downloads."""

from __future__ import annotations

import threading

from rsm_sidecar.storage.local import LocalObjectStore


class CountingStore(LocalObjectStore):
    """Counts the bytes ranged reads return in :attr:`downloaded` (set it to 0 to start over)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.downloaded = 0
        self._lock = threading.Lock()

    def get_range(self, key, start, end):
        data = super().get_range(key, start, end)
        with self._lock:
            self.downloaded += len(data)
        return data
