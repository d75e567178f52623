"""The disk chunk cache through the real gRPC service: a consumer re-reading a segment
after a sidecar restart downloads no chunk from object storage; deleting the segment
removes its entries; the metrics say so."""

from __future__ import annotations

import os
import stat

from tests.counting_store import CountingStore
from tests.service.rsm_client import SegmentFilesOnDisk, metadata, seg_id

KiB = 1024


def _metrics(sc) -> dict[str, float]:
    out = {}
    for family in sc.sidecar.metrics.registry.collect():
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def _files(path) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(path) if not d.endswith(".tmp") for n in names]


def test_fetch_after_restart_reads_chunks_from_disk_and_delete_removes_them(start_sidecar, tmp_path):
    disk = tmp_path / "disk-cache"
    settings = {"fetch__disk_cache": {"path": str(disk), "bytes": "64MiB"}}
    chunk = 64 * KiB
    log = b"".join(b"%08d %s\n" % (i, os.urandom(16).hex().encode()) for i in range(20_000))
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), log)
    md = metadata(seg_id(1), 0, 19_999, size=len(log))

    first = start_sidecar(store=CountingStore(tmp_path / "remote", fsync=False), encryption=True, **settings)
    first.client.copy(files.path_request(md))
    assert first.client.fetch(md) == log
    cold = first.store.downloaded
    stored_log = [o for o in first.store.list("") if o.key.endswith(".log")][0].size
    assert cold >= stored_log  # the whole .log object was downloaded once
    chunks = -(-len(log) // chunk)
    cached = _files(disk)
    assert len(cached) == chunks and sum(os.path.getsize(p) for p in cached) == stored_log
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in cached)
    assert stat.S_IMODE(os.stat(disk).st_mode) == 0o700
    first.server.stop(grace=0)

    store = CountingStore(tmp_path / "remote", fsync=False)
    again = start_sidecar(store=store, encryption=True, **settings)
    assert again.client.fetch(md) == log
    assert again.client.fetch(md, 300_000, 400_000) == log[300_000:400_001]
    assert store.downloaded == 0  # no ranged GET: every chunk came from the disk cache
    # one GET, the manifest (the commit marker and the cache keys), and at most one LIST: the
    # prefetch looking for the partition's next segment (there is none)
    assert store.requests.get("GET") == 1 and set(store.requests) <= {"GET", "LIST"}
    assert store.requests.get("LIST", 0) <= 1
    m = _metrics(again)
    assert m["rsm_cache_events_total{cache=disk,event=hit}"] == chunks
    assert m.get("rsm_cache_events_total{cache=disk,event=miss}", 0) == 0
    assert m["rsm_cache_entries{cache=disk}"] == chunks
    assert m["rsm_cache_bytes{cache=disk}"] == stored_log
    assert m["rsm_disk_cache_enabled{}"] == 1

    again.client.delete(md)
    assert _files(disk) == []
    m = _metrics(again)
    assert m["rsm_cache_entries{cache=disk}"] == 0 and m["rsm_cache_bytes{cache=disk}"] == 0


def test_a_recopy_through_the_service_serves_the_new_bytes_from_then_on(start_sidecar, tmp_path):
    """A copy that rewrites a segment id (its earlier copy left no complete manifest)
    drops the disk entries of the old bytes; a fetch serves the new ones."""
    disk = tmp_path / "disk-cache"
    sc = start_sidecar(encryption=True, fetch__disk_cache={"path": str(disk)})
    old = os.urandom(300 * KiB)
    md = metadata(seg_id(2), 0, 99, size=len(old))
    sc.client.copy(SegmentFilesOnDisk(str(tmp_path / "old"), old).path_request(md))
    assert sc.client.fetch(md) == old
    assert len(_files(disk)) == 5
    manifest = [o.key for o in sc.store.list("") if o.key.endswith(".rsm-manifest")][0]
    sc.store.delete(manifest)  # as an interrupted rewrite leaves it
    new = os.urandom(300 * KiB)
    sc.client.copy(SegmentFilesOnDisk(str(tmp_path / "new"), new).path_request(md))
    assert sc.client.fetch(md) == new
    assert sc.client.fetch(md, 100_000) == new[100_000:]


def test_an_unusable_cache_directory_leaves_fetches_working(start_sidecar, tmp_path):
    (tmp_path / "not-a-dir").write_bytes(b"")
    sc = start_sidecar(encryption=True, fetch__disk_cache={"path": str(tmp_path / "not-a-dir" / "cache")})
    log = os.urandom(200 * KiB)
    md = metadata(seg_id(3), 0, 99, size=len(log))
    sc.client.copy(SegmentFilesOnDisk(str(tmp_path / "seg"), log).path_request(md))
    assert sc.client.fetch(md) == log
    assert sc.client.fetch(md, 1000) == log[1000:]
    assert _metrics(sc)["rsm_disk_cache_enabled{}"] == 0
