"""Batch decompression: every codec, xerial snappy framing, size caps, bad bytes."""

from __future__ import annotations

import gzip
import os
import struct

import cramjam
import pytest
import zstandard

from rsm_sidecar.errors import DataLoss, InvalidArgument
from rsm_sidecar.kafka import Compression, DecompressionError, LimitExceededError, decompress, read_batches
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
from rsm_sidecar.kafka.compression import XERIAL_MAGIC, compress

PAYLOAD = b"".join(b"record %05d: " % i + os.urandom(8).hex().encode() for i in range(4000))
CODECS = [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]


@pytest.mark.parametrize("codec", list(Compression))
def test_round_trip(codec):
    assert decompress(codec, compress(codec, PAYLOAD)) == PAYLOAD


def test_xerial_snappy_framing():
    framed = compress(Compression.SNAPPY, PAYLOAD, xerial=True)
    assert framed.startswith(XERIAL_MAGIC) and struct.unpack_from(">ii", framed, 8) == (1, 1)
    assert decompress(Compression.SNAPPY, framed) == PAYLOAD
    assert len(PAYLOAD) > 64 * 1024  # several 32 KiB xerial blocks
    # plain raw snappy (librdkafka) is read too
    assert decompress(Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(PAYLOAD))) == PAYLOAD


def test_xerial_truncated_block():
    framed = compress(Compression.SNAPPY, PAYLOAD, xerial=True)
    with pytest.raises(DecompressionError, match="declares"):
        decompress(Compression.SNAPPY, framed[:-10])
    with pytest.raises(DecompressionError, match="version 0"):
        decompress(Compression.SNAPPY, XERIAL_MAGIC + struct.pack(">ii", 0, 0))


def test_gzip_concatenated_members_and_trailing_garbage():
    two = gzip.compress(b"abc") + gzip.compress(b"def")
    assert decompress(Compression.GZIP, two) == b"abcdef"
    with pytest.raises(DecompressionError, match="trailing garbage"):
        decompress(Compression.GZIP, gzip.compress(b"abc") + b"xyz")
    with pytest.raises(DecompressionError, match="truncated"):
        decompress(Compression.GZIP, gzip.compress(PAYLOAD)[:-20])


def test_zstd_multiple_frames():
    c = zstandard.ZstdCompressor()
    big = c.compress(PAYLOAD)
    two = c.compress(b"abc") + big + c.compress(b"def")
    assert decompress(Compression.ZSTD, two) == b"abc" + PAYLOAD + b"def"
    with pytest.raises(DecompressionError, match="truncated"):
        decompress(Compression.ZSTD, two[:-3])


def test_zstd_rle_bomb_is_stopped_near_the_cap():
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (256 * 1024 * 1024))
    assert len(bomb) < 64 * 1024
    with pytest.raises(LimitExceededError):
        decompress(Compression.ZSTD, bomb, max_size=8 * 1024 * 1024)


@pytest.mark.parametrize("codec", CODECS)
def test_garbage_is_a_decompression_error(codec):
    garbage = b"\x00\x01\x02\x03" + os.urandom(64)
    if codec is Compression.SNAPPY:
        garbage = b"\xff\xff\xff\xff\x0f" + os.urandom(32)  # claims 4 GiB, then nonsense
    with pytest.raises((DecompressionError, LimitExceededError)) as exc:
        decompress(codec, garbage, where={"source": "seg.log", "position": 7, "offset": 3})
    assert exc.value.source == "seg.log" and exc.value.position == 7


@pytest.mark.parametrize("codec", CODECS)
def test_truncated_compressed_payload(codec):
    data = compress(codec, PAYLOAD)
    with pytest.raises(DecompressionError):
        decompress(codec, data[: len(data) // 2])
    assert issubclass(DecompressionError, DataLoss)


@pytest.mark.parametrize("codec, xerial", [(c, False) for c in CODECS] + [(Compression.SNAPPY, True)])
def test_decompressed_size_cap(codec, xerial):
    bomb = b"\0" * (4 * 1024 * 1024)
    data = compress(codec, bomb, xerial=xerial)
    assert len(data) < 300 * 1024
    with pytest.raises(LimitExceededError, match="more than the cap of 1048576") as exc:
        decompress(codec, data, max_size=1024 * 1024)
    assert isinstance(exc.value, InvalidArgument)
    assert decompress(codec, data, max_size=len(bomb)) == bomb  # exactly at the cap is fine


def test_lz4_cap_below_and_above_the_ratio_shortcut():
    small = compress(Compression.LZ4, b"x" * 1000)
    # 255 * len(small) is far above this cap: the bounded path must be taken and must succeed
    assert decompress(Compression.LZ4, small, max_size=1000) == b"x" * 1000
    with pytest.raises(LimitExceededError):
        decompress(Compression.LZ4, small, max_size=999)


def test_cap_through_the_batch_api():
    data = build_batch([SimpleRecord(b"k", b"\0" * 200_000, 1)], compression=Compression.ZSTD)
    (batch,) = read_batches(data, name="seg.log")
    assert len(list(batch.records())) == 1
    with pytest.raises(LimitExceededError) as exc:
        list(batch.records(max_decompressed_size=100_000))
    assert exc.value.source == "seg.log" and exc.value.offset == 0
