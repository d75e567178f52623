"""Copying a segment into object storage.

The ``.log`` file flows through a bounded pipeline: original chunks of
``chunk_size`` bytes are transformed (zstd, AES-GCM) on a shared thread pool with at
most ``parallelism`` chunks of one copy in flight, and written in order to a streaming
upload. Memory per copy: about (parallelism + 2) x chunk size plus the storage writer's
buffer. Indexes are encrypted one by one and concatenated into ``.indexes``; the
manifest is written last and is the commit marker.

One segment id, several copies (the shim retries a copy with the same id, a client may
send two at once): the copies are serialised (``SegmentLocks``), and the first one that
completes defines the segment. A copy that finds the segment already complete (our
manifest for the same segment, authentic, its objects present with the sizes it records)
reads its source to the end and answers with the stored segment without writing
anything, so an acknowledged segment is never replaced or put at risk by a retry.
Otherwise the copy is an *attempt* with a random token recorded in its journal entry and
its manifest: it first deletes any manifest (what is there is incomplete or not ours),
then writes ``.log``, ``.indexes`` and the manifest. A failed attempt removes what it
wrote, but never a manifest of another attempt; the journal sweep follows the same rule.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Iterator

from rsm_sidecar.errors import Cancelled, DataLoss, FailedPrecondition
from rsm_sidecar.format import custom_metadata as cm
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.chunk_index import build_index
from rsm_sidecar.format.manifest import (
    INDEX_NAMES,
    TAG_BYTES,
    EncryptionInfo,
    IndexRange,
    SegmentIdentity,
    SegmentManifest,
    segment_debug_copy,
)
from rsm_sidecar.segment.journal import CopyJournal
from rsm_sidecar.segment.locks import SegmentLocks
from rsm_sidecar.segment.objects import (
    NO_MANIFEST,
    delete_data_objects,
    delete_segment_objects,
    manifest_attempt,
    object_keys,
)
from rsm_sidecar.segment.rate_limit import RateLimiter
from rsm_sidecar.segment.settings import CopySettings
from rsm_sidecar.segment.sources import Piece, SegmentSource
from rsm_sidecar.storage.base import ObjectNotFound, ObjectStore
from rsm_sidecar.transform import authentication
from rsm_sidecar.transform.chunks import ChunkCodec, crc32c
from rsm_sidecar.transform.heuristic import batches_already_compressed
from rsm_sidecar.transform.keyring import Keyring

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CopyResult:
    manifest: SegmentManifest
    base_key: str
    stored_bytes: int
    custom_metadata: bytes | None


def rechunk(pieces: Iterable[Piece], chunk_size: int) -> Iterator[bytes]:
    """Re-cut a stream of byte pieces into ``chunk_size`` chunks (the last may be
    shorter), copying each byte once."""
    parts: list[memoryview] = []
    have = 0
    for piece in pieces:
        view = memoryview(piece)
        while len(view):
            take = min(len(view), chunk_size - have)
            parts.append(view[:take])
            have += take
            view = view[take:]
            if have == chunk_size:
                yield parts[0].tobytes() if len(parts) == 1 else b"".join(parts)
                parts, have = [], 0
    if have:
        yield b"".join(parts)


class SegmentCopier:
    def __init__(
        self,
        store: ObjectStore,
        layout: fkeys.KeyLayout,
        keyring: Keyring | None,
        settings: CopySettings,
        executor: concurrent.futures.Executor,
        journal: CopyJournal | None = None,
        locks: SegmentLocks | None = None,
        on_rewrite: Callable[[str], None] = lambda base: None,
    ):
        self.store = store
        self.layout = layout
        self.keyring = keyring
        self.settings = settings
        self.executor = executor
        self.journal = journal
        self.locks = locks or (journal.locks if journal else SegmentLocks())
        #: called with a segment's base key when its objects are about to change (cache invalidation)
        self.on_rewrite = on_rewrite
        #: the upload budget shared by every copy of this copier (copy.upload_rate_limit; 0: none)
        self.upload_budget = RateLimiter(settings.upload_rate_limit) if settings.upload_rate_limit else None

    def copy(
        self,
        md: fkeys.SegmentMetadata,
        source: SegmentSource,
        leader_epoch: bytes,
        is_cancelled: Callable[[], bool] = lambda: False,
        on_stored_bytes: Callable[[int], None] = lambda n: None,
    ) -> CopyResult:
        """Copy one segment from ``source`` (its ``.log`` is cut into ``chunk_size``
        chunks here); ``leader_epoch`` is the leader-epoch checkpoint's bytes."""
        base = self.layout.base(dataclasses.replace(md, custom_metadata=None))
        log_size = source.log_size
        log_chunks = rechunk(source.log_pieces(self.settings.chunk_size), self.settings.chunk_size)

        def indexes() -> dict[str, bytes | None]:
            files = source.index_files()
            files["leaderEpoch"] = leader_epoch
            return files

        with self.locks.hold(base, is_cancelled, f"copy of {md.describe}"):
            existing = self._complete_segment(md, base, log_size)
            if existing is not None:
                for _ in log_chunks:  # the request is read to its end (and checked) all the same
                    _raise_if_cancelled(is_cancelled, md)
                indexes()
                if self.journal:
                    self.journal.settle_completed(base)
                log.info(
                    "copy of %s: the segment is already complete in storage; keeping it",
                    md.describe,
                    extra={"fields": {"op": "copy", "key": base, "action": "already-complete"}},
                )
                return existing
            attempt = os.urandom(16).hex()
            journal = self.journal
            entry = journal.begin(base, attempt) if journal is not None else None
            self.on_rewrite(base)
            try:
                result = self._copy(
                    md, base, attempt, log_chunks, log_size, indexes, is_cancelled, on_stored_bytes
                )
            except BaseException as e:
                cleaned = self._cleanup(base, attempt, md, e)
                if journal is not None and entry is not None:
                    (journal.end if cleaned else journal.release)(entry)
                raise
            finally:
                self.on_rewrite(base)
            if journal is not None and entry is not None:
                journal.end(entry)
            return result

    def _complete_segment(self, md: fkeys.SegmentMetadata, base: str, log_size: int) -> CopyResult | None:
        """The stored segment when an earlier copy of this id completed it: a manifest
        we wrote, for this segment and size, authentic under the configured keys, with
        ``.log`` and ``.indexes`` of the sizes it records. None otherwise (nothing there,
        an interrupted or foreign copy, damage): the copy then writes the segment anew."""
        key = f"{base}.{fkeys.MANIFEST}"
        try:
            raw = self.store.get(key)
            manifest = SegmentManifest.from_bytes(raw, key)
            found = SegmentIdentity.of_manifest(manifest)
            if (
                manifest.attempt is None
                or found is None
                or found.differences(SegmentIdentity.of_metadata(md))
                or manifest.original_size != log_size
                or (manifest.encryption is None) != (self.keyring is None)
            ):
                return None
            if manifest.encryption is not None and self.keyring is not None:
                data_key = self.keyring.unwrap(
                    manifest.encryption.key_id, manifest.encryption.wrapped_key, key
                )
                authentication.verify(manifest, data_key, key)
            index_size = manifest.stored_indexes_size
            log_stored = self.store.size(f"{base}.{fkeys.LOG}")
            if (
                log_stored != manifest.stored_log_size
                or self.store.size(f"{base}.{fkeys.INDEXES}") != index_size
            ):
                return None
        except ObjectNotFound:
            return None
        except (DataLoss, FailedPrecondition) as e:
            log.warning("copy of %s replaces an unusable stored segment: %s", md.describe, e)
            return None
        stored = log_stored + index_size + len(raw)
        return CopyResult(manifest, base, stored, self._custom_metadata(md, base, stored))

    def _cleanup(self, base: str, attempt: str, md: fkeys.SegmentMetadata, cause: BaseException) -> bool:
        """Remove what this attempt wrote; never another attempt's complete segment."""
        try:
            found = manifest_attempt(self.store, base)
            if found == NO_MANIFEST:
                delete_data_objects(self.store, base)
            elif found == attempt:
                delete_segment_objects(self.store, base)
            else:
                log.warning(
                    "copy of %s failed (%s); not cleaning up: the segment's manifest was written by another "
                    "copy attempt (another process copying the same segment id)",
                    md.describe,
                    cause,
                )
            return True
        except Exception as e:  # the journal sweep (or the broker's delete) finishes the job
            log.warning("copy of %s failed (%s) and its cleanup failed too: %s", md.describe, cause, e)
            return False

    def _copy(
        self,
        md: fkeys.SegmentMetadata,
        base: str,
        attempt: str,
        log_chunks: Iterator[bytes],
        log_size: int,
        indexes: Callable[[], dict[str, bytes | None]],
        is_cancelled: Callable[[], bool],
        on_stored_bytes: Callable[[int], None],
    ) -> CopyResult:
        chunks = iter(log_chunks)
        first = next(chunks, b"")
        steps = _CopySteps(self, md, attempt, first, is_cancelled, on_stored_bytes)
        keys = object_keys(base)
        # The previous version of this segment id (an earlier attempt) stops being readable
        # before any of its objects is replaced.
        self.store.delete(keys[fkeys.MANIFEST])
        stored_log = steps.log(keys[fkeys.LOG], _prepend(first, chunks), log_size)
        stored_indexes = steps.indexes(keys[fkeys.INDEXES], indexes())
        manifest, manifest_size = steps.manifest(keys[fkeys.MANIFEST], stored_log, stored_indexes)
        stored = stored_log.size + stored_indexes.size + manifest_size
        return CopyResult(manifest, base, stored, self._custom_metadata(md, base, stored))

    def _custom_metadata(self, md: fkeys.SegmentMetadata, base: str, stored: int) -> bytes | None:
        fields: dict[int, int | str] = {}
        prefix = self.layout.partition_prefix(md.topic_id, md.partition)
        for name in self.settings.custom_metadata_fields:
            tag = cm.FIELD_TAGS[name]
            if tag == cm.REMOTE_SIZE:
                fields[tag] = stored
            elif tag == cm.OBJECT_PREFIX:
                fields[tag] = prefix
            else:
                fields[tag] = base[len(prefix) :]
        return cm.encode(fields) if fields else None


