"""The one varint codec (format/varint.py): round trips, and precise errors for truncated and
overlong input, in the codec's own terms or in the caller's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.format import custom_metadata
from rsm_sidecar.format.varint import (
    U64,
    OverlongVarintError,
    TruncatedVarintError,
    VarintErrors,
    encode_unsigned,
    encode_unsigned_varint,
    encode_varint,
    encode_varlong,
    read_unsigned,
    read_unsigned_varint,
    read_varint,
    read_varlong,
)

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


def zigzag_length(n: int) -> int:
    """Bytes of Kafka's zigzag varint of ``n``: 7 bits each of (n << 1) ^ (n >> 63), at least one."""
    zigzag = (n << 1) ^ (n >> 63)
    return max(1, -(-zigzag.bit_length() // 7))


@given(st.integers(0, U64), st.binary(max_size=4))
def test_unsigned_round_trip_with_trailing_bytes(n, tail):
    enc = encode_unsigned(n)
    assert len(enc) == max(1, -(-n.bit_length() // 7))
    assert read_unsigned(enc + tail) == (n, len(enc))


@given(st.integers(0, (1 << 32) - 1))
def test_unsigned_varint_round_trip(n):
    enc = encode_unsigned_varint(n)
    assert read_unsigned_varint(b"\x01" + enc, 1) == (n, 1 + len(enc))


def test_zigzag_lengths_of_known_values():
    # Kafka's ByteUtils: 0 -> 00, -1 -> 01, 63 -> 7e, -64 -> 7f, 64 -> 80 01
    assert [len(encode_varint(n)) for n in (0, -1, 63, -64, 64, -65)] == [1, 1, 1, 1, 2, 2]
    assert encode_varint(64) == b"\x80\x01" and encode_varint(-1) == b"\x01"
    assert len(encode_varint((1 << 31) - 1)) == 5 and len(encode_varlong(-(1 << 63))) == 10


@given(INT32)
def test_varint_round_trip(n):
    enc = encode_varint(n)
    assert len(enc) == zigzag_length(n) <= 5
    assert read_varint(enc) == (n, len(enc))


@given(INT64)
def test_varlong_round_trip(n):
    enc = encode_varlong(n)
    assert len(enc) == zigzag_length(n) <= 10
    assert read_varlong(enc) == (n, len(enc))


@given(INT64)
def test_every_strict_prefix_of_an_encoding_is_truncated(n):
    enc = encode_varlong(n)
    for cut in range(len(enc)):
        with pytest.raises(TruncatedVarintError, match="buffer ends inside a varlong that started at 0"):
            read_varlong(enc[:cut])


@pytest.mark.parametrize(
    "read, data, message",
    [
        (
            read_varint,
            b"\x80" * 5 + b"\x01",
            "varint at 0 is too long: the continuation bit is set in byte 5",
        ),
        (read_unsigned_varint, b"\xff" * 6, "varint at 0 is too long"),
        (
            read_varlong,
            b"\xff" * 10 + b"\x01",
            "varlong at 0 is too long: the continuation bit is set in byte 10",
        ),
    ],
)
def test_overlong_input_is_an_error(read, data, message):
    with pytest.raises(OverlongVarintError, match=message):
        read(data)


def test_codec_errors_are_data_loss_and_callers_choose_their_own():
    assert issubclass(TruncatedVarintError, DataLoss) and issubclass(OverlongVarintError, DataLoss)

    class Mine(Exception):
        pass

    with pytest.raises(Mine, match="buffer ends inside a varint that started at 2"):
        read_varint(b"\x00\x00\x80", 2, VarintErrors(truncated=Mine, overlong=ValueError))
    with pytest.raises(Mine, match="too long"):
        read_varint(b"\x80" * 6, errors=VarintErrors(truncated=ValueError, overlong=Mine))


def test_encoders_refuse_values_out_of_range():
    for encode, value in [
        (encode_unsigned, -1),
        (encode_unsigned_varint, 1 << 32),
        (encode_varint, 1 << 31),
        (encode_varlong, -(1 << 63) - 1),
    ]:
        with pytest.raises(ValueError):
            encode(value)


def test_custom_metadata_reports_a_truncated_varint_in_its_own_terms():
    encoded = custom_metadata.encode({custom_metadata.REMOTE_SIZE: 1 << 40})
    assert custom_metadata.decode(encoded) == {custom_metadata.REMOTE_SIZE: 1 << 40}
    with pytest.raises(DataLoss, match="custom metadata: buffer ends inside a varint"):
        custom_metadata.decode(b"\x81")
    with pytest.raises(DataLoss, match="custom metadata: varlong at 0 is too long"):
        # one REMOTE_SIZE field whose 11-byte payload never ends its varlong
        custom_metadata.decode(b"\x01\x00\x0b" + b"\xff" * 11)
