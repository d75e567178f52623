"""The shared access to stored segments (``segment/access.py``) and the file adapter
over a stored segment's ``.log`` (``segment/log_file.py``), over a local-directory store
written by the sidecar's own copier."""

from __future__ import annotations

import concurrent.futures
import io

import pytest

from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError, DataLoss
from rsm_sidecar.format.keys import SegmentMetadata
from rsm_sidecar.kafka import OffsetPosition
from rsm_sidecar.kafka.indexes import encode_offset_index
from rsm_sidecar.segment.access import SegmentAccess
from rsm_sidecar.segment.log_file import StoredLogFile, offset_position
from rsm_sidecar.segment.settings import CopySettings, ReaderSettings
from rsm_sidecar.segment.sources import BytesSource

MD = SegmentMetadata("MWJ6FHTfRYy67jzwZdeqSQ", "t", 0, "tqimKeZwStOEOwRzT3L5oQ", 100, 199)


def _access(tmp_path) -> SegmentAccess:
    cfg = Config(
        {"storage": {"key_prefix": "p/", "local": {"root": str(tmp_path), "fsync": False}}}, environ={}
    )
    return SegmentAccess(cfg, ReaderSettings(chunk_cache_bytes=0, prefetch_bytes=0, max_range_bytes=2048))


def _store(access: SegmentAccess, data: bytes, offset_index: bytes) -> None:
    settings = CopySettings(chunk_size=1024, compression=True, compression_heuristic=False)
    indexes: dict[str, bytes | None] = {
        "offset": offset_index,
        "timestamp": b"",
        "producerSnapshot": b"",
        "transaction": None,
    }
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        access.copier(settings, ex).copy(MD, BytesSource(data, indexes), b"0\n0\n")


def test_stored_log_file_reads_and_seeks_across_chunks(tmp_path):
    access = _access(tmp_path)
    data = bytes(range(256)) * 40  # 10240 bytes in 1024-byte chunks
    _store(access, data, b"")
    seen: list[int] = []
    f = StoredLogFile(access.reader, access.reader.open(MD), seen.append)
    assert f.name == "p/t-MWJ6FHTfRYy67jzwZdeqSQ/0/00000000000000000100-tqimKeZwStOEOwRzT3L5oQ.log"
    assert f.seekable() and f.seek(0, io.SEEK_END) == len(data) and f.seek(0) == 0
    assert f.read(10) == data[:10]
    assert f.read(3000) == data[10:3010]  # across chunk boundaries
    f.seek(9000)
    assert f.read(5000) == data[9000:]  # clamped at the end
    assert f.read(1) == b""
    f.seek(100)
    assert f.read() == data[100:]
    buf = bytearray(50)
    f.seek(1020)
    assert f.readinto(buf) == 50 and bytes(buf) == data[1020:1070]
    assert sum(seen) >= len(data)
    f.close()


def test_offset_position_is_the_offset_index_floor_entry(tmp_path):
    access = _access(tmp_path)
    index = encode_offset_index([OffsetPosition(110, 4096), OffsetPosition(150, 8192)], 100)
    _store(access, b"x" * 10000, index)
    seg = access.reader.open(MD)
    assert [offset_position(access.reader, seg, 100, o) for o in (50, 100, 109, 110, 149, 150, 10**6)] == [
        0,
        0,
        0,
        4096,
        4096,
        8192,
        8192,
    ]


def test_offset_position_names_a_damaged_offset_index(tmp_path):
    access = _access(tmp_path)
    _store(access, b"x" * 10000, b"\x00\x00\x00\x0a\x00\x00\x10")  # 7 bytes: not whole 8-byte entries
    seg = access.reader.open(MD)
    with pytest.raises(DataLoss, match="offset index"):
        offset_position(access.reader, seg, 100, 120)


def test_lazy_keys_load_the_keyring_only_when_the_reader_is_needed(tmp_path):
    """``inspect`` commands that never decrypt (ls, du, orphans) work without the private
    keys; the sidecar and the Iceberg executors fail at once on a key problem."""
    missing = tmp_path / "no-such.priv"
    cfg = Config(
        {
            "storage": {"local": {"root": str(tmp_path / "store")}},
            "encryption": {
                "enabled": True,
                "active_key_id": "k",
                "keys": {"k": {"public_key_file": str(missing), "private_key_file": str(missing)}},
            },
        },
        environ={},
    )
    lazy = SegmentAccess(cfg, ReaderSettings(), lazy_keys=True)
    assert list(lazy.store.list(lazy.layout.prefix)) == []
    with pytest.raises(ConfigError, match="no-such.priv"):
        _ = lazy.reader
    with pytest.raises(ConfigError, match="no-such.priv"):
        SegmentAccess(cfg, ReaderSettings())
