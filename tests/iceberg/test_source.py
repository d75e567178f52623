"""The ``rsm-tiered`` Spark data source on real Spark: a topic tiered by the sidecar's own copy
code (zstd + AES-GCM, the broker's offset and time indexes) read without converting it.

What a user checks: the rows equal a conversion's, filters on partition, offset and
``ingest_timestamp`` return the same rows as without them while reading fewer segments and bytes
from storage, a damaged object fails the read naming the segment, and a ``readStream`` into an
Iceberg ``writeStream`` that is killed with SIGKILL and started again lands every offset once.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsm_sidecar.errors import ConfigError, DataLoss
from rsm_sidecar.segment.settings import CopySettings
from tests.iceberg.convert_helpers import REPO, SyntheticTopic

pytestmark = pytest.mark.integration

COLUMNS = (
    "kafka.partition AS p, kafka.offset AS o, kafka.event_timestamp AS et, "
    "kafka.ingest_timestamp AS it, kafka.batch_start AS bs, key.__raw__ AS k, val.__raw__ AS v, headers AS h"
)


def _source(spark, t: SyntheticTopic, **options):
    from rsm_sidecar.iceberg.source import register

    register(spark)
    reader = spark.read.format("rsm-tiered").option("config", str(t.config_file)).option("topic", t.topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.selectExpr(*COLUMNS.split(", ")).collect())


def _many_segments(workdir: Path, per_segment: int = 600) -> SyntheticTopic:
    """Two partitions of 5 segments x ``per_segment`` records (batches of 20), 4 KiB chunks:
    600 records are ~6 chunks and ~6 offset-index entries per segment."""
    t = SyntheticTopic(workdir)
    t.writer.settings = CopySettings(chunk_size=4096)
    for p in (0, 1):
        t.simple_segments(p, 5, per_segment=per_segment)
    return t


def test_batch_read_gives_the_rows_a_conversion_writes(tmp_path, spark):
    t = SyntheticTopic(tmp_path)
    t.transactional_segments()  # an aborted transaction: its records are not rows
    t.simple_segments(1, 2)
    df = _source(spark, t)
    rows = _rows(df)
    assert [(r[0], r[1], r[5], r[6]) for r in rows] == [(e[0], e[1], e[2], e[3]) for e in t.expected()]
    # a cut inside the segment with the aborted transaction keeps its records out
    from rsm_sidecar.iceberg.source import read_topic

    late = _rows(read_topic(spark, t.topic, t.config_file).where("kafka.offset >= 42"))
    assert late == [r for r in rows if r[1] >= 42]
    result = t.convert(spark)
    assert result.committed
    assert rows == _rows(spark.table(f"{t.catalog_name}.{result.table}"))  # all the columns


def test_sql_filters_skip_segments_and_chunks_and_keep_the_rows(tmp_path, spark):
    from rsm_sidecar.iceberg.source import create_view

    t = _many_segments(tmp_path)
    create_view(spark, "tiered", t.topic, t.config_file)
    everything = _rows(spark.table("tiered"))
    assert len(everything) == 6000
    its = sorted({r[3] for r in everything if r[0] == 0})
    t_lo, t_hi = its[len(its) // 3], its[len(its) // 2]
    queries = {
        "kafka.partition = 1": lambda r: r[0] == 1,
        "kafka.partition IN (0) AND kafka.offset >= 1250 AND kafka.offset < 1330": (
            lambda r: r[0] == 0 and 1250 <= r[1] < 1330
        ),
        "kafka.offset > 2990": lambda r: r[1] > 2990,
        "kafka.offset = 17 OR kafka.offset = 2017": lambda r: r[1] in (17, 2017),  # not pushed
        f"kafka.partition = 0 AND kafka.ingest_timestamp >= TIMESTAMP '{t_lo.isoformat()}' "
        f"AND kafka.ingest_timestamp < TIMESTAMP '{t_hi.isoformat()}'": (
            lambda r: r[0] == 0 and t_lo <= r[3] < t_hi
        ),
        "kafka.offset > 5000": lambda r: False,
    }
    # segments split into tasks of ~8 KiB too: a cut inside a piece starts from its state
    create_view(spark, "tiered_split", t.topic, t.config_file, **{"iceberg.task_bytes": "8192"})
    assert spark.table("tiered_split").rdd.getNumPartitions() > 10
    for view in ("tiered", "tiered_split"):
        for where, keep in queries.items():
            got = _rows(spark.sql(f"SELECT * FROM {view} WHERE {where}"))
            assert got == [r for r in everything if keep(r)], (view, where)
    # the Spark partitions of a scan are the segment tasks left after pruning
    tasks = {
        where: spark.sql(f"SELECT * FROM tiered WHERE {where}").rdd.getNumPartitions()
        for where in (
            "kafka.offset >= 0",
            "kafka.partition = 1",
            "kafka.partition = 0 AND kafka.offset BETWEEN 1250 AND 1330",
        )
    }
    assert tasks == {
        "kafka.offset >= 0": 10,
        "kafka.partition = 1": 5,
        "kafka.partition = 0 AND kafka.offset BETWEEN 1250 AND 1330": 1,
    }


def _read_in_process(t: SyntheticTopic, filters) -> tuple[int, int, dict[str, int], int]:
    """(rows, bytes read from storage, requests, tasks) of a read through the source's own
    reader in this process, with a fresh store (no cache carried over)."""
    from rsm_sidecar.iceberg.reading import segment_tasks
    from rsm_sidecar.iceberg.source import TieredTopicSource

    src = TieredTopicSource({"config": str(t.config_file), "topic": t.topic})
    reader = src.reader(None)
    segment_tasks._CONTEXTS.clear()
    reader.pushFilters(filters)
    parts = reader.partitions()
    rows = sum(b.num_rows for p in parts for b in reader.read(p))
    store = segment_tasks.executor_context(reader.params.storage).store
    return rows, store.bytes_read, store.requests, len(parts)


def test_pruning_reads_only_the_chunks_the_filters_can_match(tmp_path):
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, IsNotNull, LessThanOrEqual

    t = _many_segments(tmp_path, per_segment=3000)
    rows_all, bytes_all, req_all, tasks_all = _read_in_process(t, [])
    narrow = [
        IsNotNull(("kafka",)),  # read_topic's guard
        EqualTo(("kafka", "partition"), 1),
        GreaterThanOrEqual(("kafka", "offset"), 7300),
        LessThanOrEqual(("kafka", "offset"), 7339),
    ]
    rows, bytes_read, req, tasks = _read_in_process(t, narrow)
    assert (rows_all, tasks_all, tasks) == (30000, 10, 1)
    # the task starts at the offset-index entry before 7300 and stops after 7339: 40 records
    # wanted, at most one index interval (4 KiB of batches, ~100 records) more read
    assert 40 <= rows <= 200
    # 5 manifests, the transaction indexes of partition 1's segments, the offset and time
    # indexes of one segment, and the 1-2 chunks around the offsets
    assert req["GET"] <= 13 and bytes_read < bytes_all / 10, (req, bytes_read, bytes_all)
    print(
        f"\nfull read: {bytes_all} bytes, {req_all}; "
        f"partition 1 offsets 7300..7339: {bytes_read} bytes, {req}"
    )


def test_a_bare_load_reused_for_another_query_still_returns_every_row(tmp_path, spark):
    """Spark 4.1 keeps the partitions a pushdown planned on a relation and reuses them for a
    later query with no pushable filter: a bare ``load()`` must not prune (see pushFilters)."""
    t = _many_segments(tmp_path)
    df = _source(spark, t)
    assert df.where("kafka.partition = 1 AND kafka.offset > 2990").count() == 9
    assert df.count() == 6000
    assert df.where("kafka.offset = 17 OR kafka.offset = 2017").count() == 4
    df.createOrReplaceTempView("bare")
    assert spark.sql("SELECT count(*) FROM bare WHERE kafka.partition = 0").first()[0] == 3000
    assert spark.sql("SELECT count(*) FROM bare").first()[0] == 6000


def test_a_damaged_chunk_fails_the_read_naming_the_segment(tmp_path, spark):
    t = SyntheticTopic(tmp_path)
    t.simple_segments(0, 2)
    log = t.objects_of(t.segments[1])[0]
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0xFF
    log.write_bytes(bytes(data))
    with pytest.raises(Exception) as err:
        _source(spark, t).collect()
    text = str(err.value)
    assert "SegmentFailed" in text and f"{t.topic}-0@60..119" in text, text


def test_options_are_checked_before_anything_is_read():
    from rsm_sidecar.iceberg.source import SourceOptions

    with pytest.raises(ConfigError, match='"topic" is required'):
        SourceOptions.parse({"config": "x.toml"})
    with pytest.raises(ConfigError, match="startingOffsets"):
        SourceOptions.parse({"topic": "t", "startingOffsets": "yesterday"})
    with pytest.raises(ConfigError, match="maxSegmentsPerTrigger"):
        SourceOptions.parse({"topic": "t", "maxSegmentsPerTrigger": "-2"})
    with pytest.raises(ConfigError, match="unknown option.*topicname"):
        SourceOptions.parse({"topicName": "t", "topic": "t"})
    opts = SourceOptions.parse({"Topic": "t", "iceberg.registry.url": "http://r:8080"})
    assert opts.overrides == (("iceberg.registry.url", "http://r:8080"),)


# ---------------------------------------------------------------------------- streaming
STREAM_JOB = REPO / "tests" / "iceberg" / "stream_to_iceberg.py"


def _start_stream(t: SyntheticTopic, table: str, checkpoint: Path, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSM__")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(
        [sys.executable, str(STREAM_JOB), str(t.config_file), t.topic, table, str(checkpoint)],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its Spark JVM is in its process group: killpg takes both
    )


def _table_offsets(t: SyntheticTopic, table: str) -> list[tuple[int, int]]:
    from rsm_sidecar.iceberg.job import load_config
    from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
    from rsm_sidecar.iceberg.settings import CatalogSettings

    cfg, _ = load_config(t.config_file, {})
    catalog = CatalogSpec(CatalogSettings.from_config(cfg)).pyiceberg()
    try:
        tbl = catalog.load_table(("kafka", table))
    except Exception:  # not created yet
        return []
    arrow = tbl.scan(selected_fields=("kafka",)).to_arrow()
    kafka = arrow.column("kafka").combine_chunks()
    return list(zip(kafka.field("partition").to_pylist(), kafka.field("offset").to_pylist()))


def _wait(what: str, cond, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            pytest.fail(
                f"the streaming job ended ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


def _kill(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(60)


def test_read_stream_into_iceberg_killed_and_resumed_lands_each_offset_once(tmp_path):
    t = SyntheticTopic(tmp_path)
    t.transactional_segments()  # an aborted transaction, then 2 plain segments on partition 1
    table, checkpoint, log = "streamed", tmp_path / "checkpoint", tmp_path / "stream.log"
    proc = _start_stream(t, table, checkpoint, log)
    try:
        first = len(t.expected())  # the first micro-batch of a run takes everything tiered
        _wait("the first micro-batch", lambda: len(_table_offsets(t, table)) >= first, proc, log)
        for _ in range(4):  # then one segment per micro-batch (maxSegmentsPerTrigger = 1)
            t.simple_segments(0, 1)
            t.simple_segments(1, 1)
        total = len(t.expected())
        _wait("a later micro-batch", lambda: len(_table_offsets(t, table)) > first, proc, log)
        _kill(proc, signal.SIGKILL)  # while batches of the new segments are being written
        before = len(_table_offsets(t, table))
        assert before < total, "every batch landed before the kill: the test proves nothing"
        t.simple_segments(0, 1)  # tiered while the stream was down
        t.segment(1, [t.batch(1, 5, transactional_pid=9), t.marker(1, 9, commit=True)])
        proc = _start_stream(t, table, checkpoint, log)
        want = sorted((e[0], e[1]) for e in t.expected())
        _wait("every offset", lambda: len(_table_offsets(t, table)) >= len(want), proc, log)
        time.sleep(3)  # a batch landing twice would show now
        got = sorted(_table_offsets(t, table))
        assert got == want, f"{len(got)} rows for {len(want)} offsets ({before} before the kill)"
    finally:
        _kill(proc, signal.SIGTERM)


def _stream_reader(t: SyntheticTopic, **options: str):
    from rsm_sidecar.iceberg.source import TieredTopicSource

    return TieredTopicSource({"config": str(t.config_file), "topic": t.topic, **options}).streamReader(None)


def _read_rows(reader, partitions) -> dict[tuple[int, int], int]:
    """``(partition, offset) -> ingest_timestamp`` (µs) of the rows of ``partitions``, read in
    this process by the reader's own read function."""
    out: dict[tuple[int, int], int] = {}
    for part in partitions:
        for batch in reader.read(part):
            kafka = batch.column("kafka")
            for p, o, it in zip(
                kafka.field("partition").to_pylist(),
                kafka.field("offset").to_pylist(),
                kafka.field("ingest_timestamp").cast("int64").to_pylist(),
            ):
                assert (p, o) not in out, f"{(p, o)} read twice"
                out[(p, o)] = it
    return out


