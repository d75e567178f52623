"""Driver, step 4 of planning: segments larger than ``iceberg.task_bytes`` become several tasks.

Cuts are made right after the broker's own offset-index entries. Each piece starts from the exact
running maximum of ``ingest_timestamp`` before it, taken from the segment's time index: Kafka's
``LogSegment.append`` writes the time-index entry (the maximum including that append) together
with the offset-index entry, so the largest time-index timestamp at or before a cut is the
maximum before it. A segment whose cut cannot be exact (straddling re-upload; a missing, empty
or short time index) stays whole, and the note returned says why.
"""

from __future__ import annotations

from rsm_sidecar.errors import NotFound
from rsm_sidecar.iceberg.planning.chains import PartitionPlan
from rsm_sidecar.kafka import read_offset_index, read_time_index
from rsm_sidecar.kafka.errors import CorruptIndexError
from rsm_sidecar.kafka.indexes import OffsetPosition, TimestampOffset
from rsm_sidecar.segment.listing import StoredSegment
from rsm_sidecar.segment.reader import SegmentReader


def entry_maxima(offset_index: list[OffsetPosition], time_index: list[TimestampOffset]) -> list[int]:
    """For each offset-index entry ``O``: the maximum time of the segment's batches up to ``O``
    (-1: none), the largest time-index timestamp among the entries at or before ``O`` (why that
    is exact: :func:`split_points`)."""
    out: list[int] = []
    t = 0
    prefix = -1
    for e in offset_index:
        while t < len(time_index) and time_index[t].offset <= e.offset:
            prefix = max(prefix, time_index[t].timestamp)
            t += 1
        out.append(prefix)
    return out


def split_points(
    offset_index: list[OffsetPosition],
    time_index: list[TimestampOffset],
    seg: StoredSegment,
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
    last_cut = 0
    for e, prefix in zip(offset_index, entry_maxima(offset_index, time_index)):
        if e.offset < lo or e.offset >= hi:
            continue
        if e.position - last_cut >= task_bytes and seg.size - e.position >= task_bytes // 2:
            out.append((e.offset + 1, prefix))
            last_cut = e.position
    return out


def exact_indexes(
    reader: SegmentReader, seg: StoredSegment
) -> tuple[list[OffsetPosition], list[TimestampOffset]] | str:
    """The segment's offset and time indexes (two small ranged GETs) when they give the exact
    running maximum of its record times at every offset-index entry (see :func:`split_points`),
    else why not: no index, a damaged one, an empty time index, or one whose last entry is not
    the segment's ``maxTimestampMs`` (a broker appends that entry when the segment rolls;
    without it the index is short)."""
    try:
        opened = reader.open_base(seg.base, seg.describe)
        offsets = read_offset_index(
            reader.read_index(opened, "offset"), seg.start_offset, name=f"{seg.base} (offset index)"
        )
        times = read_time_index(
            reader.read_index(opened, "timestamp"), seg.start_offset, name=f"{seg.base} (time index)"
        )
    except NotFound as exc:
        return str(exc)
    except CorruptIndexError as exc:
        return f"damaged index: {exc}"
    if not times:
        return "its time index is empty"
    if times[-1].timestamp != seg.max_timestamp_ms or times[-1].offset > seg.end_offset:
        return (
            f"its time index ends at {times[-1].timestamp} -> {times[-1].offset}, not at the "
            f"segment's maxTimestampMs {seg.max_timestamp_ms} (short index)"
        )
    return offsets, times


def split_segments(reader: SegmentReader, plan: PartitionPlan, task_bytes: int) -> list[str]:
    """Fill ``plan.splits`` for the chain segments larger than ``task_bytes``. A segment is left
    whole when its range does not start at its first offset (a straddling re-upload: the
    records before the range do not count for the maximum there), or when its indexes cannot
    give an exact maximum (:func:`exact_indexes`). Returns why segments were left whole (for
    the log)."""
    notes: list[str] = []
    if task_bytes <= 0:
        return notes
    for i, (seg, (lo, hi)) in enumerate(zip(plan.chain, plan.ranges)):
        if seg.size <= task_bytes or lo != seg.start_offset:
            continue
        indexes = exact_indexes(reader, seg)
        if isinstance(indexes, str):
            notes.append(f"{seg.describe} is not split: {indexes}")
            continue
        points = split_points(*indexes, seg, lo, hi, task_bytes)
        if points:
            plan.splits[i] = points
    return notes
