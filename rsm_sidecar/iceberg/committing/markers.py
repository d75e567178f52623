"""Commit markers: what has been converted, stored in the Iceberg snapshots themselves.

Every snapshot a convert job publishes carries, in its summary (``snapshot-property.*``):

==========================  ==============================================================
``rsm.marker``              marker format version (``1``)
``rsm.topic``               topic name; ``rsm.topic-id`` its Kafka topic id
``rsm.next-offsets``        JSON ``{"<partition>": next offset to convert}`` - for every
                            partition ever converted (cumulative, so the newest marker is
                            the whole state)
``rsm.ingest-ms``           JSON ``{"<partition>": running maximum of ingest_timestamp, ms}``
``rsm.segments``            JSON ``{"<partition>": [segment ids converted by this commit]}``
``rsm.skipped``             JSON ``{"<partition>": [[from, to], ...]}`` offsets that retention
                            removed before they were converted (only when there were some)
``rsm.job-id``              the run's id (with the ``spark`` writer also the staged snapshot's ``wap.id``)
==========================  ==============================================================

The state is read from the newest snapshot with a marker among the *ancestors of ``main``*
(maintenance snapshots - compaction, deletes - have no marker and are walked through). Each
publish also moves the tag :data:`MARKER_TAG` to the marker snapshot: tagged snapshots survive
``expire_snapshots``, so the marker survives even when the snapshots between it and ``main`` are
expired (the walk then ends without a marker and the tag's snapshot is used). To start a table
over, drop the table (or at least remove the tag together with the rows).

Committing a run is a single catalog commit, *conditional on ``main`` still being the snapshot
whose markers the run read* (``assert-ref-snapshot-id``), so two runs racing on a table can
never both commit the same offsets: the second one's commit fails and commits nothing. It
either adds the data files the executors wrote as a new snapshot with the markers
(:func:`commit_files`, ``iceberg.writer = arrow``) or moves ``main`` to the snapshot Spark
staged with write-audit-publish (:func:`publish`, ``iceberg.writer = spark``); in both cases it
moves the tag with it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from rsm_sidecar.errors import ConfigError, FailedPrecondition

if TYPE_CHECKING:  # pragma: no cover
    from pyiceberg.table.refs import SnapshotRefType
    from pyiceberg.table.update import SetSnapshotRefUpdate

MARKER_TAG = "rsm-marker"
P_VERSION = "rsm.marker"
P_TOPIC = "rsm.topic"
P_TOPIC_ID = "rsm.topic-id"
P_NEXT = "rsm.next-offsets"
P_INGEST = "rsm.ingest-ms"
P_SEGMENTS = "rsm.segments"
P_SKIPPED = "rsm.skipped"
P_JOB = "rsm.job-id"
WAP_ID = "wap.id"
VERSION = "1"


class CommitConflict(FailedPrecondition):
    """The table changed since the run read its markers; the run committed nothing."""


@dataclasses.dataclass
class MarkerState:
    """What the table says has been converted."""

    main_snapshot_id: int | None = None  # main when read: the publish asserts it is unchanged
    marker_snapshot_id: int | None = None  # the snapshot the state comes from
    topic: str | None = None
    topic_id: str | None = None
    next_offsets: dict[int, int] = dataclasses.field(default_factory=dict)
    ingest_ms: dict[int, int] = dataclasses.field(default_factory=dict)
    job_id: str | None = None
    source: str = "none"  # "ancestry" | "tag" | "none"

    def next_offset(self, partition: int) -> int:
        return self.next_offsets.get(partition, 0)

    def ingest_state(self, partition: int) -> int:
        return self.ingest_ms.get(partition, -1)


def summary_properties(snapshot) -> dict[str, str]:
    """The extra properties of a snapshot's summary (the markers, Spark's metrics, ...)."""
    return dict(snapshot.summary.additional_properties) if snapshot.summary is not None else {}


def _int_map(text: str | None) -> dict[int, int]:
    return {int(k): int(v) for k, v in json.loads(text).items()} if text else {}


def marker_of(snapshot) -> dict[str, str] | None:
    props = summary_properties(snapshot)
    return props if props.get(P_VERSION) else None


def read_state(table) -> MarkerState:
    """The marker state of ``table`` (a PyIceberg table; None: no table yet)."""
    if table is None:
        return MarkerState()
    md = table.metadata
    main = md.refs.get("main")
    state = MarkerState(main_snapshot_id=main.snapshot_id if main else None)
    snap = md.snapshot_by_id(main.snapshot_id) if main else None
    found = None
    while snap is not None:
        if marker_of(snap) is not None:
            found = snap
            state.source = "ancestry"
            break
        snap = md.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
    if found is None and MARKER_TAG in md.refs:
        # Expiry removed the snapshots between main and the last marker (PyIceberg's expiry even
        # clears the parent id of the survivors): the tag still points at the last marker.
        found = md.snapshot_by_id(md.refs[MARKER_TAG].snapshot_id)
        state.source = "tag"
    if found is None:
        return state
    props = marker_of(found) or {}
    if props.get(P_VERSION) != VERSION:
        raise ConfigError(
            f"table {table.name()}: snapshot {found.snapshot_id} has marker version "
            f"{props.get(P_VERSION)!r}; this build reads {VERSION!r}"
        )
    state.marker_snapshot_id = found.snapshot_id
    state.topic = props.get(P_TOPIC)
    state.topic_id = props.get(P_TOPIC_ID)
    state.next_offsets = _int_map(props.get(P_NEXT))
    state.ingest_ms = _int_map(props.get(P_INGEST))
    state.job_id = props.get(P_JOB)
    return state


def marker_properties(
    *,
    topic: str,
    topic_id: str,
    job_id: str,
    next_offsets: dict[int, int],
    ingest_ms: dict[int, int],
    segments: dict[int, list[str]],
    skipped: dict[int, list[tuple[int, int]]],
) -> dict[str, str]:
    def dump(d: dict[int, Any]) -> str:
        return json.dumps({str(k): d[k] for k in sorted(d)}, separators=(",", ":"))

    props = {
        P_VERSION: VERSION,
        P_TOPIC: topic,
        P_TOPIC_ID: topic_id,
        P_JOB: job_id,
        P_NEXT: dump(next_offsets),
        P_INGEST: dump(ingest_ms),
        P_SEGMENTS: dump({k: v for k, v in segments.items() if v}),
    }
    if any(skipped.values()):
        props[P_SKIPPED] = dump({k: [list(r) for r in v] for k, v in skipped.items() if v})
    return props


def staged_snapshot(table, job_id: str):
    """The snapshot Spark staged for ``job_id`` (write-audit-publish), or None."""
    for snap in table.metadata.snapshots:
        if summary_properties(snap).get(WAP_ID) == job_id:
            return snap
    return None


def publish(catalog, identifier, job_id: str, expected_main: int | None):
    """Make the staged snapshot of ``job_id`` the head of ``main`` and move :data:`MARKER_TAG`
    to it - only if ``main`` is still ``expected_main``. Raises :class:`CommitConflict`."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.refs import SnapshotRefType
    from pyiceberg.table.update import AssertRefSnapshotId

    table = catalog.load_table(identifier)
    snap = staged_snapshot(table, job_id)
    if snap is None:
        raise FailedPrecondition(f"table {table.name()}: Spark staged no snapshot with wap.id {job_id}")
    main = table.metadata.refs.get("main")
    current = main.snapshot_id if main else None
    if current != expected_main or snap.parent_snapshot_id != expected_main:
        raise CommitConflict(
            f"table {'.'.join(table.name())}: main moved from {expected_main} to {current} since this "
            f"run read its markers (another convert job or maintenance committed); nothing was "
            f"committed - run the job again"
        )
    try:
        table.catalog.commit_table(
            table,
            (AssertRefSnapshotId(ref="main", snapshot_id=expected_main),),
            (
                _set_ref("main", SnapshotRefType.BRANCH, snap.snapshot_id),
                _set_ref(MARKER_TAG, SnapshotRefType.TAG, snap.snapshot_id),
            ),
        )
    except CommitFailedException as exc:
        raise CommitConflict(
            f"table {'.'.join(table.name())}: publishing snapshot {snap.snapshot_id} failed its "
            f"condition (main must still be {expected_main}): {exc}; nothing was committed - run "
            f"the job again"
        ) from None
    return snap


