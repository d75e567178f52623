"""Driver, step 1 of planning: the topic's tiered segments as object storage lists them, with
what their manifests say.

The listing is :mod:`rsm_sidecar.segment.listing`'s: :func:`list_topic_segments` lists the
object store once and keeps the segments whose manifest exists (the manifest is written last,
so those are complete), by topic id and partition; :func:`list_partition_segments` lists one
partition, optionally only from an offset on (a LIST that starts after that key: what a
follow-mode round needs, whatever the partition already holds). :func:`with_manifest_info`
reads the manifests the plan needs (offsets, sizes, timestamps).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterable

from rsm_sidecar.errors import DataLoss, NotFound
from rsm_sidecar.format.keys import MANIFEST
from rsm_sidecar.segment.listing import StoredSegment
from rsm_sidecar.segment.reader import OpenSegment, SegmentReader

LIST_THREADS = 16


def with_manifest_info(
    reader: SegmentReader,
    segments: Iterable[StoredSegment],
    on_open: Callable[[StoredSegment, OpenSegment], None] | None = None,
) -> list[StoredSegment]:
    """The segments with end offset and max timestamp from their manifests (parallel GETs).
    Segments whose manifest vanished meanwhile (retention) are dropped. ``on_open`` is called
    with each segment opened, while its manifest is at hand (the manifest cache holds a few
    thousand: reading what else the plan needs of a segment later would load it again)."""
    segments = list(segments)

    def one(seg: StoredSegment) -> StoredSegment | None:
        try:
            opened = reader.open_base(seg.base, seg.describe)
            if on_open is not None:
                on_open(seg, opened)
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
