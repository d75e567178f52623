"""Driver, step 2 of planning: which segments of a partition a run converts.

:class:`PartitionPlan` picks, per partition, the chain of segments that covers the offsets from
the table's next offset upwards without overlap (re-uploaded segments - the same offsets under a
new segment id after a failed copy or a leader change - are alternatives for the same offsets,
never converted twice), and the offset range ``[lo, hi]`` each task emits. The plan's tasks are
cut further by :mod:`~rsm_sidecar.iceberg.planning.splitting`; its transactions are settled by
:mod:`~rsm_sidecar.iceberg.planning.transactions` (which knows chains of segments, not plans).
"""

from __future__ import annotations

import dataclasses
import heapq
import time

from rsm_sidecar.iceberg.planning.listing import LIST_THREADS, with_manifest_info
from rsm_sidecar.iceberg.planning.tasks import SegmentTask
from rsm_sidecar.iceberg.planning.transactions import TxnInfo, read_txn_info, settle_transactions
from rsm_sidecar.kafka import AbortedTxn
from rsm_sidecar.segment.listing import StoredSegment
from rsm_sidecar.segment.reader import SegmentReader


@dataclasses.dataclass
class PartitionPlan:
    partition: int
    next_offset: int  # from the table's marker
    ingest_state: int
    chain: list[StoredSegment] = dataclasses.field(default_factory=list)
    ranges: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    skipped: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # lost to retention
    waiting: str | None = None  # why the plan stops where it stops
    aborted: list[AbortedTxn] = dataclasses.field(default_factory=list)
    #: the wall clock (ms) when the plan was made: the ingest bound of segments whose
    #: manifest has no copy time
    planned_ms: int = dataclasses.field(default_factory=lambda: int(time.time() * 1000))
    #: chain index -> split points of that segment: (first offset of a task after the first,
    #: maximum time of the segment's batches before it, uncapped; -1: none) - see
    #: :func:`split_segments`
    splits: dict[int, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    #: the complete segments whose manifest the plan read (those at or above ``next_offset``):
    #: what is tiered and not yet converted, for :meth:`lag`
    listed: list[StoredSegment] = dataclasses.field(default_factory=list)

    def lag(self, next_offset: int, now_ms: int) -> tuple[int, float]:
        """``(offsets, seconds)`` the table is behind remote storage once it holds the offsets
        below ``next_offset``: offsets of complete segments at or above it, and the age of the
        oldest such segment (since the broker began copying it; 0 when unknown or none)."""
        pending = [s for s in self.listed if s.end_offset >= next_offset]
        if not pending:
            return 0, 0.0
        first = max(next_offset, min(s.start_offset for s in pending))
        behind = max(s.end_offset for s in pending) + 1 - first
        copied = [s.copied_ms for s in pending if s.copied_ms > 0]
        return behind, max(0.0, (now_ms - min(copied)) / 1000) if copied else 0.0

    def ingest_bound(self, seg: StoredSegment) -> int:
        """The latest time a record of ``seg`` can have been ingested: when the broker began
        copying it (``eventTimestampMs``), else when this plan was made (the segment was
        complete in storage by then)."""
        return seg.copied_ms if seg.copied_ms > 0 else self.planned_ms

    def _state_after(self, state: int, seg: StoredSegment) -> int:
        return max(state, min(seg.max_timestamp_ms, self.ingest_bound(seg)))

    @property
    def new_next_offset(self) -> int:
        return (
            self.ranges[-1][1] + 1
            if self.ranges
            else (self.skipped[-1][1] + 1 if self.skipped else self.next_offset)
        )

    @property
    def new_ingest_state(self) -> int:
        state = self.ingest_state
        for seg in self.chain:
            state = self._state_after(state, seg)
        return state

    def tasks(self, first_index: int) -> list[SegmentTask]:
        """The executor tasks: one per chain segment, or several for a split segment (each
        piece's starting maximum: the segment's, raised by the capped maximum of the segment's
        batches before the piece)."""
        out: list[SegmentTask] = []
        state = self.ingest_state
        for i, (seg, (lo, hi)) in enumerate(zip(self.chain, self.ranges)):
            bound = self.ingest_bound(seg)
            pieces = [(lo, state)] + [
                (at, max(state, min(prefix, bound))) for at, prefix in self.splits.get(i, [])
            ]
            for k, (p_lo, p_state) in enumerate(pieces):
                last = k == len(pieces) - 1
                p_hi = hi if last else pieces[k + 1][0] - 1
                aborted = tuple(
                    (t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
                    for t in self.aborted
                    if t.last_offset >= p_lo and t.first_offset <= p_hi
                )
                out.append(
                    SegmentTask(
                        first_index + len(out),
                        self.partition,
                        seg.base,
                        seg.segment_id,
                        seg.start_offset,
                        seg.end_offset,
                        p_lo,
                        p_hi,
                        p_state,
                        aborted,
                        seg.describe,
                        bound,
                        None if last else pieces[k + 1][1],
                    )
                )
            state = self._state_after(state, seg)
        return out


def choose_chain(
    segments: list[StoredSegment], next_offset: int, limit: int = 0, earliest: int | None = None
) -> tuple[list[StoredSegment], list[tuple[int, int]], list[tuple[int, int]], str | None]:
    """Non-overlapping cover of the offsets from ``next_offset`` up.

    Returns ``(chain, ranges, skipped, waiting)``. At each step the segment covering the current
    offset with the highest end offset is taken (ties: the lowest segment id, deterministic);
    its range starts at the current offset. Offsets below the earliest segment in storage
    (``earliest``, default: the earliest of ``segments``) were removed by retention before they
    were converted: they are skipped (reported). A hole above the earliest segment stops the
    plan (the segment is not tiered yet, e.g. a copy being retried): ``waiting`` says so.

    One sweep in start-offset order with a heap of the segments started so far, by highest end
    offset: O(n log n) for n segments (a first run over a partition of 100,000 segments; the
    scan of every segment at every step this replaced was O(n^2)).
    """
    chain: list[StoredSegment] = []
    ranges: list[tuple[int, int]] = []
    skipped: list[tuple[int, int]] = []
    if not segments:
        return chain, ranges, skipped, None
    by_start = sorted(segments, key=lambda s: s.start_offset)
    if earliest is None:
        earliest = by_start[0].start_offset
    started: list[tuple[int, str, int]] = []  # (-end offset, segment id, index): best on top
    i = 0
    cur = next_offset
    waiting = None
    while not limit or len(chain) < limit:
        while i < len(by_start) and by_start[i].start_offset <= cur:
            heapq.heappush(started, (-by_start[i].end_offset, by_start[i].segment_id, i))
            i += 1
        while started and -started[0][0] < cur:  # ends before cur: covers nothing from here on
            heapq.heappop(started)
        if not started:
            if i == len(by_start):
                break
            nxt = by_start[i].start_offset
            if cur < earliest:
                skipped.append((cur, nxt - 1))
                cur = nxt
                continue
            waiting = f"offsets {cur}..{nxt - 1} are not in remote storage (yet)"
            break
        best = by_start[started[0][2]]
        chain.append(best)
        ranges.append((cur, best.end_offset))
        cur = best.end_offset + 1
    return chain, ranges, skipped, waiting


def plan_partition(
    reader: SegmentReader, segments: list[StoredSegment], next_offset: int, ingest_state: int, limit: int = 0
) -> PartitionPlan:
    """The plan of one partition from its listed segments (sorted by start offset).

    Manifests (end offsets, max timestamps) are read for the segments starting at or after
    ``next_offset`` - the new ones. Only when none of them starts exactly at ``next_offset``
    (a re-upload straddling it, or nothing new) are older segments' manifests read, newest
    first, until one covering ``next_offset`` is found. Then the transaction indexes and producer
    snapshots of the chain are read (:func:`settle_transactions`): the tail of the chain whose
    transactions are not all finished within it waits for the next run.
    """
    partition = segments[0].partition if segments else -1
    plan = PartitionPlan(partition, next_offset, ingest_state)
    if not segments:
        return plan
    earliest = segments[0].start_offset
    later = [s for s in segments if s.start_offset >= next_offset]
    if limit:
        later = later[: 2 * limit + 8]
    txns: dict[str, TxnInfo] = {}  # what each new segment says of transactions, read with its manifest

    def read_txns(seg: StoredSegment, opened) -> None:
        txns[seg.base] = read_txn_info(reader, opened, seg)

    known = with_manifest_info(reader, later, on_open=read_txns)
    if not any(s.start_offset == next_offset for s in known) and next_offset > earliest:
        older = [s for s in segments if s.start_offset < next_offset][::-1]
        for i in range(0, len(older), LIST_THREADS):
            page = [
                s
                for s in with_manifest_info(reader, older[i : i + LIST_THREADS])
                if s.end_offset >= next_offset
            ]
            if page:
                known.append(max(page, key=lambda s: s.end_offset))
                break
    chain, ranges, skipped, waiting = choose_chain(known, next_offset, limit, earliest=earliest)
    plan.chain, plan.ranges, plan.skipped, plan.waiting = chain, ranges, skipped, waiting
    plan.listed = known
    settled = settle_transactions(reader, plan.chain, txns)
    plan.aborted = settled.aborted
    if settled.complete < len(plan.chain):
        plan.chain, plan.ranges = plan.chain[: settled.complete], plan.ranges[: settled.complete]
        plan.waiting = settled.waiting
    return plan
