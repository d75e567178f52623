"""`inspect orphans`: objects that belong to no segment.

* a ``.log`` or ``.indexes`` whose ``.rsm-manifest`` is missing: a copy that was killed
  before it wrote the manifest (or failed and could not clean up), or a delete that
  stopped after removing the manifest;
* a manifest whose ``.log`` is missing (a segment deleted while something re-wrote its
  manifest);
* an object under the key prefix that is not a segment key at all.

A copy in progress looks exactly like the first case until its manifest lands, so
objects younger than the age guard (``--older-than``, default 1 hour) are listed but
never deleted. Deleting uses ``delete_many`` (a missing key is fine).

With Kafka's metadata (``--bootstrap-server``, :func:`cross_check`) the complete segments are
checked against what ``__remote_log_metadata`` says about them (:mod:`.kafka_metadata`):

* ``not-in-kafka``: stored, and no record names it, while the topic id is one Kafka tiered.
  Kafka records a copy as COPY_SEGMENT_STARTED *before* the broker sends its first byte (and
  waits until the record is consumed), and the topic is read *after* the listing, to its end:
  so a stored segment without a record is not a copy in progress. Deleted with ``--delete``
  (older than the age guard), unless the metadata topic lost its first records.
* ``deleted-in-kafka``: Kafka recorded DELETE_SEGMENT_FINISHED, or the deletion of the whole
  partition (topic deletion), but the objects are still stored. Deleted with ``--delete``.
* ``copy-not-finished``: Kafka's last record is COPY_SEGMENT_STARTED, the stored segment is
  complete and older than the age guard: the copying broker stopped (a crash) after the
  sidecar stored the segment and before it recorded COPY_SEGMENT_FINISHED. Kafka never reads
  such a segment (the new leader copies the offsets again under a new id) but still lists it,
  so it is only reported: Kafka deletes it with retention or with the topic.
* ``delete-not-finished``: DELETE_SEGMENT_STARTED recorded longer ago than the age guard;
  Kafka's expiration task retries it. Reported.
* ``topic-not-in-kafka``: segments of a topic id no record names (another cluster sharing the
  bucket, or a metadata topic that was lost). One line per topic id; never deleted.
* ``missing-in-storage``: Kafka lists the segment as COPY_SEGMENT_FINISHED (not deleted) and
  storage has no complete copy of it (checked again by key after the read, so a copy made
  after the listing is not reported): consumers of those offsets get errors.

What Kafka lists in any state (COPY_SEGMENT_STARTED, COPY_SEGMENT_FINISHED,
DELETE_SEGMENT_STARTED) is never deleted."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from rsm_sidecar.durations import format_duration
from rsm_sidecar.errors import RsmError
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.kafka_metadata import KafkaMetadata, KafkaSegment
from rsm_sidecar.inspect.output import human_bytes, table
from rsm_sidecar.kafka import remote_log_metadata as rlm
from rsm_sidecar.segment import listing
from rsm_sidecar.segment.listing import StoredSegment, StrayObject
from rsm_sidecar.segment.objects import delete_segment_objects
from rsm_sidecar.storage.base import ObjectInfo

DEFAULT_MIN_AGE_SECONDS = 3600.0
NO_MANIFEST, NO_DATA, OUTSIDE_LAYOUT = "no-manifest", "manifest-without-data", "outside-layout"


@dataclasses.dataclass
class Orphan:
    key: str
    size: int
    last_modified: datetime.datetime
    age_seconds: float
    reason: str
    action: str = "listed"  # listed | deleted | kept-too-young | delete-failed

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["last_modified"] = self.last_modified.isoformat()
        d["age_seconds"] = round(self.age_seconds, 1)
        return d


def _orphans_of(item) -> list[tuple[ObjectInfo, str]]:
    if isinstance(item, StrayObject):
        return [(item.info, OUTSIDE_LAYOUT)]
    seg: StoredSegment = item
    if not seg.has_manifest:
        return [(o, NO_MANIFEST) for o in seg.objects.values()]
    if fkeys.LOG not in seg.objects:
        return [(o, NO_DATA) for o in seg.objects.values()]
    return []


@dataclasses.dataclass(frozen=True)
class CompleteSegment:
    """A complete segment (manifest present) as the listing found it, kept small for the
    cross-check (one per segment of the store): the segment without its objects' entries, the
    bytes they hold and the manifest's time."""

    segment: StoredSegment
    stored_bytes: int
    #: the manifest's time: when the copy finished (it is written last)
    completed: datetime.datetime

    @classmethod
    def of(cls, seg: StoredSegment) -> CompleteSegment:
        completed = seg.objects[fkeys.MANIFEST].last_modified
        return cls(dataclasses.replace(seg, objects={}), seg.stored_bytes, completed)


