"""The facts about one segment that `ls` lists and `show` starts with: identity from the
key, offsets and times from the manifest's copy of the segment metadata, sizes from the
chunk index and the listing."""

from __future__ import annotations

import dataclasses
from typing import Any

from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.manifest import SegmentManifest
from rsm_sidecar.inspect.output import iso_ms, ratio
from rsm_sidecar.segment.listing import StoredSegment


@dataclasses.dataclass
class SegmentSummary:
    base: str
    topic: str
    topic_id: str
    partition: int
    segment_id: str
    start_offset: int
    end_offset: int | None  # None: the manifest has no copy of the segment metadata
    max_timestamp_ms: int | None
    event_timestamp_ms: int | None
    broker_id: int | None
    original_bytes: int  # the .log file as the broker wrote it
    stored_log_bytes: int  # the .log object (chunks after compression/encryption)
    stored_bytes: int  # all objects of the segment
    compression: bool
    key_id: str | None
    chunks: int
    chunk_size: int
    writer: str | None

    @property
    def compression_ratio(self) -> float | None:
        """Original .log bytes over stored .log bytes."""
        return ratio(self.original_bytes, self.stored_log_bytes)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["max_timestamp"] = iso_ms(self.max_timestamp_ms)
        d["compression_ratio"] = self.compression_ratio
        return d

    def describe(self) -> str:
        end = "?" if self.end_offset is None else self.end_offset
        return f"{self.topic}-{self.partition}@{self.start_offset}..{end} ({self.segment_id})"


def _int_or_none(doc: dict | None, name: str) -> int | None:
    v = (doc or {}).get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def summarize(
    seg: StoredSegment, manifest: SegmentManifest, manifest_size: int | None = None
) -> SegmentSummary:
    md = manifest.segment
    stored = seg.stored_bytes
    if manifest_size is not None and fkeys.MANIFEST not in seg.objects:
        stored += manifest_size
    log_obj = seg.object_size(fkeys.LOG)
    return SegmentSummary(
        base=seg.base,
        topic=seg.topic,
        topic_id=seg.topic_id,
        partition=seg.partition,
        segment_id=seg.segment_id,
        start_offset=_or(_int_or_none(md, "startOffset"), seg.start_offset),
        end_offset=_int_or_none(md, "endOffset"),
        max_timestamp_ms=_int_or_none(md, "maxTimestampMs"),
        event_timestamp_ms=_int_or_none(md, "eventTimestampMs"),
        broker_id=_int_or_none(md, "brokerId"),
        original_bytes=manifest.original_size,
        stored_log_bytes=log_obj if log_obj is not None else manifest.stored_log_size,
        stored_bytes=stored,
        compression=manifest.compression,
        key_id=manifest.key_id,
        chunks=manifest.chunk_index.chunk_count,
        chunk_size=manifest.chunk_index.original_chunk_size,
        writer=manifest.writer,
    )
