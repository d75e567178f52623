"""Manifests: Aiven's JSON shapes read and written, our extension, corruption detection."""

from __future__ import annotations

import json

import pytest

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.format.chunk_index import FixedChunkIndex, build_index
from rsm_sidecar.format.keys import SegmentMetadata
from rsm_sidecar.format.manifest import EncryptionInfo, IndexRange, SegmentManifest, segment_debug_copy

# Aiven's SegmentManifestV1SerdeTest documents these exact strings.
AIVEN_SEGMENT_JSON = (
    '{"remoteLogSegmentId":{"topicIdPartition":{"topicId":"lZ6vvmajTWKDBUTV6SQAtQ","topicPartition":'
    '{"topic":"topic1","partition":42}},"id":"adh9f8BMS4anaUnD8KWfWg"},"startOffset":0,"endOffset":1000,'
    '"maxTimestampMs":1000000000,"brokerId":2,"eventTimestampMs":2000000000,'
    '"segmentLeaderEpochs":{"0":100,"1":200,"2":300}}'
)
AIVEN_INDEX = (
    '"chunkIndex":{"type":"fixed","originalChunkSize":100,"originalFileSize":1000,'
    '"transformedChunkSize":110,"finalTransformedChunkSize":110}'
)
AIVEN_WITHOUT_ENCRYPTION = (
    '{"version":"1",' + AIVEN_INDEX + ',"segmentIndexes":{"offset":{"position":0,"size":1},'
    '"timestamp":{"position":1,"size":1},"producerSnapshot":{"position":2,"size":1},'
    '"leaderEpoch":{"position":3,"size":1},"transaction":{"position":4,"size":1}},'
    '"compression":false,"remoteLogSegmentMetadata":' + AIVEN_SEGMENT_JSON + "}"
)
AIVEN_WITHOUT_TXN = AIVEN_WITHOUT_ENCRYPTION.replace(
    '"transaction":{"position":4,"size":1}', '"transaction":null'
)
AIVEN_WITH_ENCRYPTION = AIVEN_WITHOUT_ENCRYPTION.replace(
    '"compression":false,', '"compression":false,"encryption":{"dataKey":"key1:AAECAw==","aad":"CgsMDQ=="},'
)

MD = SegmentMetadata(
    "lZ6vvmajTWKDBUTV6SQAtQ",
    "topic1",
    42,
    "adh9f8BMS4anaUnD8KWfWg",
    0,
    1000,
    1000000000,
    2,
    2000000000,
    {0: 100, 1: 200, 2: 300},
    100500,
)
INDEXES = {
    "offset": IndexRange(0, 1),
    "timestamp": IndexRange(1, 1),
    "producerSnapshot": IndexRange(2, 1),
    "leaderEpoch": IndexRange(3, 1),
    "transaction": IndexRange(4, 1),
}


def test_reads_aiven_manifest_without_encryption():
    m = SegmentManifest.from_bytes(AIVEN_WITHOUT_ENCRYPTION.encode())
    assert m.chunk_index == FixedChunkIndex(100, 1000, 110, 110)
    assert m.indexes == INDEXES
    assert m.compression is False and m.encryption is None
    assert m.segment == json.loads(AIVEN_SEGMENT_JSON)
    assert m.chunk_crcs is None and not m.verified_digest


def test_reads_aiven_manifest_without_txn_index_and_with_encryption():
    assert SegmentManifest.from_bytes(AIVEN_WITHOUT_TXN.encode()).indexes["transaction"] is None
    enc = SegmentManifest.from_bytes(AIVEN_WITH_ENCRYPTION.encode()).encryption
    assert enc == EncryptionInfo("key1", bytes([0, 1, 2, 3]), bytes([10, 11, 12, 13]))


def _ours(**kw) -> SegmentManifest:
    args = dict(
        chunk_index=FixedChunkIndex(100, 1000, 110, 110),
        indexes=INDEXES,
        compression=False,
        encryption=None,
        segment=segment_debug_copy(MD),
    )
    args.update(kw)
    return SegmentManifest(**args)


def test_written_manifest_is_aiven_shaped_with_extension_inside_segment_copy():
    doc = json.loads(_ours().to_bytes())
    ext = doc["remoteLogSegmentMetadata"].pop("rsmSidecar")
    assert json.dumps(doc, separators=(",", ":")) == AIVEN_WITHOUT_ENCRYPTION
    assert set(ext) == {"writer", "manifestSha256"}


def test_encrypted_manifest_matches_aiven_shape():
    enc = EncryptionInfo("key1", bytes([0, 1, 2, 3]), bytes([10, 11, 12, 13]))
    doc = json.loads(_ours(encryption=enc).to_bytes())
    doc["remoteLogSegmentMetadata"].pop("rsmSidecar")
    assert json.dumps(doc, separators=(",", ":")) == AIVEN_WITH_ENCRYPTION


def test_roundtrip_with_checksums():
    m = _ours(
        chunk_index=build_index(100, 1000, [60] * 10, None),
        compression=True,
        chunk_crcs=list(range(10)),
        index_crcs={"offset": 1, "timestamp": 2, "producerSnapshot": 3, "leaderEpoch": 4, "transaction": 5},
    )
    back = SegmentManifest.from_bytes(m.to_bytes())
    assert back.chunk_index == m.chunk_index and back.chunk_crcs == list(range(10))
    assert back.index_crcs == m.index_crcs and back.verified_digest and back.segment == m.segment


def test_every_flipped_byte_is_detected():
    raw = _ours(chunk_crcs=[7] * 10).to_bytes()
    for i in range(len(raw)):
        for flip in (0x01, 0x20):
            bad = bytearray(raw)
            bad[i] ^= flip
            with pytest.raises(DataLoss):
                SegmentManifest.from_bytes(bytes(bad), "m")


@pytest.mark.parametrize("cut", [0, 1, 20, 100, -1])
def test_truncated_manifest_is_data_loss(cut):
    raw = _ours().to_bytes()
    with pytest.raises(DataLoss, match="seg.rsm-manifest"):
        SegmentManifest.from_bytes(raw[:cut], "seg.rsm-manifest")


def test_unknown_version_is_refused():
    raw = AIVEN_WITHOUT_ENCRYPTION.replace('"version":"1"', '"version":"2"').encode()
    with pytest.raises(DataLoss, match="unsupported manifest version"):
        SegmentManifest.from_bytes(raw)


def test_key_material_not_in_repr():
    enc = EncryptionInfo("key1", b"\x01" * 256, b"\x02" * 32)
    assert "\\x01" not in repr(enc) and "AQEB" not in repr(enc)
