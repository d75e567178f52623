"""Copying a segment into object storage.

The ``.log`` file flows through a bounded pipeline: original chunks of
``chunk_size`` bytes are transformed (zstd, AES-GCM) on a shared thread pool with at
most ``parallelism`` chunks of one copy in flight, and written in order to a streaming
upload. Memory per copy: about (parallelism + 2) x chunk size plus the storage writer's
buffer. Indexes are encrypted one by one and concatenated into ``.indexes``; the
manifest is written last and is the commit marker. Any failure removes what was
written (manifest first), so a partial segment is never readable.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
from typing import Callable, Iterable, Iterator

from rsm_sidecar.errors import Cancelled, FailedPrecondition
from rsm_sidecar.format import custom_metadata as cm
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.chunk_index import build_index
from rsm_sidecar.format.manifest import INDEX_NAMES, IndexRange, SegmentManifest, EncryptionInfo, segment_debug_copy
from rsm_sidecar.segment.journal import CopyJournal, delete_segment_objects
from rsm_sidecar.storage.base import ObjectStore
from rsm_sidecar.transform.chunks import ChunkCodec, crc32c
from rsm_sidecar.transform.heuristic import batches_already_compressed
from rsm_sidecar.transform.keyring import Keyring

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CopySettings:
    chunk_size: int = 4 * 1024 * 1024
    compression: bool = True
    compression_heuristic: bool = True
    compression_level: int = 3
    parallelism: int = 2
    custom_metadata_fields: tuple[str, ...] = ("REMOTE_SIZE", "OBJECT_PREFIX")

    @classmethod
    def from_config(cls, cfg) -> "CopySettings":
        return cls(cfg["segment.chunk_size"], cfg["segment.compression"], cfg["segment.compression_heuristic"],
                   cfg["segment.compression_level"], cfg["copy.parallelism"],
                   tuple(cfg["segment.custom_metadata_fields"]))


@dataclasses.dataclass(frozen=True)
class CopyResult:
    manifest: SegmentManifest
    base_key: str
    stored_bytes: int
    custom_metadata: bytes | None


def rechunk(pieces: Iterable[bytes], chunk_size: int) -> Iterator[bytes]:
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
    def __init__(self, store: ObjectStore, layout: fkeys.KeyLayout, keyring: Keyring | None,
                 settings: CopySettings, executor: concurrent.futures.Executor,
                 journal: CopyJournal | None = None):
        self.store = store
        self.layout = layout
        self.keyring = keyring
        self.settings = settings
        self.executor = executor
        self.journal = journal

    def copy(self, md: fkeys.SegmentMetadata, log_chunks: Iterator[bytes], log_size: int,
             indexes: Callable[[], dict[str, bytes | None]],
             is_cancelled: Callable[[], bool] = lambda: False,
             on_stored_bytes: Callable[[int], None] = lambda n: None) -> CopyResult:
        """Copy one segment. ``log_chunks`` yields the ``.log`` file in ``chunk_size``
        chunks and raises if the source breaks; ``indexes`` is called once the log is
        consumed and returns the index files by manifest name (``transaction`` may be None)."""
        base = self.layout.base(dataclasses.replace(md, custom_metadata=None))
        keys = {s: f"{base}.{s}" for s in fkeys.SUFFIXES}
        entry = self.journal.begin(base) if self.journal else None
        try:
            result = self._copy(md, base, keys, log_chunks, log_size, indexes, is_cancelled, on_stored_bytes)
        except BaseException as e:
            if self._cleanup(base, md, e) and entry:
                self.journal.end(entry)
            elif entry:
                self.journal.release(entry)
            raise
        if entry:
            self.journal.end(entry)
        return result

    def _cleanup(self, base: str, md: fkeys.SegmentMetadata, cause: BaseException) -> bool:
        try:
            delete_segment_objects(self.store, base)
            return True
        except Exception as e:  # the journal sweep (or the broker's delete) finishes the job
            log.warning("copy of %s failed (%s) and its cleanup failed too: %s", md.describe, cause, e)
            return False

    def _copy(self, md, base, keys, log_chunks, log_size, indexes, is_cancelled, on_stored_bytes) -> CopyResult:
        s = self.settings
        chunks = iter(log_chunks)
        first = next(chunks, b"")
        compression = s.compression and not (s.compression_heuristic and batches_already_compressed(first))
        data_key = aad = encryption = None
        if self.keyring is not None:
            data_key, aad = self.keyring.new_data_key()
            key_id, wrapped = self.keyring.wrap(data_key)
            encryption = EncryptionInfo(key_id, wrapped, aad)
        codec = ChunkCodec(compression, data_key, aad, s.compression_level)
        verify_crc = not codec.encrypted

        sizes: list[int] = []
        crcs: list[int] = []
        original_total = 0
        with self.store.open_writer(keys[fkeys.LOG]) as writer:
            in_flight: collections.deque[concurrent.futures.Future] = collections.deque()

            def drain_one() -> None:
                out = in_flight.popleft().result()
                writer.write(out)
                on_stored_bytes(len(out))
                sizes.append(len(out))
                if verify_crc:
                    crcs.append(crc32c(out))

            for chunk in _prepend(first, chunks):
                if is_cancelled():
                    raise Cancelled(f"copy of {md.describe} cancelled by the caller")
                if len(chunk) != s.chunk_size and original_total + len(chunk) < log_size:
                    raise FailedPrecondition(f"copy of {md.describe}: short chunk of {len(chunk)} bytes at "
                                             f"position {original_total}")
                original_total += len(chunk)
                in_flight.append(self.executor.submit(codec.encode, chunk))
                while len(in_flight) >= s.parallelism:
                    drain_one()
            while in_flight:
                drain_one()
            if original_total != log_size:
                raise FailedPrecondition(f"copy of {md.describe}: received {original_total} bytes of the .log file, "
                                         f"expected {log_size}")
            writer.commit()

        index_files = indexes()
        stored_indexes = bytearray()
        ranges: dict[str, IndexRange | None] = {}
        index_crcs: dict[str, int] = {}
        for name in INDEX_NAMES:
            data = index_files.get(name)
            if data is None:
                if name != "transaction":
                    raise FailedPrecondition(f"copy of {md.describe}: index {name} missing")
                ranges[name] = None
                continue
            out = codec.encrypt_only(data)
            ranges[name] = IndexRange(len(stored_indexes), len(out))
            if verify_crc:
                index_crcs[name] = crc32c(out)
            stored_indexes += out
        if is_cancelled():
            raise Cancelled(f"copy of {md.describe} cancelled by the caller")
        self.store.put(keys[fkeys.INDEXES], bytes(stored_indexes))
        on_stored_bytes(len(stored_indexes))

        manifest = SegmentManifest(
            chunk_index=build_index(s.chunk_size, log_size, sizes, codec.fixed_transformed_size(s.chunk_size)),
            indexes=ranges, compression=compression, encryption=encryption,
            segment=segment_debug_copy(md),
            chunk_crcs=crcs if verify_crc else None, index_crcs=index_crcs if verify_crc else None)
        manifest_bytes = manifest.to_bytes()
        if is_cancelled():
            raise Cancelled(f"copy of {md.describe} cancelled by the caller")
        self.store.put(keys[fkeys.MANIFEST], manifest_bytes)
        on_stored_bytes(len(manifest_bytes))

        stored = sum(sizes) + len(stored_indexes) + len(manifest_bytes)
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
                fields[tag] = base[len(prefix):]
        return cm.encode(fields) if fields else None


def _prepend(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest
