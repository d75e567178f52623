"""Segments larger than ``iceberg.task_bytes`` split into several tasks at offset-index entries:
each task starts from the exact running maximum of the record times before it (taken from the
segment's time index, Kafka's semantics as written by ``TieredWriter``), checked here against a
maximum computed from the produced timestamps themselves; a segment whose time index is empty
or short is not split; a wrong maximum fails the task instead of writing rows; and a Spark
conversion with and without splitting gives the same rows, ``ingest_timestamp`` included."""

from __future__ import annotations

import dataclasses
import random

import pytest

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.iceberg.job import load_config
from rsm_sidecar.iceberg.planning.chains import plan_partition
from rsm_sidecar.iceberg.planning.splitting import split_points, split_segments
from rsm_sidecar.iceberg.planning.tasks import SegmentTask
from rsm_sidecar.iceberg.reading.segment_tasks import executor_context, read_task
from rsm_sidecar.kafka.indexes import OffsetPosition, TimestampOffset
from rsm_sidecar.segment.listing import StoredSegment, list_topic_segments
from rsm_sidecar.segment.reader import SegmentReader
from tests.iceberg.convert_helpers import T0, SyntheticTopic, rows

HOUR = 3_600_000
TASK_BYTES = 16 * 1024


class TimedTopic(SyntheticTopic):
    """A SyntheticTopic that remembers the time every offset counts with for the running
    maximum (record timestamps, aborted records included; a marker's timestamp)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.times: dict[int, dict[int, int]] = {}
        self.clock = T0

    def batch(self, partition, n, *, ts=None, **kw):
        off = self.next_offset.get(partition, 0)
        data = super().batch(partition, n, ts=ts, **kw)
        base = T0 + off * 10 if ts is None else ts
        for i in range(n):
            self.times.setdefault(partition, {})[off + i] = base + i
        return data

    def marker(self, partition, pid, commit, ts=None):
        off = self.next_offset.get(partition, 0)
        self.times.setdefault(partition, {})[off] = T0 + off * 10 if ts is None else ts
        return super().marker(partition, pid, commit, ts)

    def running_max(self, partition: int, bounds: list[tuple[int, int, int]]) -> dict[int, int]:
        """offset -> the running maximum *before* it, each time capped at its segment's
        bound (``bounds``: (first, last, bound) per segment)."""
        out, state = {}, -1
        for first, last, bound in bounds:
            for o in range(first, last + 1):
                out[o] = state
                state = max(state, min(self.times[partition][o], bound))
        out[bounds[-1][1] + 1] = state
        return out


def out_of_order_segment(t: TimedTopic, rng: random.Random, batches: int, *, spikes: bool = False, **kw):
    """One segment of ``batches`` batches whose timestamps go forward with jumps back (and,
    with ``spikes``, a few far ahead), with an aborted and a committed transaction."""
    out = []
    clock = t.clock
    for i in range(batches):
        clock += rng.randrange(5_000, 60_000)
        # transactions spanning several tasks: an aborted one whose records and marker are
        # ahead of the records around them (they move the maximum without giving rows), and a
        # committed one
        if i == batches // 4:
            out.append(t.batch(0, 6, ts=clock - 60_000, transactional_pid=10))
        if i == batches // 3:
            out.append(t.batch(0, 4, ts=clock + 600_000, transactional_pid=9, record=False))
        if i == batches // 2:
            out.append(t.batch(0, 3, ts=clock + 900_000, transactional_pid=9, record=False))
        if i == 2 * batches // 3:
            out.append(t.marker(0, 9, commit=False, ts=clock + 700_000))
            out.append(t.marker(0, 10, commit=True, ts=clock - 120_000))
        ts = clock - rng.randrange(0, 1_800_000)  # up to 30 min late
        if spikes and rng.random() < 0.03:
            ts = clock + 10 * HOUR
        out.append(t.batch(0, rng.randrange(5, 25), ts=ts))
    t.clock = clock
    return t.segment(0, out, **kw)


def _plan(t: TimedTopic, task_bytes: int):
    from rsm_sidecar.config import Config
    from rsm_sidecar.transform.keyring import Keyring

    reader = SegmentReader(t.store, t.layout, Keyring.from_config(Config.load(t.config_file, environ={})))
    (parts,) = list_topic_segments(t.store, t.layout, t.topic).values()
    plan = plan_partition(reader, parts[0], 0, -1)
    notes = split_segments(reader, plan, task_bytes)
    return plan, notes


def _read(t: TimedTopic, task: SegmentTask) -> list[tuple[int, int]]:
    _, params = load_config(t.config_file, {}, {})
    ctx = executor_context(params)
    out = []
    for raw in read_task(ctx, task, max_records=500, max_bytes=1 << 20):
        out.extend(zip(raw.column("offset").to_pylist(), raw.column("ingest_timestamp").to_pylist()))
    return out


def _bounds(t: TimedTopic) -> list[tuple[int, int, int]]:
    return [
        (md.start_offset, md.end_offset, md.event_timestamp_ms if md.event_timestamp_ms > 0 else 2**62)
        for md in t.segments
    ]


def test_split_tasks_start_from_the_exact_running_maximum(tmp_path):
    rng = random.Random(14)
    t = TimedTopic(tmp_path)
    out_of_order_segment(t, rng, 120)
    # copied long before the spikes' times: they count as the copy time
    out_of_order_segment(t, rng, 150, spikes=True, event_timestamp_ms=t.clock + HOUR)
    out_of_order_segment(t, rng, 100)
    assert all(md.segment_size > 2 * TASK_BYTES for md in t.segments)
    plan, notes = _plan(t, TASK_BYTES)
    assert notes == [] and sorted(plan.splits) == [0, 1, 2]
    tasks = plan.tasks(0)
    assert len(tasks) >= 3 * 3
    expected = t.running_max(0, _bounds(t))
    # contiguous pieces, each starting from the true maximum before it (mid-segment ones too)
    assert [x.lo for x in tasks[1:]] == [x.hi + 1 for x in tasks[:-1]]
    assert tasks[0].lo == 0 and tasks[-1].hi == t.segments[-1].end_offset
    mid = [x for x in tasks if x.lo != x.start_offset]
    assert len(mid) >= 6
    assert [x.ingest_state for x in tasks] == [expected[x.lo] for x in tasks]
    # the maximum really moves inside the segments, backwards timestamps included
    assert len({x.ingest_state for x in mid}) >= 3
    for x, nxt in zip(tasks, tasks[1:]):
        assert x.end_state == (nxt.ingest_state if nxt.segment_id == x.segment_id else None)
    # an aborted transaction spans split points: the tasks in its middle drop its records too
    assert sum(any(a[1] < x.lo and x.hi < a[2] for a in x.aborted) for x in tasks) >= 1
    # the executors' rows: each offset once, ingest_timestamp = max(before, own time) capped
    got = [row for x in tasks for row in _read(t, x)]
    committed = sorted(r.offset for r in t.records)
    assert [o for o, _ in got] == committed
    assert got == [(o, expected[o + 1]) for o in committed]
    assert plan.new_ingest_state == expected[t.segments[-1].end_offset + 1]


def test_split_points_only_after_offset_index_entries_and_not_in_a_straddling_range():
    seg = StoredSegment("b", "t", "X" * 22, 0, 100, "S" * 22, 999, 50, size=10_000)
    index = [OffsetPosition(100 + 10 * k, 1000 * k) for k in range(10)]  # one append per 1000 B
    times = [TimestampOffset(10, 105), TimestampOffset(30, 123), TimestampOffset(50, 160)]
    assert split_points(index, times, seg, 100, 999, 2500) == [(131, 30), (161, 50)]
    # the segment's range starts after its first offset (a re-upload straddling the previous
    # chain segment): the records before the range do not count there, so no split
    assert split_points(index, times, seg, 101, 999, 2500) == []
    assert split_points(index, times, seg, 100, 999, 0) == []
    assert split_points(index, times, seg, 100, 999, 10_000) == []
    # not at or after the range's last offset, nor leaving less than half a task
    assert split_points(index, times, seg, 100, 150, 2500) == [(131, 30)]
    assert split_points(index, times, dataclasses.replace(seg, size=7000), 100, 999, 2500) == [(131, 30)]


def test_task_bytes_zero_or_a_small_segment_is_one_task(tmp_path):
    t = TimedTopic(tmp_path)
    out_of_order_segment(t, random.Random(1), 100)
    assert len(_plan(t, 0)[0].tasks(0)) == 1
    assert len(_plan(t, t.segments[0].segment_size)[0].tasks(0)) == 1
    assert len(_plan(t, t.segments[0].segment_size // 3)[0].tasks(0)) > 1


def test_a_segment_with_a_missing_or_short_time_index_is_not_split(tmp_path):
    rng = random.Random(7)
    t = TimedTopic(tmp_path)
    out_of_order_segment(t, rng, 120, time_index=False)
    out_of_order_segment(t, rng, 120, time_index=3)  # short: the roll's entry is missing
    out_of_order_segment(t, rng, 120)
    plan, notes = _plan(t, TASK_BYTES)
    assert sorted(plan.splits) == [2]
    assert len(notes) == 2
    assert "time index is empty" in notes[0] and "short index" in notes[1]
    tasks = plan.tasks(0)
    assert [x.segment_id for x in tasks[:2]] == [md.segment_id for md in t.segments[:2]]
    assert len(tasks) > 3
    expected = t.running_max(0, _bounds(t))
    assert [x.ingest_state for x in tasks] == [expected[x.lo] for x in tasks]
    got = [row for x in tasks for row in _read(t, x)]
    assert got == [(o, expected[o + 1]) for o in sorted(r.offset for r in t.records)]


def test_a_task_whose_records_disagree_with_the_time_index_fails(tmp_path):
    t = TimedTopic(tmp_path)
    out_of_order_segment(t, random.Random(3), 120)
    plan, _ = _plan(t, TASK_BYTES)
    (points,) = plan.splits.values()
    at, prefix = points[0]
    plan.splits[0][0] = (at, prefix - 1)  # as if the index under-reported the maximum
    first = plan.tasks(0)[0]
    with pytest.raises(DataLoss, match="iceberg.task_bytes = 0"):
        _read(t, first)


def test_spark_conversion_with_and_without_splitting_gives_the_same_rows(spark, tmp_path):
    rng = random.Random(21)
    t = TimedTopic(tmp_path)
    out_of_order_segment(t, rng, 140)
    out_of_order_segment(t, rng, 160, spikes=True, event_timestamp_ms=t.clock + HOUR)
    out_of_order_segment(t, rng, 90, time_index=False)
    res_whole = t.convert(spark, **{"iceberg.task_bytes": 0, "iceberg.table": "whole"})
    res_split = t.convert(spark, **{"iceberg.task_bytes": TASK_BYTES, "iceberg.table": "split"})
    assert res_whole.committed and res_split.committed
    assert res_whole.tasks == len(t.segments) == 3
    assert res_split.tasks >= 2 * len(t.segments)
    assert res_whole.records == res_split.records == len(t.records)

    def table_rows(name):
        table = t.table(**{"iceberg.table": name})
        kafka = table.scan(selected_fields=("kafka",)).to_arrow().column("kafka").to_pylist()
        ingest = sorted((k["offset"], round(k["ingest_timestamp"].timestamp() * 1000)) for k in kafka)
        return rows(table), ingest

    whole, split = table_rows("whole"), table_rows("split")
    assert whole == split
    assert split[0] == t.expected()  # one row per committed offset
    expected = t.running_max(0, _bounds(t))
    assert split[1] == [(o, expected[o + 1]) for o, _ in split[1]]
