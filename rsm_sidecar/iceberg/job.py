"""``rsm-sidecar iceberg convert``: tiered segments of a topic -> an Iceberg table, exactly once.

Flow of one run (docs/iceberg.md "The convert job"); each step names the package that does it:

1. Read the table's markers (:mod:`.committing.markers`): per partition the next offset to
   convert and the running maximum of ``ingest_timestamp``; remember ``main``.
2. Plan (:mod:`.planning`): list the topic's segments in object storage, choose per partition
   the chain of new segments and the offset range of each, settle the aborted transactions, and
   split segments larger than ``iceberg.task_bytes`` into several tasks at offset-index entries,
   each with the exact ``ingest_timestamp`` maximum before it from the time index. Nothing new ->
   done, the table is not touched.
3. Resolve the key/value schemas (:mod:`.decoding.sides`: registry, descriptor set or raw),
   create or evolve the table (:mod:`.mapping.evolution`).
4. One Spark stage (:mod:`.stages`) over a DataFrame with one row per segment task: each task
   reads its segment (:mod:`.reading`: fetched, verified, decrypted), decodes it into Arrow
   batches of the table schema (:mod:`.mapping.rows`) and, with ``iceberg.writer = arrow`` (the
   default), writes them as Parquet data files (:mod:`.committing.data_files`) and returns only
   the files' descriptions; with ``spark`` the rows go back to the JVM and
   ``writeTo(...).append()`` writes them under ``spark.wap.id``, so the snapshot is *staged*.
5. Commit: one conditional catalog commit, only if ``main`` is still what step 1 read: it adds
   the files as a snapshot carrying the markers (arrow; :func:`.committing.markers.commit_files`)
   or moves ``main`` to the staged snapshot (spark; :func:`.committing.markers.publish`), and
   moves the ``rsm-marker`` tag with it.

With ``iceberg.mode = upsert`` the table holds one row per key (:mod:`.current_state`): step 4
reduces the rows to the latest per key and merges them into the table (``MERGE INTO``), staged
like the ``spark`` writer's snapshot, and step 5 publishes it the same way.

A run killed anywhere leaves no partial commit: before step 5 only unreferenced data files
(``maintain --remove-orphans`` deletes them) or an unreferenced staged snapshot (expired by
``maintain --expire``) exist; the next run starts from the same markers.

Test hook: ``RSM_ICEBERG_PAUSE_AT=<point>[,<point>...]`` makes the job wait at named points until
``$RSM_ICEBERG_PAUSE_DIR/<point>.resume`` exists, after creating ``<point>.paused`` (so a test can
kill it there): ``planned`` (before the Spark write), ``write`` (an executor, at the start of
the last segment task), ``staged`` (every data file written - and, with the ``spark`` writer,
the staged snapshot committed - before the commit of step 5), ``published`` (after it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypedDict, Unpack

from rsm_sidecar.config import ENV_PREFIX, Config, read_toml
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg import current_state
from rsm_sidecar.iceberg.committing import markers as mk
from rsm_sidecar.iceberg.planning.chains import PartitionPlan, plan_partition
from rsm_sidecar.iceberg.planning.splitting import split_segments
from rsm_sidecar.iceberg.planning.tasks import SegmentTask
from rsm_sidecar.iceberg.reading.segment_tasks import (
    StorageParams,
    executor_context,
    read_task,
)
from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
from rsm_sidecar.iceberg.session.spark import open_session
from rsm_sidecar.iceberg.settings import APPEND, UPSERT, JobSettings
from rsm_sidecar.iceberg.stages import (
    FILES_DDL,
    ExecutorParams,
    convert_fn,
    counts_param,
    pause_point,
    task_error,
    with_static_archive_imports,
    write_files_fn,
)
from rsm_sidecar.segment.listing import StoredSegment, list_partition_segments, list_topic_segments


def load_config(
    path: str | os.PathLike | None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> tuple[Config, StorageParams]:
    """The sidecar configuration file (+ ``RSM__`` environment, + ``overrides`` by key path,
    which win over both) and the picklable storage parameters executors rebuild it from (the
    same values: an override of ``storage.*`` or ``encryption.*`` reaches them too)."""
    env = dict(os.environ if environ is None else environ)
    values: dict[str, Any] = read_toml(path) if path is not None else {}
    rsm_env = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}
    cfg = Config(values, environ=rsm_env, source=str(path or "<defaults>"))
    over = {k.replace("__", "."): v for k, v in (overrides or {}).items() if v is not None}
    if over:
        rsm_env = {k: v for k, v in rsm_env.items() if cfg.env_path(k) not in over}
        values = {**values, **over}
        cfg = cfg.with_overrides(**over)
    read = JobSettings.from_config(cfg).read
    params = StorageParams(values, rsm_env, read.chunk_cache_bytes, read.prefetch_bytes)
    return cfg, params


@dataclasses.dataclass
class PartitionResult:
    partition: int
    segments: int = 0
    records: int = 0
    first_offset: int | None = None
    next_offset: int = 0
    skipped: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    waiting: str | None = None


@dataclasses.dataclass
class ConvertResult:
    table: str
    job_id: str
    committed: bool = False
    snapshot_id: int | None = None
    partitions: list[PartitionResult] = dataclasses.field(default_factory=list)
    schema_changes: str = "no change"
    seconds: float = 0.0
    #: executor tasks of the run (segments, or pieces of segments larger than iceberg.task_bytes)
    tasks: int = 0
    #: ``iceberg.mode``
    mode: str = APPEND
    #: a current-state table's rows the run inserted, updated and deleted (upsert mode)
    merged: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    @property
    def segments(self) -> int:
        return sum(p.segments for p in self.partitions)


# ============================================================================ the job


@dataclasses.dataclass
class Prepared:
    """A run after planning: what the Spark write needs."""

    result: ConvertResult
    catalog: Any
    state: mk.MarkerState
    plans: list[PartitionPlan]
    tasks: list[SegmentTask]
    spec: Any = None  # EncoderSpec aligned to the table
    ddl: str = ""
    marker: dict[str, str] = dataclasses.field(default_factory=dict)
    t0: float = 0.0


def log_to_stderr(line: str) -> None:
    """Where a job logs unless told otherwise."""
    print(line, file=sys.stderr, flush=True)


class TopicOptions(TypedDict, total=False):
    """The keywords of :class:`TopicRun` (their defaults are there)."""

    topic_id: str | None
    spark: Any
    spark_conf: Mapping[str, str] | None
    log: Callable[[str], None] | None


class TopicRun:
    """What a job on one topic is given: the configuration (``settings``: its ``[iceberg]``
    part), the storage and the topic; ``topic_id`` when storage holds several topics of that
    name; the Spark session to use (None: one of its own) with extra ``spark_conf`` for it; where
    it logs (stderr). :class:`ConvertJob` is one run, :class:`~rsm_sidecar.iceberg.follow.Follower`
    runs one after another."""

    def __init__(
        self,
        cfg: Config,
        storage: StorageParams,
        topic: str,
        *,
        topic_id: str | None = None,
        spark: Any = None,
        spark_conf: Mapping[str, str] | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.cfg, self.storage, self.topic, self.topic_id = cfg, storage, topic, topic_id
        self.settings = JobSettings.from_config(cfg)
        self.spark = spark
        self.spark_conf = dict(spark_conf or {})
        self.log = log or log_to_stderr


class ConvertJob(TopicRun):
    """One run of the conversion of ``topic`` (see the module docstring)."""

    def __init__(self, cfg: Config, storage: StorageParams, topic: str, **options: Unpack[TopicOptions]):
        super().__init__(cfg, storage, topic, **options)
        self.catalog_spec = CatalogSpec(self.settings.catalog)
        self.identifier = (self.settings.namespace, self.settings.table_name(topic))
        self.job_id = f"rsm-{uuid.uuid4().hex}"
        #: plan from an incremental listing (:meth:`plan`); the follower sets it between full rounds
        self.incremental_listing = False

    # ------------------------------------------------------------------ helpers
    @property
    def table_name(self) -> str:
        return ".".join(self.identifier)

    def _reader(self):
        ctx = executor_context(self.storage)
        return ctx.reader, ctx.store, ctx.layout

    @property
    def segment_reader(self):
        """The reader of the topic's stored segments (the planning's, cached per process)."""
        return executor_context(self.storage).reader

    def _load_table(self, catalog):
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def _choose_topic_id(self, listing: dict, state: mk.MarkerState) -> str | None:
        ids = sorted(listing)
        if self.topic_id:
            return self.topic_id
        if state.topic_id:
            if state.topic_id in listing or not ids:
                return state.topic_id
            raise ConfigError(
                f"table {self.table_name} was converted from topic {self.topic} with topic id "
                f"{state.topic_id}, but remote storage only has topic id(s) {', '.join(ids)}: the "
                f"topic was deleted and re-created (offsets start again at 0); convert it into a new "
                f"table (iceberg.table / --table)"
            )
        if len(ids) > 1:
            raise ConfigError(
                f"remote storage has several topics named {self.topic} (topic ids "
                f"{', '.join(ids)}; a deleted topic's segments may still be there): "
                f"choose one with --topic-id"
            )
        return ids[0] if ids else None

    # ------------------------------------------------------------------ planning
    def _list_new(self, state: mk.MarkerState) -> tuple[str, dict[int, list[StoredSegment]]]:
        """The partitions the table knows, each listed from its next offset on (one LIST per
        partition, costing what is new, not what exists). A partition whose new segments do not
        start exactly at its next offset (a hole, retention ahead of the table, or a re-upload
        straddling it) is listed whole, so that the plan sees what it needs to decide."""
        _, store, layout = self._reader()
        topic_id = self.topic_id or state.topic_id
        assert topic_id is not None
        partitions = {}
        for p in sorted(state.next_offsets):
            nxt = state.next_offset(p)
            segs = list_partition_segments(store, layout, self.topic, topic_id, p, nxt)
            if segs and segs[0].start_offset != nxt:
                segs = list_partition_segments(store, layout, self.topic, topic_id, p)
            partitions[p] = segs
        return topic_id, partitions

    def plan(
        self,
        state: mk.MarkerState,
        wanted: Callable[[int], bool] = lambda partition: True,
        incremental: bool = False,
    ) -> tuple[str | None, list[PartitionPlan]]:
        """The topic id and one plan per partition (those ``wanted``) from the offsets and
        ``ingest_timestamp`` states of ``state``. ``incremental`` (the follow-mode rounds between
        full ones, :data:`~rsm_sidecar.iceberg.follow.FULL_LISTING_EVERY`): only the partitions
        the table knows, each listed from its next offset on (:meth:`_list_new`). Otherwise the
        topic's whole listing, which also finds new partitions and a re-upload straddling a
        next offset with nothing tiered after it yet."""
        reader, store, layout = self._reader()
        partitions: dict[int, list[StoredSegment]]
        topic_id: str | None
        if incremental and (self.topic_id or state.topic_id) and state.next_offsets:
            topic_id, partitions = self._list_new(state)
        else:
            listing = list_topic_segments(store, layout, self.topic)
            topic_id = self._choose_topic_id(listing, state)
            partitions = listing.get(topic_id, {}) if topic_id else {}
        plans = []
        remaining = self.settings.max_segments
        for p in sorted(filter(wanted, partitions)):
            if not partitions[p]:  # nothing new (an incremental listing)
                plans.append(PartitionPlan(p, state.next_offset(p), state.ingest_state(p)))
                continue
            plan = plan_partition(
                reader,
                partitions[p],
                state.next_offset(p),
                state.ingest_state(p),
                limit=remaining if self.settings.max_segments else 0,
            )
            for note in split_segments(reader, plan, self.settings.task_bytes):
                self.log(f"[convert] partition {p}: {note}")
            plans.append(plan)
            if self.settings.max_segments:
                remaining -= len(plan.chain)
                if remaining <= 0:
                    break
        return topic_id, plans

    def encoder_spec(self, plans: list[PartitionPlan], table_properties: Mapping[str, str]):
        """EncoderSpec for the key and the value (registry / descriptor set / raw).

        A Protobuf subject with several top-level messages keeps the message recorded in the
        table's ``rsm.<side>.message`` property; a new table takes it from the first new record
        framed with the pinned schema id (see :func:`~rsm_sidecar.iceberg.decoding.sides.resolve_side`)."""
        from rsm_sidecar.iceberg.decoding.proto_mapping import ProtoOptions
        from rsm_sidecar.iceberg.decoding.schema_registry import SchemaRegistry, SubjectSpec
        from rsm_sidecar.iceberg.decoding.sides import (
            SideSpec,
            descriptor_set_side,
            inferred_json_side,
            json_schema_property,
            json_schema_side,
            message_property,
            resolve_side,
        )
        from rsm_sidecar.iceberg.mapping.rows import EncoderSpec

        s = self.settings
        opts = ProtoOptions(uint32_as_long=s.proto.uint32_as_long, well_known_types=s.proto.well_known_types)
        registry_config = s.registry.client_config()
        registry = SchemaRegistry.shared(registry_config) if registry_config else None
        if registry is not None:
            # each run pins the subjects' latest versions as of now (the client caches them)
            registry.client.clear_latest_caches()
        specs = []
        for is_key, side in ((True, s.key), (False, s.value)):
            if side.raw:
                specs.append(SideSpec("raw", proto_options=opts))
            elif side.descriptor_set:
                assert side.message is not None  # the settings refuse a descriptor set without a message
                specs.append(descriptor_set_side(side.descriptor_set, side.message, opts))
            elif side.json_schema:
                specs.append(json_schema_side(side.json_schema))
            elif side.json_infer:
                recorded = table_properties.get(json_schema_property(is_key))
                specs.append(inferred_json_side(self._values(plans, is_key, side.json_infer), recorded))
            elif registry is not None:
                specs.append(
                    resolve_side(
                        registry,
                        self.topic,
                        is_key,
                        SubjectSpec(side.subject, side.message),
                        opts,
                        samples=self._samples(plans, is_key),
                        recorded=table_properties.get(message_property(is_key)),
                        unframed=side.unframed,
                    )
                )
            else:
                specs.append(SideSpec("raw", proto_options=opts))
        for name, spec in (("key", specs[0]), ("value", specs[1])):
            self.log(f"[convert] {self.topic}: {name}s: {spec.describe()}")
        return EncoderSpec(specs[0], specs[1])

    def _samples(self, plans: list[PartitionPlan], is_key: bool) -> Iterator[bytes]:
        """Keys/values of the new segments that start like a schema-registry preamble, read
        lazily (to pick a Protobuf message by the indexes a producer wrote)."""
        ctx = executor_context(self.storage)
        for plan in plans:
            for task in plan.tasks(0):
                for raw in read_task(ctx, task, max_records=1000, max_bytes=1 << 20):
                    for v in raw.column("key" if is_key else "value").to_pylist():
                        if v and v[0] == 0:
                            yield v

    def _values(self, plans: list[PartitionPlan], is_key: bool, per_partition: int) -> Iterator[bytes]:
        """The first ``per_partition`` non-null keys/values of each partition's new records (the
        sample an inferred JSON Schema is made from)."""
        ctx = executor_context(self.storage)
        for plan in plans:
            left = per_partition
            for task in plan.tasks(0):
                for raw in read_task(ctx, task, max_records=min(left, 10_000), max_bytes=1 << 20):
                    for v in raw.column("key" if is_key else "value").drop_null().to_pylist():
                        yield v
                        left -= 1
                        if left == 0:
                            break
                    if left == 0:
                        break
                if left == 0:
                    break

    # ------------------------------------------------------------------ Spark
    def _spark(self):
        if self.spark is not None:
            self._register_catalog(self.spark)
            return self.spark, False
        return open_session(
            self.catalog_spec, self.settings.spark, f"rsm-iceberg-{self.topic}", self.spark_conf
        ), True

    def _register_catalog(self, spark) -> None:
        """Configure the job's catalog on an existing session (catalogs load lazily by name)."""
        for k, v in self.catalog_spec.spark_conf().items():
            if k == "spark.sql.defaultCatalog":
                continue
            current = spark.conf.get(k, None)
            if (
                current is not None
                and current != v
                and k == f"spark.sql.catalog.{self.catalog_spec.name}.uri"
            ):
                raise ConfigError(
                    f"the Spark session already has a catalog {self.catalog_spec.name!r} "
                    f"with uri {current}; use another iceberg.catalog.name"
                )
            spark.conf.set(k, v)
        for k, v in self.spark_conf.items():
            spark.conf.set(k, v)

    # ------------------------------------------------------------------ run
    def run(self) -> ConvertResult:
        prepared = self.prepare()
        if not prepared.tasks:
            return prepared.result
        return self.execute(prepared)

    def prepare(self) -> Prepared:
        """Steps 1-3: markers, plan (split tasks included), schemas and table (no Spark yet)."""
        t0 = time.monotonic()
        result = ConvertResult(self.table_name, self.job_id, mode=self.settings.mode)
        catalog = self.catalog_spec.prepare().pyiceberg()
        table = self._load_table(catalog)
        if table is not None:
            current_state.check_mode(table.properties, self.settings.mode, self.table_name)
        state = mk.read_state(table)
        if state.topic is not None and state.topic != self.topic:
            raise ConfigError(f"table {self.table_name} holds topic {state.topic!r}, not {self.topic!r}")
        topic_id, plans = self.plan(state, incremental=self.incremental_listing)
        for plan in plans:
            result.partitions.append(
                PartitionResult(
                    plan.partition,
                    len(plan.chain),
                    0,
                    plan.ranges[0][0] if plan.ranges else None,
                    plan.new_next_offset,
                    plan.skipped,
                    plan.waiting,
                )
            )
            self._log_plan(plan)
        tasks: list[SegmentTask] = []
        for plan in plans:
            tasks.extend(plan.tasks(len(tasks)))
        result.tasks = len(tasks)
        prepared = Prepared(result, catalog, state, plans, tasks, t0=t0)
        if not tasks:
            self.log(f"[convert] {self.topic} -> {self.table_name}: nothing new to convert")
            result.seconds = time.monotonic() - t0
            return prepared

        from rsm_sidecar.iceberg.decoding.sides import json_schema_property, message_property
        from rsm_sidecar.iceberg.mapping.evolution import (
            describe,
            ensure_table,
            needs_sort_order,
            plan_update,
        )
        from rsm_sidecar.iceberg.mapping.rows import RowEncoder
        from rsm_sidecar.iceberg.types import schema_to_arrow, spark_ddl

        spec = self.encoder_spec(plans, table.properties if table is not None else {})
        target = RowEncoder(spec).schema
        upsert = self.settings.mode == UPSERT
        props = {"write.wap.enabled": "true", "rsm.topic": self.topic}
        if upsert:
            props[current_state.MODE_PROPERTY] = UPSERT
        for is_key, side in ((True, spec.key), (False, spec.val)):
            if side.kind == "protobuf" and side.message:
                props[message_property(is_key)] = side.message
            if side.json_inferred and side.json_schema:
                props[json_schema_property(is_key)] = side.json_schema
        if table is None:
            partition = None if self.settings.partitioning == "none" else self.settings.partitioning
            if upsert:  # one row per key, not a history: no time partitions (docs/iceberg.md)
                partition = None
            created = {**current_state.TABLE_PROPERTIES, **props} if upsert else props
            table = ensure_table(catalog, self.identifier, target, partition=partition, properties=created)
            result.schema_changes = "created"
        else:
            changes = plan_update(table.schema(), target)
            result.schema_changes = describe(changes)
            if (
                changes
                or any(table.properties.get(k) != v for k, v in props.items())
                or needs_sort_order(table)
            ):
                table = ensure_table(catalog, self.identifier, target, properties=props)
        if result.schema_changes != "no change":
            self.log(f"[convert] {self.table_name}: schema {result.schema_changes}")
        main = table.metadata.refs.get("main")
        if (main.snapshot_id if main else None) != state.main_snapshot_id:
            raise mk.CommitConflict(
                f"table {self.table_name}: main moved while the run planned; nothing "
                f"was committed - run the job again"
            )
        prepared.spec = spec.with_table(schema_to_arrow(table.schema()))
        prepared.ddl = spark_ddl(table.schema())
        segments = {p.partition: [s.segment_id for s in p.chain] for p in plans}
        next_offsets = dict(state.next_offsets)
        ingest = dict(state.ingest_ms)
        for p in plans:
            next_offsets[p.partition] = p.new_next_offset
            if p.chain:
                ingest[p.partition] = p.new_ingest_state
        prepared.marker = mk.marker_properties(
            topic=self.topic,
            topic_id=topic_id or "",
            job_id=self.job_id,
            next_offsets=next_offsets,
            ingest_ms=ingest,
            segments=segments,
            skipped={p.partition: p.skipped for p in plans},
        )
        return prepared

    def execute(self, prepared: Prepared) -> ConvertResult:
        """Steps 4-5: the Spark write (staged) and the conditional publish."""
        result = prepared.result
        pause_point("planned")
        if self.settings.mode == UPSERT:
            counts = self._merge(prepared)
            pause_point("staged")
            snap = mk.publish(prepared.catalog, self.identifier, self.job_id, prepared.state.main_snapshot_id)
        elif self.settings.writer == "arrow":
            counts, files = self._write_files(prepared)
            pause_point("staged")
            snap = mk.commit_files(
                prepared.catalog,
                self.identifier,
                prepared.state.main_snapshot_id,
                files,
                prepared.marker,
            )
        else:
            counts = self._write(prepared)
            pause_point("staged")
            snap = mk.publish(prepared.catalog, self.identifier, self.job_id, prepared.state.main_snapshot_id)
        pause_point("published")
        result.committed = True
        result.snapshot_id = snap.snapshot_id
        for pr in result.partitions:
            pr.records = counts.get(pr.partition, [0, 0])[1]
        result.seconds = time.monotonic() - prepared.t0
        for pr in result.partitions:
            if pr.segments:
                self.log(
                    f"[convert] partition {pr.partition}: {pr.segments} segment(s), {pr.records} "
                    f"records, offsets {pr.first_offset}..{pr.next_offset - 1}"
                )
        merged = ""
        if self.settings.mode == UPSERT:
            result.merged = current_state.merge_counts(mk.summary_properties(snap))
            merged = " ({inserted} key(s) inserted, {updated} updated, {deleted} deleted)".format(
                **result.merged
            )
        self.log(
            f"[convert] {self.topic} -> {self.table_name}: committed snapshot {snap.snapshot_id}: "
            f"{result.segments} segment(s), {result.records} records{merged} in {result.seconds:.1f}s"
        )
        return result

    def _log_plan(self, plan: PartitionPlan) -> None:
        for lo, hi in plan.skipped:
            self.log(
                f"[convert] partition {plan.partition}: offsets {lo}..{hi} were deleted from "
                f"remote storage before they were converted; skipped"
            )
        if plan.chain:
            self.log(
                f"[convert] partition {plan.partition}: {len(plan.chain)} segment(s) to convert, "
                f"offsets {plan.ranges[0][0]}..{plan.ranges[-1][1]}"
                + (
                    f", {len(plan.chain) + sum(map(len, plan.splits.values()))} tasks "
                    f"({len(plan.splits)} segment(s) split)"
                    if plan.splits
                    else ""
                )
            )
        if plan.waiting:
            self.log(
                f"[convert] partition {plan.partition}: stops at offset"
                f" {plan.new_next_offset}: {plan.waiting}"
            )

    def _executor_params(self, prepared: Prepared, files: Any = None) -> ExecutorParams:
        return ExecutorParams(
            self.storage,
            prepared.spec,
            self.settings.batch_records,
            self.settings.batch_bytes,
            prepared.tasks[-1].index,
            files,
        )

    @staticmethod
    def _task_frame(spark, prepared: Prepared):
        """A DataFrame of the prepared segment tasks, one per Spark partition."""
        rows = [(t.index, t.partition, t.to_json()) for t in prepared.tasks]
        # the Python workers that turn these rows into a DataFrame get static archives too
        rdd = spark.sparkContext.parallelize(rows, len(rows)).mapPartitions(with_static_archive_imports)
        return spark.createDataFrame(rdd, "idx INT, partition INT, task STRING")

    @contextlib.contextmanager
    def _stage(self, spark, prepared: Prepared) -> Iterator[None]:
        """Run a Spark stage over the tasks: progress in the log, and an executor's error
        raised again on the driver with its own class where it is ours."""
        stop = threading.Event()
        progress = threading.Thread(
            target=self._progress, args=(spark, len(prepared.tasks), stop), daemon=True
        )
        progress.start()
        try:
            yield
        except Exception as exc:
            err = task_error(exc)
            if err is not None:
                raise err from None
            raise
        finally:
            stop.set()
            progress.join(5)

    def dataframe(self, spark, prepared: Prepared, accumulator=None):
        """The rows of the table for the prepared tasks: a DataFrame of segment tasks (one per
        Spark partition) through ``mapInArrow``."""
        params = self._executor_params(prepared)
        return self._task_frame(spark, prepared).mapInArrow(convert_fn(params, accumulator), prepared.ddl)

    def _write_files(self, prepared: Prepared) -> tuple[dict[int, list[int]], list]:
        """``iceberg.writer = arrow``: the executors write the data files; returns the per
        partition ``[segments, records]`` and the files' ``DataFile``s (nothing committed)."""
        import pickle

        from rsm_sidecar.iceberg.committing.data_files import FileTarget

        spark, own = self._spark()
        try:
            table = prepared.catalog.load_table(self.identifier)
            target = FileTarget.for_table(
                table, target_file_size=self.settings.target_file_size, write_id=self.job_id
            )
            df = self._task_frame(spark, prepared).mapInArrow(
                write_files_fn(self._executor_params(prepared, target)), FILES_DDL
            )
            with self._stage(spark, prepared):
                results = df.collect()
            counts: dict[int, list[int]] = {}
            files: list[Any] = []
            for r in results:
                c = counts.setdefault(r["partition"], [0, 0])
                c[0] += 1
                c[1] += r["records"]
                files.extend(pickle.loads(w).data_file for w in r["files"])
            return counts, files
        finally:
            if own:
                spark.stop()

    def _write(self, prepared: Prepared) -> dict[int, list[int]]:
        spark, own = self._spark()
        try:
            acc = spark.sparkContext.accumulator({}, counts_param())
            writer = self.dataframe(spark, prepared, acc).writeTo(
                f"{self.catalog_spec.name}.{self.table_name}"
            )
            for k, v in prepared.marker.items():
                writer = writer.option(f"snapshot-property.{k}", v)
            writer = (
                writer.option("distribution-mode", "none")
                # the rows are in the table's sort order already (a task's rows are one Kafka
                # partition in offset order): no local sort per task
                .option("use-table-distribution-and-ordering", "false")
                .option("fanout-enabled", "true")
                .option("target-file-size-bytes", str(self.settings.target_file_size))
            )
            spark.conf.set("spark.wap.id", self.job_id)
            try:
                with self._stage(spark, prepared):
                    writer.append()
            finally:
                spark.conf.unset("spark.wap.id")
            return dict(acc.value)
        finally:
            if own:
                spark.stop()

    def _merge(self, prepared: Prepared) -> dict[int, list[int]]:
        """``iceberg.mode = upsert``: the round's rows reduced to one per key and merged into the
        table, staged under the job's id with the markers (:func:`.current_state.merge`);
        returns the per partition ``[segments, records]`` read (nothing published)."""
        spark, own = self._spark()
        try:
            acc = spark.sparkContext.accumulator({}, counts_param())
            rows = self.dataframe(spark, prepared, acc)
            with self._stage(spark, prepared):
                current_state.merge(
                    spark,
                    rows,
                    f"{self.catalog_spec.name}.{self.table_name}",
                    self.job_id,
                    prepared.marker,
                )
            return dict(acc.value)
        finally:
            if own:
                spark.stop()

    def _progress(self, spark, total: int, stop: threading.Event) -> None:
        tracker = spark.sparkContext.statusTracker()
        last = None
        while not stop.wait(2.0):
            try:
                done = 0
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is not None and info.numTasks == total:
                        done = info.numCompletedTasks
                if done != last:
                    self.log(f"[convert] {self.table_name}: {done}/{total} task(s) done")
                    last = done
            except Exception:  # progress is best effort (session stopping)
                return


def convert(
    config: str | os.PathLike | None,
    topic: str,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    topic_id: str | None = None,
    spark=None,
    spark_conf: Mapping[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> ConvertResult:
    """Python API: convert what is new of ``topic`` (see :class:`ConvertJob`).

    ``config``: the sidecar's configuration file; ``environ``: its ``RSM__`` overrides (default:
    this process's environment); ``overrides``: configuration values by key path (e.g.
    ``{"iceberg.registry.url": ...}``); ``spark``: an existing SparkSession to use (otherwise the
    job starts one with ``iceberg.spark.master`` and stops it).
    """
    cfg, storage = load_config(config, environ, overrides)
    return ConvertJob(
        cfg, storage, topic, topic_id=topic_id, spark=spark, spark_conf=spark_conf, log=log
    ).run()