def run(
    ctx: InspectContext,
    min_age_seconds: float = DEFAULT_MIN_AGE_SECONDS,
    delete: bool = False,
    now: datetime.datetime | None = None,
    progress=None,
    stored: list[CompleteSegment] | None = None,
) -> tuple[list[Orphan], list[dict[str, str]]]:
    """The objects that belong to no segment (deleted with ``delete`` when older than the age
    guard). ``stored``, when given, receives every complete segment of the listing (the
    cross-check's input: one small entry per segment)."""
    now = now or datetime.datetime.now(datetime.UTC)
    found: list[Orphan] = []
    errors: list[dict[str, str]] = []
    for item in listing.scan(ctx.store, ctx.layout):
        if progress:
            progress.advance()
        if stored is not None and isinstance(item, StoredSegment) and item.has_manifest:
            stored.append(CompleteSegment.of(item))
        for info, reason in _orphans_of(item):
            age = (now - info.last_modified).total_seconds()
            found.append(Orphan(info.key, info.size, info.last_modified, age, reason))
    if progress:
        progress.done()
    if delete:
        for o in found:
            if o.age_seconds < min_age_seconds:
                o.action = "kept-too-young"
                continue
            try:
                ctx.store.delete_many([o.key])
                o.action = "deleted"
            except RsmError as e:
                o.action = "delete-failed"
                errors.append({"object": o.key, "error": str(e)})
    return found, errors


# -- against Kafka's metadata ------------------------------------------------------------------
NOT_IN_KAFKA, DELETED_IN_KAFKA = "not-in-kafka", "deleted-in-kafka"
COPY_NOT_FINISHED, DELETE_NOT_FINISHED = "copy-not-finished", "delete-not-finished"
TOPIC_NOT_IN_KAFKA, MISSING_IN_STORAGE = "topic-not-in-kafka", "missing-in-storage"
#: findings whose stored segment ``--delete`` removes (older than the age guard)
DELETABLE = (NOT_IN_KAFKA, DELETED_IN_KAFKA)


@dataclasses.dataclass
class SegmentFinding:
    finding: str
    topic: str
    topic_id: str
    partition: int
    start_offset: int
    segment_id: str  # for topic-not-in-kafka: the number of segments, e.g. "3 segments"
    end_offset: int = -1
    base: str | None = None  # the stored segment's base key
    stored_bytes: int = 0
    #: since the stored copy completed (missing-in-storage: since Kafka recorded the state)
    age_seconds: float = 0.0
    kafka_state: str | None = None
    note: str = ""
    action: str = "listed"  # listed | kept | deleted | kept-too-young | delete-failed

    @property
    def segment(self) -> str:
        return f"{self.topic}-{self.partition}@{self.start_offset}"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["age_seconds"] = round(self.age_seconds, 1)
        return d


@dataclasses.dataclass
class CrossCheck:
    findings: list[SegmentFinding]
    errors: list[dict[str, str]]
    stored_segments: int
    kafka_segments: int
    kafka_records: int
    incomplete_metadata: dict[int, int]

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.finding] = counts.get(f.finding, 0) + 1
        return {
            "stored_segments": self.stored_segments,
            "kafka_segments": self.kafka_segments,
            "kafka_records": self.kafka_records,
            "incomplete_metadata_partitions": {str(p): o for p, o in self.incomplete_metadata.items()},
            "findings": counts,
            "deleted": sum(1 for f in self.findings if f.action == "deleted"),
        }


def _age(now: datetime.datetime, ms: int) -> float:
    return max(0.0, now.timestamp() - ms / 1000) if ms > 0 else 0.0


