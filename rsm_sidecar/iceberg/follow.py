"""``rsm-sidecar iceberg convert --follow``: the convert job in rounds, so that a table stays
fresh without anyone scheduling it (docs/iceberg.md "Follow mode").

A round is one ordinary run of :class:`~rsm_sidecar.iceberg.job.ConvertJob` on one Spark
session kept for the follower's life: read the markers, list and plan, write, one conditional
commit. Exactly once comes from the table's markers, not from the follower, so:

* a follower killed at any point (SIGKILL included) starts again from what the table says;
  nothing of an interrupted round is committed (its data files are orphans that maintenance
  removes);
* two followers on one table both plan from the same markers; the first commit wins and the
  other's fails with :class:`~rsm_sidecar.iceberg.committing.markers.CommitConflict` (nothing of
  it is committed). That round counts as ``conflict`` and the loser plans again at once, from
  the new markers. A second follower is safe, but it repeats the winner's work: run one per
  table, and a second only as a standby.
* a round that finds the embedded SQLite catalog locked by another writer beyond the wait its
  connections allow ("database is locked", ``SQLITE_BUSY``, from PyIceberg or from Spark's JDBC
  catalog) met contention, not a fault: it counts as ``catalog_busy``, not ``failed``, and the
  next round comes after the usual interval, with no back-off and the same Spark session.

Between rounds the follower waits ``iceberg.follow.interval``; after a failed round twice as
long each time (up to 30 intervals), with a fresh Spark session when it started its own. A
configuration error (:class:`~rsm_sidecar.errors.ConfigError`: a wrong table, a field named like
a synthesized column, registry credentials refused) stops it: no later round could succeed.
Every ``iceberg.follow.maintain_interval`` it expires old snapshots, removes old orphans,
compacts a current-state table (its data files and their delete files) and, unless
``iceberg.follow.drop_deleted_offsets`` is off, deletes the rows whose offsets Kafka's
retention removed from remote storage (:func:`~rsm_sidecar.iceberg.maintenance.maintain`).
With ``iceberg.kafka.bootstrap_servers`` it reads the topic's copy lag (KIP-1241,
:mod:`~rsm_sidecar.iceberg.copy_lag`) when it starts and at each maintenance, exports it, and
logs a warning once per setting that delays uploads.

Metrics (``iceberg.follow.metrics_listen``, :class:`FollowMetrics`): rounds by outcome, records
and segments committed, failures by error class, per-partition lag in offsets and seconds, and
the freshness of every committed segment: the time from the broker beginning to copy it to its
rows being committed.
"""

from __future__ import annotations

import math
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Unpack

import prometheus_client as prom

from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg.committing.markers import CommitConflict
from rsm_sidecar.iceberg.job import ConvertJob, ConvertResult, Prepared, TopicOptions, TopicRun
from rsm_sidecar.iceberg.reading.segment_tasks import StorageParams
from rsm_sidecar.iceberg.settings import UPSERT

#: rounds that failed in a row multiply the pause up to this many intervals
MAX_BACKOFF_INTERVALS = 30
#: one round in this many (the first included) lists the topic whole; the others list each
#: partition the table knows from its next offset on, so that a round costs what is new, not what
#: is stored (docs/iceberg.md "Follow mode"; benchmarks/many_segments.py)
FULL_LISTING_EVERY = 10
#: buckets of the freshness histogram (seconds)
FRESHNESS_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600, 1800, 3600)

COMMITTED, NOTHING_NEW, CONFLICT, FAILED = "committed", "nothing_new", "conflict", "failed"
#: a round that found the embedded catalog's SQLite file locked by another writer (module docstring)
CATALOG_BUSY = "catalog_busy"


