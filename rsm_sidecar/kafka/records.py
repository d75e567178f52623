"""Records inside a v2 batch (Kafka's ``DefaultRecord``).

Each record, after the (decompressed) batch header::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint | key | valueLength varint | value |
    headerCount varint | [headerKeyLength varint | headerKey | headerValueLength varint | value]

``length`` counts the bytes after itself. A negative key/value/header-value length means null
(Kafka writes -1; like Kafka's reader any negative length is read as null). A null value is a
tombstone. Header keys are UTF-8 strings and never null.

Timestamps: ``baseTimestamp + timestampDelta``, except in log-append-time batches where every
record carries the batch's ``maxTimestamp``. Offsets: ``baseOffset + offsetDelta``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rsm_sidecar.format.varint import Buffer

from .batch import NO_SEQUENCE, BatchHeader, TimestampType, increment_sequence
from .errors import CorruptRecordError, KafkaLogError
from .varint import encode_varint, encode_varlong, read_varint, read_varlong


@dataclass(frozen=True, slots=True)
class Header:
    """A record header: a UTF-8 key and a nullable byte value."""

    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    """One record with absolute offset and timestamp. ``key``/``value`` are ``None`` when null."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    attributes: int = 0
    offset_delta: int = 0
    timestamp_delta: int = 0
    sequence: int = NO_SEQUENCE
    size_in_bytes: int = 0  #: including its own length varint

    @property
    def is_tombstone(self) -> bool:
        return self.value is None


def _read_bytes(buf: Buffer, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    n, pos = read_varint(buf, pos)
    if n < 0:
        return None, pos
    if pos + n > end:
        raise CorruptRecordError(f"{what} length {n} runs past the end of the record")
    return bytes(buf[pos : pos + n]), pos + n


def parse_record(buf: Buffer, pos: int, header: BatchHeader) -> tuple[Record, int]:
    """Parse the record at ``buf[pos:]``; return it and the position after it.

    Raises :class:`CorruptRecordError` (without location; :func:`parse_records` adds it).
    """
    start = pos
    body_len, pos = read_varint(buf, pos)
    if body_len < 1:
        raise CorruptRecordError(f"invalid record length {body_len}")
    body_start = pos
    end = body_start + body_len
    if end > len(buf):
        raise CorruptRecordError(
            f"record length {body_len} runs past the end of the batch ({len(buf) - body_start} bytes remain)"
        )
    view = memoryview(buf)[:end]
    attributes = view[pos]
    pos += 1
    ts_delta, pos = read_varlong(view, pos)
    offset_delta, pos = read_varint(view, pos)
    key, pos = _read_bytes(view, pos, end, "key")
    value, pos = _read_bytes(view, pos, end, "value")
    n_headers, pos = read_varint(view, pos)
    if n_headers < 0:
        raise CorruptRecordError(f"invalid number of record headers {n_headers}")
    if n_headers > end - pos:
        raise CorruptRecordError(
            f"number of record headers {n_headers} is larger than the {end - pos} bytes left"
        )
    headers = []
    for _ in range(n_headers):
        key_len, pos = read_varint(view, pos)
        if key_len < 0:
            raise CorruptRecordError(f"negative header key length {key_len}")
        if pos + key_len > end:
            raise CorruptRecordError(f"header key length {key_len} runs past the end of the record")
        # Java decodes header keys with replacement of malformed UTF-8; so do we.
        hkey = bytes(view[pos : pos + key_len]).decode("utf-8", errors="replace")
        pos += key_len
        hvalue, pos = _read_bytes(view, pos, end, "header value")
        headers.append(Header(hkey, hvalue))
    if pos != end:
        raise CorruptRecordError(f"record declares {body_len} bytes but its fields use {pos - body_start}")
    if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
        timestamp = header.max_timestamp
    else:
        timestamp = header.base_timestamp + ts_delta
    sequence = (
        increment_sequence(header.base_sequence, offset_delta) if header.base_sequence >= 0 else NO_SEQUENCE
    )
    record = Record(
        offset=header.base_offset + offset_delta,
        timestamp=timestamp,
        key=key,
        value=value,
        headers=tuple(headers),
        attributes=attributes,
        offset_delta=offset_delta,
        timestamp_delta=ts_delta,
        sequence=sequence,
        size_in_bytes=end - start,
    )
    return record, end


def parse_records(
    records_section: bytes, header: BatchHeader, *, source: str | None = None
) -> Iterator[Record]:
    """Records of one batch from its (decompressed) records section.

    Checks what Kafka's record iterator checks: exactly ``record_count`` records and no bytes
    left over; plus offset deltas within ``last_offset_delta``. Errors name the batch.
    """
    pos = 0
    count = header.record_count
    for i in range(count):
        try:
            record, pos = parse_record(records_section, pos, header)
        except KafkaLogError as exc:
            raise CorruptRecordError(
                f"record {i} of {count} in {header.describe()}: {exc.detail}",
                **header.where(source),
            ) from exc
        if not 0 <= record.offset_delta <= header.last_offset_delta:
            raise CorruptRecordError(
                f"record {i} has offset delta {record.offset_delta} outside the batch's "
                f"[0, {header.last_offset_delta}] ({header.describe()})",
                **header.where(source),
            )
        yield record
    if pos != len(records_section):
        raise CorruptRecordError(
            f"{len(records_section) - pos} bytes remain after the {count} declared records "
            f"({header.describe()})",
            **header.where(source),
        )


def encode_record(
    *,
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: tuple[Header, ...] | list[Header] = (),
    attributes: int = 0,
) -> bytes:
    """Serialize one record (the inverse of :func:`parse_record`)."""
    body = bytearray([attributes & 0xFF])
    body += encode_varlong(timestamp_delta)
    body += encode_varint(offset_delta)
    for field in (key, value):
        if field is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(field)) + field
    body += encode_varint(len(headers))
    for h in headers:
        hkey = h.key.encode("utf-8")
        body += encode_varint(len(hkey)) + hkey
        if h.value is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(h.value)) + h.value
    return encode_varint(len(body)) + bytes(body)
