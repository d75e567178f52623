"""Batch headers, records, reading segments batch by batch, and corruption handling."""

from __future__ import annotations

import io
import struct

import pytest

from rsm_sidecar.errors import DataLoss, InvalidArgument
from rsm_sidecar.kafka import (
    BATCH_HEADER_SIZE,
    BatchSizeError,
    Compression,
    ControlType,
    CorruptRecordError,
    CrcMismatchError,
    Header,
    TimestampType,
    TruncatedError,
    UnsupportedFormatError,
    parse_batch_header,
    read_batches,
    read_records,
    scan_batch_headers,
)
from rsm_sidecar.kafka.batch import CRC_OFFSET, MAGIC_OFFSET
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch, build_control_batch, recompute_crc
from rsm_sidecar.kafka.control import parse_control_record
from rsm_sidecar.kafka.records import Record


def recs(n, start_ts=1_000, size=10):
    return [SimpleRecord(f"k{i}".encode(), bytes([65 + i % 26]) * size, start_ts + i) for i in range(n)]


def segment(*batches: bytes) -> bytes:
    return b"".join(batches)


class CountingReader(io.RawIOBase):
    """A non-seekable stream that records every read size."""

    def __init__(self, data: bytes):
        self._buf = io.BytesIO(data)
        self.reads: list[int] = []

    def readable(self):
        return True

    def read(self, n=-1):
        self.reads.append(n)
        return self._buf.read(n)


# -- headers --------------------------------------------------------------------------------


def test_header_fields_round_trip():
    data = build_batch(
        recs(3),
        base_offset=42,
        compression=Compression.GZIP,
        transactional=True,
        producer_id=77,
        producer_epoch=3,
        base_sequence=10,
        partition_leader_epoch=5,
    )
    h = parse_batch_header(data)
    assert (h.base_offset, h.last_offset, h.next_offset, h.record_count) == (42, 44, 45, 3)
    assert h.size_in_bytes == len(data) and h.length == len(data) - 12
    assert h.magic == 2 and h.partition_leader_epoch == 5
    assert h.compression is Compression.GZIP and h.timestamp_type is TimestampType.CREATE_TIME
    assert h.is_transactional and not h.is_control and not h.has_delete_horizon
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence) == (77, 3, 10, 12)
    assert (h.base_timestamp, h.max_timestamp) == (1000, 1002)


def test_sequence_wraps_like_kafka():
    data = build_batch(recs(3), base_sequence=0x7FFFFFFF - 1, producer_id=1, producer_epoch=0)
    h = parse_batch_header(data)
    assert h.last_sequence == 0
    assert [r.sequence for r in next(iter(read_batches(data))).records()] == [0x7FFFFFFE, 0x7FFFFFFF, 0]


def test_unknown_codec_is_unsupported():
    data = bytearray(build_batch(recs(1)))
    data[22] |= 0x07  # attributes low byte: codec 7
    h = parse_batch_header(recompute_crc(bytes(data)))
    with pytest.raises(UnsupportedFormatError, match="codec id 7"):
        _ = h.compression


# -- records ----------------------------------------------------------------------------------


def test_null_keys_tombstones_and_null_header_values():
    records = [
        SimpleRecord(None, b"v", 5, (Header("h", None), Header("", b""))),
        SimpleRecord(b"k", None, 6),
        SimpleRecord(b"", b"", 7),
    ]
    (batch,) = read_batches(build_batch(records, base_offset=9))
    out = list(batch.records())
    assert [(r.offset, r.key, r.value, r.timestamp) for r in out] == [
        (9, None, b"v", 5),
        (10, b"k", None, 6),
        (11, b"", b"", 7),
    ]
    assert out[0].headers == (Header("h", None), Header("", b""))
    assert [r.is_tombstone for r in out] == [False, True, False]


def test_log_append_time_uses_max_timestamp():
    data = build_batch(recs(3), timestamp_type=TimestampType.LOG_APPEND_TIME, log_append_time=99_999)
    (batch,) = read_batches(data)
    assert batch.header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert {r.timestamp for r in batch.records()} == {99_999}


