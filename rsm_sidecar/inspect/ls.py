"""`inspect ls`: the segments in the store, one line each."""

from __future__ import annotations

import dataclasses
from typing import Any

from rsm_sidecar.inspect import manifests
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.output import fmt_ratio, human_bytes, iso_ms, table
from rsm_sidecar.inspect.progress import Progress
from rsm_sidecar.inspect.summary import SegmentSummary, summarize
from rsm_sidecar.segment import listing


@dataclasses.dataclass
class LsResult:
    segments: list[SegmentSummary]
    errors: list[dict[str, str]]

    def to_json(self) -> dict[str, Any]:
        return {
            "segments": [s.to_json() for s in self.segments],
            "errors": self.errors,
            "summary": {
                "segments": len(self.segments),
                "errors": len(self.errors),
                "original_bytes": sum(s.original_bytes for s in self.segments),
                "stored_bytes": sum(s.stored_bytes for s in self.segments),
            },
        }


def run(
    ctx: InspectContext,
    topic: str | None = None,
    partition: int | None = None,
    progress: Progress | None = None,
) -> LsResult:
    out: list[SegmentSummary] = []
    errors: list[dict[str, str]] = []
    segs = listing.segments(ctx.store, ctx.layout, topic, partition)
    for read in manifests.read_manifests(ctx.store, segs):
        if progress:
            progress.advance()
        if read.manifest is None:
            errors.append({"segment": read.seg.base, "error": str(read.error)})
            continue
        out.append(summarize(read.seg, read.manifest))
    if progress:
        progress.done()
    out.sort(key=lambda s: (s.topic, s.topic_id, s.partition, s.start_offset, s.segment_id))
    return LsResult(out, errors)


HEADERS = (
    "TOPIC",
    "PART",
    "START",
    "END",
    "MAX_TIMESTAMP",
    "ORIGINAL",
    "STORED",
    "RATIO",
    "KEY_ID",
    "CHUNKS",
    "SEGMENT_ID",
)


def print_table(result: LsResult) -> None:
    rows = [
        (
            s.topic,
            s.partition,
            s.start_offset,
            s.end_offset,
            iso_ms(s.max_timestamp_ms),
            human_bytes(s.original_bytes),
            human_bytes(s.stored_bytes),
            fmt_ratio(s.compression_ratio),
            s.key_id or "(none)",
            s.chunks,
            s.segment_id,
        )
        for s in result.segments
    ]
    table(HEADERS, rows, right=(1, 2, 3, 5, 6, 7, 9))
    total_o = sum(s.original_bytes for s in result.segments)
    total_s = sum(s.stored_bytes for s in result.segments)
    print(
        f"{len(result.segments)} segments, {human_bytes(total_o)} original, {human_bytes(total_s)} stored"
        + (f", {len(result.errors)} unreadable" if result.errors else "")
    )