def test_stream_offsets_cap_micro_batches_and_replay_the_same_rows(tmp_path):
    from rsm_sidecar.iceberg.source import TieredTopicSource

    t = SyntheticTopic(tmp_path)
    t.simple_segments(0, 2)
    t.simple_segments(1, 1)
    reader = _stream_reader(t, maxSegmentsPerTrigger="1")
    end1 = reader.latestOffset()  # Spark asks before it says where the query starts: no cap
    assert reader.initialOffset() == {}
    assert {p: v["next"] for p, v in end1.items()} == {"0": 120, "1": 60}
    rows = _read_rows(reader, reader.partitions({}, end1))
    reader.commit(end1)
    t.simple_segments(0, 1)
    t.simple_segments(1, 2)
    ends = [end1]
    for want in ({"0": 180, "1": 60}, {"0": 180, "1": 120}, {"0": 180, "1": 180}, {"0": 180, "1": 180}):
        end = reader.latestOffset()  # one segment per micro-batch, partition 0 first
        assert {p: v["next"] for p, v in end.items()} == want
        if end != ends[-1]:
            batch = _read_rows(reader, reader.partitions(ends[-1], end))
            assert not batch.keys() & rows.keys()
            rows.update(batch)
            reader.commit(end)
            ends.append(end)
    assert sorted(rows) == sorted((e[0], e[1]) for e in t.expected())
    # a micro-batch planned again by a new reader (a restarted query) gives the same rows
    again = _stream_reader(t, maxSegmentsPerTrigger="1")
    replay = _read_rows(again, again.partitions(ends[1], ends[2]))
    assert replay == {k: v for k, v in rows.items() if k[0] == 1 and 60 <= k[1] < 120}
    # ... and ingest_timestamp carries across micro-batches as in one batch read of the topic
    batch_reader = TieredTopicSource({"config": str(t.config_file), "topic": t.topic}).reader(None)
    assert _read_rows(batch_reader, batch_reader.partitions()) == rows


