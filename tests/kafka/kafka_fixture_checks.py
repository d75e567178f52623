"""Checks of one real-broker fixture case directory against its ``expected.json``.

Used by ``test_kafka_fixtures.py`` (committed fixtures) and ``test_kafka_e2e.py`` (fixtures
regenerated from a live broker). Every check compares what the library parses from the broker's
files with what was produced (and what a real read_committed consumer returned).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

from rsm_sidecar.kafka import (
    Compression,
    TimestampType,
    committed_records,
    parse_leader_epoch_checkpoint,
    read_batches,
    read_offset_index,
    read_producer_snapshot,
    read_time_index,
    read_txn_index,
    scan_batch_headers,
)
from rsm_sidecar.kafka.checkpoint import epoch_for_offset
from rsm_sidecar.kafka.indexes import lookup_offset


def unb64(s):
    return None if s is None else base64.b64decode(s)


@dataclass
class Case:
    path: Path
    expected: dict
    batches: list = field(default_factory=list)  # (segment dict, RecordBatch)

    @property
    def name(self) -> str:
        return self.path.name

    def segment_file(self, seg: dict, suffix: str) -> Path:
        return self.path / f"{seg['base_offset']:020d}{suffix}"


def load_case(path: Path) -> Case:
    case = Case(path, json.loads((path / "expected.json").read_text()))
    for seg in case.expected["segments"]:
        for batch in read_batches(case.segment_file(seg, ".log")):
            case.batches.append((seg, batch))
    return case


def data_records(case: Case):
    """(batch, record) for every record of every non-control batch, in offset order."""
    for _, batch in case.batches:
        if not batch.header.is_control:
            for record in batch.records():
                yield batch, record


def check_segments_contiguous(case: Case) -> None:
    for seg in case.expected["segments"]:
        headers = [b.header for s, b in case.batches if s is seg]
        assert headers, f"{case.name}: segment {seg['base_offset']} has no batches"
        assert headers[0].base_offset == seg["base_offset"]
        assert headers[-1].next_offset == seg["next_segment_offset"]
        for prev, cur in zip(headers, headers[1:]):
            assert cur.base_offset == prev.next_offset
            assert cur.position == prev.position + prev.size_in_bytes
        log = case.segment_file(seg, ".log")
        assert headers[-1].position + headers[-1].size_in_bytes == log.stat().st_size


def check_records_match(case: Case) -> None:
    """Record for record: offsets, keys, values, headers, timestamps, timestamp types."""
    expected = case.expected["records"]
    parsed = list(data_records(case))
    assert [r.offset for _, r in parsed] == [e["offset"] for e in expected]
    for (batch, rec), exp in zip(parsed, expected):
        where = f"{case.name} offset {rec.offset}"
        assert rec.key == unb64(exp["key"]), where
        assert rec.value == unb64(exp["value"]), where
        assert rec.is_tombstone == (exp["value"] is None), where
        assert [(h.key, h.value) for h in rec.headers] == [(k, unb64(v)) for k, v in exp["headers"]], where
        assert rec.timestamp == exp["timestamp"], where
        ts_type = {"CreateTime": TimestampType.CREATE_TIME, "LogAppendTime": TimestampType.LOG_APPEND_TIME}[
            exp["timestamp_type"]
        ]
        assert batch.header.timestamp_type == ts_type, where
        assert batch.header.is_transactional == (exp["transaction"] is not None), where
        assert batch.header.base_offset <= rec.offset <= batch.header.last_offset
        assert batch.header.base_timestamp <= rec.timestamp or ts_type is TimestampType.LOG_APPEND_TIME
    # The read_uncommitted consumer saw exactly the data records of the rolled segments.
    assert case.expected["read_uncommitted_offsets"] == [r.offset for _, r in parsed]


def check_compression(case: Case) -> None:
    name = case.name
    data_codecs = {b.header.compression for _, b in case.batches if not b.header.is_control}
    if name.startswith("broker-"):
        # The broker recompressed every batch with its own (Java) codec.
        assert data_codecs == {Compression[name.split("-", 1)[1].upper()]}, data_codecs
    elif name.startswith("producer-"):
        codec = Compression[name.split("-", 1)[1].upper()]
        # librdkafka sends a batch uncompressed when compression would not shrink it.
        assert codec in data_codecs and data_codecs <= {codec, Compression.NONE}, data_codecs
    if name == "broker-snappy":
        # snappy-java's xerial framing, as the Java codec writes it.
        assert all(
            bytes(b.raw_records_section[:8]) == b"\x82SNAPPY\x00"
            for _, b in case.batches
            if not b.header.is_control
        )


def check_offset_and_time_indexes(case: Case) -> None:
    for seg in case.expected["segments"]:
        base = seg["base_offset"]
        batches = [b for s, b in case.batches if s is seg]
        by_position = {b.header.position: b for b in batches}
        entries = read_offset_index(case.segment_file(seg, ".index"), base)
        for e in entries:
            # LogSegment.append indexes the last offset of the batch at that position.
            assert e.position in by_position, (case.name, e)
            assert by_position[e.position].header.last_offset == e.offset
        # Looking up any offset through the index then reading from there finds it.
        for batch in batches:
            for target in (batch.header.base_offset, batch.header.last_offset):
                pos = lookup_offset(entries, target, base).position
                first = next(iter(read_batches(case.segment_file(seg, ".log"), start_position=pos)))
                assert first.header.base_offset <= target
        times = read_time_index(case.segment_file(seg, ".timeindex"), base)
        assert times, f"{case.name}: a rolled segment's time index has at least the roll entry"
        running_max = -1
        max_at = {}
        for b in batches:
            running_max = max(running_max, b.header.max_timestamp)
            max_at[b.header.last_offset] = running_max
        for t in times:
            assert t.offset in max_at, (case.name, t)
            assert t.timestamp == max_at[t.offset], (case.name, t)
        # The last entry (appended when the segment rolled) holds the segment's max timestamp.
        assert times[-1].timestamp == running_max


def check_snapshot_and_epochs(case: Case) -> None:
    producer_ids = {b.header.producer_id for _, b in case.batches if b.header.has_producer_id}
    for seg in case.expected["segments"]:
        snap_path = case.path / f"{seg['next_segment_offset']:020d}.snapshot"
        snapshot = read_producer_snapshot(snap_path)
        ids = {e.producer_id for e in snapshot.entries}
        for e in snapshot.entries:
            assert e.last_offset < seg["next_segment_offset"]
            if e.producer_id in producer_ids:
                last = max(
                    b.header.last_offset
                    for s, b in case.batches
                    if b.header.producer_id == e.producer_id
                    and b.header.last_offset < seg["next_segment_offset"]
                    and not b.header.is_control
                )
                assert e.last_offset == last, (case.name, e)
        seen_before = {
            b.header.producer_id
            for s, b in case.batches
            if b.header.has_producer_id
            and not b.header.is_control
            and b.header.last_offset < seg["next_segment_offset"]
        }
        assert seen_before <= ids, (case.name, seen_before, ids)
    epochs = parse_leader_epoch_checkpoint((case.path / "leader-epoch-checkpoint").read_bytes())
    assert epochs and epochs[0].start_offset == 0
    for _, b in case.batches:
        assert b.header.partition_leader_epoch == epoch_for_offset(epochs, b.header.base_offset)


def check_transactions(case: Case) -> None:
    """Control markers, .txnindex entries and read_committed filtering against the broker."""
    exp = case.expected
    records = exp["records"]
    pid_of = {}
    for (batch, _record), e in zip(data_records(case), records):
        if e["transaction"] is not None:
            pid_of.setdefault(e["producer"], batch.header.producer_id)
            assert pid_of[e["producer"]] == batch.header.producer_id
    markers = []
    for _, b in case.batches:
        if b.header.is_control:
            (marker,) = b.control_records()
            assert marker.is_transaction_marker and marker.key_version == 0
            assert marker.coordinator_epoch is not None and marker.coordinator_epoch >= 0
            markers.append((b.header.producer_id, "commit" if marker.is_commit else "abort", marker.offset))
    # Per producer, the markers follow the transactions' outcomes in order.
    for name, pid in pid_of.items():
        outcomes = [t["outcome"] for t in exp["transactions"] if t["producer"] == name]
        assert [m[1] for m in markers if m[0] == pid] == outcomes, name
    # Every ABORT marker has a .txnindex entry in its segment, naming the transaction's first
    # data offset; no other entries.
    all_aborted = []
    for seg in exp["segments"]:
        path = case.segment_file(seg, ".txnindex")
        entries = read_txn_index(path) if path.exists() else []
        all_aborted += entries
        seg_aborts = [
            m for m in markers if m[1] == "abort" and seg["base_offset"] <= m[2] < seg["next_segment_offset"]
        ]
        assert [(t.producer_id, t.last_offset) for t in entries] == [(m[0], m[2]) for m in seg_aborts]
        for t in entries:
            # firstOffset is the first data offset of the transaction this marker ended: the
            # producer's first transactional record after its previous marker.
            previous_marker = max(
                (m[2] for m in markers if m[0] == t.producer_id and m[2] < t.last_offset), default=-1
            )
            first = min(
                r["offset"]
                for r in records
                if r["transaction"] is not None
                and pid_of[r["producer"]] == t.producer_id
                and previous_marker < r["offset"] < t.last_offset
            )
            assert t.first_offset == first, (case.name, t)
            assert t.last_stable_offset <= t.last_offset + 1
    visible = [r.offset for r in committed_records((b for _, b in case.batches), all_aborted)]
    assert visible == exp["read_committed_offsets"]
    assert visible == [r["offset"] for r in records if r["read_committed_visible"]]


def check_scan(case: Case) -> None:
    for seg in case.expected["segments"]:
        log = case.segment_file(seg, ".log")
        full = [b.header for s, b in case.batches if s is seg]
        scan = scan_batch_headers(log)
        assert scan.headers == full and scan.partial_tail is None
        assert scan.end_position == log.stat().st_size
        assert scan.record_count == sum(h.record_count for h in full)
        # A prefix that cuts a batch in two: complete headers plus a reported partial tail.
        if len(full) > 1:
            cut = full[-1].position + 30
            part = scan_batch_headers(log.read_bytes()[:cut])
            assert part.headers == full[:-1]
            assert part.partial_tail.position == full[-1].position
            assert part.partial_tail.available == 30
            assert part.partial_tail.declared_size == full[-1].size_in_bytes


ALL_CHECKS = [
    check_segments_contiguous,
    check_records_match,
    check_compression,
    check_offset_and_time_indexes,
    check_snapshot_and_epochs,
    check_transactions,
    check_scan,
]


def check_case(path: Path) -> Case:
    case = load_case(path)
    for check in ALL_CHECKS:
        check(case)
    return case
