"""`inspect seal` on a bucket written by Aiven's plugin (tests/aiven_format.py: every
compression x encryption x chunk size), run in-process through the CLI's entry point:

* every segment is verified and sealed; afterwards a reader with
  ``fetch.accept_unauthenticated_segments`` off serves each byte for byte (encrypted ones with
  encryption on; plaintext ones with encryption off, and they stay refused with it on), and
  Aiven's reader still reads each byte for byte (it ignores the block);
* a rerun skips them all and changes nothing; ``--dry-run`` writes nothing;
* damaged segments are refused, named, and left exactly as they were;
* a delete racing the rewrite never leaves a segment resurrected (``rewrite.Rewriter``, with the
  sidecar's own delete run at each point of the race)."""

from __future__ import annotations

import json

import pytest

from rsm_sidecar.cli.main import main
from rsm_sidecar.errors import DataLoss
from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata
from rsm_sidecar.format.manifest import SegmentManifest
from rsm_sidecar.inspect import rewrite
from rsm_sidecar.inspect.seal import WRITER
from rsm_sidecar.segment.reader import SegmentReader
from rsm_sidecar.segment.settings import ReaderSettings
from rsm_sidecar.storage.local import LocalObjectStore
from tests import aiven_format as aiven
from tests.aiven_fixtures import PREFIX, aiven_keys, aiven_ring, our_ring, sidecar_toml, write_aiven_bucket

__all__ = ["aiven_keys", "aiven_ring", "our_ring"]  # fixtures


def _inspect(capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["inspect", *args, "--json", "-q"])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


def _metadata(seg: aiven.SegmentInfo) -> SegmentMetadata:
    return SegmentMetadata(
        seg.topic_id, seg.topic, seg.partition, seg.segment_id, seg.start_offset, seg.end_offset
    )


def _objects(store) -> dict[str, bytes]:
    return {o.key: store.get(o.key) for o in store.list("")}


def _read_all(reader: SegmentReader, seg: aiven.SegmentInfo) -> tuple[bytes, dict[str, bytes | None]]:
    opened = reader.open(_metadata(seg))
    log = b"".join(reader.read(opened, 0, len(seg.log)))
    return log, {n: reader.read_index(opened, n) for n, data in seg.indexes.items() if data is not None}


def test_seal_every_aiven_segment_and_read_it_with_the_setting_off(
    tmp_path, capsys, aiven_keys, aiven_ring, our_ring
):
    store = LocalObjectStore(tmp_path / "bucket", fsync=False)
    written = write_aiven_bucket(store, aiven_ring)
    config = sidecar_toml(tmp_path / "sidecar.toml", tmp_path / "bucket", aiven_keys, accept=False)

    code, doc = _inspect(capsys, "seal", "--all", "-c", config, "--dry-run")
    assert code == 0 and doc["summary"]["would_seal"] == len(written) and doc["summary"]["sealed"] == 0
    before = _objects(store)

    code, doc = _inspect(capsys, "seal", "--all", "-c", config, "--parallel", "3")
    assert code == 0, doc
    assert doc["summary"] == {
        "dry_run": False,
        "segments": len(written),
        "sealed": len(written),
        "would_seal": 0,
        "skipped": 0,
        "refused": 0,
        "errors": 0,
    }
    after = _objects(store)
    assert {k for k in after if not k.endswith(".rsm-manifest")} == {
        k for k in before if not k.endswith(".rsm-manifest")
    }
    assert all(after[k] == v for k, v in before.items() if not k.endswith(".rsm-manifest")), "data changed"
    outcome = {o["base"][-22:]: o for o in doc["segments"]}

    layout = KeyLayout(PREFIX)
    strict = SegmentReader(store, layout, our_ring, ReaderSettings())
    strict_plain = SegmentReader(store, layout, None, ReaderSettings())
    for seg, settings in written:
        key = aiven.object_key(PREFIX, seg, aiven.MANIFEST)
        m = SegmentManifest.from_bytes(store.get(key), key)
        assert m.writer == WRITER and m.attempt is not None and m.has_extension
        # Aiven's strict reader ignores the block: the same bytes as before sealing
        back = aiven.read_segment(store.get, PREFIX, seg, aiven_ring)
        assert (back.log, back.indexes) == (seg.log, seg.indexes), settings
        expected = (seg.log, {n: d for n, d in seg.indexes.items() if d is not None})
        if settings.key_id is not None:
            assert m.auth is not None and m.chunk_tags is not None and m.chunk_crcs is None
            assert _read_all(strict, seg) == expected, settings
        else:
            assert m.auth is None and m.chunk_crcs is not None and m.index_crcs is not None
            assert "plaintext" in outcome[seg.segment_id]["detail"]
            assert _read_all(strict_plain, seg) == expected, settings
            with pytest.raises(DataLoss, match="not encrypted but encryption is enabled"):
                strict.open(_metadata(seg))

    # idempotent: a rerun skips everything and writes nothing
    code, doc = _inspect(capsys, "seal", "--all", "-c", config)
    assert code == 0 and doc["summary"]["skipped"] == len(written) and doc["summary"]["sealed"] == 0
    assert {o["detail"] for o in doc["segments"]} == {"already sealed"}
    assert _objects(store) == after
    # a manifest left without data (a delete that stalled past a run's settle delay) is removed by
    # the next run when seal wrote it, and left to `inspect orphans` otherwise
    sealed_seg, unsealed_seg = written[0][0], written[1][0]
    for seg in (sealed_seg, unsealed_seg):
        store.delete_many(
            [aiven.object_key(PREFIX, seg, aiven.LOG), aiven.object_key(PREFIX, seg, aiven.INDEXES)]
        )
    store.put(
        aiven.object_key(PREFIX, unsealed_seg, aiven.MANIFEST),
        before[aiven.object_key(PREFIX, unsealed_seg, aiven.MANIFEST)],
    )
    code, doc = _inspect(capsys, "seal", "--all", "-c", config)
    outcome = {o["base"][-22:]: o for o in doc["segments"]}
    assert code == 0 and doc["summary"]["skipped"] == len(written)
    assert "removed the manifest an earlier run wrote" in outcome[sealed_seg.segment_id]["detail"]
    assert not store.exists(aiven.object_key(PREFIX, sealed_seg, aiven.MANIFEST))
    assert "see inspect orphans" in outcome[unsealed_seg.segment_id]["detail"]
    assert store.exists(aiven.object_key(PREFIX, unsealed_seg, aiven.MANIFEST))
    written = written[2:]
    # inspect verify with the setting off passes every encrypted one
    code, doc = _inspect(capsys, "verify", "-c", config)
    failed = {s["base"][-22:]: s for s in doc["segments"] if s["status"] != "ok"}
    plaintext = {seg.segment_id for seg, settings in written if settings.key_id is None}
    assert set(failed) == plaintext | {unsealed_seg.segment_id}


