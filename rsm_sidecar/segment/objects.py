"""The three objects of a stored segment: their keys, which copy attempt wrote them,
and deleting them."""

from __future__ import annotations

from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.manifest import SegmentManifest
from rsm_sidecar.storage.base import ObjectNotFound, ObjectStore

#: ``manifest_attempt`` when the segment has no manifest
NO_MANIFEST = "<none>"


def object_keys(base: str) -> dict[str, str]:
    return {suffix: f"{base}.{suffix}" for suffix in fkeys.SUFFIXES}


def delete_segment_objects(store: ObjectStore, base: str) -> None:
    """Delete one segment's objects, the manifest first so that a half-deleted segment
    is never readable. Idempotent."""
    store.delete(f"{base}.{fkeys.MANIFEST}")
    delete_data_objects(store, base)


def delete_data_objects(store: ObjectStore, base: str) -> None:
    """Delete the ``.log`` and ``.indexes`` objects (when no manifest refers to them)."""
    store.delete_many([f"{base}.{fkeys.INDEXES}", f"{base}.{fkeys.LOG}"])


def manifest_attempt(store: ObjectStore, base: str) -> str | None:
    """The copy attempt recorded in the segment's manifest: ``NO_MANIFEST`` when there
    is none, None when the manifest records none (another writer, an older version).
    Raises ``DataLoss`` for a corrupt manifest and storage errors as they come."""
    key = f"{base}.{fkeys.MANIFEST}"
    try:
        raw = store.get(key)
    except ObjectNotFound:
        return NO_MANIFEST
    return SegmentManifest.from_bytes(raw, key).attempt
