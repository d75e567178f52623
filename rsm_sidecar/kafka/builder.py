"""Building v2 batches in memory: synthetic segments for tests and tools.

The output is byte-compatible with what a broker stores (same header layout, CRC32C, record
encoding); it is not meant to replace a producer. Example::

    data = build_batch([SimpleRecord(b"k", b"v", timestamp=1000)], base_offset=0)
    data += build_control_batch(ControlType.COMMIT, base_offset=1, producer_id=7)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    COMPRESSION_MASK,
    CONTROL_MASK,
    LOG_OVERHEAD,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    Compression,
    TimestampType,
    compute_batch_crc,
    encode_batch_header,
)
from .compression import compress
from .control import ControlType, encode_marker_key, encode_marker_value
from .records import Header, encode_record


@dataclass(frozen=True)
class SimpleRecord:
    """Input to :func:`build_batch`. ``offset_delta`` defaults to the record's index."""

    key: bytes | None
    value: bytes | None
    timestamp: int = 0
    headers: tuple[Header, ...] = field(default_factory=tuple)
    offset_delta: int | None = None


def build_batch(
    records: Sequence[SimpleRecord],
    *,
    base_offset: int = 0,
    compression: Compression = Compression.NONE,
    xerial_snappy: bool = False,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    log_append_time: int | None = None,
    transactional: bool = False,
    control: bool = False,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = 0,
    last_offset_delta: int | None = None,
) -> bytes:
    """Serialize one batch (header with correct length and CRC, records possibly compressed)."""
    if not records and last_offset_delta is None:
        raise ValueError("an empty batch needs an explicit last_offset_delta")
    base_ts = records[0].timestamp if records else -1
    body = bytearray()
    deltas = []
    for i, r in enumerate(records):
        delta = i if r.offset_delta is None else r.offset_delta
        deltas.append(delta)
        body += encode_record(
            offset_delta=delta,
            timestamp_delta=r.timestamp - base_ts,
            key=r.key,
            value=r.value,
            headers=r.headers,
        )
    payload = compress(compression, bytes(body), xerial=xerial_snappy)
    attributes = int(compression) & COMPRESSION_MASK
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if transactional:
        attributes |= TRANSACTIONAL_MASK
    if control:
        attributes |= CONTROL_MASK
    max_ts = max((r.timestamp for r in records), default=-1)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        if log_append_time is None:
            raise ValueError("log-append-time batches need log_append_time")
        max_ts = log_append_time
    length = BATCH_HEADER_SIZE + len(payload) - LOG_OVERHEAD
    header = encode_batch_header(
        base_offset=base_offset,
        length=length,
        partition_leader_epoch=partition_leader_epoch,
        crc=0,
        attributes=attributes,
        last_offset_delta=max(deltas) if last_offset_delta is None else last_offset_delta,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        record_count=len(records),
    )
    batch = bytearray(header + payload)
    return bytes(_set_crc(batch))


def _set_crc(batch: bytearray) -> bytearray:
    crc = compute_batch_crc(bytes(batch))
    batch[ATTRIBUTES_OFFSET - 4 : ATTRIBUTES_OFFSET] = crc.to_bytes(4, "big")
    return batch


def build_control_batch(
    control_type: ControlType,
    *,
    base_offset: int,
    producer_id: int,
    producer_epoch: int = 0,
    coordinator_epoch: int = 0,
    timestamp: int = 0,
    partition_leader_epoch: int = 0,
) -> bytes:
    """A transaction marker batch (COMMIT or ABORT), as the broker writes it."""
    record = SimpleRecord(
        key=encode_marker_key(control_type), value=encode_marker_value(coordinator_epoch), timestamp=timestamp
    )
    return build_batch(
        [record],
        base_offset=base_offset,
        transactional=True,
        control=True,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
    )


def recompute_crc(batch: bytes) -> bytes:
    """Return ``batch`` with its CRC field recomputed (to build deliberately odd batches)."""
    return bytes(_set_crc(bytearray(batch)))
