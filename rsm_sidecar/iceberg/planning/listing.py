"""Driver, step 1 of planning: the topic's tiered segments as object storage lists them.

:func:`list_topic_segments` lists the object store once and keeps the segments whose manifest
exists (the manifest is written last, so those are complete), by topic id and partition.
:func:`list_partition_segments` lists one partition, optionally only from an offset on (a LIST
that starts after that key: what a follow-mode round needs, whatever the partition already
holds). :func:`with_manifest_info` reads the manifests the plan needs (offsets, sizes,
timestamps).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Iterable

from rsm_sidecar.errors import DataLoss, NotFound
from rsm_sidecar.format.keys import MANIFEST, KeyLayout, topic_component
from rsm_sidecar.segment.reader import OpenSegment, SegmentReader
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


def list_partition_segments(
    store: ObjectStore, layout: KeyLayout, topic: str, topic_id: str, partition: int, from_offset: int = 0
) -> list[RemoteSegment]:
    """The complete segments of one partition (manifest present) by start offset; with
    ``from_offset``, only those starting at or after it, listed from that key on (keys are
    ``<20-digit start offset>-<segment id>.<suffix>``, so the listing starts right there)."""
    directory = (
        f"{layout.partition_prefix(topic_id, partition)}{topic_component(topic)}-{topic_id}/{partition}/"
    )
    start_after = f"{directory}{from_offset:020d}" if from_offset > 0 else None
    out = []
    for obj in store.list(directory, start_after):
        parsed = layout.parse(obj.key)
        if parsed is None or parsed.suffix != MANIFEST or parsed.partition != partition:
            continue
        out.append(
            RemoteSegment(
                parsed.base,
                parsed.topic,
                parsed.topic_id,
                parsed.partition,
                parsed.start_offset,
                parsed.segment_id,
            )
        )
    out.sort(key=lambda s: (s.start_offset, s.segment_id))
    return out


def with_manifest_info(
    reader: SegmentReader,
    segments: Iterable[RemoteSegment],
    on_open: Callable[[RemoteSegment, OpenSegment], None] | None = None,
) -> list[RemoteSegment]:
    """The segments with end offset and max timestamp from their manifests (parallel GETs).
    Segments whose manifest vanished meanwhile (retention) are dropped. ``on_open`` is called
    with each segment opened, while its manifest is at hand (the manifest cache holds a few
    thousand: reading what else the plan needs of a segment later would load it again)."""
    segments = list(segments)

    def one(seg: RemoteSegment) -> RemoteSegment | None:
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
