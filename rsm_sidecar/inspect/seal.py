"""`inspect seal`: give segments that carry no authenticator (written by Aiven's plugin, or
encrypted by rsm-sidecar before 0.2) the integrity block the sidecar requires, so that it
serves them with ``fetch.accept_unauthenticated_segments`` off.

Per segment:

1. Skipped when its manifest already has what the sidecar requires (our integrity block, and
   for an encrypted segment the authenticator and the tags).
2. Verified as ``inspect verify`` verifies (every chunk and index blob downloaded, decrypted or
   decompressed and checked, every batch's CRC, offsets, indexes), through a reader that accepts
   unauthenticated segments and records each stored piece as it verifies. Any problem refuses the
   segment (named, with the problems) and nothing is written. The manifest must name the segment
   its key names (``remoteLogSegmentMetadata``), since that is what the authenticator binds.
3. The new manifest is the old one plus the block (``format.md``): a fresh copy-attempt token,
   and for an encrypted segment the GCM tag of every chunk and index blob by position and the
   HMAC keyed from the segment's data key (whose key id must be in the keyring); for a plaintext
   one the CRC32C of every chunk and index blob. Every member of the old manifest is kept
   (checked after parsing the new bytes back). Aiven's reader ignores the block.
4. It replaces the old manifest atomically (``rewrite.Rewriter``: not if the segment was deleted
   or its manifest changed meanwhile; removed again if a delete raced the write), and is read
   back as a sidecar with the setting off reads it.

Resumable and idempotent: the manifests are the only state (a rerun skips sealed segments).
Memory: per segment in progress, one ranged GET (``fetch.max_range_bytes``) and 16 bytes (or 4)
per chunk.

A plaintext segment has no data key, so its block cannot be authenticated: sealing records
CRC32Cs (the integrity the sidecar gives its own plaintext segments) against damage, not against
a bucket writer. A sidecar without encryption then serves it with the setting off; one with
encryption enabled refuses every plaintext segment with the setting off, sealed or not, since a
bucket writer could plant one (see docs/operations.md, section 7).
"""

from __future__ import annotations

import array
import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator

from rsm_sidecar import __version__
from rsm_sidecar.errors import DataLoss, RsmError
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.manifest import TAG_BYTES, SegmentIdentity, SegmentManifest
from rsm_sidecar.inspect import manifests, runner
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.rewrite import Rewriter
from rsm_sidecar.inspect.runner import ERROR, SKIPPED, DryRunTally, SegmentOutcome
from rsm_sidecar.inspect.verify import SegmentVerifier
from rsm_sidecar.segment.listing import StoredSegment
from rsm_sidecar.segment.reader import OpenSegment, SegmentReader
from rsm_sidecar.storage.base import ObjectNotFound
from rsm_sidecar.transform import authentication
from rsm_sidecar.transform.chunks import Buffer, crc32c

SEALED, WOULD_SEAL, REFUSED = "sealed", "would-seal", "refused"
#: the ``writer`` of a sealed manifest
WRITER = f"rsm-sidecar {__version__} seal"
PLAINTEXT_NOTE = (
    "plaintext: sealed with CRC32Cs (no data key to authenticate with); a sidecar with encryption "
    "enabled still refuses plaintext segments unless fetch.accept_unauthenticated_segments = true"
)


@dataclasses.dataclass
class SealOutcome(SegmentOutcome):
    encrypted: bool | None = None
    key_id: str | None = None
    problems: list[str] = dataclasses.field(default_factory=list)

    def text(self) -> str:
        return super().text() + "".join(f"\n  - {p}" for p in self.problems)


def missing_block(manifest: SegmentManifest) -> str | None:
    """What the sidecar (setting off) misses in this manifest; None when nothing."""
    if not manifest.has_extension:
        return "had no integrity block: written by another plugin"
    if manifest.encryption is not None and (
        manifest.auth is None or manifest.chunk_tags is None or manifest.index_tags is None
    ):
        return "had no authenticator (rsm-sidecar before 0.2, or re-keyed before it was sealed)"
    return None


