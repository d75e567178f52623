"""Record batch header, message format v2 (magic 2), as in Kafka's ``DefaultRecordBatch``.

Layout (big-endian), 61 bytes before the records::

    baseOffset int64 | length int32 | partitionLeaderEpoch int32 | magic int8 | crc uint32 |
    attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 |
    producerId int64 | producerEpoch int16 | baseSequence int32 | recordCount int32 | records...

``length`` counts the bytes after the length field, so a batch occupies ``12 + length`` bytes.
The CRC-32C (Castagnoli) covers everything from ``attributes`` to the end of the batch; the
partition leader epoch is outside it so brokers can stamp it without recomputing.

Attributes: bits 0-2 compression codec, bit 3 timestamp type (1 = log append time), bit 4
transactional, bit 5 control batch, bit 6 delete horizon set (``baseTimestamp`` then holds the
delete horizon). The high byte is unused.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import google_crc32c

from rsm_sidecar.format.varint import Buffer

from .errors import BatchSizeError, CorruptRecordError, CrcMismatchError, UnsupportedFormatError, Where

LOG_OVERHEAD = 12  #: baseOffset + length: the bytes not counted by ``length``
HEADER_SIZE_UP_TO_MAGIC = 17  #: enough to read the magic byte (Kafka's ``HEADER_SIZE_UP_TO_MAGIC``)
BATCH_HEADER_SIZE = 61  #: ``RECORD_BATCH_OVERHEAD``: the full v2 header including the record count
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAGIC_OFFSET = 16
MAGIC_V2 = 2
LEGACY_RECORD_OVERHEAD_V0 = 14  #: smallest possible length of any message format version

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
NO_PARTITION_LEADER_EPOCH = -1

#: Default refusal threshold for a batch's length field. Kafka's own default
#: ``message.max.bytes`` is ~1 MiB; anything beyond 64 MiB in a segment is almost surely a
#: corrupt length field. Callers with bigger legitimate batches pass ``max_batch_size``.
DEFAULT_MAX_BATCH_SIZE = 64 * 1024 * 1024

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == BATCH_HEADER_SIZE


class Compression(enum.IntEnum):
    """The compression codec id in attribute bits 0-2 (``CompressionType``)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The 61-byte header of one v2 batch. ``position`` is where the batch starts in its source."""

    base_offset: int
    length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    position: int = 0

    @property
    def size_in_bytes(self) -> int:
        """Bytes the whole batch occupies: ``12 + length``."""
        return LOG_OVERHEAD + self.length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression_id(self) -> int:
        return self.attributes & COMPRESSION_MASK

    def where(self, source: str | None = None) -> Where:
        """This batch's location, for the errors about it."""
        return Where(source=source, position=self.position, offset=self.base_offset)

    @property
    def compression(self) -> Compression:
        """The codec; raises :class:`UnsupportedFormatError` for ids 5-7."""
        try:
            return Compression(self.compression_id)
        except ValueError:
            raise UnsupportedFormatError(
                f"unknown compression codec id {self.compression_id} in batch attributes "
                f"0x{self.attributes:04x}",
                **self.where(),
            ) from None

    @property
    def timestamp_type(self) -> TimestampType:
        return (
            TimestampType.LOG_APPEND_TIME
            if self.attributes & TIMESTAMP_TYPE_MASK
            else TimestampType.CREATE_TIME
        )

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        return self.base_timestamp if self.has_delete_horizon else None

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        """As ``DefaultRecordBatch.lastSequence``: wraps around at ``Integer.MAX_VALUE``."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)

    def describe(self) -> str:
        flags = [self.compression.name.lower()]
        if self.is_transactional:
            flags.append("transactional")
        if self.is_control:
            flags.append("control")
        return (
            f"batch [{self.base_offset}..{self.last_offset}] at position {self.position}, "
            f"{self.record_count} records, {self.size_in_bytes} bytes, {', '.join(flags)}"
        )


def increment_sequence(sequence: int, increment: int) -> int:
    """Producer sequence arithmetic (``DefaultRecordBatch.incrementSequence``)."""
    if sequence > 0x7FFFFFFF - increment:
        return increment - (0x7FFFFFFF - sequence) - 1
    return sequence + increment


def read_length_and_magic(
    buf: Buffer, position: int = 0, *, source: str | None = None, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
) -> tuple[int, int, int]:
    """From the first 17 bytes of a batch: ``(base_offset, length, magic)``, after the cheap
    checks Kafka's ``FileLogInputStream`` makes before it allocates anything: the length is at
    least the v2 header, at most ``max_batch_size``, and the magic is 2."""
    base_offset, length = struct.unpack_from(">qi", buf, 0)
    magic = buf[MAGIC_OFFSET]
    where = Where(source=source, position=position, offset=base_offset)
    # Same order as Kafka: the size bounds first (a zero-filled region fails here), then magic.
    if length < LEGACY_RECORD_OVERHEAD_V0:
        raise BatchSizeError(
            f"batch length field {length} is smaller than the minimum "
            f"{BATCH_HEADER_SIZE - LOG_OVERHEAD} of a v2 batch header",
            **where,
        )
    if LOG_OVERHEAD + length > max_batch_size:
        raise BatchSizeError(
            f"batch length field {length} exceeds the maximum batch size {max_batch_size} "
            "(corrupt length field, or pass a larger max_batch_size)",
            **where,
        )
    if magic in (0, 1):
        raise UnsupportedFormatError(
            f"message format v{magic} (magic {magic}) batch; only magic 2 is supported", **where
        )
    if magic != MAGIC_V2:
        raise CorruptRecordError(f"invalid magic byte {magic} (expected 2)", **where)
    if length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        raise BatchSizeError(
            f"batch length field {length} is smaller than the minimum "
            f"{BATCH_HEADER_SIZE - LOG_OVERHEAD} of a v2 batch header",
            **where,
        )
    return base_offset, length, magic


def parse_batch_header(
    buf: Buffer, position: int = 0, *, source: str | None = None, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
) -> BatchHeader:
    """Parse the 61-byte header at the start of ``buf`` (a bytes-like object of >= 61 bytes).

    ``position`` is only recorded (and used in error messages). Checks the magic, the length
    bounds, a non-negative record count and a non-negative last offset delta. Does not verify
    the CRC (that needs the whole batch: :func:`verify_batch_crc`).
    """
    if len(buf) < BATCH_HEADER_SIZE:
        raise ValueError(f"need {BATCH_HEADER_SIZE} bytes for a batch header, got {len(buf)}")
    read_length_and_magic(buf, position, source=source, max_batch_size=max_batch_size)
    fields: tuple[int, int, int, int, int, int, int, int, int, int, int, int, int] = _HEADER.unpack_from(
        buf, 0
    )
    header = BatchHeader(*fields, position=position)
    where = Where(source=source, position=position, offset=header.base_offset)
    if header.record_count < 0:
        raise CorruptRecordError(f"negative record count {header.record_count}", **where)
    if header.last_offset_delta < 0:
        raise CorruptRecordError(f"negative last offset delta {header.last_offset_delta}", **where)
    return header


def compute_batch_crc(batch: bytes) -> int:
    """CRC-32C of a whole batch's bytes from the attributes field to the end."""
    return int(google_crc32c.value(bytes(batch[ATTRIBUTES_OFFSET:])))


def verify_batch_crc(header: BatchHeader, batch: bytes, *, source: str | None = None) -> None:
    """Raise :class:`CrcMismatchError` naming the batch if its stored CRC does not match."""
    computed = compute_batch_crc(batch)
    if computed != header.crc:
        raise CrcMismatchError(
            f"CRC32C mismatch in batch [{header.base_offset}..{header.last_offset}] "
            f"({header.size_in_bytes} bytes): stored 0x{header.crc:08x}, computed 0x{computed:08x}",
            stored=header.crc,
            computed=computed,
            **header.where(source),
        )


def encode_batch_header(
    *,
    base_offset: int,
    length: int,
    partition_leader_epoch: int,
    crc: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    record_count: int,
) -> bytes:
    """The 61 header bytes for the given field values (see :mod:`rsm_sidecar.kafka.builder`)."""
    return _HEADER.pack(
        base_offset,
        length,
        partition_leader_epoch,
        MAGIC_V2,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        record_count,
    )