def test_compacted_batch_with_offset_gaps():
    records = [SimpleRecord(b"a", b"1", 1, offset_delta=0), SimpleRecord(b"b", b"2", 2, offset_delta=4)]
    (batch,) = read_batches(build_batch(records, base_offset=100, last_offset_delta=6))
    assert [r.offset for r in batch.records()] == [100, 104]
    assert batch.header.last_offset == 106


def test_empty_batch_has_no_records():
    (batch,) = read_batches(build_batch([], base_offset=5, last_offset_delta=2))
    assert batch.header.record_count == 0 and list(batch.records()) == []


def test_control_batch_markers():
    data = segment(
        build_control_batch(ControlType.COMMIT, base_offset=3, producer_id=8, coordinator_epoch=4),
        build_control_batch(ControlType.ABORT, base_offset=4, producer_id=9),
    )
    b1, b2 = read_batches(data)
    (m1,) = b1.control_records()
    (m2,) = b2.control_records()
    assert b1.header.is_control and b1.header.is_transactional
    assert (m1.offset, m1.is_commit, m1.coordinator_epoch, m1.key_version) == (3, True, 4, 0)
    assert m2.is_abort and m2.control_type is ControlType.ABORT
    assert list(read_records(data)) == []  # control records are skipped by default
    assert len(list(read_records(data, include_control=True))) == 2


def test_unknown_control_type_and_corrupt_control_key():
    rec = Record(offset=1, timestamp=0, key=b"\x00\x00\x00\x2a", value=None)
    parsed = parse_control_record(rec)
    assert parsed.type_id == 42 and parsed.control_type is None and not parsed.is_transaction_marker
    with pytest.raises(CorruptRecordError, match="at least 4 bytes"):
        parse_control_record(Record(offset=1, timestamp=0, key=b"\x00", value=None))
    with pytest.raises(CorruptRecordError, match="at least 6 bytes"):
        parse_control_record(Record(offset=1, timestamp=0, key=b"\x00\x00\x00\x01", value=b"\x00"))
    with pytest.raises(CorruptRecordError, match="key version"):
        parse_control_record(Record(offset=1, timestamp=0, key=b"\xff\xff\x00\x01", value=None))


def test_record_count_larger_than_records_is_corrupt():
    data = bytearray(build_batch(recs(2)))
    struct.pack_into(">i", data, 57, 3)  # recordCount
    (batch,) = read_batches(recompute_crc(bytes(data)))
    with pytest.raises(CorruptRecordError, match=r"record 2 of 3 in batch \[0\.\.1\]"):
        list(batch.records())


def test_trailing_bytes_after_records_are_corrupt():
    data = bytearray(build_batch(recs(2)))
    struct.pack_into(">i", data, 57, 1)
    (batch,) = read_batches(recompute_crc(bytes(data)))
    with pytest.raises(CorruptRecordError, match="bytes remain after the 1 declared records"):
        list(batch.records())


def test_record_with_bad_length_is_corrupt_and_located():
    data = bytearray(build_batch(recs(1), base_offset=7))
    data[61] = 0x7E  # record length varint -> 63, longer than the batch
    (batch,) = read_batches(recompute_crc(bytes(data)), name="seg.log")
    with pytest.raises(CorruptRecordError) as exc:
        list(batch.records())
    assert exc.value.source == "seg.log" and exc.value.offset == 7 and exc.value.position == 0
    assert "runs past the end of the batch" in str(exc.value)


# -- reading segments -----------------------------------------------------------------------------


def three_batches() -> bytes:
    return segment(
        build_batch(recs(2), base_offset=0),
        build_batch(recs(3), base_offset=2, compression=Compression.ZSTD),
        build_batch(recs(1), base_offset=5, compression=Compression.LZ4),
    )


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "file", "stream", "path"])
def test_sources(kind, tmp_path):
    data = three_batches()
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    source = {
        "bytes": data,
        "bytearray": bytearray(data),
        "memoryview": memoryview(data),
        "file": io.BytesIO(data),
        "stream": CountingReader(data),
        "path": path,
    }[kind]
    batches = list(read_batches(source))
    assert [b.header.base_offset for b in batches] == [0, 2, 5]
    assert [b.header.position for b in batches] == [
        0,
        batches[0].header.size_in_bytes,
        batches[0].header.size_in_bytes + batches[1].header.size_in_bytes,
    ]
    assert [r.offset for b in batches for r in b.records()] == [0, 1, 2, 3, 4, 5]