def _finished_by_partition(kafka: KafkaMetadata) -> dict[tuple[str, int], list[KafkaSegment]]:
    out: dict[tuple[str, int], list[KafkaSegment]] = {}
    for k in kafka.segments.values():
        if k.state == rlm.COPY_SEGMENT_FINISHED:
            out.setdefault((k.topic_id, k.partition), []).append(k)
    return out


def _others(
    finished: dict[tuple[str, int], list[KafkaSegment]], seg: KafkaSegment | StoredSegment, end: int
) -> str:
    """The finished segments of the same partition that hold the same offsets (the broker's
    copy of them under another segment id)."""
    start = seg.start_offset
    same = [
        k
        for k in finished.get((seg.topic_id, seg.partition), ())
        if k.segment_id != seg.segment_id
        and k.start_offset <= (end if end >= 0 else start)
        and k.end_offset >= start
    ]
    if not same:
        return ""
    return "offsets also in " + ", ".join(f"{k.segment_id} ({k.start_offset}..{k.end_offset})" for k in same)


def cross_check(
    ctx: InspectContext,
    stored: list[CompleteSegment],
    kafka: KafkaMetadata,
    min_age_seconds: float = DEFAULT_MIN_AGE_SECONDS,
    delete: bool = False,
    now: datetime.datetime | None = None,
) -> CrossCheck:
    """The complete segments in storage (listed before ``kafka`` was read) against Kafka's
    metadata (the module docstring says what each finding means and what is deleted)."""
    now = now or datetime.datetime.now(datetime.UTC)
    findings: list[SegmentFinding] = []
    errors: list[dict[str, str]] = []
    seen: set[str] = set()
    finished = _finished_by_partition(kafka)
    foreign: dict[tuple[str, str], list[CompleteSegment]] = {}
    for c in stored:
        s = c.segment
        seen.add(s.segment_id)
        age = (now - c.completed).total_seconds()
        k = kafka.segments.get(s.segment_id)
        finding, state, note = None, None if k is None else k.state, ""
        if k is None:
            if s.topic_id not in kafka.topic_ids:
                foreign.setdefault((s.topic, s.topic_id), []).append(c)
                continue
            if kafka.partition_deleted(s.topic_id, s.partition):
                finding, note = DELETED_IN_KAFKA, "Kafka deleted the partition's remote data"
            else:
                finding = NOT_IN_KAFKA
        elif k.state == rlm.DELETE_SEGMENT_FINISHED:
            finding = DELETED_IN_KAFKA
        elif k.state == rlm.COPY_SEGMENT_STARTED and age >= min_age_seconds:
            finding = COPY_NOT_FINISHED
            note = _others(finished, k, k.end_offset) or "no finished copy of these offsets"
        elif k.state == rlm.DELETE_SEGMENT_STARTED and _age(now, k.updated_ms) >= min_age_seconds:
            finding, note = DELETE_NOT_FINISHED, "Kafka retries the delete"
        if finding is None:
            continue
        f = SegmentFinding(
            finding, s.topic, s.topic_id, s.partition, s.start_offset, s.segment_id,
            end_offset=k.end_offset if k is not None else -1, base=s.base, stored_bytes=c.stored_bytes,
            age_seconds=age, kafka_state=state, note=note,
        )  # fmt: skip
        if finding == NOT_IN_KAFKA and not note:
            f.note = _others(finished, s, -1)
        findings.append(f)
    for (topic, topic_id), segs in sorted(foreign.items()):
        findings.append(
            SegmentFinding(
                TOPIC_NOT_IN_KAFKA,
                topic,
                topic_id,
                -1,
                -1,
                f"{len(segs)} segments",
                stored_bytes=sum(x.stored_bytes for x in segs),
                age_seconds=min((now - x.completed).total_seconds() for x in segs),
                note="no record of this topic id in __remote_log_metadata (another cluster?)",
                action="kept",
            )  # fmt: skip
        )
    for k in kafka.segments.values():
        if k.state != rlm.COPY_SEGMENT_FINISHED or k.segment_id in seen:
            continue
        if kafka.partition_deleted(k.topic_id, k.partition):
            continue
        md = fkeys.SegmentMetadata(
            k.topic_id, k.topic, k.partition, k.segment_id, max(0, k.start_offset),
            max(k.start_offset, k.end_offset, 0), custom_metadata=k.custom_metadata,
        )  # fmt: skip
        try:
            base = ctx.layout.base(md)
            if ctx.store.exists(f"{base}.{fkeys.MANIFEST}"):
                continue  # copied after the listing, or stored under the prefix its custom metadata names
        except RsmError as e:
            errors.append({"segment": k.describe, "error": str(e)})
            continue
        findings.append(
            SegmentFinding(
                MISSING_IN_STORAGE,
                k.topic,
                k.topic_id,
                k.partition,
                k.start_offset,
                k.segment_id,
                end_offset=k.end_offset,
                base=base,
                age_seconds=_age(now, k.updated_ms),
                kafka_state=k.state,
                note="Kafka serves these offsets from this segment",
            )  # fmt: skip
        )
    complete = not kafka.incomplete
    for f in findings:
        if f.finding not in DELETABLE:
            if f.action == "listed" and f.finding != MISSING_IN_STORAGE:
                f.action = "kept"
            continue
        if not complete:
            f.action = "kept"
            f.note = (f.note + "; " if f.note else "") + "metadata topic incomplete: not deleted"
            continue
        if not delete:
            continue
        if f.age_seconds < min_age_seconds:
            f.action = "kept-too-young"
            continue
        assert f.base is not None
        try:
            delete_segment_objects(ctx.store, f.base)
            f.action = "deleted"
        except RsmError as e:
            f.action = "delete-failed"
            errors.append({"segment": f.base, "error": str(e)})
    findings.sort(key=lambda f: (f.finding, f.topic, f.topic_id, f.partition, f.start_offset, f.segment_id))
    return CrossCheck(
        findings, errors, len(stored), len(kafka.segments), kafka.records, dict(kafka.incomplete)
    )


