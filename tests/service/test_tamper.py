"""Someone who can write the bucket but has no key: random damage and deliberate
rearrangement of real encrypted objects (byte flips, truncations, chunk swaps and
duplications, index-blob swaps, objects of another segment, manifest edits with and
without a recomputed digest, a planted plaintext segment). Every fetch through the
gRPC service returns the segment's exact bytes or DATA_LOSS naming the segment; never
other bytes."""

from __future__ import annotations

import json
import os
import random
import time

import grpc
import pytest

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.format.manifest import SegmentManifest
from tests.service.rsm_client import SegmentFilesOnDisk, metadata, seg_id

KiB = 1024
INDEX_TYPES = {
    pb.OFFSET: "offset",
    pb.TIMESTAMP: "timestamp",
    pb.PRODUCER_SNAPSHOT: "producerSnapshot",
    pb.TRANSACTION: "transaction",
    pb.LEADER_EPOCH: "leaderEpoch",
}


class Segment:
    def __init__(self, sc, tmp_path, n: int):
        self.md = metadata(seg_id(7000 + n), start=100 * n, end=100 * n + 99, size=200 * KiB)
        self.files = SegmentFilesOnDisk(
            str(tmp_path / f"seg{n}"), os.urandom(100 * KiB) + (b"kafka record " * 8000)[: 100 * KiB]
        )
        # equal-length index blobs, so that swapping them keeps every position valid
        for name in ("offset", "timestamp", "producerSnapshot", "transaction"):
            self.files.indexes[name] = os.urandom(816)
        self.expected_indexes = dict(self.files.indexes, leaderEpoch=self.files.leader_epoch)
        sc.client.copy(self.files.stream_requests(self.md))
        self.log = open(self.files.log_path, "rb").read()
        keys = sorted(o.key for o in sc.store.list("") if f"-{self.md.segment_id}." in o.key)
        self.base = keys[0].rsplit(".", 1)[0]
        self.keys = {k.rsplit(".", 1)[1]: k for k in keys}
        self.stored = {s: sc.store.get(k) for s, k in self.keys.items()}
        self.manifest = SegmentManifest.from_bytes(self.stored["rsm-manifest"])

    def chunk_spans(self) -> list[tuple[int, int]]:
        return [(c.transformed_position, c.transformed_size) for c in self.manifest.chunk_index.chunks()]


def _swap(data: bytes, a: tuple[int, int], b: tuple[int, int]) -> bytes:
    (pa, na), (pb_, nb) = sorted([a, b])
    return data[:pa] + data[pb_ : pb_ + nb] + data[pa + na : pb_] + data[pa : pa + na] + data[pb_ + nb :]


def _edit_manifest(raw: bytes, rng: random.Random) -> bytes:
    """A plausible edit; half the time the unkeyed SHA-256 is recomputed, as an attacker would."""
    m = SegmentManifest.from_bytes(raw)
    edit = rng.choice(
        ["offsets", "sizes", "compression", "ranges", "attempt", "tags", "strip", "aad", "epochs"]
    )
    if edit == "strip":  # remove the rsmSidecar block entirely (a downgrade to Aiven's format)
        doc = json.loads(raw)
        doc["remoteLogSegmentMetadata"].pop("rsmSidecar")
        return json.dumps(doc, separators=(",", ":")).encode()
    if edit == "offsets":
        m.segment["startOffset"] += 1
    elif edit == "epochs":
        m.segment["segmentLeaderEpochs"] = {"0": 7}
    elif edit == "sizes":
        sizes = m.chunk_index.transformed_sizes
        from rsm_sidecar.format.chunk_index import build_index

        i = rng.randrange(len(sizes) - 1)
        sizes = list(sizes)
        sizes[i], sizes[i + 1] = sizes[i + 1], sizes[i]
        m.chunk_index = build_index(
            m.chunk_index.original_chunk_size, m.chunk_index.original_file_size, sizes, None
        )
    elif edit == "compression":
        m.compression = not m.compression
    elif edit == "ranges":
        m.indexes["offset"], m.indexes["timestamp"] = m.indexes["timestamp"], m.indexes["offset"]
    elif edit == "attempt":
        m.attempt = os.urandom(16).hex()
    elif edit == "tags":
        m.chunk_tags = list(reversed(m.chunk_tags))
    elif edit == "aad":
        from rsm_sidecar.format.manifest import EncryptionInfo

        m.encryption = EncryptionInfo(
            m.encryption.key_id, m.encryption.wrapped_key, os.urandom(len(m.encryption.aad))
        )
    out = m.to_bytes()
    if rng.random() < 0.5:  # or leave the digest stale
        return out.replace(b'"writer"', b'"writeR"') if b'"writer"' in out else out
    return out


