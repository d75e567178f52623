"""`inspect du`: bytes stored per topic and partition, from one listing (no object is read)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.output import human_bytes, table
from rsm_sidecar.segment import listing
from rsm_sidecar.segment.listing import StoredSegment, StrayObject


@dataclasses.dataclass
class Usage:
    segments: int = 0  # segments with a manifest
    incomplete: int = 0  # segment keys without a manifest (see `orphans`)
    objects: int = 0
    log_bytes: int = 0
    indexes_bytes: int = 0
    manifest_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.log_bytes + self.indexes_bytes + self.manifest_bytes

    def add(self, seg: StoredSegment) -> None:
        if seg.has_manifest:
            self.segments += 1
        else:
            self.incomplete += 1
        self.objects += len(seg.objects)
        self.log_bytes += seg.object_size(fkeys.LOG) or 0
        self.indexes_bytes += seg.object_size(fkeys.INDEXES) or 0
        self.manifest_bytes += seg.object_size(fkeys.MANIFEST) or 0

    def merge(self, other: Usage) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total_bytes": self.total_bytes}


@dataclasses.dataclass
class DuResult:
    partitions: dict[tuple[str, str, int], Usage]
    outside_layout_objects: int = 0
    outside_layout_bytes: int = 0

    def topics(self) -> dict[tuple[str, str], Usage]:
        out: dict[tuple[str, str], Usage] = {}
        for (topic, topic_id, _), u in self.partitions.items():
            out.setdefault((topic, topic_id), Usage()).merge(u)
        return out

    def total(self) -> Usage:
        t = Usage()
        for u in self.partitions.values():
            t.merge(u)
        return t

    def to_json(self) -> dict[str, Any]:
        return {
            "partitions": [
                {"topic": t, "topic_id": tid, "partition": p, **u.to_json()}
                for (t, tid, p), u in sorted(self.partitions.items())
            ],
            "topics": [
                {"topic": t, "topic_id": tid, **u.to_json()} for (t, tid), u in sorted(self.topics().items())
            ],
            "outside_layout": {"objects": self.outside_layout_objects, "bytes": self.outside_layout_bytes},
            "total": {
                **self.total().to_json(),
                "total_bytes": self.total().total_bytes + self.outside_layout_bytes,
            },
        }


def run(ctx: InspectContext, topic: str | None = None, progress=None) -> DuResult:
    result = DuResult({})
    for item in listing.scan(ctx.store, ctx.layout, topic):
        if isinstance(item, StrayObject):
            result.outside_layout_objects += 1
            result.outside_layout_bytes += item.info.size
            continue
        result.partitions.setdefault((item.topic, item.topic_id, item.partition), Usage()).add(item)
        if progress:
            progress.advance()
    if progress:
        progress.done()
    return result


def print_table(result: DuResult) -> None:
    rows: list[tuple[object, ...]] = []
    topics = result.topics()
    by_topic: dict[tuple[str, str], list[tuple[int, Usage]]] = {}
    for (pt, ptid, p), u in sorted(result.partitions.items()):
        by_topic.setdefault((pt, ptid), []).append((p, u))
    for (t, tid), tu in sorted(topics.items()):
        for p, u in by_topic.get((t, tid), []):  # grouped once, not topics x partitions
            rows.append(
                (
                    t,
                    tid,
                    p,
                    u.segments,
                    u.incomplete or "",
                    human_bytes(u.log_bytes),
                    human_bytes(u.indexes_bytes),
                    human_bytes(u.manifest_bytes),
                    human_bytes(u.total_bytes),
                )
            )
        rows.append(
            (
                t,
                tid,
                "all",
                tu.segments,
                tu.incomplete or "",
                human_bytes(tu.log_bytes),
                human_bytes(tu.indexes_bytes),
                human_bytes(tu.manifest_bytes),
                human_bytes(tu.total_bytes),
            )
        )
    table(
        ("TOPIC", "TOPIC_ID", "PART", "SEGMENTS", "INCOMPLETE", "LOG", "INDEXES", "MANIFESTS", "TOTAL"),
        rows,
        right=(2, 3, 4, 5, 6, 7, 8),
    )
    total = result.total()
    objects = total.objects + result.outside_layout_objects
    line = f"total {human_bytes(total.total_bytes + result.outside_layout_bytes)} in {objects} objects"
    if result.outside_layout_objects:
        line += (
            f" ({result.outside_layout_objects} objects, {human_bytes(result.outside_layout_bytes)} outside "
            f"the key layout: see `inspect orphans`)"
        )
    print(line)
