"""Dropping a segment from the caches costs what the segment holds, not what the caches hold: the
reader drops a segment's entries around every copy and at every delete, and with a full disk cache
(100,000 entries) a scan of every entry took about 0.5 s per call under the cache's lock
(benchmarks/sidecar_startup.py's set-up; docs/operations.md "How costs grow")."""

from __future__ import annotations

import collections

from rsm_sidecar.segment.cache import ByteLRU
from rsm_sidecar.segment.disk_cache import DiskChunkCache, segment_dir


class NoScan(collections.OrderedDict):
    """An OrderedDict that fails the test when anything iterates over all of it."""

    def __iter__(self):
        raise AssertionError("the whole cache was scanned")

    def keys(self):
        raise AssertionError("the whole cache was scanned")


def test_a_group_is_dropped_without_scanning_the_cache():
    lru: ByteLRU[tuple[str, int], bytes] = ByteLRU(1 << 30, group=lambda k: k[0])
    for seg in range(200):
        for i in range(5):
            lru.put((f"seg-{seg}", i), b"x", 10)
    lru._items = NoScan(lru._items)
    lru.discard_group("seg-7")
    lru.discard_group("never-cached")
    assert not any(lru.contains(("seg-7", i)) for i in range(5))
    assert all(lru.contains(("seg-8", i)) for i in range(5))
    assert lru.size_bytes == 199 * 5 * 10 and len(lru) == 199 * 5


def test_groups_follow_replacement_and_eviction():
    lru: ByteLRU[tuple[str, int], bytes] = ByteLRU(100, group=lambda k: k[0])
    for i in range(10):
        lru.put(("a", i), b"x", 10)
    lru.put(("a", 0), b"y", 10)  # replaced, still one entry
    lru.put(("b", 0), b"x", 30)  # evicts the three least recent of "a"
    assert len(lru) == 8 and not lru.contains(("a", 1)) and lru.contains(("a", 0))
    lru.discard_group("a")
    assert len(lru) == 1 and lru.size_bytes == 30
    assert lru._members == {"b": {("b", 0)}}


def test_the_disk_cache_drops_a_segment_without_scanning_every_entry(tmp_path):
    disk = DiskChunkCache(str(tmp_path / "cache"), 1 << 30)
    for seg in ("base-a", "base-b"):
        for i in range(3):
            disk.put(disk.entry(seg, f"chunk {i}"), b"z" * 100)
    disk._items = NoScan(disk._items)
    disk.discard_segment("base-a")
    assert disk.size_bytes == 300 and not (tmp_path / "cache" / segment_dir("base-a")).exists()
    assert disk.get(disk.entry("base-b", "chunk 1"), 100) == b"z" * 100
    assert disk.get(disk.entry("base-a", "chunk 1"), 100) is None
