"""``rsm-sidecar iceberg maintain``: snapshot expiry, compaction, orphan files, retention.

Each step is an Iceberg Spark procedure or a Spark SQL statement on the job's catalog:

* ``expire``: ``system.expire_snapshots(older_than, retain_last)``. Snapshots that a branch or tag
  references are kept, so the ``rsm-marker`` tag keeps the newest marker snapshot (and with it
  the converted offsets) whatever the age. Staged snapshots of runs that never published
  (killed between staging and publishing) are unreferenced and go too, with their data files.
* ``compact``: ``system.rewrite_data_files`` (to ``iceberg.target_file_size``, only where a
  partition has at least ``min_input_files`` files): the ``sort`` strategy when the table
  declares a sort order (``kafka.partition, kafka.offset``: the rewritten files keep the order
  the table declares, which bin-packing files of several Kafka partitions together would not),
  bin-packing otherwise. Rows are unchanged. On a current-state table it also rewrites the data
  files of which 30 % or more of the rows are deleted (Iceberg's ``delete-ratio-threshold``),
  leaving out the deleted rows, and removes the delete files of the data files it rewrote.
* ``compact_deletes``: ``system.rewrite_position_delete_files`` with ``rewrite-all``: every
  position-delete file rewritten, merged per data file, and those whose data files are gone
  (rewritten by a compaction that kept them: "dangling") dropped. Iceberg 1.12's
  Spark writer already keeps one delete file per data file (each ``MERGE`` replaces the one of
  a data file it deletes rows of), so this is for delete files other writers left. Rows are
  unchanged.
* ``remove_orphans``: Iceberg's ``DeleteOrphanFiles`` Spark action (what the
  ``remove_orphan_files`` procedure runs, without its 24 h minimum): files under the table
  location that no snapshot references, e.g. what a convert job killed during its Spark write
  left. Keep ``older_than`` longer than a convert run (default 1 day): a running job's files are
  orphans until it publishes.
* ``drop_deleted_offsets``: ``DELETE FROM t WHERE kafka.partition = p AND kafka.offset < e`` where
  ``e`` is the start offset of the earliest segment of partition ``p`` still in remote storage
  (Kafka retention removed everything below), or the converted end if none is left. With
  ``drop_when_none_left=False`` (the follow mode) a storage that holds no segment of the topic at
  all drops nothing: that is more likely a wrong configuration (bucket, prefix) than retention
  having deleted everything.

Every step that commits moves ``main``; a convert job publishing at the same time then fails its
conditional publish (nothing is lost, it commits nothing and is simply run again), so schedule
maintenance between conversions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from collections.abc import Callable

from rsm_sidecar.iceberg import current_state
from rsm_sidecar.iceberg.committing import markers as mk
from rsm_sidecar.iceberg.reading.segment_tasks import StorageParams, executor_context
from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
from rsm_sidecar.iceberg.settings import UPSERT, JobSettings
from rsm_sidecar.segment.listing import list_topic_segments


@dataclasses.dataclass
class MaintainResult:
    table: str
    expired: dict[str, int] = dataclasses.field(default_factory=dict)
    compacted: dict[str, int] = dataclasses.field(default_factory=dict)
    compacted_deletes: dict[str, int] = dataclasses.field(default_factory=dict)
    orphans: list[str] = dataclasses.field(default_factory=list)
    dropped: dict[int, int] = dataclasses.field(default_factory=dict)  # partition -> rows deleted


def _ts(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("TIMESTAMP '%Y-%m-%d %H:%M:%S.%f'")


def _call(spark, procedure: str) -> dict[str, int]:
    """Run an Iceberg ``CALL`` (``procedure``); the counts of its one-row result, by column."""
    row = spark.sql(procedure).collect()[0]
    return {k: int(v) for k, v in row.asDict().items() if isinstance(v, int)}


def maintain(
    cfg,
    storage: StorageParams,
    topic: str,
    *,
    expire: bool = False,
    expire_older_than: dt.timedelta = dt.timedelta(days=5),
    retain_last: int = 1,
    compact: bool = False,
    compact_deletes: bool = False,
    min_input_files: int = 2,
    remove_orphans: bool = False,
    orphan_older_than: dt.timedelta = dt.timedelta(days=1),
    drop_deleted_offsets: bool = False,
    drop_when_none_left: bool = True,
    spark=None,
    log: Callable[[str], None] | None = None,
) -> MaintainResult:
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    settings = JobSettings.from_config(cfg)
    spec = CatalogSpec(settings.catalog).prepare()
    ident = f"{settings.namespace}.{settings.table_name(topic)}"
    full = f"{spec.name}.{ident}"
    result = MaintainResult(ident)
    own = spark is None
    if own:
        from rsm_sidecar.iceberg.session.spark import open_session

        spark = open_session(spec, settings.spark, f"rsm-iceberg-maintain-{topic}")
    else:
        for k, v in spec.spark_conf().items():
            if k != "spark.sql.defaultCatalog":
                spark.conf.set(k, v)
    now = dt.datetime.now(dt.UTC)
    try:
        if drop_deleted_offsets:
            result.dropped = _drop_deleted(
                spark, spec, storage, topic, settings, full, log, drop_when_none_left
            )
        if compact:
            table = spec.pyiceberg().load_table((settings.namespace, settings.table_name(topic)))
            strategy = "binpack" if table.sort_order().is_unsorted else "sort"
            # a current-state table: the delete files of the rewritten data files go too
            dangling = (
                ", 'remove-dangling-deletes', 'true'"
                if current_state.table_mode(table.properties) == UPSERT
                else ""
            )
            result.compacted = _call(
                spark,
                f"CALL {spec.name}.system.rewrite_data_files(table => '{ident}', "
                f"strategy => '{strategy}', options => map("
                f"'min-input-files', '{min_input_files}', "
                f"'target-file-size-bytes', '{settings.target_file_size}'{dangling}))",
            )
            log(f"[maintain] {ident}: compaction ({strategy}) {result.compacted}")
        if compact_deletes:
            result.compacted_deletes = _call(
                spark,
                f"CALL {spec.name}.system.rewrite_position_delete_files(table => '{ident}', "
                "options => map('rewrite-all', 'true'))",
            )
            log(f"[maintain] {ident}: delete files {result.compacted_deletes}")
        if expire:
            result.expired = _call(
                spark,
                f"CALL {spec.name}.system.expire_snapshots(table => '{ident}', "
                f"older_than => {_ts(now - expire_older_than)}, retain_last => {retain_last})",
            )
            log(f"[maintain] {ident}: expiry {result.expired}")
        if remove_orphans:
            result.orphans = _remove_orphans(spark, spec, full, now - orphan_older_than)
            log(f"[maintain] {ident}: removed {len(result.orphans)} orphan file(s)")
    finally:
        if own:
            spark.stop()
    return result


def _remove_orphans(spark, spec: CatalogSpec, full: str, older_than: dt.datetime) -> list[str]:
    """Iceberg's ``DeleteOrphanFiles`` action (the ``remove_orphan_files`` procedure refuses
    intervals under 24 h; the action takes any, the caller chooses)."""
    jvm = spark._jvm
    jspark = spark._jsparkSession
    table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(jspark, full)
    action = (
        jvm.org.apache.iceberg.spark.actions.SparkActions.get(jspark)
        .deleteOrphanFiles(table)
        .olderThan(int(older_than.timestamp() * 1000))
    )
    if spec.uses_s3 or spec.uses_gcs:
        action = action.usePrefixListing(True)  # list with S3FileIO/GCSFileIO, no Hadoop connector
    result = action.execute()
    return [str(x) for x in result.orphanFileLocations()]


def _drop_deleted(
    spark,
    spec: CatalogSpec,
    storage: StorageParams,
    topic: str,
    settings: JobSettings,
    full: str,
    log,
    when_none_left: bool = True,
) -> dict[int, int]:
    catalog = spec.pyiceberg()
    table = catalog.load_table((settings.namespace, settings.table_name(topic)))
    state = mk.read_state(table)
    ctx = executor_context(storage)
    listing = list_topic_segments(ctx.store, ctx.layout, topic)
    partitions = (
        listing.get(state.topic_id or "", {})
        if state.topic_id
        else (next(iter(listing.values())) if len(listing) == 1 else {})
    )
    dropped: dict[int, int] = {}
    if not partitions and not when_none_left:
        log(
            f"[maintain] {full}: remote storage holds no segment of topic {topic} "
            f"(id {state.topic_id}): not dropping any row (if retention really deleted them all, "
            f"run `iceberg maintain --drop-deleted-offsets`)"
        )
        return dropped
    for p in sorted(set(state.next_offsets) | set(partitions)):
        segs = partitions.get(p, [])
        earliest = segs[0].start_offset if segs else state.next_offset(p)
        where = f"kafka.partition = {int(p)} AND kafka.offset < {int(earliest)}"
        n = spark.sql(f"SELECT count(*) AS n FROM {full} WHERE {where}").collect()[0].n
        if n:
            spark.sql(f"DELETE FROM {full} WHERE {where}")
            log(
                f"[maintain] {full}: partition {p}: deleted {n} row(s) below offset {earliest} "
                f"(no longer in Kafka)"
            )
        dropped[p] = int(n)
    return dropped
