"""Variable-length integers, the one codec of the project: protobuf-style base-128 (7 bits a
byte, least significant group first, high bit = more bytes follow), with zig-zag for signed values.

Kafka's ``ByteUtils`` semantics: a varint is at most 5 bytes and a signed 32-bit value, a varlong
at most 10 bytes and a signed 64-bit value; bits above 32 (64) that a maximal-length encoding can
carry are dropped, and an encoding whose last allowed byte still has its continuation bit set is
an error. The same codec reads Kafka's tagged fields (KIP-917 custom metadata) and the Confluent
schema-registry preamble.

Decoders take a buffer and a position and return ``(value, next_position)``. They raise
:class:`TruncatedVarintError` when the buffer ends inside an encoding and
:class:`OverlongVarintError` for one longer than allowed, unless the caller names its own error
types (``errors=VarintErrors(truncated, overlong)``: each is called with one message) so that
every layer reports in its own terms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from rsm_sidecar.errors import DataLoss

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1
VARINT_MAX_BYTES = 5
VARLONG_MAX_BYTES = 10

#: what a decoder reads from: ``bytes``, ``bytearray`` or a ``memoryview`` of bytes
Buffer = bytes | bytearray | memoryview
ErrorFactory = Callable[[str], Exception]


class VarintError(DataLoss):
    """Bytes that are not a valid varint."""


class TruncatedVarintError(VarintError):
    """The buffer ends inside a varint."""


class OverlongVarintError(VarintError):
    """A varint whose last allowed byte still has its continuation bit set."""


class VarintErrors(NamedTuple):
    """The errors a decoder raises, each called with one message."""

    truncated: ErrorFactory
    overlong: ErrorFactory


CODEC_ERRORS = VarintErrors(TruncatedVarintError, OverlongVarintError)


def read_unsigned(
    buf: Buffer,
    pos: int = 0,
    max_bytes: int = VARLONG_MAX_BYTES,
    what: str = "varint",
    errors: VarintErrors = CODEC_ERRORS,
) -> tuple[int, int]:
    """The unsigned value of at most ``max_bytes`` bytes at ``buf[pos:]`` (not masked: a caller
    that wants Kafka's 32/64-bit wrap-around masks it) and the position after it."""
    result = 0
    shift = 0
    end = len(buf)
    start = pos
    for _ in range(max_bytes):
        if pos >= end:
            raise errors.truncated(f"buffer ends inside a {what} that started at {start}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
    raise errors.overlong(f"{what} at {start} is too long: the continuation bit is set in byte {max_bytes}")


def encode_unsigned(n: int) -> bytes:
    """Any non-negative integer -> its base-128 bytes (callers check their own range)."""
    if n < 0:
        raise ValueError(f"an unsigned varint cannot hold {n}")
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag_decode(n: int) -> int:
    """Unsigned zig-zag value -> signed value (0->0, 1->-1, 2->1, ...)."""
    return (n >> 1) ^ -(n & 1)


def zigzag_encode(n: int, bits: int) -> int:
    """Signed value -> unsigned zig-zag value in ``bits`` bits."""
    return ((n << 1) ^ (n >> (bits - 1))) & ((1 << bits) - 1)


def read_unsigned_varint(buf: Buffer, pos: int = 0, errors: VarintErrors = CODEC_ERRORS) -> tuple[int, int]:
    """An unsigned 32-bit varint (no zig-zag), as ``ByteUtils.readUnsignedVarint``."""
    raw, pos = read_unsigned(buf, pos, VARINT_MAX_BYTES, "varint", errors)
    return raw & U32, pos


def read_varint(buf: Buffer, pos: int = 0, errors: VarintErrors = CODEC_ERRORS) -> tuple[int, int]:
    """A zig-zag varint -> signed 32-bit int."""
    raw, pos = read_unsigned(buf, pos, VARINT_MAX_BYTES, "varint", errors)
    return zigzag_decode(raw & U32), pos


def read_varlong(buf: Buffer, pos: int = 0, errors: VarintErrors = CODEC_ERRORS) -> tuple[int, int]:
    """A zig-zag varlong -> signed 64-bit int."""
    raw, pos = read_unsigned(buf, pos, VARLONG_MAX_BYTES, "varlong", errors)
    return zigzag_decode(raw & U64), pos


def encode_unsigned_varint(n: int) -> bytes:
    """An unsigned 32-bit int -> varint bytes (no zig-zag)."""
    if not 0 <= n <= U32:
        raise ValueError(f"unsigned varint out of range: {n}")
    return encode_unsigned(n)


def encode_varint(n: int) -> bytes:
    """Signed 32-bit int -> zig-zag varint bytes."""
    if not -(1 << 31) <= n < (1 << 31):
        raise ValueError(f"varint out of int32 range: {n}")
    return encode_unsigned(zigzag_encode(n, 32))


def encode_varlong(n: int) -> bytes:
    """Signed 64-bit int -> zig-zag varlong bytes."""
    if not -(1 << 63) <= n < (1 << 63):
        raise ValueError(f"varlong out of int64 range: {n}")
    return encode_unsigned(zigzag_encode(n, 64))


def size_of_varint(n: int) -> int:
    return len(encode_varint(n))


def size_of_varlong(n: int) -> int:
    return len(encode_varlong(n))