class _Pieces:
    """What the reader verified, by position: the GCM tag (encrypted) or the CRC32C (plaintext)
    of each chunk and index blob of one segment."""

    def __init__(self, manifest: SegmentManifest):
        self.manifest = manifest
        self.count = manifest.chunk_index.chunk_count
        self.encrypted = manifest.encryption is not None
        self.tags = bytearray(TAG_BYTES * self.count) if self.encrypted else bytearray()
        self.crcs = array.array("I", bytes(4 * self.count)) if not self.encrypted else array.array("I")
        self.seen = bytearray(self.count)
        self.index_tags: dict[str, bytes] = {}
        self.index_crcs: dict[str, int] = {}
        self.conflicts: list[str] = []
        self._opened: OpenSegment | None = None

    def record(self, seg: OpenSegment, item: str | int, stored: Buffer) -> None:
        if seg is not self._opened:  # the reader opened the manifest (again): the one verified?
            self._opened = seg
            if seg.manifest != self.manifest:
                self.conflicts.append(f"the manifest changed while the segment was read ({item})")
        if self.conflicts:
            return
        value: bytes | int = bytes(stored[-TAG_BYTES:]) if self.encrypted else crc32c(stored)
        if isinstance(item, str):
            known = self.index_tags if self.encrypted else self.index_crcs
            if known.setdefault(item, value) != value:  # type: ignore[arg-type]
                self.conflicts.append(f"{item} index read twice with different bytes")
            return
        if self.seen[item]:
            previous = (
                self.tags[TAG_BYTES * item : TAG_BYTES * (item + 1)] if self.encrypted else self.crcs[item]
            )
            if previous != value:
                self.conflicts.append(f"chunk {item} read twice with different bytes")
            return
        self.seen[item] = 1
        if isinstance(value, bytes):
            self.tags[TAG_BYTES * item : TAG_BYTES * (item + 1)] = value
        else:
            self.crcs[item] = value

    def missing(self) -> list[str]:
        out = []
        unseen = self.count - sum(self.seen)
        if unseen:
            out.append(f"{unseen} of {self.count} chunks were not read")
        recorded = self.index_tags if self.encrypted else self.index_crcs
        for name, r in self.manifest.indexes.items():
            if r is not None and name not in recorded:
                out.append(f"the {name} index was not read")
        return out

    def sealed(self) -> SegmentManifest:
        """The manifest with the block (``auth`` is the caller's: it needs the data key)."""
        m = dataclasses.replace(self.manifest, writer=WRITER, attempt=os.urandom(16).hex(), auth=None)
        if self.encrypted:
            m.chunk_tags = [bytes(self.tags[i : i + TAG_BYTES]) for i in range(0, len(self.tags), TAG_BYTES)]
            m.index_tags = dict(self.index_tags)
            m.chunk_crcs = m.index_crcs = None
        else:
            m.chunk_crcs = list(self.crcs)
            m.index_crcs = dict(self.index_crcs)
            m.chunk_tags = m.index_tags = None
        return m


def _kept(old: SegmentManifest, new: SegmentManifest) -> list[str]:
    """Members of the old manifest the new one does not keep exactly."""
    members = ("chunk_index", "indexes", "compression", "encryption", "segment")
    return [n for n in members if getattr(old, n) != getattr(new, n)]


def _identity_problem(manifest: SegmentManifest, seg: StoredSegment) -> str | None:
    found = SegmentIdentity.of_manifest(manifest)
    if found is None or manifest.topic_name is None:
        return (
            "the manifest does not say which segment it holds (no remoteLogSegmentMetadata), which the "
            "authenticator must bind: cannot seal it"
        )
    diffs = found.differences(SegmentIdentity(seg.topic_id, seg.partition, seg.segment_id, seg.start_offset))
    if not seg.is_topic(manifest.topic_name):
        diffs.append(f"topic {manifest.topic_name!r} != {seg.topic!r}")
    if diffs:
        return f"the manifest holds another segment than its key names ({'; '.join(diffs)})"
    return None