@dataclasses.dataclass
class _StoredLog:
    """What ``_CopySteps.log`` stored: the original size and, per chunk, the stored size and
    the CRC32C (unencrypted) or GCM tag (encrypted) that the manifest records."""

    original_size: int = 0
    sizes: list[int] = dataclasses.field(default_factory=list)
    crcs: list[int] = dataclasses.field(default_factory=list)
    tags: list[bytes] = dataclasses.field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(self.sizes)


@dataclasses.dataclass
class _StoredIndexes:
    """What ``_CopySteps.indexes`` stored: each index's range in ``.indexes`` (None: absent)
    and its CRC32C or GCM tag."""

    size: int = 0
    ranges: dict[str, IndexRange | None] = dataclasses.field(default_factory=dict)
    crcs: dict[str, int] = dataclasses.field(default_factory=dict)
    tags: dict[str, bytes] = dataclasses.field(default_factory=dict)


class _CopySteps:
    """The steps of one copy attempt, in their order: the ``.log`` (``log``), the ``.indexes``
    (``indexes``), the manifest last (``manifest``, the commit marker). They share the
    attempt's transform (compression chosen from the first chunk, a fresh data key), its
    cancellation and its progress: each step stops when the caller cancels, waits for the
    copier's upload budget before it stores, and reports what it stored."""

    def __init__(
        self,
        copier: SegmentCopier,
        md: fkeys.SegmentMetadata,
        attempt: str,
        first_chunk: bytes,
        is_cancelled: Callable[[], bool],
        on_stored_bytes: Callable[[int], None],
    ):
        s = copier.settings
        self.copier, self.md, self.attempt = copier, md, attempt
        self.is_cancelled, self.on_stored_bytes = is_cancelled, on_stored_bytes
        self.compression = s.compression and not (
            s.compression_heuristic and batches_already_compressed(first_chunk)
        )
        self.data_key: bytes | None = None
        aad = None
        self.encryption: EncryptionInfo | None = None
        if copier.keyring is not None:
            self.data_key, aad = copier.keyring.new_data_key()
            key_id, wrapped = copier.keyring.wrap(self.data_key)
            self.encryption = EncryptionInfo(key_id, wrapped, aad)
        self.codec = ChunkCodec(self.compression, self.data_key, aad, s.compression_level)
        #: unencrypted parts are checked by CRC32C; encrypted ones carry their GCM tags
        self.verify_crc = not self.codec.encrypted

    def _check_cancelled(self) -> None:
        _raise_if_cancelled(self.is_cancelled, self.md)

    def _budget(self, nbytes: int) -> None:
        budget = self.copier.upload_budget
        if budget is not None:  # waiting for budget is progress: on_stored_bytes(0)
            budget.acquire(nbytes, self.is_cancelled, heartbeat=lambda: self.on_stored_bytes(0))

    def log(self, key: str, chunks: Iterable[bytes], log_size: int) -> _StoredLog:
        """Transform the ``.log``'s chunks on the copier's pool, at most ``parallelism`` in
        flight, and write them in order to one streaming upload."""
        s, md, stored = self.copier.settings, self.md, _StoredLog()
        with self.copier.store.open_writer(key) as writer:
            in_flight: collections.deque[concurrent.futures.Future[bytes]] = collections.deque()

            def drain_one() -> None:
                out = in_flight.popleft().result()
                self._budget(len(out))
                writer.write(out)
                self.on_stored_bytes(len(out))
                stored.sizes.append(len(out))
                if self.verify_crc:
                    stored.crcs.append(crc32c(out))
                else:
                    stored.tags.append(bytes(out[-TAG_BYTES:]))

            for chunk in chunks:
                self._check_cancelled()
                if len(chunk) != s.chunk_size and stored.original_size + len(chunk) < log_size:
                    raise FailedPrecondition(
                        f"copy of {md.describe}: short chunk of {len(chunk)} bytes at "
                        f"position {stored.original_size}"
                    )
                stored.original_size += len(chunk)
                in_flight.append(self.copier.executor.submit(self.codec.encode, chunk))
                while len(in_flight) >= s.parallelism:
                    drain_one()
            while in_flight:
                drain_one()
            if stored.original_size != log_size:
                raise FailedPrecondition(
                    f"copy of {md.describe}: received {stored.original_size} bytes of the .log file, "
                    f"expected {log_size}"
                )
            writer.commit()
        return stored

    def indexes(self, key: str, files: dict[str, bytes | None]) -> _StoredIndexes:
        """Encrypt the index files one by one into one ``.indexes`` object (every index but the
        transaction index is required)."""
        data = bytearray()
        stored = _StoredIndexes()
        for name in INDEX_NAMES:
            index = files.get(name)
            if index is None:
                if name != "transaction":
                    raise FailedPrecondition(f"copy of {self.md.describe}: index {name} missing")
                stored.ranges[name] = None
                continue
            out = self.codec.encrypt_only(index)
            stored.ranges[name] = IndexRange(len(data), len(out))
            if self.verify_crc:
                stored.crcs[name] = crc32c(out)
            else:
                stored.tags[name] = bytes(out[-TAG_BYTES:])
            data += out
        self._check_cancelled()
        self._budget(len(data))
        self.copier.store.put(key, bytes(data))
        self.on_stored_bytes(len(data))
        stored.size = len(data)
        return stored

    def manifest(self, key: str, log: _StoredLog, indexes: _StoredIndexes) -> tuple[SegmentManifest, int]:
        """Write the manifest that describes what the two other steps stored (authenticated
        under the data key when encrypted): the segment is complete once it is there. Returns
        it and its size."""
        chunk_size = self.copier.settings.chunk_size
        manifest = SegmentManifest(
            chunk_index=build_index(
                chunk_size, log.original_size, log.sizes, self.codec.fixed_transformed_size(chunk_size)
            ),
            indexes=indexes.ranges,
            compression=self.compression,
            encryption=self.encryption,
            segment=segment_debug_copy(self.md),
            chunk_crcs=log.crcs if self.verify_crc else None,
            index_crcs=indexes.crcs if self.verify_crc else None,
            attempt=self.attempt,
            chunk_tags=None if self.verify_crc else log.tags,
            index_tags=None if self.verify_crc else indexes.tags,
        )
        if self.data_key is not None:
            manifest.auth = authentication.authenticator(manifest, self.data_key)
        manifest_bytes = manifest.to_bytes()
        self._check_cancelled()
        self.copier.store.put(key, manifest_bytes)
        self.on_stored_bytes(len(manifest_bytes))
        return manifest, len(manifest_bytes)


def _raise_if_cancelled(is_cancelled: Callable[[], bool], md: fkeys.SegmentMetadata) -> None:
    if is_cancelled():
        raise Cancelled(f"copy of {md.describe} cancelled by the caller")


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest
