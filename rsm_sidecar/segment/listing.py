"""The segments in the store, from one listing: the one record of a stored segment
(``StoredSegment``) that the inspection tools and the Iceberg jobs both use.

A listing is sorted by key and the keys of one segment all start with ``<base>.``, so they are
adjacent: grouping streams, holding one segment at a time. A segment exists once its manifest
does (the manifest is written last): :func:`segments`, :func:`list_topic_segments` and
:func:`list_partition_segments` give those; :func:`scan` also gives the incomplete ones and the
objects outside the key layout."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping

from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.keys import KeyLayout, ParsedKey
from rsm_sidecar.storage.base import ObjectInfo, ObjectStore


@dataclasses.dataclass(frozen=True)
class StoredSegment:
    """One segment as a listing finds it: where it is (its key's fields; ``topic`` as keys spell
    it, long names shortened), which of its three objects are there (``objects``, by suffix) and,
    once its manifest is read, what the manifest says of it (-1: not read)."""

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
    objects: Mapping[str, ObjectInfo] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of_key(cls, key: ParsedKey, objects: Mapping[str, ObjectInfo] | None = None) -> StoredSegment:
        return cls(
            key.base,
            key.topic,
            key.topic_id,
            key.partition,
            key.start_offset,
            key.segment_id,
            objects=objects or {},
        )

    def is_topic(self, name: str) -> bool:
        """Whether this segment belongs to topic ``name`` (long names are shortened in keys)."""
        return self.topic == fkeys.topic_component(name)

    def object_key(self, suffix: str) -> str:
        return f"{self.base}.{suffix}"

    @property
    def has_manifest(self) -> bool:
        return fkeys.MANIFEST in self.objects

    @property
    def stored_bytes(self) -> int:
        return sum(o.size for o in self.objects.values())

    def object_size(self, suffix: str) -> int | None:
        o = self.objects.get(suffix)
        return None if o is None else o.size

    @property
    def describe(self) -> str:
        end = f"..{self.end_offset}" if self.end_offset >= 0 else ""
        return f"{self.topic}-{self.partition}@{self.start_offset}{end} ({self.segment_id})"

    @property
    def sort_key(self) -> tuple[str, str, int, int, str]:
        return (self.topic, self.topic_id, self.partition, self.start_offset, self.segment_id)


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
) -> Iterator[StoredSegment | StrayObject]:
    """Segments, complete or not (and, unless filtering by topic/partition or ``strays=False``,
    objects outside the layout) in listing order."""

    def wanted(key: ParsedKey) -> bool:
        return (topic is None or key.is_topic(topic)) and (partition is None or key.partition == partition)

    filtering = topic is not None or partition is not None
    return _grouped(store.list(list_prefix(layout, topic)), layout, wanted, strays and not filtering)


def segments(
    store: ObjectStore, layout: KeyLayout, topic: str | None = None, partition: int | None = None
) -> Iterator[StoredSegment]:
    """Segments that exist: those with a manifest (the manifest is written last), in listing
    order."""
    for item in scan(store, layout, topic, partition, strays=False):
        if isinstance(item, StoredSegment) and item.has_manifest:
            yield item


def list_topic_segments(
    store: ObjectStore, layout: KeyLayout, topic: str
) -> dict[str, dict[int, list[StoredSegment]]]:
    """``topic_id -> partition -> segments that exist``, by start offset."""
    out: dict[str, dict[int, list[StoredSegment]]] = {}
    for seg in segments(store, layout, topic):
        out.setdefault(seg.topic_id, {}).setdefault(seg.partition, []).append(seg)
    for parts in out.values():
        for segs in parts.values():
            segs.sort(key=_by_offset)
    return out


def list_partition_segments(
    store: ObjectStore, layout: KeyLayout, topic: str, topic_id: str, partition: int, from_offset: int = 0
) -> list[StoredSegment]:
    """The segments of one partition that exist, by start offset; with ``from_offset``, only
    those starting at or after it, listed from that key on (keys are
    ``<20-digit start offset>-<segment id>.<suffix>``, so the listing starts right there)."""
    directory = layout.partition_directory(topic, topic_id, partition)
    start_after = f"{directory}{from_offset:020d}" if from_offset > 0 else None
    found = _grouped(store.list(directory, start_after), layout, lambda k: k.partition == partition, False)
    return sorted((s for s in found if isinstance(s, StoredSegment) and s.has_manifest), key=_by_offset)


def find_segment(store: ObjectStore, layout: KeyLayout, key: ParsedKey) -> StoredSegment | None:
    """The objects of the segment that ``key`` names, complete or not (None: none exists)."""
    found = _grouped(store.list(key.base + "."), layout, lambda k: k.base == key.base, False)
    return next((s for s in found if isinstance(s, StoredSegment)), None)


def _by_offset(seg: StoredSegment) -> tuple[int, str]:
    return (seg.start_offset, seg.segment_id)


def _grouped(
    infos: Iterable[ObjectInfo], layout: KeyLayout, wanted: Callable[[ParsedKey], bool], strays: bool
) -> Iterator[StoredSegment | StrayObject]:
    """The listed objects grouped by segment (adjacent in a listing), those of segments not
    ``wanted`` left out, objects outside the layout as ``StrayObject`` when ``strays``."""
    key: ParsedKey | None = None
    objects: dict[str, ObjectInfo] = {}
    for info in infos:
        parsed = layout.parse(info.key)
        if parsed is None:
            if strays:
                yield StrayObject(info)
            continue
        if not wanted(parsed):
            continue
        if key is not None and key.base != parsed.base:
            yield StoredSegment.of_key(key, objects)
            objects = {}
        key = parsed
        objects[parsed.suffix] = info
    if key is not None:
        yield StoredSegment.of_key(key, objects)
