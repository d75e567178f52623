"""Offset/time indexes, transaction index, leader-epoch checkpoint and producer snapshots."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsm_sidecar.errors import DataLoss, InvalidArgument
from rsm_sidecar.kafka import (
    AbortedTxn,
    CorruptIndexError,
    EpochEntry,
    OffsetPosition,
    TimestampOffset,
    TruncatedError,
    UnsupportedFormatError,
    base_offset_from_filename,
    collect_aborted_txns,
    format_leader_epoch_checkpoint,
    lookup_offset,
    lookup_timestamp,
    parse_leader_epoch_checkpoint,
    read_offset_index,
    read_producer_snapshot,
    read_time_index,
    read_txn_index,
)
from rsm_sidecar.kafka.checkpoint import epoch_for_offset
from rsm_sidecar.kafka.indexes import encode_offset_index, encode_time_index
from rsm_sidecar.kafka.snapshot import (
    ProducerSnapshotEntry,
    encode_producer_snapshot,
    parse_producer_snapshot,
)
from rsm_sidecar.kafka.txnindex import encode_txn_index

BASE = 1000
OFFSETS = [OffsetPosition(1003, 4100), OffsetPosition(1010, 8300), OffsetPosition(1011, 12400)]
TIMES = [TimestampOffset(5000, 1003), TimestampOffset(5000, 1010), TimestampOffset(7000, 1011)]


# -- offset and time indexes ----------------------------------------------------------------------


def test_base_offset_from_filename():
    assert base_offset_from_filename("/x/00000000000000001234.index") == 1234
    assert base_offset_from_filename("00000000000000000000.log") == 0
    assert base_offset_from_filename("00000000000000000007.txnindex") == 7
    with pytest.raises(ValueError):
        base_offset_from_filename("1234.index")


def test_offset_index_round_trip_and_lookup():
    data = encode_offset_index(OFFSETS, BASE)
    assert data[:8] == struct.pack(">ii", 3, 4100)
    assert read_offset_index(data, BASE) == OFFSETS
    assert read_offset_index(io.BytesIO(data), BASE) == OFFSETS
    assert lookup_offset(OFFSETS, 999, BASE) == OffsetPosition(BASE, 0)
    assert lookup_offset(OFFSETS, 1005, BASE) == OFFSETS[0]
    assert lookup_offset(OFFSETS, 1010, BASE) == OFFSETS[1]
    assert lookup_offset(OFFSETS, 10**9, BASE) == OFFSETS[2]
    assert lookup_offset([], 1005, BASE) == OffsetPosition(BASE, 0)


def test_time_index_round_trip_and_lookup():
    data = encode_time_index(TIMES, BASE)
    assert data[:12] == struct.pack(">qi", 5000, 3)
    assert read_time_index(data, BASE) == TIMES
    assert lookup_timestamp(TIMES, 4999, BASE) == TimestampOffset(-1, BASE)
    assert lookup_timestamp(TIMES, 6000, BASE).offset == 1010
    assert lookup_timestamp(TIMES, 7000, BASE) == TIMES[2]


@pytest.mark.parametrize("padding_entries", [1, 10, 500])
def test_preallocated_zero_padding_is_ignored(padding_entries):
    data = encode_offset_index(OFFSETS, BASE) + b"\0" * (8 * padding_entries)
    assert read_offset_index(data, BASE) == OFFSETS
    tdata = encode_time_index(TIMES, BASE) + b"\0" * (12 * padding_entries)
    assert read_time_index(tdata, BASE) == TIMES


def test_all_zero_files_are_empty_indexes():
    assert read_offset_index(b"\0" * 4096, BASE) == []
    assert read_time_index(b"\0" * 4092, BASE) == []
    assert read_offset_index(b"", BASE) == []


def test_time_index_first_entry_may_have_relative_offset_zero():
    data = encode_time_index([TimestampOffset(42, BASE), TimestampOffset(50, BASE + 3)], BASE)
    assert read_time_index(data + b"\0" * 24, BASE) == [
        TimestampOffset(42, BASE),
        TimestampOffset(50, BASE + 3),
    ]


def test_entry_after_padding_is_corrupt():
    data = encode_offset_index(OFFSETS, BASE) + b"\0" * 16 + struct.pack(">ii", 20, 99999)
    with pytest.raises(CorruptIndexError, match="non-zero entry in slot 5 after the zero padding"):
        read_offset_index(data, BASE, name="00000000000000001000.index")


def test_relative_offset_zero_that_is_not_padding_is_corrupt():
    data = encode_offset_index(OFFSETS, BASE) + struct.pack(">ii", 0, 777)
    with pytest.raises(CorruptIndexError, match="slot 3 has relative offset 0"):
        read_offset_index(data, BASE)


def test_length_not_a_multiple_of_the_entry_size():
    with pytest.raises(CorruptIndexError, match="not a multiple of the 8-byte") as exc:
        read_offset_index(encode_offset_index(OFFSETS, BASE) + b"\0\0\0", BASE, name="x.index")
    assert exc.value.source == "x.index" and isinstance(exc.value, DataLoss)
    with pytest.raises(CorruptIndexError, match="not a multiple of the 12-byte"):
        read_time_index(encode_time_index(TIMES, BASE)[:-1], BASE)


def test_non_monotonic_offset_index_is_corrupt():
    bad = [OffsetPosition(1003, 4100), OffsetPosition(1002, 8300)]
    with pytest.raises(CorruptIndexError, match="does not increase") as exc:
        read_offset_index(encode_offset_index(bad, BASE), BASE)
    assert exc.value.position == 8
    bad = [OffsetPosition(1003, 4100), OffsetPosition(1004, 4100)]
    with pytest.raises(CorruptIndexError, match="does not increase"):
        read_offset_index(encode_offset_index(bad, BASE), BASE)
    with pytest.raises(CorruptIndexError, match="negative"):
        read_offset_index(struct.pack(">ii", -5, 10), BASE)


def test_time_index_going_back_is_corrupt():
    bad = [TimestampOffset(5000, 1003), TimestampOffset(4000, 1010)]
    with pytest.raises(CorruptIndexError, match="goes back"):
        read_time_index(encode_time_index(bad, BASE), BASE)


def test_large_index_is_streamed(tmp_path):
    entries = [OffsetPosition(BASE + 1 + i, 100 * (i + 1)) for i in range(50_000)]
    path = tmp_path / "00000000000000001000.index"
    path.write_bytes(encode_offset_index(entries, BASE) + b"\0" * 8000)
    assert read_offset_index(path, base_offset_from_filename(path)) == entries


# -- transaction index ------------------------------------------------------------------------------


TXNS = [AbortedTxn(7, 10, 20, 10), AbortedTxn(8, 12, 25, 21), AbortedTxn(7, 30, 31, 32)]


def test_txn_index_layout_and_round_trip():
    data = encode_txn_index(TXNS)
    assert len(data) == 34 * 3
    assert data[:34] == struct.pack(">hqqqq", 0, 7, 10, 20, 10)
    assert read_txn_index(data) == TXNS
    assert read_txn_index(b"") == []


def test_txn_index_partial_tail():
    data = encode_txn_index(TXNS) + b"\0" * 20
    with pytest.raises(TruncatedError, match="20-byte fragment") as exc:
        read_txn_index(data, name="00000000000000000000.txnindex")
    assert exc.value.position == 102
    assert read_txn_index(data, allow_partial_tail=True) == TXNS  # Kafka's own behaviour


def test_txn_index_validation():
    newer = struct.pack(">hqqqq", 1, 7, 10, 20, 10)
    with pytest.raises(UnsupportedFormatError, match="version 1"):
        read_txn_index(newer)
    with pytest.raises(CorruptIndexError, match="offsets 20..10"):
        read_txn_index(struct.pack(">hqqqq", 0, 7, 20, 10, 10))
    with pytest.raises(CorruptIndexError, match="must increase"):
        read_txn_index(encode_txn_index([TXNS[1], TXNS[0]]))


def test_collect_aborted_txns_like_the_broker():
    seg1 = [AbortedTxn(7, 10, 20, 10)]
    seg2 = [AbortedTxn(8, 12, 25, 21), AbortedTxn(9, 40, 45, 41)]
    seg3 = [AbortedTxn(7, 50, 60, 100)]
    # fetching [0, 22): seg2's first entry overlaps and its LSO 21 < 22, so the search goes on
    # until seg2's second entry (LSO 41 >= 22) proves completeness.
    found, complete = collect_aborted_txns([seg1, seg2, seg3], 0, 22)
    assert found == [seg1[0], seg2[0]] and complete
    found, complete = collect_aborted_txns([seg1], 0, 22)
    assert found == [seg1[0]] and not complete
    # [21, 50): seg1's entry ended before 21; seg3's starts at 50 (excluded) but its LSO 100
    # proves completeness.
    found, complete = collect_aborted_txns([seg1, seg2, seg3], 21, 50)
    assert found == [seg2[0], seg2[1]] and complete


# -- leader-epoch checkpoint ------------------------------------------------------------------------


def test_checkpoint_round_trip():
    entries = [EpochEntry(0, 0), EpochEntry(2, 3), EpochEntry(5, 3000)]
    text = format_leader_epoch_checkpoint(entries)
    assert text == "0\n3\n0 0\n2 3\n5 3000\n"
    assert parse_leader_epoch_checkpoint(text) == entries
    assert parse_leader_epoch_checkpoint(text.encode()) == entries
    assert parse_leader_epoch_checkpoint(text.replace("\n", "\r\n")) == entries
    assert parse_leader_epoch_checkpoint("0\n3\n0  0\n2\t3\n5 3000") == entries
    assert epoch_for_offset(entries, 2) == 0 and epoch_for_offset(entries, 3) == 2
    assert epoch_for_offset(entries, 10**6) == 5 and epoch_for_offset([], 5) is None


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 10**12)), max_size=20))
def test_checkpoint_round_trip_property(pairs):
    epochs = sorted({e for e, _ in pairs})
    offsets = sorted(o for _, o in pairs)[: len(epochs)]
    entries = [EpochEntry(e, o) for e, o in zip(epochs, offsets)]
    assert parse_leader_epoch_checkpoint(format_leader_epoch_checkpoint(entries)) == entries


@pytest.mark.parametrize("text", ["", "0\n", "0\n0\n"])
def test_checkpoint_empty_forms(text):
    assert parse_leader_epoch_checkpoint(text) == []


@pytest.mark.parametrize(
    "text, error, message",
    [
        ("1\n0\n", UnsupportedFormatError, "version 1"),
        ("x\n", CorruptIndexError, "malformed version"),
        ("0\n2\n0 0\n", CorruptIndexError, "expected 2 entries, found 1"),
        ("0\n1\n0 0 0\n", CorruptIndexError, "malformed line 3"),
        ("0\n1\n0 zero\n", CorruptIndexError, "malformed start offset on line 3"),
        ("0\n2\n3 10\n2 20\n", CorruptIndexError, "epochs must increase"),
        ("0\n2\n1 10\n2 5\n", CorruptIndexError, "start offsets must not decrease"),
        ("0\n1\n-1 0\n", CorruptIndexError, "negative"),
        ("0\n1\n0 0\n\n", CorruptIndexError, "malformed line 4"),
    ],
)
def test_checkpoint_errors(text, error, message):
    with pytest.raises(error, match=message) as exc:
        parse_leader_epoch_checkpoint(text, name="leader-epoch-checkpoint")
    assert exc.value.source == "leader-epoch-checkpoint"
    assert isinstance(exc.value, (DataLoss, InvalidArgument))


# -- producer snapshot ------------------------------------------------------------------------------


ENTRIES = [
    ProducerSnapshotEntry(1000, 0, 41, 120, 2, 1_700_000_000_000, -1, -1),
    ProducerSnapshotEntry(1001, 3, 5, 130, 0, 1_700_000_000_100, 7, 125),
]


def test_snapshot_round_trip(tmp_path):
    data = encode_producer_snapshot(ENTRIES)
    assert len(data) == 10 + 46 * 2
    path = tmp_path / "00000000000000000131.snapshot"
    path.write_bytes(data)
    snap = read_producer_snapshot(path)
    assert snap.version == 1 and snap.entries == tuple(ENTRIES)
    assert [e.has_open_transaction for e in snap.entries] == [False, True]
    assert parse_producer_snapshot(encode_producer_snapshot([])).entries == ()


def test_snapshot_corruption():
    data = bytearray(encode_producer_snapshot(ENTRIES))
    data[20] ^= 1
    with pytest.raises(CorruptIndexError, match="CRC mismatch"):
        parse_producer_snapshot(bytes(data), name="x.snapshot")
    good = encode_producer_snapshot(ENTRIES)
    with pytest.raises(UnsupportedFormatError, match="version 2"):
        parse_producer_snapshot(b"\x00\x02" + good[2:])
    with pytest.raises(TruncatedError):
        parse_producer_snapshot(good[:5])
    with pytest.raises(CorruptIndexError):  # CRC covers the count, so truncation is a mismatch
        parse_producer_snapshot(good[:-46])


def test_snapshot_size_limit():
    with pytest.raises(CorruptIndexError, match="larger than 64 bytes"):
        read_producer_snapshot(encode_producer_snapshot(ENTRIES), max_size=64)
