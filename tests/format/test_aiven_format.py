"""Compatibility with Aiven's plugin in both directions, through tests/aiven_format.py (an
Aiven-format writer and reader that share no code with rsm_sidecar):

* that module against the known answers of Aiven's own serde tests (manifests, the chunk
  size codec), and its strictness (an unknown member fails, as in Aiven's Jackson mapping);
* segments Aiven's way (every compression x encryption x chunk size) read back byte for
  byte by the sidecar's reader under ``fetch.accept_unauthenticated_segments``, and refused
  without it;
* segments the sidecar writes read back byte for byte by the Aiven-format reader."""

from __future__ import annotations

import concurrent.futures
import json

import pytest
from cryptography.exceptions import InvalidTag

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.reader import SegmentReader
from rsm_sidecar.segment.settings import CopySettings, ReaderSettings
from rsm_sidecar.segment.sources import BytesSource
from rsm_sidecar.storage.local import LocalObjectStore
from tests import aiven_format as aiven
from tests.aiven_fixtures import (
    CHUNK_SIZES,
    COMPRESSION,
    KEY_IDS,
    PREFIX,
    aiven_keys,
    aiven_ring,
    our_ring,
    write_aiven_bucket,
)
from tests.format.test_manifest import (
    AIVEN_SEGMENT_JSON,
    AIVEN_WITH_ENCRYPTION,
    AIVEN_WITHOUT_ENCRYPTION,
    AIVEN_WITHOUT_TXN,
)

__all__ = ["aiven_keys", "aiven_ring", "our_ring"]  # fixtures

#: the encoding of [10, 20, 30] in Aiven's ChunkIndexSerializationTest
AIVEN_ENCODED_CHUNKS = "KLUv/SAPeQAAAAAAAwAAAAoBAAoAAAAe"


# -- the Aiven-format module against Aiven's known answers ------------------------------------
def test_chunk_size_codec_matches_aivens_known_answer():
    raw = aiven.encode_chunk_sizes([10, 20, 30])
    assert raw == bytes.fromhex("000000030000000a01000a0000001e")
    assert aiven.encode_transformed_chunks([10, 20, 30]) == AIVEN_ENCODED_CHUNKS
    assert aiven.decode_transformed_chunks(AIVEN_ENCODED_CHUNKS) == [10, 20, 30]
    for values in ([], [7], [5, 5], [300, 70000, 2, 9], [2**31 - 1, 0, 2**31 - 1]):
        assert aiven.decode_chunk_sizes(aiven.encode_chunk_sizes(values)) == values


def test_manifests_match_aivens_serde_test_strings():
    segment = json.loads(AIVEN_SEGMENT_JSON)
    index = {
        "type": "fixed",
        "originalChunkSize": 100,
        "originalFileSize": 1000,
        "transformedChunkSize": 110,
        "finalTransformedChunkSize": 110,
    }
    ranges = {name: (i, 1) for i, name in enumerate(aiven.INDEX_ORDER)}
    assert aiven.manifest_json(index, ranges, False, None, segment).decode() == AIVEN_WITHOUT_ENCRYPTION
    assert (
        aiven.manifest_json(index, {**ranges, "transaction": None}, False, None, segment).decode()
        == AIVEN_WITHOUT_TXN
    )
    enc = {"dataKey": "key1:AAECAw==", "aad": "CgsMDQ=="}
    assert aiven.manifest_json(index, ranges, False, enc, segment).decode() == AIVEN_WITH_ENCRYPTION
    for text in (AIVEN_WITHOUT_ENCRYPTION, AIVEN_WITHOUT_TXN, AIVEN_WITH_ENCRYPTION):
        parsed = aiven.parse_manifest(text.encode())
        assert parsed["transformed"] == [110] * 10 and parsed["original_chunk_size"] == 100


