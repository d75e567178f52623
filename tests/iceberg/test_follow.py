"""``convert --follow``: segments tiered while the follower runs reach the table; a follower
SIGKILLed in a round and started again commits every offset once; two followers on one table
commit the offsets once (the loser's round is a ``conflict``, nothing of it committed); SIGTERM
stops it cleanly; its Prometheus metrics say what happened. Real Spark (local[2]), segments
stored by the sidecar's own copy code, kills with SIGKILL on the follower's process group."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.exceptions import NoSuchTableError

from devstack.common import free_port
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg.committing import markers as mk
from rsm_sidecar.iceberg.follow import CATALOG_BUSY, CONFLICT, FAILED, Follower, FollowMetrics
from rsm_sidecar.iceberg.job import load_config
from tests.iceberg.convert_helpers import SyntheticTopic, kill_group, offsets, rows, wait_paused


def _wait_for_rows(t: SyntheticTopic, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    got: list = []
    while time.monotonic() < deadline:
        try:
            got = rows(t.table())
        except NoSuchTableError:
            got = []
        if got == t.expected():
            return
        time.sleep(0.3)
    raise AssertionError(f"the table has {len(got)} of {len(t.records)} rows after {timeout:.0f}s")


def _segments_now(t: SyntheticTopic, partition: int, count: int, per_segment: int = 40) -> None:
    """Segments whose manifest records the broker's copy time as now (for freshness)."""
    for _ in range(count):
        now = int(time.time() * 1000)
        t.segment(
            partition, [t.batch(partition, 20) for _ in range(per_segment // 20)], event_timestamp_ms=now
        )


def _sample(metrics: FollowMetrics, name: str, **labels) -> float:
    value = metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


def _scrape(port: int) -> dict[tuple, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@contextlib.contextmanager
def _following(spark, t: SyntheticTopic, maintain_interval: float):
    """A follower of ``t`` running in a thread (rounds every 0.2 s) until the block ends; it, its
    metrics and its log lines."""
    overrides = {"iceberg.follow.interval": 0.2, "iceberg.follow.maintain_interval": maintain_interval}
    cfg, storage = load_config(t.config_file, {}, overrides)
    metrics, lines = FollowMetrics(), []
    follower = Follower(cfg, storage, t.topic, spark=spark, metrics=metrics, log=lines.append)
    stop = threading.Event()
    thread = threading.Thread(target=follower.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield follower, metrics, lines
    finally:
        stop.set()
        thread.join(120)
    assert not thread.is_alive()


def test_a_follower_converts_segments_as_they_are_tiered(spark, tmp_path):
    t = SyntheticTopic(tmp_path / "f", "f")
    _segments_now(t, 0, 2)
    with _following(spark, t, maintain_interval=0) as (_, metrics, lines):
        _wait_for_rows(t)
        _segments_now(t, 0, 1)
        _segments_now(t, 1, 2)
        _wait_for_rows(t)
    table = t.table()
    assert len(offsets(table)) == len(set(offsets(table))) == len(t.records) == 200
    assert mk.read_state(table).next_offsets == {0: 120, 1: 80}
    assert _sample(metrics, "rsm_iceberg_follow_records_total") == 200
    assert _sample(metrics, "rsm_iceberg_follow_segments_total") == 5
    assert _sample(metrics, "rsm_iceberg_follow_rounds_total", outcome="committed") >= 2
    assert _sample(metrics, "rsm_iceberg_follow_rounds_total", outcome=FAILED) == 0, "\n".join(lines)
    assert _sample(metrics, "rsm_iceberg_follow_freshness_seconds_count") == 5
    assert 0 < _sample(metrics, "rsm_iceberg_follow_freshness_seconds_sum") < 5 * 180
    for p in ("0", "1"):
        assert _sample(metrics, "rsm_iceberg_follow_lag_offsets", partition=p) == 0
        assert _sample(metrics, "rsm_iceberg_follow_lag_seconds", partition=p) == 0


def test_lag_counts_what_is_tiered_and_not_converted(spark, tmp_path):
    """One round with ``iceberg.max_segments = 1``: the plan reads 3 segments, converts one;
    the lag is the other two, aged from the oldest one's copy time."""
    t = SyntheticTopic(tmp_path / "lag", "lag")
    copied = int(time.time() * 1000) - 60_000
    for i in range(3):
        t.segment(0, [t.batch(0, 20), t.batch(0, 20)], event_timestamp_ms=copied + i * 1000)
    cfg, storage = load_config(t.config_file, {}, {"iceberg.max_segments": 1})
    metrics = FollowMetrics()
    follower = Follower(cfg, storage, t.topic, spark=spark, metrics=metrics, log=lambda line: None)
    assert follower.round() == "committed"
    assert _sample(metrics, "rsm_iceberg_follow_lag_offsets", partition="0") == 80
    assert 59 <= _sample(metrics, "rsm_iceberg_follow_lag_seconds", partition="0") < 120
    assert follower.round() == "committed"
    assert _sample(metrics, "rsm_iceberg_follow_lag_offsets", partition="0") == 40
    assert follower.round() == "committed"
    assert follower.round() == "nothing_new"
    assert _sample(metrics, "rsm_iceberg_follow_lag_offsets", partition="0") == 0
    assert rows(t.table()) == t.expected()


def test_the_follower_drops_what_kafka_retention_deleted_at_its_maintenance(spark, tmp_path):
    """``iceberg.follow.drop_deleted_offsets`` (on by default): once retention removed a
    segment from remote storage, the next maintenance deletes its rows; off, they stay; and a
    storage that shows no segment of the topic at all (a wrong bucket or prefix, more likely
    than retention having deleted everything) drops nothing."""
    t = SyntheticTopic(tmp_path / "ret", "ret")
    _segments_now(t, 0, 3)
    _segments_now(t, 1, 1)
    with _following(spark, t, maintain_interval=1) as (follower, metrics, lines):
        _wait_for_rows(t)
        for path in t.objects_of(t.segments[0]):  # retention deleted partition 0's first segment
            path.unlink()
        deadline = time.monotonic() + 180
        while (0, 0) in offsets(t.table()) and time.monotonic() < deadline:
            time.sleep(0.3)
    kept = [r for r in t.expected() if not (r[0] == 0 and r[1] < 40)]
    assert rows(t.table()) == kept, "\n".join(lines)
    assert _sample(metrics, "rsm_iceberg_follow_dropped_rows_total") == 40
    assert _sample(metrics, "rsm_iceberg_follow_maintenance_total", outcome="failed") == 0

    for path in t.objects_of(t.segments[1]):
        path.unlink()
    cfg_off, _ = load_config(t.config_file, {}, {"iceberg.follow.drop_deleted_offsets": False})
    off = Follower(cfg_off, follower.storage, t.topic, spark=spark, log=lambda line: None)
    assert off.maintain() and rows(t.table()) == kept  # an archive keeps them

    for md in t.segments[2:]:  # nothing of the topic left in storage
        for path in t.objects_of(md):
            path.unlink()
    lines.clear()
    assert follower.maintain() and rows(t.table()) == kept
    assert any("holds no segment of topic ret" in line for line in lines), lines


def test_a_follower_killed_in_a_round_then_restarted_commits_every_offset_once(tmp_path):
    t = SyntheticTopic(tmp_path / "k", "k")
    _segments_now(t, 0, 2)
    _segments_now(t, 1, 1)
    pause_dir = tmp_path / "pause"
    proc = t.cli("convert", "--follow", "--interval", "0.5", pause_at="staged", pause_dir=pause_dir)
    wait_paused(proc, pause_dir, "staged")  # every data file written, nothing committed
    kill_group(proc)
    table = t.table()
    assert table.current_snapshot() is None
    assert list((t.workdir / "catalog" / "warehouse").rglob("*.parquet"))  # the round's orphans

    port = free_port()
    proc = t.cli("convert", "--follow", "--interval", "0.5", "--metrics-listen", f"127.0.0.1:{port}")
    try:
        _wait_for_rows(t)
        _segments_now(t, 1, 1)
        _wait_for_rows(t)
        scraped = _scrape(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "[follow] k: stopped" in err
    table = t.table()
    assert len(offsets(table)) == len(set(offsets(table))) == len(t.records) == 160
    assert scraped[("rsm_iceberg_follow_records_total", ())] == 160
    assert scraped[("rsm_iceberg_follow_rounds_total", (("outcome", "failed"),))] == 0


def test_two_followers_on_one_table_commit_the_offsets_once(spark, tmp_path):
    t = SyntheticTopic(tmp_path / "two", "two")
    _segments_now(t, 0, 2)
    pause_dir = tmp_path / "pause"
    port = free_port()
    slow = t.cli(
        "convert",
        "--follow",
        "--interval",
        "0.5",
        "--metrics-listen",
        f"127.0.0.1:{port}",
        pause_at="staged",
        pause_dir=pause_dir,
    )
    try:
        wait_paused(slow, pause_dir, "staged")  # the slow follower's files are written
        cfg, storage = load_config(t.config_file, {}, {})
        fast = Follower(cfg, storage, t.topic, spark=spark, log=lambda line: None)
        assert fast.round() == "committed"  # the other follower commits first
        (pause_dir / "staged.resume").write_text("go")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            scraped = _scrape(port)
            if scraped.get(("rsm_iceberg_follow_rounds_total", (("outcome", "nothing_new"),)), 0) >= 1:
                break
            time.sleep(0.3)
    finally:
        slow.send_signal(signal.SIGTERM)
        out, err = slow.communicate(timeout=120)
    assert slow.returncode == 0, err[-3000:]
    assert scraped[("rsm_iceberg_follow_rounds_total", (("outcome", CONFLICT),))] == 1
    assert scraped[("rsm_iceberg_follow_rounds_total", (("outcome", "committed"),))] == 0
    assert "another writer committed first" in err
    table = t.table()
    assert rows(table) == t.expected()
    assert len(table.metadata.snapshots) == 1  # only the fast follower's commit


def test_a_configuration_error_stops_the_follower(spark, tmp_path):
    """The table holds another topic: no later round could succeed, so the error is raised (the
    CLI exits 1) instead of being retried for ever."""
    t = SyntheticTopic(tmp_path / "cfg", "first")
    _segments_now(t, 0, 1)
    t.convert(spark, **{"iceberg.table": "shared"})
    cfg, storage = load_config(t.config_file, {}, {"iceberg.table": "shared"})
    metrics = FollowMetrics()
    follower = Follower(cfg, storage, "second", spark=spark, metrics=metrics, log=lambda line: None)
    stop = threading.Event()
    with pytest.raises(ConfigError, match="holds topic 'first', not 'second'"):
        follower.run(stop)
    assert _sample(metrics, "rsm_iceberg_follow_failures_total", error="ConfigError") == 1


def test_failed_rounds_back_off_and_a_lost_commit_plans_again_at_once(tmp_path):
    t = SyntheticTopic(tmp_path / "b", "b")
    cfg, storage = load_config(t.config_file, {}, {"iceberg.follow.interval": 2})
    follower = Follower(cfg, storage, t.topic, log=lambda line: None)
    assert follower.pause_after("committed") == follower.pause_after("nothing_new") == 2
    assert follower.pause_after(CONFLICT) == 0
    waits = []
    for n in range(1, 8):
        follower.failures_in_a_row = n
        waits.append(follower.pause_after(FAILED))
    assert waits == [4, 8, 16, 32, 60, 60, 60]  # doubling, capped at 30 intervals


def test_a_round_that_finds_the_catalog_locked_counts_as_busy_not_failed(tmp_path):
    """The fault is real SQLite's: a writer holds a WAL file's write lock, and a connection that
    may not wait gets "database is locked", wrapped as SQLAlchemy (under PyIceberg) raises it.
    It reaches the round through the job: a real round meets it only after its connections'
    30 s wait, too slow for this suite. The round is ``catalog_busy``: no failure, no back-off,
    and the log line says where it was raised. Any other error still fails the round."""
    from sqlalchemy.exc import OperationalError

    db = tmp_path / "locked.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.OperationalError, match="database is locked") as locked:
        sqlite3.connect(db, timeout=0, isolation_level=None).execute("BEGIN IMMEDIATE")
    holder.execute("ROLLBACK")

    class Job:
        def __init__(self, error):
            self.error = error

        def prepare(self):
            raise self.error

    t = SyntheticTopic(tmp_path / "busy", "busy")
    cfg, storage = load_config(t.config_file, {}, {"iceberg.follow.interval": 2})
    metrics, lines = FollowMetrics(), []
    follower = Follower(cfg, storage, t.topic, metrics=metrics, log=lines.append)
    follower.failures_in_a_row = 3
    follower._job = lambda: Job(OperationalError("BEGIN IMMEDIATE", {}, locked.value))
    assert follower.round() == CATALOG_BUSY
    assert follower.failures_in_a_row == 0 and follower.pause_after(CATALOG_BUSY) == 2
    assert "locked by another writer" in lines[-1] and "raised at" in lines[-1], lines
    assert _sample(metrics, "rsm_iceberg_follow_rounds_total", outcome=CATALOG_BUSY) == 1
    assert _sample(metrics, "rsm_iceberg_follow_rounds_total", outcome=FAILED) == 0

    follower._job = lambda: Job(OperationalError("SELECT 1", {}, sqlite3.OperationalError("disk I/O error")))
    assert follower.round() == FAILED
    assert _sample(metrics, "rsm_iceberg_follow_rounds_total", outcome=FAILED) == 1