class FollowMetrics:
    """The follower's Prometheus metrics, in a registry of their own."""

    def __init__(self, registry: prom.CollectorRegistry | None = None):
        self.registry = registry or prom.CollectorRegistry()
        r = self.registry
        self.rounds = prom.Counter("rsm_iceberg_follow_rounds", "Rounds by outcome.", ["outcome"], registry=r)
        self.records = prom.Counter(
            "rsm_iceberg_follow_records", "Records committed to the table.", registry=r
        )
        self.segments = prom.Counter(
            "rsm_iceberg_follow_segments", "Segments committed to the table.", registry=r
        )
        self.failures = prom.Counter(
            "rsm_iceberg_follow_failures", "Failed rounds by error class.", ["error"], registry=r
        )
        self.lag_offsets = prom.Gauge(
            "rsm_iceberg_follow_lag_offsets",
            "Offsets of complete tiered segments not in the table yet (after the last round).",
            ["partition"],
            registry=r,
        )
        self.lag_seconds = prom.Gauge(
            "rsm_iceberg_follow_lag_seconds",
            "Age of the oldest tiered segment not in the table yet, since the broker began "
            "copying it (after the last round; 0: none).",
            ["partition"],
            registry=r,
        )
        self.freshness = prom.Histogram(
            "rsm_iceberg_follow_freshness_seconds",
            "Per committed segment: from the broker beginning to copy it to its rows committed.",
            buckets=FRESHNESS_BUCKETS,
            registry=r,
        )
        self.last_commit = prom.Gauge(
            "rsm_iceberg_follow_last_commit_timestamp_seconds",
            "Wall clock of the last commit.",
            registry=r,
        )
        self.maintenance = prom.Counter(
            "rsm_iceberg_follow_maintenance", "Maintenance runs by outcome.", ["outcome"], registry=r
        )
        self.dropped = prom.Counter(
            "rsm_iceberg_follow_dropped_rows",
            "Rows deleted because Kafka's retention removed their offsets from remote storage.",
            registry=r,
        )
        self.copy_lag_seconds = prom.Gauge(
            "rsm_iceberg_follow_copy_lag_seconds",
            "The topic's KIP-1241 copy lag, time check: a rolled segment is uploaded once its newest "
            "record is this old (or the size check passes); 0: uploads not delayed; +Inf: check off; "
            "NaN: not known (no iceberg.kafka.bootstrap_servers, or the broker did not answer).",
            registry=r,
        )
        self.copy_lag_bytes = prom.Gauge(
            "rsm_iceberg_follow_copy_lag_bytes",
            "The topic's KIP-1241 copy lag, size check: bytes of newer log that must follow a rolled "
            "segment before it is uploaded (or the time check passes); 0, +Inf, NaN as above.",
            registry=r,
        )
        self.copy_lag_seconds.set(math.nan)
        self.copy_lag_bytes.set(math.nan)
        for outcome in (COMMITTED, NOTHING_NEW, CONFLICT, CATALOG_BUSY, FAILED):
            self.rounds.labels(outcome)
        for outcome in ("ok", "failed"):
            self.maintenance.labels(outcome)


