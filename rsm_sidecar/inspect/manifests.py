"""The manifests of listed segments (:mod:`rsm_sidecar.segment.listing`), as the inspection
tools read them: the raw bytes too (``show``, ``rekey``, ``seal``), many at once (``ls``,
``locate``), a segment whose manifest cannot be read reported, not raised."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from rsm_sidecar.errors import RsmError
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.manifest import SegmentManifest
from rsm_sidecar.inspect.parallel import ordered_map
from rsm_sidecar.segment.listing import StoredSegment
from rsm_sidecar.storage.base import ObjectStore


def read_manifest(store: ObjectStore, base: str) -> tuple[bytes, SegmentManifest]:
    """The manifest's bytes and its parsed, verified form (``DataLoss`` names the key)."""
    key = f"{base}.{fkeys.MANIFEST}"
    raw = store.get(key)
    return raw, SegmentManifest.from_bytes(raw, key)


@dataclasses.dataclass
class ManifestRead:
    seg: StoredSegment
    raw: bytes | None = None
    manifest: SegmentManifest | None = None
    error: Exception | None = None


def read_manifests(store: ObjectStore, segs, workers: int = 8) -> Iterator[ManifestRead]:
    """``read_manifest`` for each segment, ``workers`` GETs in flight (sequential small
    GETs of thousands of manifests would take minutes), results in input order. Errors
    are returned in ``ManifestRead.error``, not raised."""

    def one(seg: StoredSegment) -> ManifestRead:
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
