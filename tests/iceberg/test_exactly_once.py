"""Exactly once per (partition, offset): re-runs, the job's driver SIGKILLed (with Spark's JVM
and workers) at each stage, two jobs racing on one table, re-uploaded overlapping segments, a
corrupt segment. Segments are stored by the sidecar's own copy code (zstd + AES-GCM) in a local
directory; Spark is real (local[2]); kills are real (``os.killpg`` SIGKILL on the CLI's process
group, paused at named points by the job's test hook)."""

from __future__ import annotations

import pytest

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.iceberg.committing import markers as mk
from rsm_sidecar.iceberg.session import scratch
from tests.iceberg.convert_helpers import SyntheticTopic, kill_group, offsets, result_json, rows, wait_paused


def build(tmp_path, name="orders") -> SyntheticTopic:
    """Partition 0: three segments with an aborted transaction whose marker is in the next
    segment; partition 1: two segments."""
    t = SyntheticTopic(tmp_path / name, name)
    t.segment(0, [t.batch(0, 30), t.batch(0, 5, transactional_pid=7, record=False)])
    t.segment(0, [t.marker(0, 7, commit=False), t.batch(0, 40)])
    t.segment(0, [t.batch(0, 25, transactional_pid=8), t.marker(0, 8, commit=True), t.batch(0, 10)])
    t.simple_segments(1, 2, per_segment=40)
    return t


def paused_convert(t: SyntheticTopic, tmp_path, point: str):
    """The CLI's ``convert --json`` of ``t``, its Spark scratch directories under
    ``tmp_path/scratch``, once it is paused at ``point`` (pause files in ``tmp_path/pause``): the
    process, the pause directory and the scratch directory."""
    pause_dir = tmp_path / "pause"
    scratch_base = tmp_path / "scratch"
    proc = t.cli(
        "convert",
        "--json",
        pause_at=point,
        pause_dir=pause_dir,
        extra_env={"RSM__ICEBERG__SPARK__SCRATCH_DIR": str(scratch_base)},
    )
    wait_paused(proc, pause_dir, point)
    return proc, pause_dir, scratch_base


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_rerun_adds_nothing_and_new_segments_are_appended(spark, tmp_path, writer):
    t = build(tmp_path)
    res = t.convert(spark, **{"iceberg.writer": writer})
    assert res.committed and res.records == len(t.records) == 185
    table = t.table()
    assert rows(table) == t.expected()
    state = mk.read_state(table)
    assert state.next_offsets == {0: 112, 1: 80}
    assert table.metadata.refs[mk.MARKER_TAG].snapshot_id == table.current_snapshot().snapshot_id
    summary = table.current_snapshot().summary
    assert summary[mk.P_JOB] == res.job_id
    # arrow: the driver commits the executors' files; spark: Spark staged the snapshot (WAP)
    assert summary.get("wap.id") == (res.job_id if writer == "spark" else None)
    first_snapshot = table.current_snapshot().snapshot_id

    again = t.convert(spark, **{"iceberg.writer": writer})
    assert not again.committed and again.records == 0
    assert t.table().current_snapshot().snapshot_id == first_snapshot

    t.simple_segments(1, 1, per_segment=20)
    more = t.convert(spark, **{"iceberg.writer": writer})
    assert more.committed and more.records == 20 and [p.segments for p in more.partitions] == [0, 1]
    table = t.table()
    assert rows(table) == t.expected()
    assert mk.read_state(table).next_offsets == {0: 112, 1: 100}


@pytest.mark.parametrize("point", ["planned", "write", "staged", "published"])
def test_killed_at_any_point_then_rerun_gives_one_row_per_offset(spark, tmp_path, point):
    t = build(tmp_path)
    proc, _, scratch_base = paused_convert(t, tmp_path, point)
    kill_group(proc)
    # what the killed driver left is in its own scratch directory (Spark starts after "planned"),
    # and it goes at the next job's start (sweep: what claiming does first)
    left = sorted(scratch_base.glob("job-*")) if scratch_base.exists() else []
    if point == "planned":
        assert left == []
    else:
        assert len(left) == 1, left
        spark_left = {p.name.split("-")[0] for p in left[0].iterdir()}
        assert {"spark", "artifacts", "liblz4"} <= spark_left, spark_left  # not in /tmp
        if point == "write":  # the session is up: Spark's copy of the jars (58 MiB) is there too
            assert list(left[0].rglob("iceberg-spark-runtime-*.jar")) and "blockmgr" in spark_left
        assert scratch.sweep(scratch_base) == left and list(scratch_base.iterdir()) == []
    table = t.table()
    if point == "published":
        assert rows(table) == t.expected()
    else:
        assert table.current_snapshot() is None and table.metadata.refs.get("main") is None
        assert table.metadata.snapshots == []
        if point == "staged":  # the executors' files are written, not committed: orphans
            assert list((t.workdir / "catalog" / "warehouse").rglob("*.parquet"))
    res = t.convert(spark)
    assert res.committed == (point != "published")
    table = t.table()
    assert rows(table) == t.expected()
    assert len(offsets(table)) == len(set(offsets(table))) == 185
    assert mk.read_state(table).next_offsets == {0: 112, 1: 80}