def test_start_and_end_position():
    data = three_batches()
    first = parse_batch_header(data).size_in_bytes
    assert [b.header.base_offset for b in read_batches(data, start_position=first)] == [2, 5]
    second = parse_batch_header(data[first:]).size_in_bytes
    assert [
        b.header.base_offset
        for b in read_batches(io.BytesIO(data), start_position=first, end_position=first + second)
    ] == [2]
    assert [b.header.base_offset for b in read_batches(CountingReader(data), start_position=first)] == [2, 5]


def test_flipped_byte_gives_crc_error_naming_the_batch():
    data = bytearray(three_batches())
    second = parse_batch_header(bytes(data)).size_in_bytes
    data[second + 70] ^= 0x01  # inside the 2nd batch's records
    with pytest.raises(CrcMismatchError) as exc:
        list(read_batches(bytes(data), name="00000000000000000000.log"))
    err = exc.value
    assert isinstance(err, DataLoss)
    assert (err.source, err.position, err.offset) == ("00000000000000000000.log", second, 2)
    assert err.stored != err.computed
    assert f"position {second}" in str(err) and "offset 2" in str(err) and "[2..4]" in str(err)
    # Without verification the batch is returned (its records may then fail to parse).
    assert len(list(read_batches(bytes(data), verify_crc=False))) == 3


def test_leader_epoch_is_outside_the_crc():
    data = bytearray(build_batch(recs(2)))
    struct.pack_into(">i", data, 12, 12345)
    (batch,) = read_batches(bytes(data))
    assert batch.header.partition_leader_epoch == 12345


def test_crc_field_itself_corrupted():
    data = bytearray(build_batch(recs(2)))
    data[CRC_OFFSET] ^= 0xFF
    with pytest.raises(CrcMismatchError):
        list(read_batches(bytes(data)))


@pytest.mark.parametrize("cut", [1, 16, 17, 60, 61, 62])
def test_truncated_segment(cut):
    data = three_batches()
    size0 = parse_batch_header(data).size_in_bytes
    truncated = data[: size0 + cut]
    with pytest.raises(TruncatedError) as exc:
        list(read_batches(truncated))
    assert exc.value.position == size0
    assert isinstance(exc.value, DataLoss)


def test_absurd_length_is_rejected_before_allocating():
    data = bytearray(build_batch(recs(1)))
    struct.pack_into(">i", data, 8, 0x7FFFFFF0)  # ~2 GiB
    reader = CountingReader(bytes(data) + b"\0" * 100)
    with pytest.raises(BatchSizeError, match="exceeds the maximum batch size") as exc:
        list(read_batches(reader))
    assert max(n for n in reader.reads if n is not None) <= BATCH_HEADER_SIZE
    assert exc.value.position == 0 and isinstance(exc.value, DataLoss)
    # A caller may allow larger batches explicitly: then it is "only" truncated.
    with pytest.raises(TruncatedError):
        list(read_batches(bytes(data), max_batch_size=1 << 31))


@pytest.mark.parametrize(
    "length, message", [(-1, "smaller than the minimum"), (10, "smaller than the minimum")]
)
def test_negative_or_tiny_length(length, message):
    data = bytearray(build_batch(recs(1)))
    struct.pack_into(">i", data, 8, length)
    with pytest.raises(BatchSizeError, match=message):
        list(read_batches(bytes(data)))


def test_zero_filled_tail_is_corrupt_not_silently_ignored():
    data = three_batches() + b"\0" * 100
    with pytest.raises(BatchSizeError, match="length field 0 is smaller") as exc:
        list(read_batches(data))
    assert exc.value.position == len(data) - 100


@pytest.mark.parametrize(
    "magic, error",
    [
        (0, UnsupportedFormatError),
        (1, UnsupportedFormatError),
        (3, CorruptRecordError),
        (0xFF, CorruptRecordError),
    ],
)
def test_magic(magic, error):
    data = bytearray(build_batch(recs(1)))
    data[MAGIC_OFFSET] = magic
    with pytest.raises(error):
        list(read_batches(bytes(data)))
    if error is UnsupportedFormatError:
        assert issubclass(error, InvalidArgument)


