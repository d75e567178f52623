"""`inspect rekey`: re-wrap every segment's data key under the active key id.

Only the manifest changes: the data key (DEK) is unwrapped with the key it was wrapped
under and wrapped again with the active key; chunks and indexes stay as they are, since
the DEK and the AAD do not change.

* Atomic: each manifest is replaced with one ``store.put``, which publishes atomically
  (rename on a local directory, a single PUT on S3/GCS). A reader sees the old manifest
  or the new one, both valid while the old key is still in the keyring.
* Idempotent: segments already under the active key are skipped.
* Resumable: there is no state besides the manifests; killed at any point, a rerun
  skips what was done and finishes the rest.
* Preserving: the new manifest is ``SegmentManifest.to_bytes`` of the old one with only
  ``encryption.dataKey`` changed (the authenticator does not cover the wrapped key, so it
  stays valid and is verified after the write). Before writing, the new bytes are parsed back and
  compared field by field with the old manifest; a manifest written by rsm-sidecar must
  also re-serialise to exactly its old bytes (otherwise it holds something this version
  would drop, and it is left alone). The new manifest is read back and unwrapped after
  the write.
* Concurrent deletes and writers: the manifest is replaced only if it is still the one read and
  its data is there; a delete racing the write has the new manifest removed again
  (``rewrite.Rewriter``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from rsm_sidecar.errors import ConfigError, RsmError
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.manifest import EncryptionInfo, SegmentManifest
from rsm_sidecar.inspect import manifests, runner
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.rewrite import Rewriter
from rsm_sidecar.inspect.runner import ERROR, SKIPPED, DryRunTally, SegmentOutcome
from rsm_sidecar.segment.listing import StoredSegment
from rsm_sidecar.transform import authentication
from rsm_sidecar.transform.keyring import Keyring

REKEYED, WOULD_REKEY = "rekeyed", "would-rekey"


@dataclasses.dataclass
class RekeyOutcome(SegmentOutcome):
    from_key: str | None = None
    to_key: str | None = None

    def text(self) -> str:
        arrow = f"{self.from_key} -> {self.to_key}" if self.to_key else ""
        return f"  {arrow}{super().text()}"


def _preserved(old: SegmentManifest, new: SegmentManifest) -> list[str]:
    """Members that differ other than the wrapped key."""
    diffs = [
        name
        for name in (
            "chunk_index",
            "indexes",
            "compression",
            "segment",
            "chunk_crcs",
            "index_crcs",
            "attempt",
            "chunk_tags",
            "index_tags",
            "auth",
        )
        if getattr(old, name) != getattr(new, name)
    ]
    if old.writer is not None and old.writer != new.writer:
        diffs.append("writer")
    if (old.encryption and old.encryption.aad) != (new.encryption and new.encryption.aad):
        diffs.append("encryption.aad")
    return diffs


def rekey_segment(
    ctx: InspectContext, keyring: Keyring, seg: StoredSegment, dry_run: bool, rewriter: Rewriter
) -> RekeyOutcome:
    out = RekeyOutcome(seg.base, seg.describe, ERROR)
    manifest_key = seg.object_key(fkeys.MANIFEST)
    log_key = seg.object_key(fkeys.LOG)
    try:
        raw, manifest = manifests.read_manifest(ctx.store, seg.base)
        if manifest.encryption is None:
            out.action, out.detail = SKIPPED, "not encrypted"
            return out
        old = manifest.encryption
        out.from_key = old.key_id
        if old.key_id == keyring.active_id:
            out.action, out.detail = SKIPPED, f"already under the active key {old.key_id}"
            return out
        if old.key_id not in keyring.pairs:
            out.detail = (
                f"{manifest_key}: data key is wrapped under key id {old.key_id!r}, which is not in the "
                f"keyring (known: {', '.join(sorted(keyring.pairs))}); segment left as is"
            )
            return out
        if manifest.verified_digest and manifest.to_bytes() != raw:
            out.detail = (
                f"{manifest_key}: the manifest does not re-serialise to its own bytes (written by "
                f"{manifest.writer or 'another writer'}); not rewritten to avoid losing members"
            )
            return out
        data_key = keyring.unwrap(old.key_id, old.wrapped_key, manifest_key)
        new_id, wrapped = keyring.wrap(data_key)
        out.to_key = new_id
        new_raw = dataclasses.replace(
            manifest, encryption=EncryptionInfo(new_id, wrapped, old.aad)
        ).to_bytes()
        check = SegmentManifest.from_bytes(new_raw, f"{manifest_key} (new)")
        diffs = _preserved(manifest, check)
        if diffs:
            out.detail = f"{manifest_key}: re-encoding would change {', '.join(diffs)}; not rewritten"
            return out
        if not ctx.store.exists(log_key):
            out.action, out.detail = SKIPPED, f"{log_key} is gone (segment being deleted)"
            return out
        if dry_run:
            out.action = WOULD_REKEY
            return out
        skipped = rewriter.replace(seg.base, raw, new_raw)
        if skipped is not None:
            out.action, out.detail = SKIPPED, skipped.reason
            return out
        _, written = manifests.read_manifest(ctx.store, seg.base)
        if (
            written.encryption is None
            or keyring.unwrap(written.encryption.key_id, written.encryption.wrapped_key, manifest_key)
            != data_key
        ):
            out.detail = f"{manifest_key}: read-back after the rewrite does not unwrap to the same data key"
            return out
        if written.auth is not None:  # the authenticator does not cover the wrapped key: still valid
            authentication.verify(written, data_key, manifest_key)
        out.action = REKEYED
        return out
    except RsmError as e:
        out.detail = str(e)
        return out
    except Exception as e:  # a manifest this code cannot handle: report it, go on with the rest
        out.detail = f"{manifest_key}: unexpected {type(e).__name__}: {e}"
        return out


class RekeySummary(DryRunTally):
    ACTIONS = {REKEYED: "rekeyed", WOULD_REKEY: "would_rekey", SKIPPED: "skipped", ERROR: "errors"}
    PROBLEMS = ("errors",)
    DONE = ("rekeyed", "would_rekey", "re-keyed")

    def __init__(self, active_key: str, dry_run: bool):
        super().__init__(dry_run, active_key=active_key)
        self.active_key = active_key

    def text(self) -> str:
        return (
            f"{self.segments} segments: {self.done()}, {self['skipped']} skipped, {self['errors']} errors "
            f"(active key {self.active_key}{', dry run' if self.dry_run else ''})"
        )


def run(
    ctx: InspectContext,
    segs: Iterable[StoredSegment],
    on_outcome: Callable[[RekeyOutcome], None],
    dry_run: bool = False,
    workers: int = 4,
    progress=None,
) -> RekeySummary:
    keyring = ctx.keyring
    if keyring is None:
        raise ConfigError(
            "encryption.enabled is false in this configuration: there is no keyring to re-key with"
        )
    rewriter = Rewriter(ctx.store)

    def undone() -> Iterator[tuple[str, RekeyOutcome]]:
        for base in rewriter.settle():
            detail = f"{base}.log was deleted after the rewrite; manifest removed again"
            yield REKEYED, RekeyOutcome(base, base, SKIPPED, detail=detail)

    return runner.run(
        segs,
        lambda s: rekey_segment(ctx, keyring, s, dry_run, rewriter),
        RekeySummary(keyring.active_id, dry_run),
        on_outcome,
        workers=workers,
        progress=progress,
        revisions=undone,
    )
