"""Planning without Spark: the non-overlapping chain of (re-uploaded) segments, retention gaps,
transactions whose markers are not tiered yet, and reading markers back from a real PyIceberg
SqlCatalog table (ancestry walk, tag fallback after expiry)."""

from __future__ import annotations

import pyarrow as pa

from rsm_sidecar.iceberg.committing import markers as mk
from rsm_sidecar.iceberg.planning.chains import choose_chain, plan_partition
from rsm_sidecar.iceberg.session.catalogs import LocalCatalog
from rsm_sidecar.segment.listing import StoredSegment, list_topic_segments
from rsm_sidecar.segment.reader import SegmentReader
from tests.iceberg.convert_helpers import SyntheticTopic


def seg(start, end, sid="A" * 22, ts=0):
    return StoredSegment(f"b-{start}-{sid}", "t", "X" * 22, 0, start, sid, end, ts)


def test_chain_takes_each_offset_once_across_reuploads():
    a, a2 = seg(0, 99, "A" * 22), seg(0, 99, "B" * 22)  # the same offsets, re-uploaded
    b, c = seg(100, 199, "C" * 22), seg(150, 260, "D" * 22)  # c straddles b
    chain, ranges, skipped, waiting = choose_chain([a, a2, b, c], 0)
    assert ranges == [(0, 99), (100, 199), (200, 260)]
    assert [s.segment_id for s in chain] == ["A" * 22, "C" * 22, "D" * 22]
    assert not skipped and waiting is None
    # resuming in the middle of a segment starts there
    chain, ranges, _, _ = choose_chain([a, b, c], 120)
    assert ranges == [(120, 199), (200, 260)] and chain == [b, c]
    chain, ranges, _, _ = choose_chain([a, b, c], 160)  # both cover 160: the longer one
    assert ranges == [(160, 260)] and chain == [c]
    assert choose_chain([a, b, c], 261)[1] == []


def test_chain_skips_what_retention_removed_and_waits_at_holes():
    chain, ranges, skipped, waiting = choose_chain([seg(500, 599), seg(700, 799)], 0)
    assert skipped == [(0, 499)] and ranges == [(500, 599)]
    assert waiting == "offsets 600..699 are not in remote storage (yet)"
    assert choose_chain([seg(0, 9), seg(10, 19)], 0, limit=1)[1] == [(0, 9)]


def _reader(topic: SyntheticTopic) -> SegmentReader:
    from rsm_sidecar.config import Config
    from rsm_sidecar.transform.keyring import Keyring

    return SegmentReader(
        topic.store, topic.layout, Keyring.from_config(Config.load(topic.config_file, environ={}))
    )


def _plan(topic, next_offset=0):
    listing = list_topic_segments(topic.store, topic.layout, topic.topic)
    (parts,) = listing.values()
    return plan_partition(_reader(topic), parts[0], next_offset, -1)


def test_a_segment_waits_until_its_open_transactions_are_finished_in_storage(tmp_path):
    t = SyntheticTopic(tmp_path)
    t.segment(0, [t.batch(0, 5)])  # 0..4
    t.segment(0, [t.batch(0, 5), t.batch(0, 3, transactional_pid=7, record=False)])  # 5..12, txn open
    plan = _plan(t)
    assert [s.end_offset for s in plan.chain] == [4]
    assert "still open" in plan.waiting and plan.new_next_offset == 5
    # the abort marker arrives in the next segment (which itself ends with nothing open)
    t.segment(0, [t.marker(0, 7, commit=False), t.batch(0, 4)])  # 13..17
    plan = _plan(t)
    assert [s.end_offset for s in plan.chain] == [4, 12, 17] and plan.waiting is None
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in plan.aborted] == [(7, 10, 13)]
    tasks = plan.tasks(0)
    assert [t_.aborted for t_ in tasks][1][0][:3] == (7, 10, 13)
    assert tasks[0].aborted == ()
    # resuming after the first segment still sees the abort
    plan = _plan(t, next_offset=5)
    assert [s.end_offset for s in plan.chain] == [12, 17] and len(plan.aborted) == 1