def test_two_jobs_racing_on_a_table_commit_the_offsets_once(spark, tmp_path):
    t = build(tmp_path)
    slow, pause_dir, scratch_base = paused_convert(t, tmp_path, "staged")  # staged, not published yet
    fast = t.convert(spark)  # a second job reads the same markers, commits
    assert fast.committed and fast.records == 185
    (pause_dir / "staged.resume").write_text("go")
    code, out, err = result_json(slow)
    assert code == 1 and out is None
    assert "main moved from None to" in err and "nothing was committed" in err, err[-2000:]
    assert list(scratch_base.iterdir()) == []  # a job that ends removes its scratch directory
    table = t.table()
    assert rows(table) == t.expected()
    assert len(table.metadata.snapshots) == 1  # the slow job's files were never committed
    assert table.current_snapshot().summary[mk.P_JOB] == fast.job_id


def test_reuploaded_and_overlapping_segments_never_duplicate_rows(spark, tmp_path):
    t = SyntheticTopic(tmp_path / "re", "re")
    b0 = [t.batch(0, 50), t.batch(0, 50)]  # 0..99
    b1 = [t.batch(0, 50), t.batch(0, 50)]  # 100..199
    t.segment(0, b0)
    t.segment(0, b0, track=False)  # the same offsets re-uploaded under a new id
    first = t.convert(spark)
    assert first.records == 100 and first.partitions[0].segments == 1
    t.segment(0, b1)
    b2 = [t.batch(0, 50)]  # 200..249
    t.segment(0, b1[1:] + b2)  # a re-upload after a leader change: 150..249
    t.segment(0, b1, track=False)  # and another copy of 100..199
    second = t.convert(spark)
    assert second.records == 150
    table = t.table()
    assert rows(table) == t.expected()
    assert offsets(table) == [(0, o) for o in range(250)]
    # a table converted from scratch over all those copies is the same
    fresh = t.convert(spark, **{"iceberg.table": "re_fresh"})
    assert fresh.records == 250
    assert rows(t.table(**{"iceberg.table": "re_fresh"})) == t.expected()


def test_a_corrupt_segment_fails_the_job_naming_it_and_commits_nothing(spark, tmp_path):
    t = build(tmp_path)
    bad = t.segments[1]
    log = t.objects_of(bad)[0]
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0x01
    good = log.read_bytes()
    log.write_bytes(bytes(data))
    with pytest.raises(DataLoss) as err:
        t.convert(spark)
    msg = str(err.value)
    assert bad.segment_id in msg and f"orders-0@{bad.start_offset}" in msg, msg
    assert ".log chunk" in msg
    table = t.table()
    assert table.current_snapshot() is None
    log.write_bytes(good)
    assert t.convert(spark).records == 185
    assert rows(t.table()) == t.expected()


@pytest.mark.parametrize("granularity", ["hour", "month"])
def test_time_partitioning_of_ingest_timestamp(spark, tmp_path, granularity):
    t = SyntheticTopic(tmp_path / granularity, f"p-{granularity}")
    for i in range(3):  # three hours apart, same month
        t.segment(0, [t.batch(0, 5, ts=1_700_000_000_000 + i * 3_600_000)])
    t.convert(spark, **{"iceberg.partitioning": granularity})
    table = t.table()
    (field,) = table.spec().fields
    assert str(field.transform) == granularity and field.name == f"ingest_{granularity}"
    assert table.schema().find_column_name(field.source_id) == "kafka.ingest_timestamp"
    parts = table.inspect.partitions().num_rows
    assert parts == (3 if granularity == "hour" else 1)


def test_a_far_future_timestamp_does_not_pin_later_rows_to_a_future_partition(spark, tmp_path):
    import datetime as dt

    from tests.iceberg.convert_helpers import T0

    day = 86_400_000
    t = SyntheticTopic(tmp_path / "future", "future")
    copied = T0 + 60_000
    # offset 3: a producer clock ten years ahead, between normal records
    t.segment(0, [t.batch(0, 3), t.batch(0, 1, ts=T0 + 3650 * day), t.batch(0, 2)], event_timestamp_ms=copied)
    t.convert(spark)
    assert mk.read_state(t.table()).ingest_ms == {0: copied}  # the marker is not pinned either
    # the next run: records a day later, copied a day later
    t.segment(0, [t.batch(0, 4, ts=T0 + day)], event_timestamp_ms=T0 + day + 60_000)
    t.convert(spark)
    table = t.table()
    assert rows(table) == t.expected()  # event_timestamp keeps the far-future time as produced
    ingest = {
        k["offset"]: int(k["ingest_timestamp"].timestamp() * 1000 + 0.5)
        for k in table.scan(selected_fields=("kafka",)).to_arrow().column("kafka").to_pylist()
    }
    assert ingest == {0: T0, 1: T0 + 1, 2: T0 + 2, 3: copied, 4: copied, 5: copied} | {
        6 + i: T0 + day + i for i in range(4)
    }
    # two day partitions: T0's day and the next; none in the future
    epoch_day = dt.date(1970, 1, 1)
    days = sorted(
        epoch_day + dt.timedelta(days=p["ingest_day"])
        if isinstance(p["ingest_day"], int)
        else p["ingest_day"]
        for p in table.inspect.partitions().column("partition").to_pylist()
    )
    t0_day = dt.datetime.fromtimestamp(T0 / 1000, dt.UTC).date()
    assert days == [t0_day, t0_day + dt.timedelta(days=1)]