class Follower(TopicRun):
    """Converts ``topic`` in rounds until :meth:`run`'s ``stop`` is set (module docstring)."""

    def __init__(
        self,
        cfg: Config,
        storage: StorageParams,
        topic: str,
        *,
        metrics: FollowMetrics | None = None,
        clock: Callable[[], float] = time.time,
        **options: Unpack[TopicOptions],
    ):
        super().__init__(cfg, storage, topic, **options)
        self._own_spark = self.spark is None
        self.metrics = metrics or FollowMetrics()
        self.clock = clock
        self.failures_in_a_row = 0
        self.rounds_done = 0
        self._last_maintenance = clock()
        self._copy_lag_said: set[str] = set()

    # ------------------------------------------------------------------ one round
    def _session(self):
        if self.spark is None:
            from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
            from rsm_sidecar.iceberg.session.spark import open_session

            self.spark = open_session(
                CatalogSpec(self.settings.catalog),
                self.settings.spark,
                f"rsm-iceberg-follow-{self.topic}",
                self.spark_conf,
            )
        return self.spark

    def _job(self) -> ConvertJob:
        spark = self._session()
        return ConvertJob(
            self.cfg, self.storage, self.topic, topic_id=self.topic_id, spark=spark, log=self._job_log
        )

    def _job_log(self, line: str) -> None:
        """The job's log, without its "nothing new" line (a quiet topic would log it at every
        round; ``rsm_iceberg_follow_rounds_total{outcome="nothing_new"}`` counts them)."""
        if "nothing new to convert" not in line:
            self.log(line)

    def round(self) -> str:
        """One run of the job; returns its outcome (``committed``, ``nothing_new``,
        ``conflict``, ``catalog_busy`` or ``failed``). A :class:`ConfigError` is raised: no round
        can succeed."""
        try:
            job = self._job()
            job.incremental_listing = self.rounds_done % FULL_LISTING_EVERY != 0
            prepared = job.prepare()
            if not prepared.tasks:
                self._record_lag(prepared, None)
                outcome = NOTHING_NEW
            else:
                result = job.execute(prepared)
                self._record_commit(prepared, result)
                outcome = COMMITTED
        except CommitConflict as exc:
            self.log(f"[follow] {self.topic}: another writer committed first ({exc}); planning again")
            outcome = CONFLICT
        except ConfigError:
            self.metrics.rounds.labels(FAILED).inc()
            self.metrics.failures.labels("ConfigError").inc()
            raise
        except Exception as exc:
            if _catalog_locked(exc):
                self.log(
                    f"[follow] {self.topic}: the catalog database was locked by another writer "
                    f"({type(exc).__name__}{_raised_at(exc)}); planning again next round"
                )
                outcome = CATALOG_BUSY
            else:  # a round that fails is retried; the markers make it safe
                self.metrics.failures.labels(type(exc).__name__).inc()
                self.log(f"[follow] {self.topic}: round failed: {type(exc).__name__}: {exc}{_raised_at(exc)}")
                self._reset_session()
                outcome = FAILED
        self.metrics.rounds.labels(outcome).inc()
        self.rounds_done += 1
        self.failures_in_a_row = self.failures_in_a_row + 1 if outcome == FAILED else 0
        return outcome

    def _record_commit(self, prepared: Prepared, result: ConvertResult) -> None:
        now = self.clock()
        self.metrics.records.inc(result.records)
        self.metrics.segments.inc(result.segments)
        self.metrics.last_commit.set(now)
        for plan in prepared.plans:
            for seg in plan.chain:
                if seg.copied_ms > 0:
                    self.metrics.freshness.observe(max(0.0, now - seg.copied_ms / 1000))
        self._record_lag(prepared, result)

    def _record_lag(self, prepared: Prepared, result: ConvertResult | None) -> None:
        now_ms = int(self.clock() * 1000)
        for plan in prepared.plans:
            upto = plan.new_next_offset if result is not None else plan.next_offset
            offsets, seconds = plan.lag(upto, now_ms)
            self.metrics.lag_offsets.labels(str(plan.partition)).set(offsets)
            self.metrics.lag_seconds.labels(str(plan.partition)).set(seconds)

    def _reset_session(self) -> None:
        """After a failure, a session the follower started is started afresh next round (a
        dead JVM would otherwise fail every later round)."""
        if self._own_spark and self.spark is not None:
            try:
                self.spark.stop()
            except Exception:  # stopping a broken session is best effort
                pass
            self.spark = None

    # ------------------------------------------------------------------ the loop
    def pause_after(self, outcome: str) -> float:
        """Seconds to wait before the next round."""
        interval = self.settings.follow.interval
        if outcome == CONFLICT:
            return 0.0
        if outcome == FAILED:
            return interval * min(2**self.failures_in_a_row, MAX_BACKOFF_INTERVALS)
        return interval

    def maintain_if_due(self) -> bool:
        every = self.settings.follow.maintain_interval
        if not every or self.clock() - self._last_maintenance < every:
            return False
        self._last_maintenance = self.clock()
        self.check_copy_lag()
        return self.maintain()

    def maintain(self) -> bool:
        """Expire snapshots, remove orphans and (``iceberg.follow.drop_deleted_offsets``) drop the
        rows Kafka no longer has; a failure is logged and counted, conversion goes on."""
        from rsm_sidecar.iceberg.maintenance import maintain

        try:
            result = maintain(
                self.cfg,
                self.storage,
                self.topic,
                expire=True,
                remove_orphans=True,
                # a current-state table's rounds each add a data file, and delete rows of the
                # older ones: compact them (with their delete files)
                compact=self.settings.mode == UPSERT,
                drop_deleted_offsets=self.settings.follow.drop_deleted_offsets,
                drop_when_none_left=False,
                spark=self._session(),
                log=self.log,
            )
        except Exception as exc:  # maintenance is retried at its next time; conversion goes on
            self.metrics.maintenance.labels("failed").inc()
            self.log(f"[follow] {self.topic}: maintenance failed: {type(exc).__name__}: {exc}")
            return False
        self.metrics.dropped.inc(sum(result.dropped.values()))
        self.metrics.maintenance.labels("ok").inc()
        return True

    def check_copy_lag(self):
        """Read the topic's copy lag from the broker (``iceberg.kafka.bootstrap_servers``), export
        it, and log what it means once per setting (and once per failure kind). Returns the
        :class:`~rsm_sidecar.iceberg.copy_lag.CopyLag`, or None."""
        if not self.settings.kafka.bootstrap_servers:
            return None
        from rsm_sidecar.iceberg.copy_lag import CopyLagUnavailable, client_config, read_copy_lag

        conf = client_config(self.settings.kafka.bootstrap_servers, self.settings.kafka.client)
        try:
            lag = read_copy_lag(self.topic, conf, self.settings.kafka.timeout)
        except CopyLagUnavailable as exc:  # the broker is optional to the follower: say so once, go on
            self.metrics.copy_lag_seconds.set(math.nan)
            self.metrics.copy_lag_bytes.set(math.nan)
            self._say_once(
                f"unavailable {exc.kind}",
                f"[follow] {self.topic}: cannot read the topic's copy lag from "
                f"{self.settings.kafka.bootstrap_servers}: {exc}",
            )
            return None
        delayed = lag.delays_uploads
        self.metrics.copy_lag_seconds.set(lag.ms / 1000 if delayed else 0.0)
        self.metrics.copy_lag_bytes.set(lag.bytes if delayed else 0.0)
        line = f"[follow] {'WARNING: ' if delayed else ''}{lag.describe()}"
        self._say_once(line, line)
        return lag

    def _say_once(self, key: str, line: str) -> None:
        """Log ``line`` unless something with the same ``key`` was logged before (a setting's
        description, or one kind of failure whatever its message says this time)."""
        if key not in self._copy_lag_said:
            self._copy_lag_said.add(key)
            self.log(line)

    def run(self, stop: threading.Event) -> None:
        """Rounds until ``stop`` is set (a round in progress finishes first)."""
        self.check_copy_lag()
        try:
            while not stop.is_set():
                outcome = self.round()
                if stop.is_set():
                    break
                self.maintain_if_due()
                stop.wait(self.pause_after(outcome))
        finally:
            if self._own_spark and self.spark is not None:
                self.spark.stop()
                self.spark = None


def _raised_at(exc: BaseException) -> str:
    """Where ``exc`` was raised: the innermost frame of its traceback and, when that is in a
    library, the innermost frame of this package that led there. A failed round is retried, so
    its one log line must say where it failed."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}"
    ours = [f for f in frames if f"{os.sep}rsm_sidecar{os.sep}" in f.filename]
    if ours and ours[-1] is not frames[-1]:
        where += f", called from {ours[-1].filename}:{ours[-1].lineno} in {ours[-1].name}"
    return f" (raised at {where})"


def _catalog_locked(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is SQLite's "database is locked"
    (``SQLITE_BUSY``): from Python's ``sqlite3`` under PyIceberg, or from Spark's JDBC catalog
    (sqlite-jdbc), whose message reaches Python in a Py4J error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if "database is locked" in text or "SQLITE_BUSY" in text:
            return True
        current = current.__cause__ or current.__context__
    return False
