"""A topic's tiered segments as a Spark data source (Spark 4's Python Data Source API).

``spark.read.format("rsm-tiered")`` and ``spark.readStream.format("rsm-tiered")`` return the
rows a conversion would write (the table layout of :mod:`~rsm_sidecar.iceberg.mapping.table_schema`:
committed records only, the key and value decoded as ``iceberg convert`` decodes them), read
straight from object storage with the sidecar's configuration::

    from rsm_sidecar.iceberg.source import read_topic
    df = read_topic(spark, "orders", config="sidecar.toml")   # registers the format
    df.where("kafka.partition = 1 AND kafka.offset >= 1000").show()

Batch reads plan like a conversion of the whole topic, then keep only the tasks the filters on
``kafka.partition``, ``kafka.offset`` and ``kafka.ingest_timestamp`` can match, narrowed to the
chunks that can (:mod:`~rsm_sidecar.iceberg.planning.pruning`), when the DataFrame comes from
:func:`read_topic` (why: :meth:`TieredBatchReader.pushFilters`). Spark still evaluates every
filter on the rows. Streaming reads carry, per partition, the next offset and the running
``ingest_timestamp`` maximum as the stream's offset, so a batch read again after a restart gives
the same rows; with an Iceberg ``writeStream`` (which skips a batch id it has committed) each
offset lands once. The options are in :class:`SourceOptions` and in docs/iceberg.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)

from rsm_sidecar.errors import ConfigError, DataLoss
from rsm_sidecar.iceberg.committing.markers import MarkerState
from rsm_sidecar.iceberg.planning.pruning import HIGHEST, LOWEST, PruneStats, ReadBounds, prune_tasks
from rsm_sidecar.iceberg.planning.tasks import SegmentTask
from rsm_sidecar.iceberg.stages import ExecutorParams, encoded_batches, static_archive_imports

if TYPE_CHECKING:
    from rsm_sidecar.iceberg.job import ConvertJob
    from rsm_sidecar.iceberg.planning.chains import PartitionPlan

FORMAT = "rsm-tiered"
#: segments read to choose a Protobuf message when the subject has several (as a new table does)
SAMPLE_SEGMENTS = 4
#: the options that are not configuration keys
OPTIONS = ("config", "topic", "topicid", "startingoffsets", "maxsegmentspertrigger")


def register(spark) -> None:
    """Register the ``rsm-tiered`` format on ``spark`` and turn on Python filter pushdown (Spark
    refuses a reader that implements it while it is off)."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(TieredTopicSource)


#: the filter :func:`read_topic` adds: true for every row, it makes Spark push the filters of
#: every query on the DataFrame to the source again (see :meth:`TieredBatchReader.pushFilters`)
GUARD = "kafka IS NOT NULL"


def read_topic(spark, topic: str, config: str | os.PathLike | None = None, **options: str):
    """A DataFrame of ``topic``'s tiered rows whose queries skip the segments and chunks their
    filters on ``kafka.partition``, ``kafka.offset`` and ``kafka.ingest_timestamp`` exclude
    (``options``: those of :class:`SourceOptions`). Use it, or :func:`create_view`, rather than
    a bare ``load()`` when filters should prune: see :meth:`TieredBatchReader.pushFilters`."""
    register(spark)
    reader = spark.read.format(FORMAT).option("topic", topic)
    if config is not None:
        reader = reader.option("config", str(config))
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load().where(GUARD)


def create_view(
    spark, name: str, topic: str, config: str | os.PathLike | None = None, **options: str
) -> None:
    """A temporary view ``name`` of :func:`read_topic` (for Spark SQL)."""
    read_topic(spark, topic, config, **options).createOrReplaceTempView(name)


