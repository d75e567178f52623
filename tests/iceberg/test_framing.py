"""Confluent wire-format preamble: vectors from the spec (MessageIndexes.java) and errors."""

import pytest

from rsm_sidecar.iceberg.decoding import framing


@pytest.mark.parametrize(
    "indexes, encoded",
    [
        ([0], b"\x00"),  # the [0] shortcut: a single 0x00
        ([1], b"\x02\x02"),  # count 1, index 1 (both zig-zag)
        ([0, 2], b"\x04\x00\x04"),
        ([3, 0, 1], b"\x06\x06\x00\x02"),
        ([64], b"\x02\x80\x01"),  # multi-byte varint
    ],
)
def test_message_index_vectors(indexes, encoded):
    pre = framing.encode_preamble(1, indexes)
    assert pre == b"\x00\x00\x00\x00\x01" + encoded
    fr = framing.parse(pre + b"\x0a\x01a", protobuf=True)
    assert fr == framing.Framed(1, tuple(indexes), len(pre))


def test_observed_vector_from_confluent_kafka():
    # test-servers.md: 2nd top-level message {name:"a", ts:5}
    data = bytes.fromhex("00 00000001 0202 0a0161 1005".replace(" ", ""))
    fr = framing.parse(data, protobuf=True)
    assert (fr.schema_id, fr.indexes, data[fr.header_len :]) == (1, (1,), bytes.fromhex("0a01611005"))


def test_full_form_of_zero_index_and_avro():
    assert framing.parse(b"\x00\x00\x00\x01\x00\x02\x00rest", protobuf=True).indexes == (0,)
    assert framing.parse(b"\x00\x00\x00\x00\x02\x02", protobuf=False) == framing.Framed(2, None, 5)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "too short"),
        (b"\x00\x00\x00", "too short"),
        (b"\x01\x00\x00\x00\x01\x00", "missing magic byte: first byte is 0x01"),
        (b'{"json": 1}', "missing magic byte: first byte is 0x7b"),
        (b"\x00\x00\x00\x00\x01\x02", "truncated varint"),
        (b"\x00\x00\x00\x00\x01\x02\x80", "truncated varint"),
        (b"\x00\x00\x00\x00\x01\x01", "invalid message-index count -1"),
        (b"\x00\x00\x00\x00\x01\x02\x01", "negative message index"),
    ],
)
def test_bad_preambles(data, message):
    with pytest.raises(framing.FramingError, match=message):
        framing.parse(data, protobuf=True)


def test_framing_reports_varint_errors_as_framing_errors():
    assert framing.parse(framing.encode_preamble(7, [1, 300]), protobuf=True).indexes == (1, 300)
    with pytest.raises(framing.FramingError, match="truncated varint in message indexes"):
        framing.parse(b"\x00\x00\x00\x00\x07\x04\x80", protobuf=True)
    with pytest.raises(framing.FramingError, match="varlong at 5 is too long"):
        framing.parse(b"\x00\x00\x00\x00\x07" + b"\xff" * 10 + b"\x01", protobuf=True)


def test_kop_schema_version_marker_is_named_not_decoded():
    """Kafka-on-Pulsar's 0x03 0x04 + 8-byte Pulsar schema version: unsupported, said so."""
    kop = b"\x03\x04" + (7).to_bytes(8, "big") + b"\x0a\x01x"
    for protobuf in (True, False):
        with pytest.raises(
            framing.FramingError,
            match=r"KoP schema-version marker 0x03 0x04 \(Pulsar schema version 7\) is not supported",
        ):
            framing.parse(kop, protobuf=protobuf)
    with pytest.raises(framing.FramingError, match="missing magic byte: first byte is 0x03"):
        framing.parse(b"\x03\x04\x00\x00\x00", protobuf=True)  # too short for a version
