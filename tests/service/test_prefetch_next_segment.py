"""Prefetch across a segment's end, through the real gRPC service on a local-directory store:
a consumer reading a segment to its end finds the partition's next segment (its indexes and
first ``cache.prefetch_bytes``) already loaded, so the broker's first calls for it
(``fetchIndex``, then a fetch from position 0) wait for no object-store request; the guess
is bounded by the prefetch window, and is not made when the next offset is ambiguous."""

from __future__ import annotations

import os
import threading
import time

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from tests.counting_store import CountingStore
from tests.service.rsm_client import SegmentFilesOnDisk, metadata, seg_id

KiB = 1024
CHUNK = 64 * KiB
PREFETCH = 256 * KiB


class KeyCountingStore(CountingStore):
    """Every ranged read, in order: (key, first byte, bytes returned)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.ranges: list[tuple[str, int, int]] = []
        self._ranges_lock = threading.Lock()

    def get_range(self, key, start, end):
        data = super().get_range(key, start, end)
        with self._ranges_lock:
            self.ranges.append((key, start, len(data)))
        return data

    def get(self, key):
        data = super().get(key)
        with self._ranges_lock:
            self.ranges.append((key, 0, len(data)))
        return data

    def read_of(self, segment_id: str, suffix: str, since: int = 0) -> list[tuple[int, int]]:
        """(first byte, length) of the reads of ``segment_id``'s object ending in ``suffix``."""
        with self._ranges_lock:
            return [(s, n) for k, s, n in self.ranges[since:] if segment_id in k and k.endswith(suffix)]


def _log(first_offset: int, n: int) -> bytes:
    offsets = range(first_offset, first_offset + n)
    return b"".join(b"%08d %s\n" % (i, os.urandom(24).hex().encode()) for i in offsets)


def _copy(sc, tmp_path, name: str, md, log: bytes) -> SegmentFilesOnDisk:
    files = SegmentFilesOnDisk(str(tmp_path / name), log)
    sc.client.copy(files.path_request(md))
    return files


def _settled(store: KeyCountingStore, quiet: float = 0.5, timeout: float = 20) -> None:
    """Waits until the store has seen no request for ``quiet`` seconds (prefetches done)."""
    deadline = time.monotonic() + timeout
    last = (dict(store.requests), store.downloaded)
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = (dict(store.requests), store.downloaded)
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet:
            return
    raise AssertionError(f"the store was still busy after {timeout} s: {store.requests}")


def _reader(start_sidecar, tmp_path) -> tuple:
    """A second sidecar on the same bucket: nothing of the copies is in its caches."""
    store = KeyCountingStore(tmp_path / "remote", fsync=False)
    sc = start_sidecar(
        store=store, encryption=True, segment__chunk_size=CHUNK, cache__prefetch_bytes=PREFETCH
    )
    return sc, store


def test_reading_a_segment_to_its_end_loads_the_next_segments_start_and_indexes(start_sidecar, tmp_path):
    writer = start_sidecar(encryption=True, segment__chunk_size=CHUNK, cache__prefetch_bytes=PREFETCH)
    logs = [_log(0, 20_000), _log(20_000, 20_000)]  # about 1.1 MiB each, 18 chunks
    mds = [
        metadata(seg_id(1), 0, 19_999, size=len(logs[0])),
        metadata(seg_id(2), 20_000, 39_999, size=len(logs[1])),
    ]
    files = [_copy(writer, tmp_path, f"seg{i}", md, log) for i, (md, log) in enumerate(zip(mds, logs))]

    sc, store = _reader(start_sidecar, tmp_path)
    assert sc.client.fetch(mds[0]) == logs[0]
    _settled(store)
    # the next segment's start is loaded, and no more than the prefetch window of it
    stored_chunk = CHUNK + 28  # an uncompressed-size bound: zstd output + IV + GCM tag
    prefetched = store.read_of(seg_id(2), ".log")
    assert prefetched and sum(n for _, n in prefetched) <= (PREFETCH // CHUNK) * stored_chunk
    prefetched_end = max(s + n for s, n in prefetched)
    assert store.read_of(seg_id(2), ".rsm-manifest") and store.read_of(seg_id(2), ".indexes")
    since = len(store.ranges)

    # the broker's first calls for the next segment: its indexes, then a fetch from 0
    assert sc.client.index(mds[1], pb.OFFSET) == files[1].indexes["offset"]
    assert sc.client.index(mds[1], pb.TIMESTAMP) == files[1].indexes["timestamp"]
    assert sc.client.index(mds[1], pb.TRANSACTION) == files[1].indexes["transaction"]
    assert sc.client.fetch(mds[1], 0, PREFETCH - 1) == logs[1][:PREFETCH]
    _settled(store)
    # nothing read again: no manifest, no index, no chunk before the prefetched end (the reads
    # after it are the usual prefetch ahead of this fetch)
    assert not store.read_of(seg_id(2), ".rsm-manifest", since)
    assert not store.read_of(seg_id(2), ".indexes", since)
    assert all(s >= prefetched_end for s, _ in store.read_of(seg_id(2), ".log", since))

    # and the rest of it reads as before
    assert sc.client.fetch(mds[1]) == logs[1]


def test_no_guess_when_two_segments_start_at_the_next_offset(start_sidecar, tmp_path):
    """Two copies of the next offset (say, two leader epochs' segments): which one the broker
    will ask for is unknown, so neither is loaded."""
    writer = start_sidecar(encryption=True, segment__chunk_size=CHUNK, cache__prefetch_bytes=PREFETCH)
    log0, log1 = _log(0, 5_000), _log(5_000, 5_000)
    md0 = metadata(seg_id(1), 0, 4_999, size=len(log0))
    _copy(writer, tmp_path, "seg0", md0, log0)
    for n in (2, 3):
        _copy(writer, tmp_path, f"seg{n}", metadata(seg_id(n), 5_000, 9_999, size=len(log1)), log1)

    sc, store = _reader(start_sidecar, tmp_path)
    assert sc.client.fetch(md0) == log0
    _settled(store)
    assert store.requests.get("LIST") == 1  # it looked, once
    assert not store.read_of(seg_id(2), "") and not store.read_of(seg_id(3), "")


def test_a_planted_next_manifest_costs_nothing_but_a_failed_guess(start_sidecar, tmp_path):
    """Someone who can write the bucket plants a manifest at the next offset: the prefetch
    opens it, refuses it (no valid authenticator), and the read that triggered it is
    unaffected; a real request for that segment gets the clear error, not a cached guess."""
    writer = start_sidecar(encryption=True, segment__chunk_size=CHUNK, cache__prefetch_bytes=PREFETCH)
    log0 = _log(0, 5_000)
    md0 = metadata(seg_id(1), 0, 4_999, size=len(log0))
    _copy(writer, tmp_path, "seg0", md0, log0)
    planted = next(iter((tmp_path / "remote").rglob("*.rsm-manifest")))
    fake = planted.with_name(planted.name.replace(f"{0:020d}-{seg_id(1)}", f"{5_000:020d}-{seg_id(9)}"))
    fake.write_bytes(b'{"version": 1, "hello": "world"}')

    sc, store = _reader(start_sidecar, tmp_path)
    assert sc.client.fetch(md0) == log0
    _settled(store)
    assert store.requests.get("LIST") == 1
    md9 = metadata(seg_id(9), 5_000, 9_999, size=1000)
    try:
        sc.client.fetch(md9)
    except Exception as e:  # grpc.RpcError
        assert "manifest" in str(e)
    else:
        raise AssertionError("a planted manifest was served")
