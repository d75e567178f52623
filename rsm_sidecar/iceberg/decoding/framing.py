"""The Confluent schema-registry wire-format preamble.

``0x00`` magic, a 4-byte big-endian schema id, and for Protobuf the *message indexes*: a
zig-zag varint count followed by that many zig-zag varint indexes (the path from the file's
top-level messages into nested types). The common case ``[0]`` is written as a single ``0x00``
(count 0 means ``[0]``); in full form it would be ``02 00``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from rsm_sidecar.format.varint import VarintErrors, encode_varlong, read_varlong

MAGIC = 0
#: Marker of Kafka-on-Pulsar's schema-version header (+ 8-byte big-endian Pulsar schema version):
#: recognised only to say so in the error, never decoded (docs/iceberg.md).
KOP_MARKER = b"\x03\x04"
_MAX_INDEXES = 64  # nesting depth; anything deeper is corrupt input, not a schema


class FramingError(ValueError):
    """The bytes do not start with a valid Confluent preamble (a record-level error)."""


class Framed(NamedTuple):
    schema_id: int
    indexes: tuple[int, ...] | None  # None when not parsed (Avro/JSON)
    header_len: int  # bytes of preamble; payload = data[header_len:]


def _truncated(message: str) -> FramingError:
    return FramingError(f"truncated varint in message indexes: {message}")


_ERRORS = VarintErrors(truncated=_truncated, overlong=FramingError)


def _read_zigzag(data: bytes, pos: int) -> tuple[int, int]:
    return read_varlong(data, pos, _ERRORS)


def parse(data: bytes, *, protobuf: bool) -> Framed:
    """Parse the preamble of ``data``; raise :class:`FramingError` if it is not one."""
    if len(data) < 5:
        raise FramingError(f"too short for a schema-registry preamble ({len(data)} bytes)")
    if data[0] != MAGIC:
        if data[:2] == KOP_MARKER and len(data) >= 10:
            version = int.from_bytes(data[2:10], "big", signed=True)
            raise FramingError(
                f"KoP schema-version marker 0x03 0x04 (Pulsar schema version {version}) is not "
                "supported: only the Confluent preamble (0x00 + 4-byte schema id) is decoded"
            )
        raise FramingError(f"missing magic byte: first byte is 0x{data[0]:02x}, expected 0x00")
    schema_id = int.from_bytes(data[1:5], "big", signed=True)
    if not protobuf:
        return Framed(schema_id, None, 5)
    if len(data) > 5 and data[5] == 0:
        return Framed(schema_id, (0,), 6)
    count, pos = _read_zigzag(data, 5)
    if count < 0 or count > _MAX_INDEXES:
        raise FramingError(f"invalid message-index count {count}")
    idx = []
    for _ in range(count):
        v, pos = _read_zigzag(data, pos)
        if v < 0:
            raise FramingError(f"negative message index {v}")
        idx.append(v)
    return Framed(schema_id, tuple(idx), pos)


def encode_preamble(schema_id: int, indexes: Sequence[int] | None = None) -> bytes:
    """The preamble for ``schema_id`` (+ Protobuf ``indexes``; ``[0]`` -> single ``0x00``)."""
    head = bytes([MAGIC]) + int(schema_id).to_bytes(4, "big", signed=True)
    if indexes is None:
        return head
    idx = list(indexes)
    if idx == [0]:
        return head + b"\x00"
    return head + encode_varlong(len(idx)) + b"".join(encode_varlong(i) for i in idx)
