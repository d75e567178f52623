"""Copy then read back: every byte of every range equals the original, for every
combination of size, compression and encryption."""

from __future__ import annotations

import concurrent.futures
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsm_sidecar.config import Config
from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.reader import SegmentReader
from rsm_sidecar.segment.settings import CopySettings, ReaderSettings
from rsm_sidecar.segment.sources import BytesSource
from rsm_sidecar.storage.local import LocalObjectStore
from rsm_sidecar.transform.keyring import Keyring
from tests.keys_fixture import encryption_config

CHUNK = 1024
POOL = concurrent.futures.ThreadPoolExecutor(4)


def metadata(n: int, size: int) -> SegmentMetadata:
    sid = f"seg{n:019d}"[:22].ljust(22, "A")
    return SegmentMetadata(
        "MWJ6FHTfRYy67jzwZdeqSQ", "prop-topic", n % 3, sid, n * 10, n * 10 + 5, segment_size=size
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory, rsa_keys):
    store = LocalObjectStore(tmp_path_factory.mktemp("roundtrip"), fsync=False)
    keyring = Keyring.from_config(
        Config({"storage": {"local": {"root": "/unused"}}, "encryption": encryption_config(rsa_keys)})
    )
    return store, keyring, tmp_path_factory.mktemp("disk-cache")


def _indexes():
    return {
        "offset": b"\x00" * 8,
        "timestamp": b"\x01" * 12,
        "producerSnapshot": b"snap",
        "leaderEpoch": b"0\n1\n0 0\n",
        "transaction": None,
    }


def _source(original: bytes) -> BytesSource:
    indexes = _indexes()
    del indexes["leaderEpoch"]
    return BytesSource(original, indexes)


def segment_bytes(size: int, compressible: bool, seed: int) -> bytes:
    if compressible:
        base = (b"kafka record %d " % seed) * (size // 10 + 1)
        return base[:size]
    return os.urandom(size)


counter = iter(range(10**9))


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    size=st.sampled_from([0, 1, CHUNK - 1, CHUNK, CHUNK + 1]) | st.integers(0, 12 * CHUNK),
    compression=st.booleans(),
    encryption=st.booleans(),
    compressible=st.booleans(),
    parallelism=st.integers(1, 4),
    data=st.data(),
)
def test_any_range_reads_back_the_original_bytes(
    env, size, compression, encryption, compressible, parallelism, data
):
    store, keyring, disk_cache = env
    n = next(counter)
    original = segment_bytes(size, compressible, n)
    md = metadata(n, size)
    layout = KeyLayout("prop/")
    copier = SegmentCopier(
        store,
        layout,
        keyring if encryption else None,
        CopySettings(
            chunk_size=CHUNK, compression=compression, compression_heuristic=False, parallelism=parallelism
        ),
        POOL,
    )
    result = copier.copy(md, _source(original), _indexes()["leaderEpoch"])
    assert result.manifest.compression == compression
    assert (result.manifest.encryption is not None) == encryption
    reader = SegmentReader(
        store,
        layout,
        keyring if encryption else None,
        ReaderSettings(
            chunk_cache_bytes=data.draw(st.sampled_from([0, 3 * CHUNK, 10**7])),
            max_range_bytes=data.draw(st.sampled_from([1024, 3000, 10**6])),
            prefetch_bytes=0,
            disk_cache_path=data.draw(st.sampled_from(["", str(disk_cache)])),
        ),
    )
    seg = reader.open(md)
    assert seg.manifest.original_size == size
    if size == 0:
        assert b"".join(reader.read(seg, 0, 10)) == b""
        return
    for _ in range(3):
        start = data.draw(st.integers(0, size - 1))
        end = data.draw(st.integers(start, size + 100))
        assert b"".join(reader.read(seg, start, end)) == original[start : end + 1]
    assert b"".join(reader.read(seg, 0, size - 1)) == original
    if reader.disk is not None:  # a restarted reader: its chunks come from the disk cache
        restarted = SegmentReader(store, layout, reader.keyring, reader.settings)
        assert b"".join(restarted.read(restarted.open(md), 0, size - 1)) == original
    for name in ("offset", "timestamp", "producerSnapshot", "leaderEpoch"):
        assert reader.read_index(seg, name) == _indexes()[name]


def test_compressed_segment_is_smaller_and_index_is_compact(env):
    store, keyring, disk_cache = env
    size = 200 * CHUNK
    original = segment_bytes(size, True, 1)
    md = metadata(999_999, size)
    copier = SegmentCopier(store, KeyLayout("compact/"), None, CopySettings(chunk_size=CHUNK), POOL)
    result = copier.copy(md, _source(original), _indexes()["leaderEpoch"])
    assert result.manifest.compression and result.manifest.chunk_index.kind == "variable"
    assert result.manifest.stored_log_size < size / 5
