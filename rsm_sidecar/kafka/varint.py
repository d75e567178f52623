"""Kafka's variable-length integers (``ByteUtils``): protobuf-style base-128 with zig-zag.

* varint: at most 5 bytes, a signed 32-bit value; varlong: at most 10 bytes, a signed 64-bit value.
* As in Kafka, bits above 32 (64) that a maximal-length encoding can carry are dropped, and an
  encoding whose last allowed byte still has its continuation bit set is an error.

Decoders take a buffer and a position and return ``(value, next_position)``; they raise
:class:`~rsm_sidecar.kafka.errors.CorruptRecordError` for an overlong encoding and
:class:`~rsm_sidecar.kafka.errors.TruncatedError` when the buffer ends inside one.
"""

from __future__ import annotations

from .errors import CorruptRecordError, TruncatedError

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


def _read_unsigned(buf, pos: int, max_bytes: int, mask: int, what: str) -> tuple[int, int]:
    result = 0
    shift = 0
    end = len(buf)
    start = pos
    for _ in range(max_bytes):
        if pos >= end:
            raise TruncatedError(f"buffer ends inside a {what} that started at {start}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result & mask, pos
        shift += 7
    raise CorruptRecordError(
        f"{what} at {start} is too long: the continuation bit is set in byte {max_bytes}"
    )


def zigzag_decode(n: int) -> int:
    """Unsigned zig-zag value -> signed value (0->0, 1->-1, 2->1, ...)."""
    return (n >> 1) ^ -(n & 1)


def zigzag_encode(n: int, bits: int) -> int:
    """Signed value -> unsigned zig-zag value in ``bits`` bits."""
    return ((n << 1) ^ (n >> (bits - 1))) & ((1 << bits) - 1)


def read_unsigned_varint(buf, pos: int = 0) -> tuple[int, int]:
    """An unsigned 32-bit varint (no zig-zag), as ``ByteUtils.readUnsignedVarint``."""
    return _read_unsigned(buf, pos, 5, _U32, "varint")


def read_varint(buf, pos: int = 0) -> tuple[int, int]:
    """A zig-zag varint -> signed 32-bit int."""
    raw, pos = _read_unsigned(buf, pos, 5, _U32, "varint")
    return zigzag_decode(raw), pos


def read_varlong(buf, pos: int = 0) -> tuple[int, int]:
    """A zig-zag varlong -> signed 64-bit int."""
    raw, pos = _read_unsigned(buf, pos, 10, _U64, "varlong")
    return zigzag_decode(raw), pos


def _write_unsigned(n: int) -> bytes:
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_unsigned_varint(n: int) -> bytes:
    if not 0 <= n <= _U32:
        raise ValueError(f"unsigned varint out of range: {n}")
    return _write_unsigned(n)


def encode_varint(n: int) -> bytes:
    """Signed 32-bit int -> zig-zag varint bytes."""
    if not -(1 << 31) <= n < (1 << 31):
        raise ValueError(f"varint out of int32 range: {n}")
    return _write_unsigned(zigzag_encode(n, 32))


def encode_varlong(n: int) -> bytes:
    """Signed 64-bit int -> zig-zag varlong bytes."""
    if not -(1 << 63) <= n < (1 << 63):
        raise ValueError(f"varlong out of int64 range: {n}")
    return _write_unsigned(zigzag_encode(n, 64))


def size_of_varint(n: int) -> int:
    return len(encode_varint(n))


def size_of_varlong(n: int) -> int:
    return len(encode_varlong(n))
