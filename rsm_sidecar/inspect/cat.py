"""`inspect cat`: the original ``.log`` bytes of a segment (or a byte range of it), as the
broker would receive them from a fetch, streamed chunk by chunk."""

from __future__ import annotations

from typing import BinaryIO

from rsm_sidecar.inspect.context import InspectContext, UsageError
from rsm_sidecar.inspect.progress import Progress
from rsm_sidecar.segment.listing import StoredSegment


def byte_range(size: int, start: int | None, end: int | None) -> tuple[int, int]:
    """``[start, end]`` inclusive, as in ``fetchLogSegment``; ``end`` is clamped to the
    segment, ``end < start`` is an empty range only when ``start`` is the size."""
    start = 0 if start is None else start
    last = size - 1 if end is None else min(end, size - 1)
    if start < 0 or (end is not None and end < 0):
        raise UsageError(f"--start/--end must not be negative (got {start}, {end})")
    if start > size:
        raise UsageError(f"--start {start} is beyond the end of the {size}-byte segment")
    if end is not None and end < start:
        raise UsageError(f"--end {end} is before --start {start} (the range is inclusive)")
    return start, last


def run(
    ctx: InspectContext,
    seg: StoredSegment,
    out: BinaryIO,
    start: int | None = None,
    end: int | None = None,
    progress: Progress | None = None,
) -> dict:
    """Write the bytes to ``out``; return what was written."""
    opened = ctx.reader.open_base(seg.base, seg.describe)
    size = opened.manifest.original_size
    first, last = byte_range(size, start, end)
    written = 0
    if first <= last:
        for piece in ctx.reader.read(opened, first, last):
            out.write(piece)
            written += len(piece)
            if progress:
                progress.add_bytes(len(piece))
    out.flush()
    if progress:
        progress.done()
    return {"segment": seg.base, "segment_bytes": size, "start": first, "end": last, "bytes": written}
