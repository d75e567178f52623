"""Driver, for reads with filters (the Spark data source): the tasks a read needs.

:class:`ReadBounds` is what a read's filters say about ``kafka.partition``, ``kafka.offset``
and ``kafka.ingest_timestamp`` (inclusive bounds; a bound that is not exact is widened, since
Spark evaluates every filter again on the rows). :func:`prune_tasks` drops the tasks that hold
no row inside them and narrows the others:

* whole segments go by their offsets and by their ``ingest_timestamp`` range: a row's
  ``ingest_timestamp`` never decreases along a partition, so a task's rows lie between its
  starting maximum and its segment's capped ``maxTimestampMs``;
* inside a segment the task starts at the last offset-index entry the bounds exclude
  everything before (the chunks before it are not read) and stops at the upper offset bound or
  at the first entry whose running maximum is above the upper time bound (the chunks after it
  are not read). The running maximum at an entry comes from the segment's time index exactly as
  for split tasks (:mod:`~rsm_sidecar.iceberg.planning.splitting`), so the rows read carry the
  same ``ingest_timestamp`` as in a full read. A segment whose indexes cannot give it exactly,
  or whose range starts after its first offset (a straddling re-upload), is read from the start
  of its range.

``event_timestamp`` is not used: a producer's clock orders nothing, and in ``LogAppendTime``
batches the record times are not bounded by the segment's ``maxTimestampMs``.
"""

from __future__ import annotations

import dataclasses

from rsm_sidecar.iceberg.planning.chains import PartitionPlan
from rsm_sidecar.iceberg.planning.splitting import entry_maxima, exact_indexes
from rsm_sidecar.iceberg.planning.tasks import SegmentTask
from rsm_sidecar.segment.reader import SegmentReader

LOWEST = -(2**63)
HIGHEST = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class ReadBounds:
    """Inclusive bounds on the rows a read wants (``partitions`` None: every partition)."""

    partitions: frozenset[int] | None = None
    offset_min: int = 0
    offset_max: int = HIGHEST
    ingest_min_ms: int = LOWEST
    ingest_max_ms: int = HIGHEST

    def wants_partition(self, partition: int) -> bool:
        return self.partitions is None or partition in self.partitions

    @property
    def empty(self) -> bool:
        return (
            self.partitions == frozenset()
            or self.offset_min > self.offset_max
            or self.ingest_min_ms > self.ingest_max_ms
        )

    @property
    def narrows_segments(self) -> bool:
        return (
            self.offset_min > 0
            or self.offset_max < HIGHEST
            or self.ingest_min_ms > LOWEST
            or self.ingest_max_ms < HIGHEST
        )


@dataclasses.dataclass
class PruneStats:
    """What pruning did (for the log and the tests)."""

    tasks_planned: int = 0
    tasks_kept: int = 0
    segments_kept: int = 0
    starts_moved: int = 0  # tasks that start after the first offset of their range
    ends_moved: int = 0  # tasks that stop before the last offset of their range
    index_reads: int = 0  # segments whose offset and time indexes were read
    not_exact: list[str] = dataclasses.field(default_factory=list)  # why a cut was not made

    def add(self, other: PruneStats) -> None:
        for f in dataclasses.fields(self):
            if f.name == "not_exact":
                self.not_exact.extend(other.not_exact)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def prune_tasks(
    reader: SegmentReader, plan: PartitionPlan, bounds: ReadBounds, first_index: int = 0
) -> tuple[list[SegmentTask], PruneStats]:
    """The plan's tasks that can hold rows inside ``bounds``, narrowed (module docstring),
    numbered from ``first_index``."""
    stats = PruneStats()
    tasks = plan.tasks(0)
    stats.tasks_planned = len(tasks)
    if bounds.empty or not bounds.wants_partition(plan.partition):
        return [], stats
    segments = {s.base: s for s in plan.chain}
    from_start = {s.base for s, (lo, _) in zip(plan.chain, plan.ranges) if lo == s.start_offset}
    maxima: dict[str, list[tuple[int, int]] | None] = {}
    out: list[SegmentTask] = []
    for t in tasks:
        seg = segments[t.base]
        cap = t.ingest_bound if t.ingest_bound >= 0 else HIGHEST
        last_state = max(t.ingest_state, min(seg.max_timestamp_ms, cap))  # no row of t is later
        if (
            t.hi < bounds.offset_min
            or t.lo > bounds.offset_max
            or last_state < bounds.ingest_min_ms
            or t.ingest_state > bounds.ingest_max_ms
        ):
            continue
        lo, state, hi = t.lo, t.ingest_state, min(t.hi, bounds.offset_max)
        moves_start = bounds.offset_min > lo or bounds.ingest_min_ms > state
        moves_end = bounds.ingest_max_ms < last_state
        if (moves_start or moves_end) and t.base in from_start:
            if t.base not in maxima:
                maxima[t.base] = _entry_states(reader, seg, stats)
            for offset, prefix in maxima[t.base] or ():
                if offset < t.lo or offset >= hi:
                    continue
                at = max(t.ingest_state, min(prefix, cap))  # the running maximum at `offset`
                if moves_start and (offset < bounds.offset_min or at < bounds.ingest_min_ms):
                    lo, state = offset + 1, at  # nothing at or before `offset` is wanted
                if moves_end and at > bounds.ingest_max_ms:
                    hi = offset  # every row after `offset` is later than wanted
                    break
        if lo > hi:
            continue
        stats.starts_moved += lo != t.lo
        stats.ends_moved += hi != t.hi
        out.append(
            dataclasses.replace(
                t,
                index=first_index + len(out),
                lo=lo,
                hi=hi,
                ingest_state=state,
                aborted=tuple(a for a in t.aborted if a[2] >= lo and a[1] <= hi),
                end_state=t.end_state if hi == t.hi else None,
            )
        )
    stats.tasks_kept = len(out)
    stats.segments_kept = len({t.base for t in out})
    return out, stats


def _entry_states(reader: SegmentReader, seg, stats: PruneStats) -> list[tuple[int, int]] | None:
    """``(offset, maximum time of the segment's batches up to it)`` per offset-index entry,
    or None (noted) when the indexes cannot give it exactly."""
    stats.index_reads += 1
    indexes = exact_indexes(reader, seg)
    if isinstance(indexes, str):
        stats.not_exact.append(f"{seg.describe} is read from its start: {indexes}")
        return None
    offsets, times = indexes
    return [(e.offset, m) for e, m in zip(offsets, entry_maxima(offsets, times))]