def _log(line: str) -> None:
    print(f"[{FORMAT}] {line}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """The data source's options (names are case-insensitive, as in Spark):

    * ``config``: the sidecar's configuration file (storage, encryption keys, ``iceberg.*``
      decoding settings); ``RSM__`` environment variables apply as for the sidecar;
    * ``topic`` (required); ``topicId`` when storage holds several topics of that name;
    * any configuration key with a dot (``iceberg.registry.url``, ``storage.local.root``...)
      overrides the file's value;
    * streaming: ``startingOffsets`` ``earliest`` (default: everything tiered) or ``latest``
      (what is tiered from now on); ``maxSegmentsPerTrigger`` (default 0: no limit) caps the
      segments of one micro-batch, partitions in order; the first micro-batch of each run of the
      query is not capped (Spark asks for the latest offset before it says where the query
      starts or resumes).
    """

    topic: str
    config: str | None = None
    topic_id: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    starting: str = "earliest"
    max_segments: int = 0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}
        topic = opts.get("topic")
        if not topic:
            raise ConfigError(f'{FORMAT}: the option "topic" is required')
        starting = opts.get("startingoffsets", "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise ConfigError(f'{FORMAT}: startingOffsets must be "earliest" or "latest", not {starting!r}')
        try:
            max_segments = int(opts.get("maxsegmentspertrigger", "0"))
        except ValueError:
            max_segments = -1
        if max_segments < 0:
            raise ConfigError(
                f"{FORMAT}: maxSegmentsPerTrigger must be a whole number >= 0 (0: no limit), "
                f"not {opts.get('maxsegmentspertrigger')!r}"
            )
        unknown = sorted(k for k in opts if k not in OPTIONS and "." not in k and k != "path")
        if unknown:
            raise ConfigError(
                f"{FORMAT}: unknown option(s) {', '.join(unknown)}; the options are config, topic, "
                f"topicId, startingOffsets, maxSegmentsPerTrigger and configuration keys "
                f"(iceberg.registry.url, ...)"
            )
        overrides = tuple(sorted((k, v) for k, v in opts.items() if "." in k))
        return cls(topic, opts.get("config"), opts.get("topicid"), overrides, starting, max_segments)

    def job(self, max_segments: int = 0) -> ConvertJob:
        """The conversion planner for the topic (no table, no Spark: it only plans and decodes)."""
        from rsm_sidecar.iceberg.job import ConvertJob, load_config

        cfg, storage = load_config(self.config, overrides=dict(self.overrides))
        job = ConvertJob(cfg, storage, self.topic, topic_id=self.topic_id, log=_log)
        job.settings = dataclasses.replace(job.settings, max_segments=max_segments)
        return job


# ---------------------------------------------------------------------------- filters
def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_ms(value: Any, rounding: str) -> int | None:
    """A filter's timestamp as epoch milliseconds, widened (``floor`` for lower bounds)."""
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    us = (value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    return us // 1000 if rounding == "floor" else -(-us // 1000)


def read_bounds(filters: Iterable[Any]) -> ReadBounds:
    """What the pushed filters (an AND) say about partition, offset and ingest time. Only
    bounds that can be made inclusive and no narrower than the filter are taken."""
    partitions: frozenset[int] | None = None
    lo, hi, t_lo, t_hi = 0, HIGHEST, LOWEST, HIGHEST
    for f in filters:
        path = getattr(f, "attribute", None)
        value: Any = getattr(f, "value", None)
        if path == ("kafka", "partition"):
            values = [value] if isinstance(f, EqualTo) else list(value) if isinstance(f, In) else []
            if not values or any(_as_int(v) is None for v in values):
                continue
            partitions = frozenset(values) if partitions is None else partitions & frozenset(values)
        elif path == ("kafka", "offset"):
            n = _as_int(value)
            if n is None:
                continue
            if isinstance(f, (EqualTo, GreaterThanOrEqual, GreaterThan)):
                lo = max(lo, n + 1 if isinstance(f, GreaterThan) else n)
            if isinstance(f, (EqualTo, LessThanOrEqual, LessThan)):
                hi = min(hi, n - 1 if isinstance(f, LessThan) else n)
        elif path == ("kafka", "ingest_timestamp"):
            low, high = _as_ms(value, "floor"), _as_ms(value, "ceil")
            if low is not None and isinstance(f, (EqualTo, GreaterThanOrEqual, GreaterThan)):
                t_lo = max(t_lo, low)
            if high is not None and isinstance(f, (EqualTo, LessThanOrEqual, LessThan)):
                t_hi = min(t_hi, high)
    return ReadBounds(partitions, lo, hi, t_lo, t_hi)


# ---------------------------------------------------------------------------- reading
def read_partition(params: ExecutorParams, partition: InputPartition | None) -> Iterator[Any]:
    """Executors: one input partition (a segment task) as Arrow batches of the rows (Spark
    reads the partition None once when a read has no partition: no rows)."""
    if partition is None:
        return
    static_archive_imports()
    task = SegmentTask.from_json(partition.value)
    try:
        yield from encoded_batches(params, task)
    except Exception as exc:
        from rsm_sidecar.iceberg.reading.segment_tasks import SegmentFailed, describe_error

        raise SegmentFailed(describe_error(task, exc)) from exc


def _executor_params(job: ConvertJob, spec: Any) -> ExecutorParams:
    return ExecutorParams(job.storage, spec, job.settings.batch_records, job.settings.batch_bytes, -1)


def _state(offsets: Mapping[str, Any]) -> MarkerState:
    return MarkerState(
        next_offsets={int(p): int(v["next"]) for p, v in offsets.items()},
        ingest_ms={int(p): int(v["ingest"]) for p, v in offsets.items()},
    )


def _offsets(base: Mapping[str, Any], plans: list[PartitionPlan]) -> dict[str, Any]:
    out = {p: dict(v) for p, v in base.items()}
    for plan in plans:
        out[str(plan.partition)] = {"next": plan.new_next_offset, "ingest": plan.new_ingest_state}
    return out


def _pruned(job: ConvertJob, plans: list[PartitionPlan], bounds: ReadBounds) -> list[SegmentTask]:
    reader = job.segment_reader
    tasks: list[SegmentTask] = []
    stats = PruneStats()
    for plan in plans:
        for lo, hi in plan.skipped:
            _log(f"partition {plan.partition}: offsets {lo}..{hi} are no longer in remote storage")
        kept, st = prune_tasks(reader, plan, bounds, len(tasks))
        tasks.extend(kept)
        stats.add(st)
    for note in stats.not_exact:
        _log(note)
    _log(
        f"{job.topic}: {stats.tasks_kept} of {stats.tasks_planned} task(s) read "
        f"({stats.segments_kept} segment(s); {stats.starts_moved} start and {stats.ends_moved} "
        f"end(s) moved inside a segment, {stats.index_reads} segment index read(s))"
    )
    return tasks


class TieredTopicSource(DataSource):
    """``rsm-tiered``: batch and streaming reads of a topic's tiered segments (module docstring)."""

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        self.opts = SourceOptions.parse(options)
        self._spec: Any = None  # the key and value decoding, resolved once (pickled with self)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _encoder_spec(self) -> Any:
        if self._spec is None:
            job = self.opts.job(max_segments=SAMPLE_SEGMENTS)
            _, plans = job.plan(MarkerState())
            self._spec = job.encoder_spec(plans, {})
        return self._spec

    def schema(self) -> str:
        from rsm_sidecar.iceberg.mapping.rows import RowEncoder
        from rsm_sidecar.iceberg.types import spark_ddl

        return spark_ddl(RowEncoder(self._encoder_spec()).schema)

    def reader(self, schema) -> DataSourceReader:
        return TieredBatchReader(self.opts, self._encoder_spec())

    def streamReader(self, schema) -> DataSourceStreamReader:
        return TieredStreamReader(self.opts, self._encoder_spec())


class TieredBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, spec: Any):
        self.opts = opts
        self.bounds = ReadBounds()
        self.params = _executor_params(opts.job(), spec)  # pickled with read() before partitions()

    def pushFilters(self, filters):
        """Every filter stays for Spark to evaluate; those on partition, offset and ingest
        time also prune what is read - only when :data:`GUARD` is among them.

        Spark 4.1 to 4.3 keep the partitions a filter pushdown planned on the relation, and a
        later query on the same DataFrame that has no filter Spark can hand to Python reuses
        them: pruned by the earlier query's filters, it would silently miss rows (``df.where(
        "kafka.partition = 1").count()`` then ``df.count()``). :func:`read_topic` adds
        :data:`GUARD` to its DataFrame, so every query on it pushes filters and plans afresh; a
        bare ``load()`` is read whole, whatever the filters.
        """
        filters = list(filters)
        if any(isinstance(f, IsNotNull) and f.attribute == ("kafka",) for f in filters):
            self.bounds = read_bounds(filters)
        return filters

    def partitions(self):
        job = self.opts.job()
        if self.bounds.empty:
            return []
        _, plans = job.plan(MarkerState(), self.bounds.wants_partition)
        return [InputPartition(t.to_json()) for t in _pruned(job, plans, self.bounds)]

    def read(self, partition):
        yield from read_partition(self.params, partition)


class TieredStreamReader(DataSourceStreamReader):
    """Offsets: ``{"<partition>": {"next": <next offset>, "ingest": <running maximum, ms>}}``."""

    def __init__(self, opts: SourceOptions, spec: Any):
        self.opts = opts
        self.params = _executor_params(opts.job(), spec)
        #: the end of the last batch Spark planned or committed (None: not known yet)
        self._frontier: dict[str, Any] | None = None

    def initialOffset(self) -> dict:
        """Where a new query starts (Spark asks only when the checkpoint has no offsets)."""
        if self.opts.starting == "earliest":
            return {}
        _, plans = self.opts.job().plan(MarkerState())
        return _offsets({}, plans)

    def latestOffset(self) -> dict:
        # Spark asks for the latest offset before it says where a query starts or resumes (the
        # initial offset, or the checkpoint's): the first batch of a run is not capped
        known = self._frontier is not None
        base: dict[str, Any] = self._frontier if self._frontier is not None else {}
        _, plans = self.opts.job(self.opts.max_segments if known else 0).plan(_state(base))
        return _offsets(base, plans)

    def _advance(self, end: Mapping[str, Any]) -> None:
        frontier = dict(self._frontier or {})
        for p, v in end.items():
            if p not in frontier or int(v["next"]) > int(frontier[p]["next"]):
                frontier[p] = dict(v)
        self._frontier = frontier

    def partitions(self, start: dict, end: dict):
        self._advance(end)
        wanted = {int(p) for p, v in end.items() if int(v["next"]) > int(start.get(p, {"next": 0})["next"])}
        if not wanted:
            return []
        job = self.opts.job()
        _, plans = job.plan(
            _state({p: start.get(p, {"next": 0, "ingest": -1}) for p in end}), wanted.__contains__
        )
        tasks: list[SegmentTask] = []
        for plan in plans:
            last = int(end[str(plan.partition)]["next"]) - 1
            reached = plan.new_next_offset - 1
            if reached < last:
                raise DataLoss(
                    f"{self.opts.topic}-{plan.partition}: this micro-batch covers offsets up to "
                    f"{last}, but remote storage now holds them only up to {reached}"
                    + (f" ({plan.waiting})" if plan.waiting else "")
                )
            kept, _ = prune_tasks(job.segment_reader, plan, ReadBounds(offset_max=last), len(tasks))
            tasks.extend(kept)
        return [InputPartition(t.to_json()) for t in tasks]

    def read(self, partition):
        yield from read_partition(self.params, partition)

    def commit(self, end: dict) -> None:
        self._advance(end)