def test_bad_compressed_payload_is_corrupt():
    data = bytearray(build_batch(recs(5), compression=Compression.GZIP))
    data[61 + 12 : 61 + 20] = b"\xff" * 8
    (batch,) = read_batches(recompute_crc(bytes(data)))
    with pytest.raises(CorruptRecordError, match="gzip payload .* does not decompress"):
        list(batch.records())


# -- header-only scans -----------------------------------------------------------------------------


def test_scan_skips_bodies_and_matches_full_read():
    data = three_batches()
    reader = CountingReader(data)
    scan = scan_batch_headers(reader)
    assert [h.base_offset for h in scan.headers] == [0, 2, 5]
    assert scan.partial_tail is None and scan.end_position == len(data)
    assert scan.record_count == 6 and scan.first_offset == 0 and scan.last_offset == 5
    assert scan.bytes_by_compression()[Compression.ZSTD] == scan.headers[1].size_in_bytes
    assert scan.headers == [b.header for b in read_batches(data)]


@pytest.mark.parametrize("cut_into", [0, 5, 17, 40, 61, 100])
def test_scan_reports_partial_tail(cut_into):
    data = three_batches()
    last = scan_batch_headers(data).headers[-1]
    buf = data[: last.position + cut_into]
    scan = scan_batch_headers(buf)
    assert [h.base_offset for h in scan.headers] == [0, 2]
    if cut_into == 0:
        assert scan.partial_tail is None
        return
    tail = scan.partial_tail
    assert tail.position == last.position and tail.available == cut_into
    assert tail.declared_size == (last.size_in_bytes if cut_into >= 17 else None)
    assert tail.base_offset == (5 if cut_into >= 17 else None)


def test_scan_with_limit_on_a_file(tmp_path):
    data = three_batches()
    path = tmp_path / "seg.log"
    path.write_bytes(data)
    first = parse_batch_header(data).size_in_bytes
    scan = scan_batch_headers(path, limit=first + 20)
    assert [h.base_offset for h in scan.headers] == [0]
    assert scan.partial_tail.position == first and scan.partial_tail.available == 20
    assert scan.bytes_scanned == first


def test_scan_max_batches():
    data = three_batches()
    scan = scan_batch_headers(data, max_batches=2)
    assert [h.base_offset for h in scan.headers] == [0, 2]
    assert scan.end_position == scan.headers[1].position + scan.headers[1].size_in_bytes
    assert scan.partial_tail is None


def test_scan_can_verify_crc():
    data = bytearray(three_batches())
    data[-3] ^= 0x10
    assert len(scan_batch_headers(bytes(data)).headers) == 3
    with pytest.raises(CrcMismatchError):
        scan_batch_headers(bytes(data), verify_crc=True)


def test_scan_still_rejects_corrupt_headers():
    data = bytearray(three_batches())
    data[MAGIC_OFFSET] = 9
    with pytest.raises(CorruptRecordError):
        scan_batch_headers(bytes(data))


def test_reading_a_large_segment_holds_one_batch_at_a_time(tmp_path):
    import tracemalloc

    value = bytes(range(256)) * 400  # 100 KiB
    path = tmp_path / "00000000000000000000.log"
    with open(path, "wb") as f:
        for i in range(200):  # ~20 MiB segment
            f.write(
                build_batch(
                    [SimpleRecord(b"k", value, i)],
                    base_offset=i,
                    compression=Compression.LZ4 if i % 2 else Compression.NONE,
                )
            )
    tracemalloc.start()
    try:
        count = 0
        for batch in read_batches(path):
            for record in batch.records():
                count += len(record.value)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 200 * len(value)
    assert peak < 2 * 1024 * 1024, f"peak {peak} bytes while reading a {path.stat().st_size}-byte file"
    reader = CountingReader(path.read_bytes())
    assert sum(1 for _ in read_batches(reader)) == 200
    assert max(reader.reads) < 110 * 1024
