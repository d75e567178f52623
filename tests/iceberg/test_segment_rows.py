"""The columnar segment record parser (segment_rows) against the Kafka library's own record
parser, transactions, offset ranges, ingest timestamps, bounded windows and corrupt input."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from rsm_sidecar.iceberg.reading.raw_records import RAW_RECORD_SCHEMA, SegmentRowReader
from rsm_sidecar.kafka import (
    AbortedTxn,
    Compression,
    ControlType,
    CorruptRecordError,
    TimestampType,
    read_batches,
    read_records,
)
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch, build_control_batch, recompute_crc
from rsm_sidecar.kafka.records import Header

T0 = 1_700_000_000_000


def _random_records(rng: random.Random, n: int, ts: int) -> list[SimpleRecord]:
    out = []
    for _i in range(n):
        key = None if rng.random() < 0.2 else rng.randbytes(rng.choice([0, 3, 12, 13, 40]))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 1, 12, 13, 100, 3000]))
        headers = tuple(
            Header(
                rng.choice(["a", "trace-id", "é", ""]),
                None if rng.random() < 0.3 else rng.randbytes(rng.choice([0, 5, 20])),
            )
            for _ in range(rng.choice([0, 0, 1, 3, 9]))
        )
        out.append(SimpleRecord(key, value, ts + rng.randrange(-5, 50), headers))
    return out


def _read(data: bytes, lo=0, hi=10**12, aborted=(), state=-1, **kw):
    reader = SegmentRowReader(4, lo, hi, aborted, state, **kw)
    out = list(reader.batches(read_batches(data)))
    for b in out:
        assert b.schema == RAW_RECORD_SCHEMA
    return reader, (pa.Table.from_batches(out, RAW_RECORD_SCHEMA).to_pylist() if out else [])


@pytest.mark.parametrize("compression", list(Compression))
def test_matches_the_library_parser(compression):
    rng = random.Random(int(compression))
    data = b""
    off = 0
    for b in range(30):
        recs = _random_records(rng, rng.choice([1, 2, 17, 100]), T0 + b * 1000)
        data += build_batch(recs, base_offset=off, compression=compression)
        off += len(recs)
    expected = list(read_records(data))
    _, got = _read(data)
    assert len(got) == len(expected) == off
    for g, e in zip(got, expected):
        assert g["partition"] == 4
        assert g["offset"] == e.offset
        assert (g["key"], g["value"]) == (e.key, e.value)
        assert g["timestamp"] == e.timestamp
        assert [(h["key"], h["value"]) for h in g["headers"]] == [(h.key, h.value) for h in e.headers]
    # batch_start is the batch's base offset
    starts = {b.header.base_offset for b in read_batches(data)}
    assert {g["batch_start"] for g in got} == starts


def _read_columnar_as_the_library(monkeypatch, data: bytes):
    """The rows of ``data`` read on the columnar path only (a fallback to the library parser
    fails), whose offsets, keys and values are the library's records': the rows and those records."""

    def no_fallback(self, w):
        raise AssertionError("the columnar parse fell back to the library parser")

    monkeypatch.setattr(SegmentRowReader, "_slow", no_fallback)
    _, got = _read(data, max_records=100_000, max_bytes=1 << 30)
    expected = list(read_records(data))
    assert [(g["offset"], g["key"], g["value"]) for g in got] == [
        (e.offset, e.key, e.value) for e in expected
    ]
    return got, expected


@pytest.mark.parametrize("sizes", [[100, 1, 2, 17] * 6, [1000] + [3] * 20, [5] * 7, [2000]])
def test_valid_batches_are_parsed_columnar_without_the_fallback(monkeypatch, sizes):
    """Windows of many small batches (walked together), one large batch among small ones and
    few batches (walked one by one) all parse on the columnar path and match the library."""
    rng = random.Random(len(sizes))
    data, off = b"", 0
    for n in sizes:
        recs = _random_records(rng, n, T0 + off)
        data += build_batch(recs, base_offset=off)
        off += n

    got, expected = _read_columnar_as_the_library(monkeypatch, data)
    assert [[(h["key"], h["value"]) for h in g["headers"]] for g in got] == [
        [(h.key, h.value) for h in e.headers] for e in expected
    ]


def test_records_of_8_kib_and_more_among_small_ones_are_parsed_columnar(monkeypatch):
    """A record of 8 KiB or more has a length of three bytes or more: the sections walked
    together read that step's lengths in full, and the rows still match the library."""
    rng = random.Random(7)
    data, off = b"", 0
    for b in range(12):
        recs = _random_records(rng, 20, T0 + off)
        if b % 3 == 0:
            big = SimpleRecord(b"big", rng.randbytes(rng.choice([8192, 20_000, 70_000])), T0 + off)
            recs.insert(rng.randrange(len(recs)), big)
        data += build_batch(recs, base_offset=off)
        off += len(recs)

    _read_columnar_as_the_library(monkeypatch, data)


