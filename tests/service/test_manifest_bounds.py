"""A manifest that claims absurd sizes (a bucket writer, or damage, on an unencrypted segment):
every size it declares is bounded before anything is allocated for it, so the sidecar answers
DATA_LOSS naming the segment, never INTERNAL: MemoryError, and its memory stays flat."""

from __future__ import annotations

import hashlib
import json
import os
import resource

import grpc
import pytest

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.format.manifest import SegmentManifest
from tests.service.rsm_client import SegmentFilesOnDisk, metadata, seg_id

KiB = 1024
#: (original chunk size, original file size, stored chunk size): the chunk count they claim
CLAIMS = {
    "2^40 chunks": (1, 2**40, 1),
    "2^34 chunks": (16, 2**38, 17),
    "2^31-1 chunks (within Java ints)": (1, 2**31 - 1, 1),
    "2^31-1 empty stored chunks": (1, 2**31 - 1, 0),
}


def _claim(raw: bytes, chunk: int, size: int, stored: int, keep_extension: bool) -> bytes:
    """The manifest with a fixed chunk index claiming ``size`` bytes in ``chunk``-byte chunks of
    ``stored`` bytes each; with or without our extension (its digest recomputed, as a bucket writer
    can: an unencrypted segment has no secret)."""
    doc = json.loads(raw)
    doc["chunkIndex"] = {
        "type": "fixed",
        "originalChunkSize": chunk,
        "originalFileSize": size,
        "transformedChunkSize": stored,
        "finalTransformedChunkSize": stored,
    }
    ext = doc["remoteLogSegmentMetadata"].pop("rsmSidecar")
    if not keep_extension:
        return json.dumps(doc, separators=(",", ":")).encode()
    # recompute the unkeyed digest
    ext["manifestSha256"] = "0" * 64
    doc["remoteLogSegmentMetadata"]["rsmSidecar"] = ext
    body = json.dumps(doc, separators=(",", ":")).encode()
    return body.replace(b"0" * 64, hashlib.sha256(body).hexdigest().encode(), 1)


@pytest.mark.parametrize("keep_extension", [False, True], ids=["aiven-shaped", "with-extension"])
def test_absurd_chunk_counts_are_data_loss_naming_the_segment(start_sidecar, tmp_path, keep_extension):
    sc = start_sidecar(fetch__accept_unauthenticated_segments=not keep_extension)
    md = metadata(seg_id(4242), start=0, end=99, size=64 * KiB)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(64 * KiB))
    sc.client.copy(files.stream_requests(md))
    key = next(o.key for o in sc.store.list("") if o.key.endswith(".rsm-manifest"))
    original = sc.store.get(key)
    assert SegmentManifest.from_bytes(original).encryption is None
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for name, (chunk, size, stored) in CLAIMS.items():
        sc.store.put(key, _claim(original, chunk, size, stored, keep_extension))
        sc.sidecar.reader.forget(key.removesuffix(".rsm-manifest"))
        for call in (
            lambda: sc.client.fetch(md),
            lambda: sc.client.fetch(md, 100, 200),
            lambda: sc.client.index(md, pb.OFFSET),
        ):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.DATA_LOSS, (name, e.value.code(), e.value.details())
            assert md.segment_id in e.value.details(), (name, e.value.details())
    # nothing sized by the claims was allocated (ru_maxrss is in KiB)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 200 * 1024
    sc.store.put(key, original)
    sc.sidecar.reader.forget(key.removesuffix(".rsm-manifest"))
    assert sc.client.fetch(md) == open(files.log_path, "rb").read()
