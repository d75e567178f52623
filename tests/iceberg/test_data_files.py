"""The executors' Parquet writer (``iceberg.writer = arrow``) on a real local Iceberg table:
files per partition value with the table's field ids, rolled at the target size, committed by
one conditional commit with the markers, readable by Spark's Iceberg runtime; an aborted task
leaves no file; a commit on a moved ``main`` commits nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rsm_sidecar.iceberg.committing import markers as mk
from rsm_sidecar.iceberg.committing.data_files import FileTarget, TaskFileWriter
from rsm_sidecar.iceberg.mapping.evolution import ensure_table
from rsm_sidecar.iceberg.mapping.rows import EncoderSpec, RowEncoder
from rsm_sidecar.iceberg.reading.raw_records import KafkaRecord, raw_batch
from rsm_sidecar.iceberg.types import schema_to_arrow

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % DAY_MS  # a midnight


def _table(local_catalog, partition="day"):
    catalog = local_catalog.pyiceberg()
    ident = ("kafka", f"files_{uuid.uuid4().hex[:8]}")
    encoder = RowEncoder(EncoderSpec())
    table = ensure_table(catalog, ident, encoder.schema, partition=partition)
    spec = EncoderSpec().with_table(schema_to_arrow(table.schema()))
    return catalog, ident, table, RowEncoder(spec)


def _records(first: int, n: int, day: int) -> list[KafkaRecord]:
    ts = T0 + day * DAY_MS
    return [
        KafkaRecord(0, o, first, ts + o, ts + o, b"k%d" % o, b"v%d" % o, [("h", b"x")])
        for o in range(first, first + n)
    ]


def _marker(job: str, next_offset: int) -> dict[str, str]:
    return mk.marker_properties(
        topic="t",
        topic_id="id",
        job_id=job,
        next_offsets={0: next_offset},
        ingest_ms={0: 0},
        segments={0: ["s"]},
        skipped={},
    )


def test_one_file_per_day_with_field_ids_committed_once_and_read_by_spark(local_catalog, spark):
    catalog, ident, table, enc = _table(local_catalog)
    writer = TaskFileWriter(FileTarget.for_table(table, target_file_size=1 << 30, write_id="w1"), 7)
    # one batch spanning two days, then a third day
    writer.write(enc.encode(raw_batch(_records(0, 50, 0) + _records(50, 30, 1))))
    writer.write(enc.encode(raw_batch(_records(80, 20, 2))))
    written = writer.close()
    assert sorted(w.records for w in written) == [20, 30, 50]
    files = [w.data_file for w in written]
    days = sorted(f.partition[0] for f in files)
    assert days == [T0 // DAY_MS + d for d in range(3)]
    for w in written:
        assert "/data/ingest_day=" in w.path and "/w1-00007-" in w.path
        fields = pq.read_schema(w.path.removeprefix("file://"))
        assert (
            fields.field("kafka").metadata[b"PARQUET:field_id"]
            == str(table.schema().find_field("kafka").field_id).encode()
        )

    snap = mk.commit_files(catalog, ident, None, files, _marker("job-1", 100))
    table = catalog.load_table(ident)
    assert table.current_snapshot().snapshot_id == snap.snapshot_id
    assert table.metadata.refs[mk.MARKER_TAG].snapshot_id == snap.snapshot_id
    assert mk.read_state(table).next_offsets == {0: 100}
    assert table.current_snapshot().summary["added-records"] == "100"
    got = sorted(r["offset"] for r in table.scan().to_arrow().column("kafka").to_pylist())
    assert got == list(range(100))
    # Iceberg's own (Java) reader in Spark reads the files, partition pruning included
    name = f"rsm.{'.'.join(ident)}"
    day1 = spark.sql(
        f"SELECT kafka.offset AS o, cast(val.__raw__ AS string) AS v FROM {name} "
        f"WHERE kafka.ingest_timestamp >= timestamp_millis({T0 + DAY_MS}) "
        f"AND kafka.ingest_timestamp < timestamp_millis({T0 + 2 * DAY_MS}) ORDER BY o"
    ).collect()
    assert [(r.o, r.v) for r in day1] == [(o, f"v{o}") for o in range(50, 80)]


def test_a_task_keeps_at_most_two_files_open_and_loses_no_row(local_catalog):
    """Memory stays bounded when rows jump between many time partitions: a third partition
    finishes the least recently written file (a later row for it goes to a further file)."""
    catalog, ident, table, enc = _table(local_catalog)
    target = FileTarget.for_table(table, target_file_size=1 << 30, write_id="many")
    writer = TaskFileWriter(target, 0)
    days = [0, 1, 2, 0, 3, 1]
    for i, day in enumerate(days):
        writer.write(enc.encode(raw_batch(_records(i * 10, 10, day))))
        assert len(writer._open) <= 2
    written = writer.close()
    assert sum(w.records for w in written) == 60 and len(written) == 6
    mk.commit_files(catalog, ident, None, [w.data_file for w in written], _marker("m", 60))
    got = catalog.load_table(ident).scan().to_arrow().column("kafka").to_pylist()
    assert sorted(r["offset"] for r in got) == list(range(60))


def test_files_roll_at_the_target_size_and_all_rows_are_committed(local_catalog):
    catalog, ident, table, enc = _table(local_catalog, partition=None)
    target = FileTarget.for_table(table, target_file_size=1, write_id="roll")
    target = FileTarget(target.metadata_json, target.io_properties, 1, row_group_bytes=1, write_id="roll")
    writer = TaskFileWriter(target, 0)
    for i in range(5):
        writer.write(enc.encode(raw_batch(_records(i * 10, 10, 0))))
    written = writer.close()
    assert len(written) == 5 and all(w.records == 10 for w in written)
    mk.commit_files(catalog, ident, None, [w.data_file for w in written], _marker("job-r", 50))
    table = catalog.load_table(ident)
    assert table.scan().to_arrow().num_rows == 50
    assert table.inspect.files().num_rows == 5


def test_an_aborted_task_deletes_its_files(local_catalog):
    catalog, ident, table, enc = _table(local_catalog)
    target = FileTarget(
        table.metadata.model_dump_json(), dict(table.io.properties), 1 << 30, row_group_bytes=1, write_id="ab"
    )
    writer = TaskFileWriter(target, 0)
    writer.write(enc.encode(raw_batch(_records(0, 10, 0) + _records(10, 10, 1))))
    paths = [p.removeprefix("file://") for p in writer._written_paths]
    assert len(paths) == 2 and all(Path(p).exists() for p in paths)
    writer.abort()
    assert not any(Path(p).exists() for p in paths)


def test_two_attempts_of_one_task_never_write_the_same_file(local_catalog):
    """A retried or speculative attempt of a task must not overwrite the files of the attempt
    whose descriptions the driver commits."""
    catalog, ident, table, enc = _table(local_catalog)
    target = FileTarget.for_table(table, target_file_size=1 << 30, write_id="twice")
    first, second = TaskFileWriter(target, 3), TaskFileWriter(target, 3)
    first.write(enc.encode(raw_batch(_records(0, 10, 0))))
    second.write(enc.encode(raw_batch(_records(0, 10, 0))))
    a, b = first.close(), second.close()
    assert {w.path for w in a}.isdisjoint({w.path for w in b})
    second.abort()  # the losing attempt cleans up its own files only
    assert all(Path(w.path.removeprefix("file://")).exists() for w in a)
    mk.commit_files(catalog, ident, None, [w.data_file for w in a], _marker("t", 10))
    assert catalog.load_table(ident).scan().to_arrow().num_rows == 10


def test_a_commit_after_main_moved_commits_nothing(local_catalog):
    catalog, ident, table, enc = _table(local_catalog)

    def files(job):
        w = TaskFileWriter(FileTarget.for_table(table, target_file_size=1 << 30, write_id=job), 0)
        w.write(enc.encode(raw_batch(_records(0, 10, 0))))
        return [x.data_file for x in w.close()]

    first = mk.commit_files(catalog, ident, None, files("a"), _marker("a", 10))
    with pytest.raises(mk.CommitConflict, match="main moved from None to"):
        mk.commit_files(catalog, ident, None, files("b"), _marker("b", 10))
    table = catalog.load_table(ident)
    assert [s.snapshot_id for s in table.metadata.snapshots] == [first.snapshot_id]
    assert table.scan().to_arrow().num_rows == 10