def _tamper(
    kind: str, seg: Segment, other: Segment, plain: dict[str, bytes], rng: random.Random
) -> dict[str, bytes]:
    """The objects to put under ``seg``'s keys."""
    s = seg.stored
    if kind == "flip":
        suffix = rng.choice(list(s))
        data = bytearray(s[suffix])
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return {suffix: bytes(data)}
    if kind == "truncate":
        suffix = rng.choice(list(s))
        return {suffix: s[suffix][: rng.randrange(len(s[suffix]))]}
    if kind == "chunk-swap":
        spans = seg.chunk_spans()
        a, b = rng.sample(spans, 2)
        return {"log": _swap(s["log"], a, b)}
    if kind == "chunk-duplicate":
        spans = seg.chunk_spans()
        (pa, na), (pb_, nb) = rng.sample(spans, 2)
        n = min(na, nb)
        data = s["log"]
        return {"log": data[:pb_] + data[pa : pa + n] + data[pb_ + n :]}
    if kind == "index-swap":
        ranges = [r for r in seg.manifest.indexes.values() if r is not None and r.size == 816 + 28]
        a, b = rng.sample(ranges, 2)
        return {"indexes": _swap(s["indexes"], (a.position, a.size), (b.position, b.size))}
    if kind == "cross-segment":
        which = rng.choice([["log"], ["indexes"], ["rsm-manifest"], ["log", "indexes", "rsm-manifest"]])
        return {w: other.stored[w] for w in which}
    if kind == "manifest-edit":
        return {"rsm-manifest": _edit_manifest(s["rsm-manifest"], rng)}
    if kind == "plaintext-planted":
        return dict(plain)
    raise AssertionError(kind)


KINDS = [
    "flip",
    "truncate",
    "chunk-swap",
    "chunk-duplicate",
    "index-swap",
    "cross-segment",
    "manifest-edit",
    "plaintext-planted",
]


@pytest.mark.slow
def test_tampered_encrypted_segments_are_refused_never_served_wrong(start_sidecar, tmp_path):
    seed = int(os.environ.get("RSM_TEST_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    sc = start_sidecar(
        encryption=True, segment__chunk_size=32 * KiB, cache__chunk_bytes=0, cache__prefetch_bytes=0
    )
    segments = [Segment(sc, tmp_path, n) for n in range(4)]
    # a plaintext segment written by an unencrypted sidecar for the same id, to plant
    plain_sc = start_sidecar(store=sc.store)
    victim = segments[0]
    plain_sc.client.delete(victim.md)
    plain_sc.client.copy(victim.files.stream_requests(victim.md))
    plain = {s: sc.store.get(k) for s, k in victim.keys.items()}
    assert SegmentManifest.from_bytes(plain["rsm-manifest"]).encryption is None
    for suffix, key in victim.keys.items():
        sc.store.put(key, victim.stored[suffix])

    tally = {k: [0, 0] for k in KINDS}  # kind -> [refused, served intact]
    for trial in range(1200):
        seg, other = rng.sample(segments, 2)
        if trial % 8 == 7:
            seg, other = victim, segments[1]
        kind = (
            KINDS[trial % len(KINDS)]
            if seg is victim or KINDS[trial % len(KINDS)] != "plaintext-planted"
            else "flip"
        )
        changed = _tamper(kind, seg, other, plain, rng)
        while all(
            seg.stored[suffix] == data for suffix, data in changed.items()
        ):  # an edit that changed nothing
            changed = _tamper(kind, seg, other, plain, rng)
        for suffix, data in changed.items():
            sc.store.put(seg.keys[suffix], data)
        sc.sidecar.reader.forget(seg.base)
        try:
            got = sc.client.fetch(seg.md)
            indexes = {name: sc.client.index(seg.md, t) for t, name in INDEX_TYPES.items()}
            assert got == seg.log, f"seed {seed} trial {trial} ({kind}): wrong bytes served"
            assert indexes == {n: seg.expected_indexes[n] for n in INDEX_TYPES.values()}, (
                f"seed {seed} trial {trial} ({kind}): wrong index bytes served"
            )
            tally[kind][1] += 1
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.DATA_LOSS, (
                f"seed {seed} trial {trial} ({kind}): {e.code()} {e.details()}"
            )
            assert seg.md.segment_id in e.details(), (
                f"trial {trial} ({kind}): error does not name the segment: {e.details()}"
            )
            tally[kind][0] += 1
        for suffix in changed:
            sc.store.put(seg.keys[suffix], seg.stored[suffix])
        sc.sidecar.reader.forget(seg.base)
    print("\n" + "\n".join(f"{k:18s} refused {r:4d}  intact {i:4d}" for k, (r, i) in tally.items()))
    # every rearrangement changes bytes a full read uses: all must be refused
    assert all(i == 0 for i in (tally[k][1] for k in KINDS)), tally
    assert sum(r for r, _ in tally.values()) == 1200