def test_markers_from_the_ancestry_or_from_the_tag_after_expiry(tmp_path):
    catalog = LocalCatalog(tmp_path, name="m").pyiceberg()
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=pa.schema([("a", pa.int64())]))
    assert mk.read_state(table).next_offsets == {}
    props = mk.marker_properties(
        topic="t",
        topic_id="X" * 22,
        job_id="j1",
        next_offsets={0: 10, 1: 3},
        ingest_ms={0: 5},
        segments={0: ["s1"]},
        skipped={},
    )
    table.append(pa.table({"a": [1]}), snapshot_properties=props)
    marked = table.current_snapshot().snapshot_id
    table.manage_snapshots().create_tag(marked, mk.MARKER_TAG).commit()
    table.append(pa.table({"a": [2]}))  # e.g. maintenance: no marker
    middle = table.current_snapshot().snapshot_id
    table.append(pa.table({"a": [3]}))
    state = mk.read_state(table)
    assert (state.source, state.marker_snapshot_id) == ("ancestry", marked)
    assert state.next_offsets == {0: 10, 1: 3} and state.ingest_state(0) == 5 and state.ingest_state(1) == -1
    assert state.main_snapshot_id == table.current_snapshot().snapshot_id
    table.maintenance.expire_snapshots().by_id(middle).commit()
    table = catalog.load_table("ns.t")
    state = mk.read_state(table)
    assert (state.source, state.marker_snapshot_id, state.next_offsets) == ("tag", marked, {0: 10, 1: 3})


def test_one_far_future_timestamp_does_not_pin_the_ingest_maximum(tmp_path):
    from rsm_sidecar.config import read_toml
    from rsm_sidecar.iceberg.reading.segment_tasks import ExecutorContext, StorageParams, read_task
    from tests.iceberg.convert_helpers import T0

    day = 86_400_000
    future = T0 + 3650 * day  # a producer clock ten years ahead
    t = SyntheticTopic(tmp_path)
    copied = T0 + 60_000  # the broker began copying segment 0 a minute after T0
    # 0..2 normal, 3 far in the future, 4..7 normal again
    t.segment(0, [t.batch(0, 3), t.batch(0, 1, ts=future), t.batch(0, 4)], event_timestamp_ms=copied)
    # a day later, copied a day later
    t.segment(0, [t.batch(0, 5, ts=T0 + day)], event_timestamp_ms=T0 + day + 60_000)
    # no copy time in the manifest: bounded by the planning clock
    t.segment(0, [t.batch(0, 2, ts=future + 1)])
    plan = _plan(t)
    tasks = plan.tasks(0)
    assert [x.ingest_bound for x in tasks] == [copied, T0 + day + 60_000, plan.planned_ms]
    assert [x.ingest_state for x in tasks] == [-1, copied, T0 + day + 4]
    assert plan.new_ingest_state == plan.planned_ms < future

    ctx = ExecutorContext(StorageParams(read_toml(t.config_file), {}))
    got = {}
    for task in tasks:
        for b in read_task(ctx, task, max_records=100, max_bytes=1 << 20):
            for o, ev, ing in zip(
                b["offset"].to_pylist(), b["timestamp"].to_pylist(), b["ingest_timestamp"].to_pylist()
            ):
                got[o] = (ev, ing)
    # the event time is kept as produced; the ingest time is capped at the copy time
    assert got[3] == (future, copied)
    assert [got[o][1] for o in range(8)] == [T0, T0 + 1, T0 + 2, copied, copied, copied, copied, copied]
    # the next segment's rows are back at their own (day later) times: the right day partition
    assert [got[o][1] for o in range(8, 13)] == [T0 + day + i for i in range(5)]
    assert [got[o] for o in (13, 14)] == [(future + 1 + i, plan.planned_ms) for i in range(2)]


def test_embedded_catalog_transactions_wait_for_a_writer_instead_of_failing(tmp_path):
    """A PyIceberg transaction that reads, then writes after another connection (Spark's JDBC
    catalog, another job) has written, waits for the write lock: with SQLite's deferred BEGIN it
    failed at once with "database is locked" (a follower round failed so)."""
    import sqlite3
    import threading

    local = LocalCatalog(tmp_path, name="w")
    catalog = local.pyiceberg()
    row = "INSERT INTO iceberg_namespace_properties VALUES ('w', ?, 'k', 'v')"
    other_done = threading.Event()

    def other_writer() -> None:
        con = sqlite3.connect(local.db_file, timeout=20)
        with con:
            con.execute(row, ("other",))
        con.close()
        other_done.set()

    with catalog.engine.connect() as conn:
        tx = conn.begin()
        conn.exec_driver_sql("SELECT count(*) FROM iceberg_tables").fetchall()
        writer = threading.Thread(target=other_writer)
        writer.start()
        # the other connection waits for this transaction's write lock instead of writing now
        assert not other_done.wait(1.0)
        conn.exec_driver_sql(row, ("ours",))
        tx.commit()
    writer.join(30)
    with sqlite3.connect(local.db_file) as con:
        got = sorted(r[0] for r in con.execute("SELECT namespace FROM iceberg_namespace_properties"))
    assert got == ["other", "ours"]
