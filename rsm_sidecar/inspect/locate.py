"""The SEGMENT argument: a segment UUID, an object key (any of the three suffixes, with or
without the key prefix) or ``topic/partition/offset`` (the segment holding that offset)."""

from __future__ import annotations

import re

from rsm_sidecar.errors import NotFound
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.inspect import manifests
from rsm_sidecar.inspect.context import InspectContext, UsageError
from rsm_sidecar.segment import listing
from rsm_sidecar.segment.listing import StoredSegment

_UUID = re.compile(r"^[A-Za-z0-9_-]{22}$")
_TPO = re.compile(r"^(?P<topic>[A-Za-z0-9._-]{1,249})/(?P<partition>\d{1,10})/(?P<offset>\d{1,19})$")

FORMS = "a segment UUID, an object key (.log, .indexes or .rsm-manifest) or topic/partition/offset"


class AmbiguousSegment(UsageError):
    """Several stored copies match (the broker re-uploads the same offsets under a new
    segment id after a failed copy or a leader change)."""

    def __init__(self, message: str, candidates: list[StoredSegment]):
        super().__init__(message)
        self.candidates = candidates


def _no_manifest(seg: StoredSegment) -> NotFound:
    present = ", ".join(sorted(seg.objects))
    return NotFound(
        f"segment {seg.describe} has no manifest {seg.object_key(fkeys.MANIFEST)} (objects present: "
        f"{present}): an incomplete or interrupted upload; see `rsm-sidecar inspect orphans`"
    )


def _by_key(ctx: InspectContext, spec: str) -> StoredSegment | None:
    for candidate in (spec, ctx.layout.prefix + spec):
        for key in (candidate, f"{candidate}.{fkeys.MANIFEST}"):
            parsed = ctx.layout.parse(key)
            if parsed is None:
                continue
            seg = listing.find_segment(ctx.store, ctx.layout, parsed)
            if seg is None:
                raise NotFound(f"no object of segment {parsed.base} exists (looked for {parsed.base}.*)")
            if not seg.has_manifest:
                raise _no_manifest(seg)
            return seg
    return None


def _by_uuid(ctx: InspectContext, segment_id: str) -> StoredSegment:
    found = [
        s
        for s in listing.scan(ctx.store, ctx.layout, strays=False)
        if isinstance(s, StoredSegment) and s.segment_id == segment_id
    ]
    if not found:
        raise NotFound(f"no segment with id {segment_id} under prefix {ctx.layout.prefix!r}")
    with_manifest = [s for s in found if s.has_manifest]
    if not with_manifest:
        raise _no_manifest(found[0])
    if len(with_manifest) > 1:  # the same id under two topic ids: not produced by Kafka, but say so
        raise AmbiguousSegment(
            f"segment id {segment_id} appears {len(with_manifest)} times: "
            + "; ".join(s.base for s in with_manifest),
            with_manifest,
        )
    return with_manifest[0]


def _by_offset(ctx: InspectContext, topic: str, partition: int, offset: int) -> StoredSegment:
    candidates = (
        s for s in listing.segments(ctx.store, ctx.layout, topic, partition) if s.start_offset <= offset
    )
    matches: list[StoredSegment] = []
    for read in manifests.read_manifests(ctx.store, candidates):
        if read.manifest is None:
            continue  # unreadable manifests are reported by ls/verify, not here
        end = (read.manifest.segment or {}).get("endOffset")
        if isinstance(end, int) and read.seg.start_offset <= offset <= end:
            matches.append(read.seg)
    if not matches:
        raise NotFound(f"no tiered segment of {topic}-{partition} holds offset {offset}")
    if len(matches) > 1:
        lines = "\n".join(
            f"  {s.segment_id}  start {s.start_offset}  topic id {s.topic_id}  {s.base}" for s in matches
        )
        raise AmbiguousSegment(
            f"{len(matches)} stored copies of {topic}-{partition} hold offset {offset} "
            f"(the broker re-uploads after a failed copy or a leader change); pass one "
            f"segment UUID:\n{lines}",
            matches,
        )
    return matches[0]


def locate(ctx: InspectContext, spec: str) -> StoredSegment:
    """The segment ``spec`` names; ``NotFound``, ``AmbiguousSegment`` or ``UsageError``."""
    spec = spec.strip()
    seg = _by_key(ctx, spec)
    if seg is not None:
        return seg
    if _UUID.match(spec):
        return _by_uuid(ctx, spec)
    m = _TPO.match(spec)
    if m:
        return _by_offset(ctx, m["topic"], int(m["partition"]), int(m["offset"]))
    raise UsageError(f"SEGMENT {spec!r} is not {FORMS}")