def print_table(orphans: list[Orphan], min_age_seconds: float, delete: bool) -> None:
    if not orphans:
        print("no orphaned objects")
        return
    table(
        ("KEY", "SIZE", "AGE", "REASON", "ACTION"),
        [(o.key, human_bytes(o.size), format_duration(o.age_seconds), o.reason, o.action) for o in orphans],
        right=(1, 2),
    )
    young = sum(1 for o in orphans if o.age_seconds < min_age_seconds)
    line = f"{len(orphans)} orphaned objects, {human_bytes(sum(o.size for o in orphans))}"
    if delete:
        line += f"; {sum(1 for o in orphans if o.action == 'deleted')} deleted"
    if young:
        line += (
            f"; {young} younger than {format_duration(min_age_seconds)} "
            f"{'kept' if delete else 'would be kept'} (possibly a copy in progress)"
        )
    print(line)


def print_cross_check(result: CrossCheck, min_age_seconds: float, delete: bool) -> None:
    print()
    print(
        f"against Kafka's __remote_log_metadata ({result.kafka_records} records, "
        f"{result.kafka_segments} segments; {result.stored_segments} complete segments in storage):"
    )
    if result.incomplete_metadata:
        parts = ", ".join(f"{p} (from offset {o})" for p, o in sorted(result.incomplete_metadata.items()))
        print(
            f"warning: the metadata topic no longer holds its first records (partitions {parts}): "
            "segments it recorded may look unknown; nothing is deleted"
        )
    if not result.findings:
        print("storage and Kafka agree")
        return
    table(
        ("FINDING", "SEGMENT", "SEGMENT_ID", "KAFKA_STATE", "STORED", "AGE", "ACTION", "NOTE"),
        [
            (
                f.finding,
                f.segment if f.partition >= 0 else f"{f.topic} ({f.topic_id})",
                f.segment_id,
                f.kafka_state or "(none)",
                human_bytes(f.stored_bytes) if f.base or f.stored_bytes else "-",
                format_duration(f.age_seconds),
                f.action,
                f.note,
            )
            for f in result.findings
        ],
        right=(4, 5),
    )
    counts = result.summary()["findings"]
    line = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    if delete:
        line += f"; {result.summary()['deleted']} deleted"
    elif any(f.finding in DELETABLE and f.action == "listed" for f in result.findings):
        line += (
            f"; --delete removes the {' and '.join(DELETABLE)} ones older than "
            f"{format_duration(min_age_seconds)}"
        )
    print(line)
