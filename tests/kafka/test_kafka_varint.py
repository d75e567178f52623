"""Zig-zag varint/varlong edge cases (Kafka's ByteUtils semantics)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.kafka.errors import CorruptRecordError, TruncatedError
from rsm_sidecar.kafka.varint import (
    encode_unsigned_varint,
    encode_varint,
    encode_varlong,
    read_unsigned_varint,
    read_varint,
    read_varlong,
    size_of_varint,
    size_of_varlong,
)

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@pytest.mark.parametrize(
    "value, encoded",
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (-2, b"\x03"),
        (63, b"\x7e"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (300, b"\xd8\x04"),
        (-300, b"\xd7\x04"),
        (INT32_MAX, b"\xfe\xff\xff\xff\x0f"),
        (INT32_MIN, b"\xff\xff\xff\xff\x0f"),
    ],
)
def test_varint_known_vectors(value, encoded):
    assert encode_varint(value) == encoded
    assert read_varint(encoded) == (value, len(encoded))
    assert size_of_varint(value) == len(encoded)


@pytest.mark.parametrize(
    "value, size",
    [
        (0, 1),
        (-1, 1),
        (INT64_MAX, 10),
        (INT64_MIN, 10),
        (1 << 35, 6),
        (-(1 << 35), 6),
    ],
)
def test_varlong_sizes_and_round_trip(value, size):
    encoded = encode_varlong(value)
    assert len(encoded) == size == size_of_varlong(value)
    assert read_varlong(encoded) == (value, size)


def test_read_at_position_returns_next_position():
    buf = b"junk" + encode_varint(-5) + encode_varlong(1 << 40) + b"tail"
    v, pos = read_varint(buf, 4)
    assert v == -5
    w, pos2 = read_varlong(buf, pos)
    assert w == 1 << 40 and buf[pos2:] == b"tail"


def test_overlong_varint_is_corrupt():
    # Continuation bit still set in the 5th byte: Kafka's "Varint is too long".
    with pytest.raises(CorruptRecordError, match="too long"):
        read_varint(b"\x80\x80\x80\x80\x80\x01")
    with pytest.raises(CorruptRecordError, match="too long"):
        read_varlong(b"\xff" * 10 + b"\x01")


def test_truncated_varint():
    with pytest.raises(TruncatedError, match="ends inside a varint"):
        read_varint(b"\x80\x80")
    with pytest.raises(TruncatedError):
        read_varlong(b"")
    assert issubclass(TruncatedError, DataLoss)


def test_fifth_byte_high_bits_are_dropped_like_java():
    # Java shifts the 5th byte left by 28 into an int: bits beyond 32 are lost.
    raw, _ = read_unsigned_varint(b"\xff\xff\xff\xff\x7f")
    assert raw == 0xFFFFFFFF
    assert read_varint(b"\xff\xff\xff\xff\x7f")[0] == INT32_MIN


def test_encode_range_checks():
    with pytest.raises(ValueError):
        encode_varint(INT32_MAX + 1)
    with pytest.raises(ValueError):
        encode_varlong(INT64_MIN - 1)
    with pytest.raises(ValueError):
        encode_unsigned_varint(-1)


@given(st.integers(INT32_MIN, INT32_MAX))
def test_varint_round_trip(n):
    enc = encode_varint(n)
    assert len(enc) in range(1, 6)
    assert read_varint(enc + b"\xaa") == (n, len(enc))


@given(st.integers(INT64_MIN, INT64_MAX))
def test_varlong_round_trip(n):
    enc = encode_varlong(n)
    assert len(enc) in range(1, 11)
    assert read_varlong(enc) == (n, len(enc))
