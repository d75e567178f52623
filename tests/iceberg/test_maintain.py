"""``iceberg maintain`` on real tables: expiry keeps the marker (and the converted offsets),
removes unpublished staged snapshots; compaction keeps the rows; orphan removal deletes what a
SIGKILLed job left; rows of offsets Kafka retention removed are dropped on request."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from rsm_sidecar.iceberg.committing import markers as mk
from rsm_sidecar.iceberg.job import ConvertJob, load_config
from tests.iceberg.convert_helpers import SyntheticTopic, kill_group, rows, wait_paused

NOW = dt.timedelta(0)


def _data_files(t: SyntheticTopic) -> set[str]:
    root = t.workdir / "catalog" / "warehouse"
    return {str(p) for p in root.rglob("*.parquet")}


def test_expire_keeps_the_marker_snapshot_and_drops_unpublished_staged_ones(spark, tmp_path):
    t = SyntheticTopic(tmp_path / "exp", "exp")
    t.simple_segments(0, 3)
    t.convert(spark)
    marked = t.table().current_snapshot().snapshot_id
    t.maintain(spark, compact=True)  # a snapshot without marker on top
    # a run staged by Spark but never published (what a job killed before publishing leaves)
    t.simple_segments(0, 1)
    cfg, storage = load_config(t.config_file, {}, {"iceberg.writer": "spark"})
    job = ConvertJob(cfg, storage, t.topic, spark=spark, log=lambda line: None)
    job._write(job.prepare())  # Spark's write-audit-publish staging (iceberg.writer = spark)
    table = t.table()
    staged = mk.staged_snapshot(table, job.job_id)
    assert staged is not None and len(table.metadata.snapshots) == 3
    res = t.maintain(spark, expire=True, expire_older_than=NOW, retain_last=1)
    table = t.table()
    ids = {s.snapshot_id for s in table.metadata.snapshots}
    assert marked in ids and staged.snapshot_id not in ids
    assert ids == {marked, table.current_snapshot().snapshot_id}
    assert res.expired.get("deleted_data_files_count", 0) >= 1  # the staged run's files
    state = mk.read_state(table)
    assert state.marker_snapshot_id == marked and state.next_offsets == {0: 180}
    # the next run converts exactly what is new
    res = t.convert(spark)
    assert res.records == 60
    assert rows(t.table()) == t.expected()


def test_compaction_reduces_the_file_count_with_identical_rows(spark, tmp_path):
    t = SyntheticTopic(tmp_path / "cmp", "cmp")
    t.simple_segments(0, 4)
    t.simple_segments(1, 4)
    t.convert(spark)
    before = rows(t.table())
    files_before = t.table().inspect.files().num_rows
    assert files_before == 8  # one file per segment task
    res = t.maintain(spark, compact=True)
    table = t.table()
    assert table.inspect.files().num_rows < files_before
    assert res.compacted["rewritten_data_files_count"] == files_before
    assert rows(table) == before == t.expected()
    assert t.convert(spark).records == 0  # the markers are still found through the replace snapshot


def test_orphan_removal_deletes_the_files_a_killed_job_left(spark, tmp_path):
    t = SyntheticTopic(tmp_path / "orph", "orph")
    for p in (0, 1):
        t.simple_segments(p, 2)
    pause = tmp_path / "pause"
    proc = t.cli("convert", pause_at="write", pause_dir=pause)
    wait_paused(proc, pause, "write")  # the last segment task: earlier ones wrote files
    kill_group(proc)
    left = _data_files(t)
    assert left and t.table().current_snapshot() is None
    assert t.convert(spark).records == len(t.records)
    referenced = {
        str(Path(f.removeprefix("file:"))) for f in t.table().inspect.files().column("file_path").to_pylist()
    }
    assert not (left & referenced)
    res = t.maintain(spark, remove_orphans=True, orphan_older_than=NOW)
    removed = {str(Path(f.removeprefix("file:"))) for f in res.orphans}
    assert left <= removed and not (removed & referenced)
    assert _data_files(t) == referenced
    assert rows(t.table()) == t.expected()


def test_drop_deleted_offsets_removes_rows_retention_took_from_kafka(spark, tmp_path):
    t = SyntheticTopic(tmp_path / "ret", "ret")
    t.simple_segments(0, 3)
    t.simple_segments(1, 1)
    t.convert(spark)
    for path in t.objects_of(t.segments[0]):  # retention deletes partition 0's oldest segment
        path.unlink()
    res = t.maintain(spark, drop_deleted_offsets=True)
    assert res.dropped == {0: 60, 1: 0}
    assert rows(t.table()) == [r for r in t.expected() if not (r[0] == 0 and r[1] < 60)]
    assert t.convert(spark).records == 0