class Sealer:
    def __init__(self, ctx: InspectContext, dry_run: bool, on_bytes: Callable[[int], None] = lambda n: None):
        self.ctx = ctx
        self.dry_run = dry_run
        self.on_bytes = on_bytes
        self.rewriter = Rewriter(ctx.store)
        #: how a sidecar with the setting off reads (the read-back after the write)
        self.strict = dataclasses.replace(ctx.reader_settings, accept_unauthenticated=False)

    def seal(self, seg: StoredSegment) -> SealOutcome:
        out = SealOutcome(seg.base, seg.describe, ERROR)
        manifest_key = seg.object_key(fkeys.MANIFEST)
        try:
            return self._seal(seg, out, manifest_key)
        except RsmError as e:
            out.detail = str(e)
        except Exception as e:  # a manifest this code cannot handle: report it, go on with the rest
            out.detail = f"{manifest_key}: unexpected {type(e).__name__}: {e}"
        return out

    def _seal(self, seg: StoredSegment, out: SealOutcome, manifest_key: str) -> SealOutcome:
        try:
            raw, manifest = manifests.read_manifest(self.ctx.store, seg.base)
        except ObjectNotFound:
            out.action, out.detail = SKIPPED, f"{manifest_key} is gone (the segment was deleted)"
            return out
        out.encrypted, out.key_id = manifest.encryption is not None, manifest.key_id
        if fkeys.LOG not in seg.objects and not self.ctx.store.exists(seg.object_key(fkeys.LOG)):
            return self._without_data(seg, out, manifest, manifest_key)
        missing = missing_block(manifest)
        if missing is None:
            out.action, out.detail = (
                SKIPPED,
                "already sealed" if manifest.writer == WRITER else "has its integrity block",
            )
            return out
        problem = _identity_problem(manifest, seg)
        log_size, claimed = seg.object_size(fkeys.LOG), manifest.stored_log_size
        if problem is None and log_size is not None and log_size != claimed:
            # (before anything is sized by the chunk count the manifest claims)
            problem = f"{seg.object_key(fkeys.LOG)} is {log_size} bytes, the chunk index says {claimed}"
        if problem is not None:
            out.action, out.problems = REFUSED, [f"{manifest_key}: {problem}"]
            return out
        data_key = None
        if manifest.encryption is not None:
            keyring = self.ctx.keyring
            if keyring is None:
                out.detail = (
                    f"{manifest_key}: the segment is encrypted under key id "
                    f"{manifest.encryption.key_id!r} but encryption is not configured"
                )
                return out
            data_key = keyring.unwrap(
                manifest.encryption.key_id, manifest.encryption.wrapped_key, manifest_key
            )
        pieces = _Pieces(manifest)
        reader = SegmentReader(
            self.ctx.store,
            self.ctx.layout,
            self.ctx.keyring,
            dataclasses.replace(self.ctx.reader_settings, accept_unauthenticated=True),
            on_verified=pieces.record,
        )
        report = SegmentVerifier(self.ctx, seg, on_bytes=self.on_bytes, reader=reader).run()
        problems = report.problems + pieces.conflicts + (pieces.missing() if report.ok else [])
        if problems:
            out.action, out.problems = REFUSED, problems
            return out
        sealed = pieces.sealed()
        if data_key is not None:
            sealed.auth = authentication.authenticator(sealed, data_key)
        new_raw = sealed.to_bytes()
        check = SegmentManifest.from_bytes(new_raw, f"{manifest_key} (new)")
        diffs = _kept(manifest, check)
        if diffs:
            out.detail = f"{manifest_key}: sealing would change {', '.join(diffs)}; not written"
            return out
        if data_key is not None:
            authentication.verify(check, data_key, manifest_key)
        out.detail = (
            missing if manifest.encryption is not None or self.ctx.keyring is None else PLAINTEXT_NOTE
        )
        if self.dry_run:
            out.action = WOULD_SEAL
            return out
        skipped = self.rewriter.replace(seg.base, raw, new_raw)
        if skipped is not None:
            out.action, out.detail = SKIPPED, skipped.reason
            return out
        self._read_back(seg, check)
        out.action = SEALED
        return out

    def _without_data(
        self, seg: StoredSegment, out: SealOutcome, manifest: SegmentManifest, manifest_key: str
    ) -> SealOutcome:
        """A manifest whose ``.log`` is gone: one a killed run of seal left after a delete raced
        it is removed; any other is left to ``inspect orphans``."""
        if manifest.writer == WRITER:
            self.ctx.store.delete(manifest_key)
            out.action, out.detail = SKIPPED, "its .log is gone: removed the manifest an earlier run wrote"
        else:
            out.action, out.detail = SKIPPED, "its .log is gone (manifest without data: see inspect orphans)"
        return out

    def _read_back(self, seg: StoredSegment, written: SegmentManifest) -> None:
        """Open the written manifest as a sidecar with the setting off does (a plaintext segment
        as one without encryption does)."""
        keyring = self.ctx.keyring if written.encryption is not None else None
        reader = SegmentReader(self.ctx.store, self.ctx.layout, keyring, self.strict)
        try:
            opened = reader.open_base(seg.base, seg.describe)
        except ObjectNotFound:
            return  # deleted meanwhile
        if opened.manifest != written:
            raise DataLoss(f"{seg.object_key(fkeys.MANIFEST)}: read back after sealing, the manifest differs")


class SealSummary(DryRunTally):
    ACTIONS = {
        SEALED: "sealed",
        WOULD_SEAL: "would_seal",
        SKIPPED: "skipped",
        REFUSED: "refused",
        ERROR: "errors",
    }
    PROBLEMS = ("refused", "errors")
    DONE = ("sealed", "would_seal", "sealed")

    def text(self) -> str:
        return (
            f"{self.segments} segments: {self.done()}, {self['skipped']} skipped, {self['refused']} refused, "
            f"{self['errors']} errors{' (dry run)' if self.dry_run else ''}"
        )


def run(
    ctx: InspectContext,
    segs: Iterable[StoredSegment],
    on_outcome: Callable[[SealOutcome], None],
    dry_run: bool = False,
    workers: int = 4,
    progress=None,
) -> SealSummary:
    _ = ctx.reader  # loads the keyring: a configuration error stops here, not once per segment
    sealer = Sealer(ctx, dry_run, on_bytes=progress.add_bytes if progress else lambda n: None)

    def undone() -> Iterator[tuple[str, SealOutcome]]:
        for base in sealer.rewriter.settle():
            detail = "its .log was deleted after sealing: the manifest was removed again"
            yield SEALED, SealOutcome(base, base, SKIPPED, detail=detail)

    return runner.run(
        segs,
        sealer.seal,
        SealSummary(dry_run),
        on_outcome,
        workers=workers,
        progress=progress,
        revisions=undone,
    )