def test_the_aiven_reader_is_as_strict_as_aivens_mapping():
    doc = json.loads(AIVEN_WITHOUT_ENCRYPTION)
    # whatever remoteLogSegmentMetadata holds is ignored (a write-only property) ...
    doc["remoteLogSegmentMetadata"]["rsmSidecar"] = {"anything": [1, 2]}
    aiven.parse_manifest(json.dumps(doc).encode())
    # ... but an unknown member anywhere else fails, as do missing ones
    for path in (("extra",), ("chunkIndex", "extra"), ("segmentIndexes", "offset", "extra")):
        bad = json.loads(AIVEN_WITHOUT_ENCRYPTION)
        node = bad
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = 1
        with pytest.raises(aiven.AivenFormatError, match="Unrecognized"):
            aiven.parse_manifest(json.dumps(bad).encode())
    missing = json.loads(AIVEN_WITHOUT_ENCRYPTION)
    del missing["compression"]
    with pytest.raises(aiven.AivenFormatError, match="Missing"):
        aiven.parse_manifest(json.dumps(missing).encode())


# -- Aiven -> rsm-sidecar ------------------------------------------------------------------------
def _metadata(seg: aiven.SegmentInfo) -> SegmentMetadata:
    return SegmentMetadata(
        seg.topic_id, seg.topic, seg.partition, seg.segment_id, seg.start_offset, seg.end_offset
    )


def test_the_sidecar_reads_aiven_segments_byte_for_byte_under_the_migration_setting(
    tmp_path, aiven_ring, our_ring
):
    store = LocalObjectStore(tmp_path, fsync=False)
    written = write_aiven_bucket(store, aiven_ring)
    assert len(written) == len(COMPRESSION) * len(KEY_IDS) * len(CHUNK_SIZES)
    layout = KeyLayout(PREFIX)
    ring = our_ring
    migrating = SegmentReader(store, layout, ring, ReaderSettings(accept_unauthenticated=True))
    strict = SegmentReader(store, layout, ring, ReaderSettings())
    for seg, settings in written:
        opened = migrating.open(_metadata(seg))
        assert opened.manifest.compression == settings.compression
        assert opened.manifest.key_id == settings.key_id
        assert b"".join(migrating.read(opened, 0, len(seg.log))) == seg.log, settings
        for name, data in seg.indexes.items():
            if data is not None:
                assert migrating.read_index(opened, name) == data
        with pytest.raises(DataLoss, match="fetch.accept_unauthenticated_segments"):
            strict.open(_metadata(seg))


# -- rsm-sidecar -> Aiven ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "compression,encrypted", [(False, False), (True, False), (False, True), (True, True)]
)
def test_aivens_reader_reads_what_the_sidecar_writes(tmp_path, aiven_ring, our_ring, compression, encrypted):
    store = LocalObjectStore(tmp_path, fsync=False)
    layout = KeyLayout(PREFIX)
    ring = our_ring if encrypted else None
    settings = CopySettings(
        chunk_size=1000,
        compression=compression,
        compression_heuristic=False,
        custom_metadata_fields=(),
    )
    segs = aiven.fixture_segments("ours", aiven.kafka_uuid("ours"))
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        copier = SegmentCopier(store, layout, ring, settings, ex)
        for seg in segs:
            indexes = {k: v for k, v in seg.indexes.items() if k != "leaderEpoch"}
            copier.copy(_metadata(seg), BytesSource(seg.log, indexes), seg.indexes["leaderEpoch"])
    for seg in segs:
        back = aiven.read_segment(store.get, PREFIX, seg, aiven_ring)
        assert back.log == seg.log
        assert back.indexes == seg.indexes
        assert back.compression == compression and back.key_id == ("aiven-key-1" if encrypted else None)


def test_a_damaged_chunk_fails_aivens_reader_too(tmp_path, aiven_ring):
    """The Aiven-format reader is not lenient: it notices a flipped byte (GCM)."""
    store = LocalObjectStore(tmp_path, fsync=False)
    seg, settings = write_aiven_bucket(store, aiven_ring)[4]
    assert settings.key_id is not None
    key = aiven.object_key(PREFIX, seg, aiven.LOG)
    data = bytearray(store.get(key))
    data[40] ^= 1
    store.put(key, bytes(data))
    with pytest.raises(InvalidTag):
        aiven.read_segment(store.get, PREFIX, seg, aiven_ring)
