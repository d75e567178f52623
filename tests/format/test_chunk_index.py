"""Chunk indexes: Aiven's known-answer vectors and codec cases, plus properties."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.format.chunk_index import (
    Chunk,
    ChunkIndex,
    FixedChunkIndex,
    VariableChunkIndex,
    build_index,
    decode_sizes,
    decode_transformed_chunks,
    encode_sizes,
    encode_transformed_chunks,
)

INT_MAX = 2**31 - 1
AIVEN_ENCODED_CHUNKS = "KLUv/SAPeQAAAAAAAwAAAAoBAAoAAAAe"


def test_known_answer_vector_10_20_30():
    raw = encode_sizes([10, 20, 30])
    assert raw == bytes.fromhex("000000030000000a01000a0000001e")
    assert encode_transformed_chunks([10, 20, 30]) == AIVEN_ENCODED_CHUNKS
    assert decode_transformed_chunks(AIVEN_ENCODED_CHUNKS) == [10, 20, 30]


#: a fixed-size chunk index as Aiven's plugin writes it
AIVEN_FIXED = {
    "type": "fixed",
    "originalChunkSize": 100,
    "originalFileSize": 250,
    "transformedChunkSize": 110,
    "finalTransformedChunkSize": 30,
}


def test_aiven_fixed_index_json_and_chunks():
    obj = dict(AIVEN_FIXED)
    index = ChunkIndex.from_json(obj)
    assert index.to_json() == obj
    assert list(index.to_json()) == [
        "type",
        "originalChunkSize",
        "originalFileSize",
        "transformedChunkSize",
        "finalTransformedChunkSize",
    ]
    assert index.chunks() == [
        Chunk(0, 0, 100, 0, 110),
        Chunk(1, 100, 100, 110, 110),
        Chunk(2, 200, 50, 220, 30),
    ]


def test_aiven_variable_index_json_and_chunks():
    obj = {
        "type": "variable",
        "originalChunkSize": 100,
        "originalFileSize": 250,
        "transformedChunks": AIVEN_ENCODED_CHUNKS,
    }
    index = ChunkIndex.from_json(obj)
    assert isinstance(index, VariableChunkIndex)
    assert index.to_json() == obj
    assert index.chunks() == [Chunk(0, 0, 100, 0, 10), Chunk(1, 100, 100, 10, 20), Chunk(2, 200, 50, 30, 30)]


@pytest.mark.parametrize(
    "values, width",
    [
        ([0, 1000, 2, 44002, 369], 2),
        ([INT_MAX, INT_MAX - 1, INT_MAX - 2, 10], 1),
        ([INT_MAX // 2, INT_MAX // 2 - 1, INT_MAX // 2 - 2, 10], 1),
        ([1, 2, 3, INT_MAX], 1),
        ([1, 0xFF + 10, 0xFF + 20, 0xFF + 30, INT_MAX], 2),
        ([1, 0xFFFF + 10, 0xFFFF + 20, 0xFFFF + 30, INT_MAX], 3),
        ([1, 0xFFFFFF + 10, 0xFFFFFF + 20, 0xFFFFFF + 30, INT_MAX], 4),
        (list(range(0, INT_MAX - 2000, 1000 * 1000)), 4),
    ],
)
def test_aiven_codec_cases(values, width):
    raw = encode_sizes(values)
    assert len(raw) == 4 + 4 + 1 + (len(values) - 1) * width + 4
    count, _base, got_width = struct.unpack(">iiB", raw[:9])
    assert (count, got_width) == (len(values), width)
    assert decode_sizes(raw) == values


@pytest.mark.parametrize("values", [[], [213], [INT_MAX]])
def test_codec_small_lists(values):
    assert decode_sizes(encode_sizes(values)) == values


@pytest.mark.parametrize("values", [[-1], [-1, 2, 3], [1, -2, 3], [1, 2, -3]])
def test_codec_rejects_negative_values(values):
    with pytest.raises(ValueError):
        encode_sizes(values)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, INT_MAX), max_size=300))
def test_codec_roundtrip_property(values):
    assert decode_transformed_chunks(encode_transformed_chunks(values)) == values


@pytest.mark.parametrize("text", ["not base64!", "KLUv/SAP", "AAAA", AIVEN_ENCODED_CHUNKS[:-4]])
def test_corrupt_transformed_chunks_is_data_loss(text):
    with pytest.raises(DataLoss):
        decode_transformed_chunks(text)


def test_index_with_wrong_chunk_count_is_data_loss():
    bad = {
        "type": "variable",
        "originalChunkSize": 100,
        "originalFileSize": 500,
        "transformedChunks": AIVEN_ENCODED_CHUNKS,
    }
    with pytest.raises(DataLoss, match="3 chunks listed"):
        ChunkIndex.from_json(bad)


@pytest.mark.parametrize(
    "missing", ["originalChunkSize", "originalFileSize", "transformedChunkSize", "finalTransformedChunkSize"]
)
def test_fixed_index_requires_every_field(missing):
    obj = dict(AIVEN_FIXED)
    del obj[missing]
    with pytest.raises(DataLoss, match=missing):
        ChunkIndex.from_json(obj)


@settings(max_examples=200, deadline=None)
@given(chunk=st.integers(1, 64), file_size=st.integers(0, 2000), data=st.data())
def test_chunks_for_range_cover_exactly_the_range(chunk, file_size, data):
    count = -(-file_size // chunk)
    sizes = data.draw(st.lists(st.integers(1, 200), min_size=count, max_size=count))
    index = build_index(chunk, file_size, sizes, None)
    if file_size == 0:
        assert index.chunk_count == 0 and index.chunks_for_range(0, 10) == []
        return
    start = data.draw(st.integers(0, file_size - 1))
    end = data.draw(st.integers(start, file_size + 50))
    chunks = index.chunks_for_range(start, end)
    assert chunks[0].original_position <= start < chunks[0].original_end
    assert chunks[-1].original_position <= min(end, file_size - 1) < chunks[-1].original_end
    for a, b in zip(chunks, chunks[1:]):
        assert a.original_end == b.original_position and a.transformed_end == b.transformed_position
    assert index.transformed_file_size == sum(sizes)


def test_build_index_fixed_and_empty():
    fixed = build_index(100, 250, [128, 128, 78], 128)
    assert isinstance(fixed, FixedChunkIndex) and fixed.to_json()["finalTransformedChunkSize"] == 78
    single = build_index(100, 50, [78], 128)
    assert single.to_json()["transformedChunkSize"] == 128  # the nominal size, as Aiven writes it
    empty = build_index(100, 0, [], None)
    assert isinstance(empty, FixedChunkIndex) and empty.chunk_count == 0
    with pytest.raises(ValueError):
        build_index(100, 250, [128, 120, 78], 128)


@pytest.mark.parametrize(
    "obj, message",
    [
        ({"originalChunkSize": 1, "originalFileSize": 2**40}, "original file size must be 0..2"),
        ({"originalChunkSize": 2**31, "originalFileSize": 10}, "original chunk size must be 1..2"),
        ({"originalChunkSize": 0, "originalFileSize": 10}, "original chunk size must be 1..2"),
        ({"transformedChunkSize": 2**31}, "transformed chunk size must be 0..2"),
        ({"transformedChunkSize": 0}, "never empty when stored"),
        ({"finalTransformedChunkSize": 0}, "never empty when stored"),
    ],
)
def test_fixed_index_sizes_are_bounded_like_aivens_java_ints(obj, message):
    full = {
        "type": "fixed",
        "originalChunkSize": 100,
        "originalFileSize": 250,
        "transformedChunkSize": 110,
        "finalTransformedChunkSize": 30,
        **obj,
    }
    with pytest.raises(DataLoss, match=message):
        ChunkIndex.from_json(full)


def test_a_fixed_index_of_two_billion_chunks_costs_nothing_until_read():
    index = ChunkIndex.from_json(
        {
            "type": "fixed",
            "originalChunkSize": 1,
            "originalFileSize": INT_MAX,
            "transformedChunkSize": 29,
            "finalTransformedChunkSize": 29,
        }
    )
    assert index.chunk_count == INT_MAX and index.transformed_file_size == 29 * INT_MAX
    assert index.memory_bytes < 1024
    span = index.chunks_for_range(0, INT_MAX)
    assert len(span) == INT_MAX and span[-1] == Chunk(INT_MAX - 1, INT_MAX - 1, 1, 29 * (INT_MAX - 1), 29)
    assert list(span[5:7]) == [Chunk(5, 5, 1, 145, 29), Chunk(6, 6, 1, 174, 29)]
    assert index.chunk_for_transformed_position(29 * 1000 + 3) == 1000


def test_a_variable_index_is_checked_against_the_file_before_its_sizes_are_unpacked():
    sizes = encode_transformed_chunks([5] * 1000)
    with pytest.raises(DataLoss, match=r"1000 chunks listed .* \(expected 3\)"):
        ChunkIndex.from_json(
            {
                "type": "variable",
                "originalChunkSize": 100,
                "originalFileSize": 250,
                "transformedChunks": sizes,
            }
        )
    with pytest.raises(DataLoss, match="stored chunk size 0"):
        ChunkIndex.from_json(
            {
                "type": "variable",
                "originalChunkSize": 100,
                "originalFileSize": 250,
                "transformedChunks": encode_transformed_chunks([5, 0, 5]),
            }
        )
