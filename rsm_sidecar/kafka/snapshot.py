"""Producer state snapshot files (``<offset>.snapshot``), as Kafka's ``ProducerStateManager``
writes them (the ``ProducerSnapshot`` message, version 1, not flexible)::

    version int16 (1) | crc uint32 | entryCount int32 | entries...
    entry: producerId int64 | epoch int16 | lastSequence int32 | lastOffset int64 |
           offsetDelta int32 | timestamp int64 | coordinatorEpoch int32 | currentTxnFirstOffset int64

The CRC-32C covers everything after the CRC field (from the entry count to the end). Entries
are 46 bytes, so a snapshot is small (one entry per live producer); it is still size-checked
before it is read. ``currentTxnFirstOffset`` is -1 when the producer has no open transaction.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

from .errors import CorruptIndexError, TruncatedError, UnsupportedFormatError
from .reader import Source, _open

SNAPSHOT_VERSION = 1
_HEADER = struct.Struct(">hIi")
_ENTRY = struct.Struct(">qhiqiqiq")
ENTRY_SIZE = _ENTRY.size  # 46
CRC_COVERAGE_START = 6
#: Refuse snapshots larger than this (about 1.4 million producers).
DEFAULT_MAX_SNAPSHOT_SIZE = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ProducerSnapshotEntry:
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int

    @property
    def has_open_transaction(self) -> bool:
        return self.current_txn_first_offset >= 0


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    version: int
    crc: int
    entries: tuple[ProducerSnapshotEntry, ...]


def read_producer_snapshot(
    source: Source, *, name: str | None = None, max_size: int = DEFAULT_MAX_SNAPSHOT_SIZE
) -> ProducerSnapshot:
    """Parse and validate (version, CRC, exact length) a producer snapshot."""
    with _open(source, name) as (f, label):
        data = f.read(max_size + 1)
        if len(data) > max_size:
            raise CorruptIndexError(f"producer snapshot is larger than {max_size} bytes", source=label)
    return parse_producer_snapshot(data, name=label)


def parse_producer_snapshot(data: bytes, *, name: str = "<snapshot>") -> ProducerSnapshot:
    if len(data) < _HEADER.size:
        raise TruncatedError(
            f"producer snapshot is {len(data)} bytes, shorter than its {_HEADER.size}-byte header",
            source=name,
        )
    version, crc, count = _HEADER.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise UnsupportedFormatError(
            f"producer snapshot version {version} (supported: {SNAPSHOT_VERSION})", source=name
        )
    computed = google_crc32c.value(bytes(data[CRC_COVERAGE_START:]))
    if computed != crc:
        raise CorruptIndexError(
            f"producer snapshot CRC mismatch: stored 0x{crc:08x}, computed 0x{computed:08x}", source=name
        )
    if count < 0:
        raise CorruptIndexError(f"negative producer entry count {count}", source=name)
    expected = _HEADER.size + count * ENTRY_SIZE
    if len(data) != expected:
        raise CorruptIndexError(
            f"producer snapshot declares {count} entries ({expected} bytes) but has {len(data)} bytes",
            source=name,
        )
    entries = tuple(
        ProducerSnapshotEntry(*_ENTRY.unpack_from(data, _HEADER.size + i * ENTRY_SIZE)) for i in range(count)
    )
    return ProducerSnapshot(version, crc, entries)


def encode_producer_snapshot(entries: list[ProducerSnapshotEntry]) -> bytes:
    body = struct.pack(">i", len(entries)) + b"".join(
        _ENTRY.pack(
            e.producer_id,
            e.producer_epoch,
            e.last_sequence,
            e.last_offset,
            e.offset_delta,
            e.timestamp,
            e.coordinator_epoch,
            e.current_txn_first_offset,
        )
        for e in entries
    )
    crc = google_crc32c.value(body)
    return struct.pack(">hI", SNAPSHOT_VERSION, crc) + body
