"""`inspect orphans`: objects that belong to no segment.

* a ``.log`` or ``.indexes`` whose ``.rsm-manifest`` is missing: a copy that was killed
  before it wrote the manifest (or failed and could not clean up), or a delete that
  stopped after removing the manifest;
* a manifest whose ``.log`` is missing (a segment deleted while something re-wrote its
  manifest);
* an object under the key prefix that is not a segment key at all.

A copy in progress looks exactly like the first case until its manifest lands, so
objects younger than the age guard (``--older-than``, default 1 hour) are listed but
never deleted. Deleting uses ``delete_many`` (a missing key is fine)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from rsm_sidecar.durations import format_duration
from rsm_sidecar.errors import RsmError
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.inspect import listing
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.listing import SegmentObjects, StrayObject
from rsm_sidecar.inspect.output import human_bytes, table
from rsm_sidecar.storage.base import ObjectInfo

DEFAULT_MIN_AGE_SECONDS = 3600.0
NO_MANIFEST, NO_DATA, OUTSIDE_LAYOUT = "no-manifest", "manifest-without-data", "outside-layout"


@dataclasses.dataclass
class Orphan:
    key: str
    size: int
    last_modified: datetime.datetime
    age_seconds: float
    reason: str
    action: str = "listed"  # listed | deleted | kept-too-young | delete-failed

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["last_modified"] = self.last_modified.isoformat()
        d["age_seconds"] = round(self.age_seconds, 1)
        return d


def _orphans_of(item) -> list[tuple[ObjectInfo, str]]:
    if isinstance(item, StrayObject):
        return [(item.info, OUTSIDE_LAYOUT)]
    seg: SegmentObjects = item
    if not seg.has_manifest:
        return [(o, NO_MANIFEST) for o in seg.objects.values()]
    if fkeys.LOG not in seg.objects:
        return [(o, NO_DATA) for o in seg.objects.values()]
    return []


def run(
    ctx: InspectContext,
    min_age_seconds: float = DEFAULT_MIN_AGE_SECONDS,
    delete: bool = False,
    now: datetime.datetime | None = None,
    progress=None,
) -> tuple[list[Orphan], list[dict[str, str]]]:
    now = now or datetime.datetime.now(datetime.UTC)
    found: list[Orphan] = []
    errors: list[dict[str, str]] = []
    for item in listing.scan(ctx.store, ctx.layout):
        if progress:
            progress.advance()
        for info, reason in _orphans_of(item):
            age = (now - info.last_modified).total_seconds()
            found.append(Orphan(info.key, info.size, info.last_modified, age, reason))
    if progress:
        progress.done()
    if delete:
        for o in found:
            if o.age_seconds < min_age_seconds:
                o.action = "kept-too-young"
                continue
            try:
                ctx.store.delete_many([o.key])
                o.action = "deleted"
            except RsmError as e:
                o.action = "delete-failed"
                errors.append({"object": o.key, "error": str(e)})
    return found, errors


def print_table(orphans: list[Orphan], min_age_seconds: float, delete: bool) -> None:
    if not orphans:
        print("no orphaned objects")
        return
    table(
        ("KEY", "SIZE", "AGE", "REASON", "ACTION"),
        [(o.key, human_bytes(o.size), format_duration(o.age_seconds), o.reason, o.action) for o in orphans],
        right=(1, 2),
    )
    young = sum(1 for o in orphans if o.age_seconds < min_age_seconds)
    line = f"{len(orphans)} orphaned objects, {human_bytes(sum(o.size for o in orphans))}"
    if delete:
        line += f"; {sum(1 for o in orphans if o.action == 'deleted')} deleted"
    if young:
        line += (
            f"; {young} younger than {format_duration(min_age_seconds)} "
            f"{'kept' if delete else 'would be kept'} (possibly a copy in progress)"
        )
    print(line)
