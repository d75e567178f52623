"""The segments in the store, from one listing: objects grouped by segment (the three
keys of a segment share their base), and the objects outside the key layout.

A listing is sorted by key and the keys of one segment all start with ``<base>.``, so
they are adjacent: grouping streams, holding one segment at a time."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from rsm_sidecar.errors import RsmError
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.keys import KeyLayout, ParsedKey
from rsm_sidecar.format.manifest import SegmentManifest
from rsm_sidecar.inspect.parallel import ordered_map
from rsm_sidecar.storage.base import ObjectInfo, ObjectStore


@dataclasses.dataclass
class SegmentObjects:
    """The objects of one segment found by a listing (one to three of them)."""

    key: ParsedKey
    objects: dict[str, ObjectInfo] = dataclasses.field(default_factory=dict)

    @property
    def base(self) -> str:
        return self.key.base

    @property
    def has_manifest(self) -> bool:
        return fkeys.MANIFEST in self.objects

    @property
    def stored_bytes(self) -> int:
        return sum(o.size for o in self.objects.values())

    def size(self, suffix: str) -> int | None:
        o = self.objects.get(suffix)
        return None if o is None else o.size

    def describe(self) -> str:
        k = self.key
        return f"{k.topic}-{k.partition}@{k.start_offset} ({k.segment_id})"

    @property
    def sort_key(self) -> tuple:
        k = self.key
        return (k.topic, k.topic_id, k.partition, k.start_offset, k.segment_id)


@dataclasses.dataclass(frozen=True)
class StrayObject:
    """An object under the key prefix whose key is not a segment key."""

    info: ObjectInfo


def list_prefix(layout: KeyLayout, topic: str | None) -> str:
    """The narrowest listing prefix that finds every segment of ``topic`` (all topics
    when None). With a hashed prefix the topic is not at the start of the key."""
    if topic is None or layout.hashed_prefix_chars:
        return layout.topic_list_prefix()
    return f"{layout.prefix}{fkeys.topic_component(topic)}-"


def scan(
    store: ObjectStore,
    layout: KeyLayout,
    topic: str | None = None,
    partition: int | None = None,
    strays: bool = True,
) -> Iterator[SegmentObjects | StrayObject]:
    """Segments (and, unless filtering by topic/partition or ``strays=False``, objects
    outside the layout) in listing order."""
    filtering = topic is not None or partition is not None
    current: SegmentObjects | None = None
    for info in store.list(list_prefix(layout, topic)):
        parsed = layout.parse(info.key)
        if parsed is None:
            if strays and not filtering:
                yield StrayObject(info)
            continue
        if (topic is not None and not parsed.is_topic(topic)) or (
            partition is not None and parsed.partition != partition
        ):
            continue
        if current is not None and current.base != parsed.base:
            yield current
            current = None
        if current is None:
            current = SegmentObjects(parsed)
        current.objects[parsed.suffix] = info
    if current is not None:
        yield current


def segments(
    store: ObjectStore, layout: KeyLayout, topic: str | None = None, partition: int | None = None
) -> Iterator[SegmentObjects]:
    """Segments that exist: those with a manifest (the manifest is written last)."""
    for item in scan(store, layout, topic, partition, strays=False):
        if isinstance(item, SegmentObjects) and item.has_manifest:
            yield item


def read_manifest(store: ObjectStore, base: str) -> tuple[bytes, SegmentManifest]:
    """The manifest's bytes and its parsed, verified form (``DataLoss`` names the key)."""
    key = f"{base}.{fkeys.MANIFEST}"
    raw = store.get(key)
    return raw, SegmentManifest.from_bytes(raw, key)


@dataclasses.dataclass
class ManifestRead:
    seg: SegmentObjects
    raw: bytes | None = None
    manifest: SegmentManifest | None = None
    error: Exception | None = None


def read_manifests(store: ObjectStore, segs, workers: int = 8) -> Iterator[ManifestRead]:
    """``read_manifest`` for each segment, ``workers`` GETs in flight (sequential small
    GETs of thousands of manifests would take minutes), results in input order. Errors
    are returned in ``ManifestRead.error``, not raised."""

    def one(seg: SegmentObjects) -> ManifestRead:
        try:
            raw, manifest = read_manifest(store, seg.base)
            return ManifestRead(seg, raw, manifest)
        except RsmError as e:
            return ManifestRead(seg, error=e)
        except Exception as e:  # a manifest corrupt in a way the parser does not name
            return ManifestRead(
                seg, error=RsmError(f"{seg.base}.{fkeys.MANIFEST}: unexpected {type(e).__name__}: {e}")
            )

    return ordered_map(one, segs, workers)