def _damage(store, seg: aiven.SegmentInfo, suffix: str, position: int) -> None:
    key = aiven.object_key(PREFIX, seg, suffix)
    data = bytearray(store.get(key))
    data[position % len(data)] ^= 0x40
    store.put(key, bytes(data))


def test_damaged_segments_are_refused_named_and_left_as_they_are(tmp_path, capsys, aiven_keys, aiven_ring):
    store = LocalObjectStore(tmp_path / "bucket", fsync=False)
    written = write_aiven_bucket(store, aiven_ring)
    by = {(s.compression, s.key_id, s.chunk_size): seg for seg, s in written}
    damaged = {
        # a ciphertext byte: the GCM tag fails
        by[(False, "aiven-key-1", 1000)].segment_id: "authentication failed",
        # a record's byte in a plaintext, uncompressed chunk: only the batch CRC can tell
        by[(False, None, 4096)].segment_id: "CRC",
        # a zstd frame
        by[(True, None, 1000)].segment_id: "zstd",
        # an index blob
        by[(True, "aiven-key-2", 4096)].segment_id: "index",
    }
    _damage(store, by[(False, "aiven-key-1", 1000)], aiven.LOG, 700)
    _damage(store, by[(False, None, 4096)], aiven.LOG, 300)
    _damage(store, by[(True, None, 1000)], aiven.LOG, 2)
    _damage(store, by[(True, "aiven-key-2", 4096)], aiven.INDEXES, 30)
    # a manifest that holds another segment than its key names
    moved = by[(True, "aiven-key-1", 1000)]
    key = aiven.object_key(PREFIX, moved, aiven.MANIFEST)
    doc = json.loads(store.get(key))
    doc["remoteLogSegmentMetadata"]["remoteLogSegmentId"]["id"] = aiven.kafka_uuid("another segment")
    store.put(key, json.dumps(doc, separators=(",", ":")).encode())
    damaged[moved.segment_id] = "holds another segment"
    # a manifest claiming two billion one-byte chunks (refused before anything is sized by it)
    huge = by[(False, None, 1000)]
    key = aiven.object_key(PREFIX, huge, aiven.MANIFEST)
    doc = json.loads(store.get(key))
    doc["chunkIndex"].update(originalChunkSize=1, originalFileSize=2**31 - 1, transformedChunkSize=1)
    store.put(key, json.dumps(doc, separators=(",", ":")).encode())
    damaged[huge.segment_id] = f"is {len(huge.log)} bytes, the chunk index says 21474"
    before = _objects(store)

    config = sidecar_toml(tmp_path / "sidecar.toml", tmp_path / "bucket", aiven_keys, accept=False)
    code, doc = _inspect(capsys, "seal", "--all", "-c", config)
    assert code == 1
    outcome = {o["base"][-22:]: o for o in doc["segments"]}
    for segment_id, why in damaged.items():
        o = outcome[segment_id]
        assert o["action"] == "refused", o
        assert any(why in p for p in o["problems"]), o["problems"]
        assert o["segment"].endswith(f"({segment_id})")
        manifest = next(k for k in before if segment_id in k and k.endswith(".rsm-manifest"))
        assert store.get(manifest) == before[manifest], "a refused segment's manifest was written"
    assert doc["summary"]["refused"] == len(damaged)
    assert doc["summary"]["sealed"] == len(written) - len(damaged)