def test_stream_starting_at_latest_reads_only_what_is_tiered_later(tmp_path):
    t = SyntheticTopic(tmp_path)
    t.simple_segments(0, 2)
    reader = _stream_reader(t, startingOffsets="latest")
    start = reader.initialOffset()
    assert {p: v["next"] for p, v in start.items()} == {"0": 120}
    assert reader.latestOffset() == start  # nothing new
    reader.commit(start)
    t.simple_segments(0, 1)
    t.simple_segments(1, 1)
    end = reader.latestOffset()
    assert sorted(_read_rows(reader, reader.partitions(start, end))) == sorted(
        [(0, o) for o in range(120, 180)] + [(1, o) for o in range(60)]
    )


def test_stream_batch_whose_segment_vanished_fails_naming_the_offsets(tmp_path):
    t = SyntheticTopic(tmp_path)
    t.simple_segments(0, 3)
    reader = _stream_reader(t)
    end = reader.latestOffset()
    for obj in t.objects_of(t.segments[1]):  # someone deletes a segment above the earliest
        obj.unlink()
    with pytest.raises(
        DataLoss,
        match=r"orders-0: this micro-batch covers offsets up to 179, but remote storage now holds "
        r"them only up to 59",
    ):
        reader.partitions({}, end)


def test_read_bounds_from_filters():
    from pyspark.sql.datasource import EqualTo, GreaterThan, In, LessThan

    from rsm_sidecar.iceberg.source import read_bounds

    ts = dt.datetime(2026, 1, 1, 0, 0, 0, 1500, tzinfo=dt.UTC)  # 1.5 ms past a second
    b = read_bounds(
        [
            In(("kafka", "partition"), (1, 2)),
            EqualTo(("kafka", "partition"), 2),
            GreaterThan(("kafka", "offset"), 9),
            LessThan(("kafka", "offset"), 20),
            GreaterThan(("kafka", "ingest_timestamp"), ts),
            LessThan(("kafka", "ingest_timestamp"), ts),
            EqualTo(("key", "__raw__"), b"x"),  # not a bound: ignored
        ]
    )
    ms = int(ts.timestamp() * 1000)
    assert (b.partitions, b.offset_min, b.offset_max) == (frozenset([2]), 10, 19)
    assert (b.ingest_min_ms, b.ingest_max_ms) == (ms, ms + 1)  # widened to whole ms