def commit_files(catalog, identifier, expected_main: int | None, data_files, properties: dict[str, str]):
    """Add ``data_files`` (written by the executors, :mod:`.data_files`) to ``main`` as one
    snapshot carrying the markers ``properties``, and move :data:`MARKER_TAG` to it - one
    catalog commit, only if ``main`` is still ``expected_main``. Raises :class:`CommitConflict`."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.refs import SnapshotRefType

    table = catalog.load_table(identifier)
    name = ".".join(table.name())
    main = table.metadata.refs.get("main")
    current = main.snapshot_id if main else None
    if current != expected_main:
        raise CommitConflict(
            f"table {name}: main moved from {expected_main} to {current} since this run read its "
            f"markers (another convert job or maintenance committed); nothing was committed - run "
            f"the job again"
        )
    tx = table.transaction()
    # fast_append asserts that main is still the snapshot it was loaded at (= expected_main)
    with tx.update_snapshot(snapshot_properties=properties).fast_append() as append:
        for f in data_files:
            append.append_data_file(f)
    snapshot_id = append.snapshot_id
    tx._apply((_set_ref(MARKER_TAG, SnapshotRefType.TAG, snapshot_id),), ())
    try:
        tx.commit_transaction()
    except CommitFailedException as exc:
        raise CommitConflict(
            f"table {name}: the commit failed its condition (main must still be {expected_main}): "
            f"{exc}; nothing was committed - run the job again"
        ) from None
    return catalog.load_table(identifier).metadata.snapshot_by_id(snapshot_id)


def _set_ref(name: str, kind: SnapshotRefType, snapshot_id: int) -> SetSnapshotRefUpdate:
    """Point a branch or tag at a snapshot, with no retention settings of its own."""
    from pyiceberg.table.update import SetSnapshotRefUpdate

    return SetSnapshotRefUpdate(
        ref_name=name,
        type=kind,
        snapshot_id=snapshot_id,
        max_ref_age_ms=None,
        max_snapshot_age_ms=None,
        min_snapshots_to_keep=None,
    )