class RacingStore(LocalObjectStore):
    """A local store on which the sidecar's delete of one segment (manifest first, then the data,
    as segment/objects.py does) is spread over a manifest rewrite: its manifest removal runs
    before the rewrite's ``manifest_at``-th request after arming, its data removal before the
    ``data_at``-th (a real delete cannot be timed to a request otherwise)."""

    def arm(self, base: str, manifest_at: int, data_at: int) -> None:
        self.base, self.at, self.requests_seen = base, {manifest_at: "manifest", data_at: "data"}, 0

    def _request(self) -> None:
        if not hasattr(self, "at"):
            return
        self.requests_seen += 1
        step = self.at.pop(self.requests_seen, None)
        if step is not None:
            self._delete(step)

    def _delete(self, step: str) -> None:
        if step == "manifest":
            LocalObjectStore.delete(self, f"{self.base}.rsm-manifest")
        else:
            LocalObjectStore.delete_many(self, [f"{self.base}.indexes", f"{self.base}.log"])

    def finish(self) -> None:
        """The delete's steps the rewrite's requests did not reach, in order."""
        for _, step in sorted(self.at.items()):
            self._delete(step)
        self.at = {}

    def get(self, key):
        self._request()
        return super().get(key)

    def exists(self, key):
        self._request()
        return super().exists(key)

    def put(self, key, data):
        self._request()
        return super().put(key, data)


#: the rewrite's requests: 1 GET manifest, 2 HEAD .log, 3 HEAD .indexes, 4 PUT manifest,
#: 5 HEAD .log, then settle's 6 HEAD .log and (when .log is gone) 7 GET manifest; 8: after the last one
RACES = [(m, d) for m in range(1, 8) for d in range(m + 1, 9)]


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def test_a_delete_racing_the_rewrite_never_resurrects_the_segment(tmp_path):
    clock = FakeClock()  # settle's delay passes at once
    for manifest_at, data_at in RACES:
        store = RacingStore(tmp_path / f"{manifest_at}-{data_at}", fsync=False)
        base = "p/t-MWJ6FHTfRYy67jzwZdeqSQ/0/00000000000000000000-AAAAAAAAAAAAAAAAAAAAAA"
        for suffix, data in (("log", b"L"), ("indexes", b"I"), ("rsm-manifest", b"old")):
            store.put(f"{base}.{suffix}", data)
        rewriter = rewrite.Rewriter(store, clock=clock.now, sleep=clock.sleep)
        store.arm(base, manifest_at, data_at)
        rewriter.replace(base, b"old", b"new")
        rewriter.settle()
        store.finish()  # the delete completes (the rewrite may have made fewer requests)
        left = {o.key: store.get(o.key) for o in LocalObjectStore.list(store, "")}
        if data_at >= 7 and manifest_at in (2, 3, 4):
            # the one window left: the manifest removed between the rewrite's read and its write,
            # and the data only after the settle delay (a delete stalled that long): a manifest
            # without data, ours, which `inspect orphans` lists and a rerun of `inspect seal` removes
            assert left == {f"{base}.rsm-manifest": b"new"}, (manifest_at, data_at)
        else:
            assert left == {}, (manifest_at, data_at, left)


def test_a_rewrite_without_a_racing_delete_is_written_and_kept(tmp_path):
    store = LocalObjectStore(tmp_path, fsync=False)
    base = "p/t-MWJ6FHTfRYy67jzwZdeqSQ/0/00000000000000000000-AAAAAAAAAAAAAAAAAAAAAA"
    for suffix, data in (("log", b"L"), ("indexes", b"I"), ("rsm-manifest", b"old")):
        store.put(f"{base}.{suffix}", data)
    rewriter = rewrite.Rewriter(store, sleep=lambda s: None)
    assert rewriter.replace(base, b"changed meanwhile", b"new") is not None
    assert store.get(f"{base}.rsm-manifest") == b"old"
    assert rewriter.replace(base, b"old", b"new") is None
    assert rewriter.settle() == []
    assert store.get(f"{base}.rsm-manifest") == b"new"