def test_ingest_timestamp_is_the_running_maximum_and_control_batches_count():
    data = build_batch([SimpleRecord(b"k", b"a", T0 + 50), SimpleRecord(b"k", b"b", T0 + 10)], base_offset=0)
    data += build_control_batch(ControlType.COMMIT, base_offset=2, producer_id=9, timestamp=T0 + 500)
    data += build_batch([SimpleRecord(b"k", b"c", T0 + 20)], base_offset=3)
    reader, got = _read(data, state=T0 + 5)
    assert [g["timestamp"] for g in got] == [T0 + 50, T0 + 10, T0 + 20]
    assert [g["ingest_timestamp"] for g in got] == [T0 + 50, T0 + 50, T0 + 500]
    assert reader.state == T0 + 500
    # a state from earlier segments above everything here
    _, got = _read(data, state=T0 + 10_000)
    assert {g["ingest_timestamp"] for g in got} == {T0 + 10_000}


def test_log_append_time_batches_ingest_at_the_append_time_event_keeps_the_producer_time():
    recs = [SimpleRecord(b"k", b"v%d" % i, T0 + i) for i in range(3)]
    data = build_batch(
        recs, base_offset=0, timestamp_type=TimestampType.LOG_APPEND_TIME, log_append_time=T0 + 9_000
    )
    data += build_batch(
        recs, base_offset=3, timestamp_type=TimestampType.LOG_APPEND_TIME, log_append_time=T0 + 8_000
    )  # the broker clock stepped back
    _, got = _read(data)
    assert [g["timestamp"] for g in got] == [T0, T0 + 1, T0 + 2] * 2
    assert [g["ingest_timestamp"] for g in got] == [T0 + 9_000] * 6
    # what a consumer sees as the record timestamp is the append time
    assert [r.timestamp for r in read_records(data)] == [T0 + 9_000] * 3 + [T0 + 8_000] * 3


def test_aborted_transactions_and_markers_never_become_rows():
    def transactional(value: bytes, offset: int, producer_id: int) -> bytes:
        return build_batch(
            [SimpleRecord(b"k", value, T0)],
            base_offset=offset,
            transactional=True,
            producer_id=producer_id,
            producer_epoch=0,
        )

    d = build_batch([SimpleRecord(b"k", b"plain-0", T0)], base_offset=0)
    d += transactional(b"aborted-1", 1, producer_id=7)
    d += transactional(b"committed-2", 2, producer_id=8)
    d += transactional(b"aborted-3", 3, producer_id=7)
    d += build_control_batch(ControlType.ABORT, base_offset=4, producer_id=7, timestamp=T0 + 1000)
    d += build_control_batch(ControlType.COMMIT, base_offset=5, producer_id=8, timestamp=T0 + 1000)
    d += transactional(b"committed-6", 6, producer_id=7)
    d += build_control_batch(ControlType.COMMIT, base_offset=7, producer_id=7, timestamp=T0)
    reader, got = _read(d, aborted=[AbortedTxn(7, 1, 4, 2)])
    assert [g["value"] for g in got] == [b"plain-0", b"committed-2", b"committed-6"]
    assert reader.stats.skipped_batches == 5 and reader.stats.aborted_records == 2
    assert got[-1]["ingest_timestamp"] == T0 + 1000  # the markers advanced it


def test_offset_range_limits_rows_and_the_ingest_maximum():
    d = build_batch([SimpleRecord(b"k", b"%d" % i, T0 + 100 * (5 - i)) for i in range(5)], base_offset=10)
    d += build_batch([SimpleRecord(b"k", b"%d" % i, T0) for i in range(5, 8)], base_offset=15)
    reader, got = _read(d, lo=12, hi=16, state=T0)
    assert [g["offset"] for g in got] == [12, 13, 14, 15, 16]
    # offsets 10 and 11 (timestamps T0+500, T0+400) are outside the range: they do not count
    assert [g["ingest_timestamp"] for g in got] == [T0 + 300] * 5
    assert reader.last_offset == 16


def test_windows_are_bounded_in_records_and_bytes():
    d = b"".join(
        build_batch([SimpleRecord(b"k", b"x" * 1000, T0)] * 100, base_offset=i * 100) for i in range(30)
    )
    reader = SegmentRowReader(0, 0, 10**9, max_records=250, max_bytes=10**9)
    sizes = [b.num_rows for b in reader.batches(read_batches(d))]
    assert sum(sizes) == 3000 and max(sizes) <= 300  # a window closes at the batch that crosses it
    reader = SegmentRowReader(0, 0, 10**9, max_records=10**6, max_bytes=50_000)
    sizes = [b.num_rows for b in reader.batches(read_batches(d))]
    assert sum(sizes) == 3000 and max(sizes) <= 100


def test_invalid_utf8_header_key_is_replaced_like_java():
    rec = SimpleRecord(b"k", b"v", T0, (Header("ok", b"1"),))
    raw = bytearray(build_batch([rec], base_offset=0))
    i = raw.rindex(b"ok")
    raw[i : i + 2] = b"\xff\xfe"
    _, got = _read(recompute_crc(bytes(raw)))
    assert got[0]["headers"] == [{"key": "\ufffd\ufffd", "value": b"1"}]


def test_corrupt_records_raise_naming_the_batch():
    rec = SimpleRecord(b"key", b"value", T0)
    raw = bytearray(build_batch([rec, rec], base_offset=40))
    raw[61 + 1] = 0x7F  # the first record's attributes byte is fine; break its timestamp varint
    raw[61] = 0x02  # record length 1: the fields cannot fit
    with pytest.raises(CorruptRecordError, match=r"base offset 40|offset 40|\[40\.\.41\]"):
        _read(recompute_crc(bytes(raw)))
