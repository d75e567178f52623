"""Tiered segments of a topic as the Iceberg job sees them: listing and planning (driver),
reading (executors).

Driver side:

* :func:`list_topic_segments` lists the object store once and keeps the segments whose manifest
  exists (the manifest is written last, so those are complete), by topic id and partition.
* :class:`PartitionPlan` picks, per partition, the chain of segments that covers the offsets
  from the table's next offset upwards without overlap (re-uploaded segments - the same offsets
  under a new segment id after a failed copy or a leader change - are alternatives for the same
  offsets, never converted twice), and the offset range ``[lo, hi]`` each task emits.
* Transactions: a segment's transaction index lists only the aborts whose marker is in that
  segment, so the driver reads the transaction indexes of every segment of the chain and hands
  each task the aborted transactions overlapping its range. A segment is converted only once
  every transaction with data in it is known to be finished *within the tiered segments*: the
  producer snapshot stored with a later chain segment (the producer state at that segment's
  end) must show no transaction that started at or before the segment's end still open.
  Otherwise the segment waits for the next run (its markers are not tiered yet).

Executor side: :func:`read_task` streams one task's segment from storage (verified, decrypted,
decompressed by :class:`~rsm_sidecar.segment.reader.SegmentReader`), batch by batch, into raw
record batches (:mod:`rsm_sidecar.iceberg.segment_rows`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from rsm_sidecar.config import Config
from rsm_sidecar.errors import DataLoss, NotFound, RsmError
from rsm_sidecar.format.keys import MANIFEST, KeyLayout, topic_component
from rsm_sidecar.iceberg.segment_rows import SegmentRowReader
from rsm_sidecar.kafka import AbortedTxn, read_batches, read_offset_index, read_time_index
from rsm_sidecar.kafka.errors import CorruptIndexError
from rsm_sidecar.kafka.indexes import OffsetPosition, TimestampOffset
from rsm_sidecar.kafka.snapshot import parse_producer_snapshot
from rsm_sidecar.kafka.txnindex import read_txn_index
from rsm_sidecar.segment.access import SegmentAccess
from rsm_sidecar.segment.log_file import StoredLogFile, offset_position
from rsm_sidecar.segment.reader import ReaderSettings, SegmentReader
from rsm_sidecar.storage.base import ObjectStore

LIST_THREADS = 16


@dataclasses.dataclass(frozen=True)
class RemoteSegment:
    base: str
    topic: str
    topic_id: str
    partition: int
    start_offset: int
    segment_id: str
    end_offset: int = -1
    max_timestamp_ms: int = -1
    #: ``eventTimestampMs`` of the manifest: the broker's clock when it began copying the
    #: segment, after every record of it was appended (-1: not recorded)
    copied_ms: int = -1
    #: bytes of the original ``.log`` (-1: not known)
    size: int = -1

    @property
    def describe(self) -> str:
        end = self.end_offset if self.end_offset >= 0 else "?"
        return f"{self.topic}-{self.partition}@{self.start_offset}..{end} ({self.segment_id})"


def list_topic_segments(
    store: ObjectStore, layout: KeyLayout, topic: str
) -> dict[str, dict[int, list[RemoteSegment]]]:
    """``topic_id -> partition -> complete segments`` (manifest present), by start offset."""
    prefix = layout.prefix if layout.hashed_prefix_chars else f"{layout.prefix}{topic_component(topic)}-"
    out: dict[str, dict[int, list[RemoteSegment]]] = {}
    for obj in store.list(prefix):
        parsed = layout.parse(obj.key)
        if parsed is None or not parsed.is_topic(topic) or parsed.suffix != MANIFEST:
            continue
        seg = RemoteSegment(
            parsed.base,
            parsed.topic,
            parsed.topic_id,
            parsed.partition,
            parsed.start_offset,
            parsed.segment_id,
        )
        out.setdefault(parsed.topic_id, {}).setdefault(parsed.partition, []).append(seg)
    for parts in out.values():
        for segs in parts.values():
            segs.sort(key=lambda s: (s.start_offset, s.segment_id))
    return out


def with_manifest_info(reader: SegmentReader, segments: Iterable[RemoteSegment]) -> list[RemoteSegment]:
    """The segments with end offset and max timestamp from their manifests (parallel GETs).
    Segments whose manifest vanished meanwhile (retention) are dropped."""
    segments = list(segments)

    def one(seg: RemoteSegment) -> RemoteSegment | None:
        try:
            opened = reader.open_base(seg.base, seg.describe)
        except NotFound:
            return None
        info = opened.manifest.segment or {}
        end, max_ts = info.get("endOffset"), info.get("maxTimestampMs")
        if not isinstance(end, int) or end < seg.start_offset:
            raise DataLoss(
                f"segment {seg.describe}: manifest {seg.base}.{MANIFEST} has no valid "
                f"remoteLogSegmentMetadata.endOffset ({end!r})"
            )
        if not isinstance(max_ts, int):
            raise DataLoss(
                f"segment {seg.describe}: manifest {seg.base}.{MANIFEST} has no "
                f"remoteLogSegmentMetadata.maxTimestampMs"
            )
        copied = info.get("eventTimestampMs")
        copied = copied if isinstance(copied, int) and copied > 0 else -1
        return dataclasses.replace(
            seg,
            end_offset=end,
            max_timestamp_ms=max_ts,
            copied_ms=copied,
            size=opened.manifest.original_size,
        )

    if len(segments) <= 1:
        results = [one(s) for s in segments]
    else:
        with concurrent.futures.ThreadPoolExecutor(min(LIST_THREADS, len(segments))) as pool:
            results = list(pool.map(one, segments))
    return [r for r in results if r is not None]


# ============================================================================ planning


@dataclasses.dataclass(frozen=True)
class SegmentTask:
    """One executor task: emit offsets ``[lo, hi]`` of one segment (JSON on the wire)."""

    index: int
    partition: int
    base: str
    segment_id: str
    start_offset: int
    end_offset: int
    lo: int
    hi: int
    ingest_state: int
    aborted: tuple[tuple[int, int, int, int], ...] = ()  # (pid, first, last, lso)
    describe: str = ""
    ingest_bound: int = -1  # no record of the segment was ingested later (ms; -1: no bound)
    #: a task that ends where the next task of the same segment starts: the running maximum the
    #: driver gave that task, which this task must reach at ``hi`` (None: not split there)
    end_state: int | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SegmentTask:
        d = json.loads(text)
        d["aborted"] = tuple(tuple(a) for a in d["aborted"])
        return cls(**d)

    def aborted_txns(self) -> list[AbortedTxn]:
        return [AbortedTxn(*a) for a in self.aborted]


@dataclasses.dataclass
class PartitionPlan:
    partition: int
    next_offset: int  # from the table's marker
    ingest_state: int
    chain: list[RemoteSegment] = dataclasses.field(default_factory=list)
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

    def ingest_bound(self, seg: RemoteSegment) -> int:
        """The latest time a record of ``seg`` can have been ingested: when the broker began
        copying it (``eventTimestampMs``), else when this plan was made (the segment was
        complete in storage by then)."""
        return seg.copied_ms if seg.copied_ms > 0 else self.planned_ms

    def _state_after(self, state: int, seg: RemoteSegment) -> int:
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
    segments: list[RemoteSegment], next_offset: int, limit: int = 0, earliest: int | None = None
) -> tuple[list[RemoteSegment], list[tuple[int, int]], list[tuple[int, int]], str | None]:
    """Non-overlapping cover of the offsets from ``next_offset`` up.

    Returns ``(chain, ranges, skipped, waiting)``. At each step the segment covering the current
    offset with the highest end offset is taken (ties: the lowest segment id, deterministic);
    its range starts at the current offset. Offsets below the earliest segment in storage
    (``earliest``, default: the earliest of ``segments``) were removed by retention before they
    were converted: they are skipped (reported). A hole above the earliest segment stops the
    plan (the segment is not tiered yet, e.g. a copy being retried): ``waiting`` says so.
    """
    chain: list[RemoteSegment] = []
    ranges: list[tuple[int, int]] = []
    skipped: list[tuple[int, int]] = []
    if not segments:
        return chain, ranges, skipped, None
    if earliest is None:
        earliest = min(s.start_offset for s in segments)
    cur = next_offset
    waiting = None
    while not limit or len(chain) < limit:
        covering = [s for s in segments if s.start_offset <= cur <= s.end_offset]
        if not covering:
            later = [s for s in segments if s.start_offset > cur]
            if not later:
                break
            nxt = min(s.start_offset for s in later)
            if cur < earliest:
                skipped.append((cur, nxt - 1))
                cur = nxt
                continue
            waiting = f"offsets {cur}..{nxt - 1} are not in remote storage (yet)"
            break
        best = max(covering, key=lambda s: (s.end_offset, [-ord(c) for c in s.segment_id]))
        chain.append(best)
        ranges.append((cur, best.end_offset))
        cur = best.end_offset + 1
    return chain, ranges, skipped, waiting


def plan_partition(
    reader: SegmentReader, segments: list[RemoteSegment], next_offset: int, ingest_state: int, limit: int = 0
) -> PartitionPlan:
    """The plan of one partition from its listed segments (sorted by start offset).

    Manifests (end offsets, max timestamps) are read for the segments starting at or after
    ``next_offset`` - the new ones. Only when none of them starts exactly at ``next_offset``
    (a re-upload straddling it, or nothing new) are older segments' manifests read, newest
    first, until one covering ``next_offset`` is found. Then the transaction indexes and producer
    snapshots of the chain are read (:func:`finish_transactions`).
    """
    partition = segments[0].partition if segments else -1
    plan = PartitionPlan(partition, next_offset, ingest_state)
    if not segments:
        return plan
    earliest = segments[0].start_offset
    later = [s for s in segments if s.start_offset >= next_offset]
    if limit:
        later = later[: 2 * limit + 8]
    known = with_manifest_info(reader, later)
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
    finish_transactions(reader, plan)
    return plan


def read_aborted_and_open(
    reader: SegmentReader, seg: RemoteSegment
) -> tuple[list[AbortedTxn], list[int] | None]:
    """(aborted transactions listed in the segment's transaction index, first offsets of the
    transactions open at its end per its producer snapshot - None when it has no snapshot)."""
    opened = reader.open_base(seg.base, seg.describe)
    try:
        aborted = read_txn_index(
            reader.read_index(opened, "transaction"), name=f"{seg.base} (transaction index)"
        )
    except NotFound:
        aborted = []
    try:
        snap = parse_producer_snapshot(
            reader.read_index(opened, "producerSnapshot"), name=f"{seg.base} (producer snapshot)"
        )
        open_first = [e.current_txn_first_offset for e in snap.entries if e.has_open_transaction]
    except NotFound:
        open_first = None
    return aborted, open_first


def finish_transactions(reader: SegmentReader, plan: PartitionPlan) -> None:
    """Read the chain's transaction indexes and producer snapshots; drop the tail of the chain
    whose transactions are not all finished within the chain (they wait for the next run)."""
    if not plan.chain:
        return
    chain = plan.chain
    if len(chain) == 1:
        infos = [read_aborted_and_open(reader, chain[0])]
    else:
        with concurrent.futures.ThreadPoolExecutor(min(LIST_THREADS, len(chain))) as pool:
            infos = list(pool.map(lambda s: read_aborted_and_open(reader, s), chain))
    seen = set()
    aborted = []
    for txns, _ in infos:
        for t in txns:
            key = (t.producer_id, t.first_offset, t.last_offset)
            if key not in seen:
                seen.add(key)
                aborted.append(t)
    aborted.sort(key=lambda t: (t.last_offset, t.first_offset))
    plan.aborted = aborted
    # threshold[j]: every transaction open at chain[j]'s end started after this offset
    thresholds = []
    for _, open_first in infos:
        if open_first is None:
            thresholds.append(-1)  # unknown: proves nothing
        else:
            thresholds.append(min(open_first) - 1 if open_first else 2**63 - 1)
    # chain[i] is complete iff max(thresholds[i:]) >= its end offset; that is a prefix
    suffix = -1
    keep = 0
    for j in range(len(chain) - 1, -1, -1):
        suffix = max(suffix, thresholds[j])
        if suffix >= chain[j].end_offset:
            keep = j + 1
            break
    if keep < len(chain):
        first_open = chain[keep]
        plan.waiting = (
            f"transactions with data in {first_open.describe} or before are still open at "
            f"the end of the tiered segments; converting it once their markers are tiered"
        )
        plan.chain = chain[:keep]
        plan.ranges = plan.ranges[:keep]


# ============================================================================ splitting


def split_points(
    offset_index: list[OffsetPosition],
    time_index: list[TimestampOffset],
    seg: RemoteSegment,
    lo: int,
    hi: int,
    task_bytes: int,
) -> list[tuple[int, int]]:
    """Where to split one segment's range ``[lo, hi]`` into tasks of about ``task_bytes``
    bytes: ``(first offset of the next task, maximum time of the segment's batches before it)``.

    Kafka's ``LogSegment.append`` writes an offset-index entry ``(O, P)`` - ``O`` the last
    offset of the append, ``P`` its first byte - together with ``timeIndex.maybeAppend(max time
    so far, offset of the batch holding it)``, where "so far" includes that append. Every
    time-index entry names a batch at or before its offset, and the entry written at ``O`` (or
    an equal one before it) holds the maximum up to ``O``; so the largest time-index timestamp
    among the entries with offset ``<= O`` is exactly the maximum time of the segment's batches
    up to ``O``, and a task may start at ``O + 1``. Only offset-index entries are split points.
    """
    if task_bytes <= 0 or seg.size <= task_bytes or lo != seg.start_offset:
        return []
    out: list[tuple[int, int]] = []
    t = 0
    prefix = -1
    last_cut = 0
    for e in offset_index:
        while t < len(time_index) and time_index[t].offset <= e.offset:
            prefix = max(prefix, time_index[t].timestamp)
            t += 1
        if e.offset < lo or e.offset >= hi:
            continue
        if e.position - last_cut >= task_bytes and seg.size - e.position >= task_bytes // 2:
            out.append((e.offset + 1, prefix))
            last_cut = e.position
    return out


def split_segments(reader: SegmentReader, plan: PartitionPlan, task_bytes: int) -> list[str]:
    """Fill ``plan.splits`` for the chain segments larger than ``task_bytes`` (their offset and
    time indexes are read: two small ranged GETs each). A segment is left whole when its range
    does not start at its first offset (a straddling re-upload: the records before the range do
    not count for the maximum there), or when its indexes cannot give an exact maximum: no or
    an empty time index, or one whose last entry is not the segment's ``maxTimestampMs`` (a
    broker appends that entry when the segment rolls; without it the index is short). Returns
    why segments were left whole (for the log)."""
    notes: list[str] = []
    if task_bytes <= 0:
        return notes
    for i, (seg, (lo, hi)) in enumerate(zip(plan.chain, plan.ranges)):
        if seg.size <= task_bytes or lo != seg.start_offset:
            continue
        why = None
        try:
            opened = reader.open_base(seg.base, seg.describe)
            offsets = read_offset_index(
                reader.read_index(opened, "offset"), seg.start_offset, name=f"{seg.base} (offset index)"
            )
            times = read_time_index(
                reader.read_index(opened, "timestamp"), seg.start_offset, name=f"{seg.base} (time index)"
            )
        except NotFound as exc:
            why = str(exc)
        except CorruptIndexError as exc:
            why = f"damaged index: {exc}"
        else:
            if not times:
                why = "its time index is empty"
            elif times[-1].timestamp != seg.max_timestamp_ms or times[-1].offset > seg.end_offset:
                why = (
                    f"its time index ends at {times[-1].timestamp} -> {times[-1].offset}, not at the "
                    f"segment's maxTimestampMs {seg.max_timestamp_ms} (short index)"
                )
            else:
                points = split_points(offsets, times, seg, lo, hi, task_bytes)
                if points:
                    plan.splits[i] = points
        if why is not None:
            notes.append(f"{seg.describe} is not split: {why}")
    return notes


# ============================================================================ executors


@dataclasses.dataclass(frozen=True)
class StorageParams:
    """What an executor needs to open the store like the sidecar: the sidecar's configuration
    (parsed TOML file + ``RSM__`` environment overrides) and the reader settings."""

    values: Mapping[str, Any] = dataclasses.field(repr=False)
    environ: Mapping[str, str] = dataclasses.field(repr=False)
    chunk_cache_bytes: int = 24 * 1024 * 1024
    prefetch_bytes: int = 8 * 1024 * 1024

    def cache_key(self) -> str:
        return hashlib.sha256(
            json.dumps(
                [self.values, self.environ, self.chunk_cache_bytes, self.prefetch_bytes],
                sort_keys=True,
                default=str,
            ).encode()
        ).hexdigest()


class ExecutorContext(SegmentAccess):
    """Store, key layout, keyring and segment reader of one executor process."""

    def __init__(self, params: StorageParams):
        cfg = Config(params.values, environ=params.environ, source="the job's sidecar configuration")
        settings = ReaderSettings(
            manifest_cache_bytes=4 * 1024 * 1024,
            index_cache_bytes=8 * 1024 * 1024,
            chunk_cache_bytes=params.chunk_cache_bytes,
            prefetch_bytes=params.prefetch_bytes,
            max_range_bytes=8 * 1024 * 1024,
        )
        prefetch = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rsm-prefetch")
            if params.prefetch_bytes
            else None
        )
        super().__init__(cfg, settings, prefetch=prefetch)


_CONTEXTS: dict[str, ExecutorContext] = {}
_CONTEXT_LOCK = threading.Lock()


def executor_context(params: StorageParams) -> ExecutorContext:
    key = params.cache_key()
    with _CONTEXT_LOCK:
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            ctx = _CONTEXTS[key] = ExecutorContext(params)
        return ctx


def read_task(
    ctx: ExecutorContext, task: SegmentTask, *, max_records: int, max_bytes: int
) -> Iterator[pa.RecordBatch]:
    """Raw record batches of one task (bounded: one Kafka batch + one window at a time)."""
    seg = ctx.reader.open_base(task.base, task.describe)
    size = seg.manifest.original_size
    rows = SegmentRowReader(
        task.partition,
        task.lo,
        task.hi,
        task.aborted_txns(),
        task.ingest_state,
        ingest_bound=task.ingest_bound,
        max_records=max_records,
        max_bytes=max_bytes,
        source=f"{task.base}.log",
    )
    if size == 0:
        return
    pos = offset_position(ctx.reader, seg, task.start_offset, task.lo)
    with StoredLogFile(ctx.reader, seg) as log_file:
        yield from rows.batches(read_batches(log_file, start_position=pos, name=log_file.name))
    if task.end_state is not None and rows.state != task.end_state:
        # the next task of this segment started from the maximum the driver took from the time
        # index; the records disagree: fail the run (nothing is committed) rather than write
        # rows with a wrong ingest_timestamp
        raise DataLoss(
            f"{task.base}: the running maximum of the record times at offset {task.hi} is "
            f"{rows.state}, but the segment's time index gave {task.end_state} to the task "
            f"starting at {task.hi + 1}; convert with iceberg.task_bytes = 0 (no split segments)"
        )


def describe_error(task: SegmentTask, exc: BaseException) -> str:
    return f"segment {task.describe} ({task.base}): {type(exc).__name__}: {exc}"


class SegmentFailed(RsmError):
    """Converting one segment failed; the message names the segment."""
