"""Current-state tables (``iceberg.mode = upsert``): one row per key, kept with Iceberg's
row-level ``MERGE INTO`` through Spark (docs/iceberg.md "Current-state tables").

A round reads and decodes the new segments exactly as an append round does (the same tasks,
decoders, row schema and schema evolution: :class:`~rsm_sidecar.iceberg.job.ConvertJob`);
instead of appending the rows it reduces them to one per key and merges them into the table:

* **The key** is the record's key bytes (``key.__raw__``), as Kafka's log compaction compares
  keys: whatever decodes them, equal bytes are one key. A record without a key (null) has no row.
* **The winner** of a key is its latest committed record in the order :data:`ORDER`:
  ``kafka.ingest_timestamp``, then ``kafka.partition``, then ``kafka.offset``. Along a Kafka
  partition ``ingest_timestamp`` never decreases (the job makes it monotonic), so within a
  partition this is offset order: the record with the highest offset wins. Only a key that a
  producer wrote to several partitions is ordered across partitions, by the time the broker
  received it (``ingest_timestamp``; a tie goes to the higher partition). Aborted transactional
  records never reach the rows (the reading drops them), so they never win.
* **A tombstone** (null value: ``val`` is null) deletes the key's row.
* **The merge** (:func:`merge_statement`) replaces or deletes a row only by a record later in
  :data:`ORDER` than the row's own, and inserts only values. Within a round, the records of a
  key are reduced to the latest first (:func:`latest_per_key`; ``MERGE`` refuses two source rows
  for one target row).

Exactly once comes from the same markers as for append tables
(:mod:`~rsm_sidecar.iceberg.committing.markers`): the ``MERGE`` runs under ``spark.wap.id``, so
Spark *stages* its snapshot, which carries the markers (``spark.sql.iceberg.snapshot-property.*``),
and the one conditional catalog commit (:func:`~rsm_sidecar.iceberg.committing.markers.publish`)
moves ``main`` to it only if ``main`` is still what the round read. A run killed before that
commit leaves an unreferenced staged snapshot (``maintain --expire`` removes it with its files);
offsets are converted once, and the merge would leave the table unchanged if the same records
came again (nothing is later than itself).

The limit of the cross-partition rule: a tombstone's deletion cannot stop a record that is
*earlier* in :data:`ORDER` but converted in a *later* round (its partition's segment tiered
later) from inserting the key again, because nothing remembers deleted keys. Keys that live in
one partition (what Kafka's default partitioner does) never meet it.

New tables are Iceberg format version 2 with :data:`TABLE_PROPERTIES`: merge-on-read, the
``MERGE`` writes position-delete files for the rows it replaces or deletes. PyIceberg 0.12
reads them; format version 3 (deletion vectors) is not used because PyIceberg 0.12 cannot write
v3 metadata, which the conditional commit needs (docs/iceberg.md has the figures of both merge
modes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg.settings import APPEND, UPSERT

#: the order that decides a key's row: the latest record wins (module docstring)
ORDER = ("kafka.ingest_timestamp", "kafka.partition", "kafka.offset")
#: the column holding a record's key identity
KEY = "key.__raw__"
#: the table property naming what a table holds (absent: an append table, as before it existed)
MODE_PROPERTY = "rsm.mode"
#: properties of a new current-state table; an operator may change the merge modes later
#: (``ALTER TABLE ... SET TBLPROPERTIES``), the job never sets them again
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}
#: the snapshot summary's counts of a ``MERGE`` (Iceberg's Spark metrics) -> our names
MERGE_METRICS = {
    "spark.merge-into.num-target-rows-inserted": "inserted",
    "spark.merge-into.num-target-rows-updated": "updated",
    "spark.merge-into.num-target-rows-deleted": "deleted",
}
SNAPSHOT_PROPERTY = "spark.sql.iceberg.snapshot-property."
WAP_ID = "spark.wap.id"


def table_mode(properties: Mapping[str, str]) -> str:
    """What a table holds, from its properties (:data:`MODE_PROPERTY`)."""
    return properties.get(MODE_PROPERTY, APPEND)


def check_mode(properties: Mapping[str, str], mode: str, table: str) -> None:
    """Refuse to convert into a table that holds the other kind of rows."""
    found = table_mode(properties)
    if found == mode:
        return
    what = {APPEND: "an append table (every record)", UPSERT: "a current-state table (one row per key)"}
    raise ConfigError(
        f"table {table} is {what[found]}, and this run has iceberg.mode = {mode!r}: each mode "
        f"needs a table of its own; name another with iceberg.table (--table), or leave it unset "
        f"for the mode's default name"
    )


def _order(alias: str) -> str:
    return "struct(" + ", ".join(f"{alias}.{c}" for c in ORDER) + ")"


def merge_statement(target: str, source: str) -> str:
    """The ``MERGE INTO`` of a round: ``source`` holds at most one row per key (the latest of
    the round), ``target`` is the table (module docstring)."""
    later = f"{_order('s')} > {_order('t')}"
    return (
        f"MERGE INTO {target} t USING {source} s ON t.{KEY} = s.{KEY}\n"
        f"WHEN MATCHED AND s.val IS NULL AND {later} THEN DELETE\n"
        f"WHEN MATCHED AND {later} THEN UPDATE SET *\n"
        f"WHEN NOT MATCHED AND s.val IS NOT NULL THEN INSERT *"
    )


def latest_per_key(rows) -> Any:
    """A round's rows (a DataFrame of the table's schema) reduced to the latest per key
    (:data:`ORDER`), rows without a key left out. ``max_by`` aggregates in two steps (each task
    its own rows first), so a key repeated within a task costs no shuffle."""
    from pyspark.sql import functions as F

    columns = rows.columns
    latest = F.max_by(F.struct(*[F.col(c) for c in columns]), F.struct(*[F.col(c) for c in ORDER]))
    return (
        rows.where(F.col(KEY).isNotNull())
        .groupBy(F.col(KEY).alias("__key"))
        .agg(latest.alias("__row"))
        .select(*[F.col(f"__row.{c}").alias(c) for c in columns])
    )


def merge(spark, rows, target: str, job_id: str, snapshot_properties: Mapping[str, str]) -> None:
    """Reduce ``rows`` to the latest per key and merge them into ``target`` as a snapshot that
    Spark stages under ``job_id`` (write-audit-publish) with ``snapshot_properties`` in its
    summary; nothing is published (:func:`~rsm_sidecar.iceberg.committing.markers.publish`).

    The reduced rows are kept (memory, then disk) for the statement: a copy-on-write ``MERGE``
    reads its source twice (to find the files to rewrite, then to write them), and would
    otherwise read and decode the segments twice."""
    from pyspark import StorageLevel

    source = latest_per_key(rows).persist(StorageLevel.MEMORY_AND_DISK)
    view = f"rsm_round_{job_id.replace('-', '_')}"
    source.createOrReplaceTempView(view)
    confs = {f"{SNAPSHOT_PROPERTY}{k}": v for k, v in snapshot_properties.items()}
    confs[WAP_ID] = job_id
    try:
        for k, v in confs.items():
            spark.conf.set(k, v)
        spark.sql(merge_statement(target, view))
    finally:
        for k in confs:
            spark.conf.unset(k)
        spark.catalog.dropTempView(view)
        source.unpersist()


def merge_counts(summary: Mapping[str, str]) -> dict[str, int]:
    """Rows the round's ``MERGE`` inserted, updated and deleted, from its snapshot summary."""
    return {ours: int(summary.get(theirs, 0)) for theirs, ours in MERGE_METRICS.items()}
