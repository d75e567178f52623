"""Reading segments back: manifests, index files and byte ranges of the original ``.log``.

Opening is cheap after the first time (parsed manifests and unwrapped data keys are
cached). Every open checks that the manifest belongs to the segment asked for; opening a
manifest the first time checks its authenticator (encrypted segments), and a manifest
without one is refused unless ``accept_unauthenticated`` (migrations from Aiven's plugin
or from rsm-sidecar before 0.2). Every stored chunk and index blob is checked against the
tag the manifest records for its position before it is decrypted.

A range read is lazy: it maps [start, end] to chunks, takes them from the chunk cache or
downloads runs of contiguous missing chunks with one ranged GET each
(at most ``max_range_bytes``), verifies and decodes them, and yields the original bytes.
Sequential prefetch loads the chunks after the last one served into the cache in the
background, so a consumer reading a whole segment pays each chunk once. It reaches across
the segment's end: when fewer than ``prefetch_bytes`` are left, the next segment of the
partition (the one starting at this one's end offset + 1, found with one LIST) is opened
and its first chunks and its offset, time and transaction indexes are loaded too, so the
broker's first reads of that segment (``fetchIndex``, then a fetch from position 0) do
not wait for the object store, the data key's unwrap and the decoding. Stopping the
iteration (a cancelled fetch) stops further downloads except prefetches in flight.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, overload

from rsm_sidecar.errors import DataLoss, FailedPrecondition, NoSuchIndex, NotFound
from rsm_sidecar.format import custom_metadata
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.chunk_index import Chunk
from rsm_sidecar.format.manifest import TAG_BYTES, SegmentIdentity, SegmentManifest
from rsm_sidecar.segment.cache import ByteLRU, SingleFlight
from rsm_sidecar.segment.disk_cache import DiskChunkCache
from rsm_sidecar.segment.settings import ReaderSettings
from rsm_sidecar.storage.base import InvalidRange, ObjectNotFound, ObjectStore
from rsm_sidecar.transform import authentication
from rsm_sidecar.transform.chunks import Buffer, ChunkCodec
from rsm_sidecar.transform.keyring import Keyring

log = logging.getLogger(__name__)

#: index names of the manifest by KIP-405 IndexType name
INDEX_BY_TYPE = {
    "OFFSET": "offset",
    "TIMESTAMP": "timestamp",
    "PRODUCER_SNAPSHOT": "producerSnapshot",
    "TRANSACTION": "transaction",
    "LEADER_EPOCH": "leaderEpoch",
}


#: indexes the broker loads for every segment it reads (RemoteIndexCache), prefetched
#: with the next segment's first chunks
INDEXES_PREFETCHED = ("offset", "timestamp", "transaction")
#: how long ``next_segment_metadata`` waits for a lookup of the next segment already under way
NEXT_SEGMENT_WAIT_S = 5.0

#: reads of one segment remembered to tell a sequential read from a random one (``read``): one
#: per reader that may follow another (consumers at different places in the same segment)
RECENT_READS = 16
#: a partition whose sequential reads scheduled a prefetch this recently counts as read at once
#: with the others: the prefetch windows of all of them share the chunk cache (``_prefetch_window``)
ACTIVE_READER_S = 5.0
#: most chunks one download or one prefetch window spans (chunks of a few bytes would otherwise
#: make ``max_range_bytes`` or ``prefetch_bytes`` millions of chunk records)
MAX_RUN_CHUNKS = 4096
#: a manifest that claims more chunks than this is checked against the ``.log`` object's size
#: (one HEAD) before it is used: no chunk index then claims more chunks than stored bytes. Below
#: it (256 GiB at 4 MiB chunks, 64 MiB at 1 KiB) what a manifest claims costs little either way.
CHUNKS_WITHOUT_SIZE_CHECK = 1 << 16

#: (base key, segment version, index name or chunk id)
CacheKey = tuple[str, str, str | int]

#: what the chunk cache holds per chunk: its original bytes
CachedChunk = bytes


@dataclasses.dataclass
class OpenSegment:
    """A segment whose manifest is loaded and whose data key is unwrapped."""

    base: str
    manifest: SegmentManifest
    codec: ChunkCodec
    cost: int  # bytes accounted in the manifest cache
    #: highest chunk id the prefetch of the segment before loaded (``_prefetch_next_segment``)
    prefetched_to: int = -1
    #: (first byte, byte after the last one served, highest chunk id it scheduled for prefetch)
    #: of the segment's last ``RECENT_READS`` reads: a read that starts after one's first byte and
    #: at most at its end continues it, and its prefetch window too
    recent_reads: collections.deque[tuple[int, int, int]] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=RECENT_READS)
    )
    #: bytes of the next segment of the partition scheduled for prefetch (see ``read``)
    next_prefetched_bytes: int = 0
    #: that next segment's base key, found once (a LIST) by the first prefetch that reaches it
    #: (a key, not the open segment: segments must not keep their successors out of the cache's
    #: accounting)
    next_segment: concurrent.futures.Future[str | None] | None = None
    #: distinguishes versions of one segment id in the caches (the manifest's attempt, or its digest)
    version: str = ""
    #: the topic partition the segment belongs to (its key's), or its base key outside the layout:
    #: what ``_prefetch_window`` counts readers by
    partition: str = ""

    def key(self, suffix: str) -> str:
        return f"{self.base}.{suffix}"

    def cache_key(self, item: str | int) -> CacheKey:
        """The key of an index (by name) or a chunk (by id) of this segment in the caches."""
        return (self.base, self.version, item)

    def __repr__(self) -> str:
        return f"OpenSegment({self.base!r})"


def _segment_of(key: CacheKey) -> str:
    """The segment (base key) an index or chunk cache entry belongs to."""
    return key[0]


class SegmentReader:
    def __init__(
        self,
        store: ObjectStore,
        layout: fkeys.KeyLayout,
        keyring: Keyring | None,
        settings: ReaderSettings = ReaderSettings(),
        prefetch_executor: concurrent.futures.Executor | None = None,
        on_cache_event: Callable[[str, str], None] = lambda cache, event: None,
        on_verified: Callable[[OpenSegment, str | int, Buffer], None] | None = None,
    ):
        """``on_verified(segment, index name or chunk id, stored bytes)`` is called for every
        stored piece once it has verified and decoded (``inspect seal`` records them)."""
        self.store = store
        self.on_verified = on_verified
        self.layout = layout
        self.keyring = keyring
        self.settings = settings
        self.manifests: ByteLRU[str, OpenSegment] = ByteLRU(
            settings.manifest_cache_bytes, lambda e: on_cache_event("manifest", e)
        )
        self.indexes: ByteLRU[CacheKey, bytes] = ByteLRU(
            settings.index_cache_bytes, lambda e: on_cache_event("index", e), group=_segment_of
        )
        self.chunks: ByteLRU[CacheKey, CachedChunk] = ByteLRU(
            settings.chunk_cache_bytes, lambda e: on_cache_event("chunk", e), group=_segment_of
        )
        #: stored chunks on disk (surviving restarts); None when ``disk_cache_path`` is empty
        self.disk: DiskChunkCache | None = (
            DiskChunkCache(
                settings.disk_cache_path, settings.disk_cache_bytes, lambda e: on_cache_event("disk", e)
            )
            if settings.disk_cache_path
            else None
        )
        self._loading: SingleFlight[CacheKey, CachedChunk] = SingleFlight()
        self._manifest_loading: SingleFlight[str, OpenSegment] = SingleFlight()
        #: how many times ``forget`` ran; a manifest loaded across a forget is not cached
        self._forgets = 0
        self._prefetch = prefetch_executor
        self._prefetch_lock = threading.Lock()
        #: partition -> when its sequential reads last scheduled a prefetch (``_prefetch_window``)
        self._active_readers: dict[str, float] = {}
        self._active_pruned = 0.0

    # -- opening ----------------------------------------------------------------
    def open(self, md: fkeys.SegmentMetadata) -> OpenSegment:
        """The segment ``md`` names; ``DataLoss`` if its objects hold another segment."""
        return self.open_base(self.layout.base(md), md.describe, SegmentIdentity.of_metadata(md))

    def open_base(
        self, base: str, describe: str | None = None, expected: SegmentIdentity | None = None
    ) -> OpenSegment:
        """Load (or take from cache) the manifest of the segment whose keys start with
        ``base`` and check that it holds ``expected`` (by default: what the key names)."""
        if expected is None:
            parsed = self.layout.parse(f"{base}.{fkeys.MANIFEST}")
            if parsed is not None:
                expected = SegmentIdentity(
                    parsed.topic_id, parsed.partition, parsed.segment_id, parsed.start_offset
                )
        seg = self._open_cached(base, describe or base)
        self._check_identity(seg, expected, describe or base)
        return seg

    def _open_cached(self, base: str, describe: str) -> OpenSegment:
        cached = self.manifests.get(base)
        if cached is not None:
            return cached
        claimed, waiting = self._manifest_loading.claim([base])
        if waiting:
            return waiting[base].result()
        forgets = self._forgets
        try:
            seg = self._load_manifest(base, describe)
        except BaseException as e:
            self._manifest_loading.fail(base, e)
            raise
        if forgets == self._forgets:  # a segment changed while loading: do not cache what may be stale
            self.manifests.put(base, seg, seg.cost)
        self._manifest_loading.resolve(base, seg)
        return seg

    def _check_identity(self, seg: OpenSegment, expected: SegmentIdentity | None, describe: str) -> None:
        if expected is None:
            return
        key = seg.key(fkeys.MANIFEST)
        found = SegmentIdentity.of_manifest(seg.manifest)
        if found is None:
            if seg.manifest.auth is not None or not self.settings.accept_unauthenticated:
                raise DataLoss(
                    f"{key}: the manifest does not say which segment it holds (no "
                    f"remoteLogSegmentMetadata); refusing to serve it as {describe}"
                )
            return
        diffs = found.differences(expected)
        if diffs:
            raise DataLoss(
                f"{key}: the manifest holds another segment than {describe} ({'; '.join(diffs)}): objects "
                f"were moved or swapped in the bucket"
            )

    def _load_manifest(self, base: str, describe: str) -> OpenSegment:
        key = f"{base}.{fkeys.MANIFEST}"
        try:
            raw = self.store.get(key)
        except ObjectNotFound:
            raise NotFound(f"segment {describe} not found: no manifest {key}") from None
        manifest = SegmentManifest.from_bytes(raw, key)
        self._check_authenticity_policy(manifest, key)
        if manifest.chunk_index.chunk_count > CHUNKS_WITHOUT_SIZE_CHECK:
            self._check_log_size(base, manifest, key)
        data_key = aad = None
        if manifest.encryption is not None:
            if self.keyring is None:
                raise FailedPrecondition(
                    f"{key}: segment is encrypted under key id {manifest.encryption.key_id!r} "
                    f"but encryption is not configured"
                )
            data_key = self.keyring.unwrap(manifest.encryption.key_id, manifest.encryption.wrapped_key, key)
            aad = manifest.encryption.aad
            if manifest.auth is not None:
                authentication.verify(manifest, data_key, key)
        codec = ChunkCodec(manifest.compression, data_key, aad)
        version = manifest.attempt or hashlib.sha256(raw).hexdigest()[:32]
        per_chunk = 80 if manifest.chunk_tags is not None or manifest.chunk_crcs is not None else 0
        cost = (
            len(raw) + manifest.chunk_index.memory_bytes + per_chunk * manifest.chunk_index.chunk_count + 1024
        )
        parsed = self.layout.parse(f"{base}.{fkeys.MANIFEST}")
        partition = f"{parsed.topic_id}-{parsed.partition}" if parsed is not None else base
        return OpenSegment(base, manifest, codec, cost, version=version, partition=partition)

    def _check_log_size(self, base: str, manifest: SegmentManifest, key: str) -> None:
        """``DataLoss`` unless the ``.log`` object has the size the chunk index claims."""
        log_key = f"{base}.{fkeys.LOG}"
        try:
            size = self.store.size(log_key)
        except ObjectNotFound:
            raise NotFound(
                f"segment {base}: data object {log_key} is missing (the manifest exists)"
            ) from None
        index = manifest.chunk_index
        if size != index.transformed_file_size:
            raise DataLoss(
                f"{key}: the chunk index claims {index.chunk_count} chunks in {index.transformed_file_size} "
                f"stored bytes, but {log_key} has {size} bytes (a damaged or forged manifest)"
            )

    def _check_authenticity_policy(self, manifest: SegmentManifest, key: str) -> None:
        """Which manifests may be read at all (see ``fetch.accept_unauthenticated_segments``)."""
        if self.settings.accept_unauthenticated:
            return
        hint = (
            "; set fetch.accept_unauthenticated_segments = true to read segments written by Aiven's plugin "
            "or by rsm-sidecar before 0.2 (migrations only: a bucket writer could then plant or rearrange "
            "them)"
        )
        if not manifest.has_extension:
            raise DataLoss(
                f"{key}: the manifest has no rsm-sidecar integrity block (written by another plugin, or "
                f"the block was stripped){hint}"
            )
        if self.keyring is not None and manifest.encryption is None:
            raise DataLoss(
                f"{key}: the segment is not encrypted but encryption is enabled (a plaintext segment "
                f"planted in the bucket, or one written before encryption was enabled){hint}"
            )
        if manifest.encryption is not None and (
            manifest.auth is None or manifest.chunk_tags is None or manifest.index_tags is None
        ):
            raise DataLoss(
                f"{key}: the encrypted segment's manifest carries no authenticator (written by "
                f"rsm-sidecar before 0.2, or the authenticator was stripped){hint}"
            )

    def forget(self, base: str) -> None:
        """Drop everything cached about a segment (after a delete, around a copy)."""
        self._forgets += 1
        self.manifests.discard(base)
        self.indexes.discard_group(base)
        self.chunks.discard_group(base)
        if self.disk is not None:
            self.disk.discard_segment(base)

    # -- indexes -----------------------------------------------------------------
    def read_index(self, seg: OpenSegment, name: str) -> bytes:
        """The plain bytes of one index; ``NotFound`` when the segment has none of that kind."""
        r = seg.manifest.indexes.get(name)
        if r is None:
            raise NoSuchIndex(f"segment {seg.base}: no {name} index")
        cached = self.indexes.get(seg.cache_key(name))
        if cached is not None:
            return cached
        key = seg.key(fkeys.INDEXES)
        if r.size == 0:
            stored = b""
        else:
            try:
                stored = self.store.get_range(key, r.position, r.position + r.size - 1)
            except ObjectNotFound:
                raise NotFound(f"segment {seg.base}: indexes object {key} is missing") from None
            except InvalidRange:
                stored = b""
            if len(stored) != r.size:
                raise DataLoss(
                    f"{key}: truncated: {name} index needs bytes {r.position}..{r.position + r.size - 1}, "
                    f"got {len(stored)} bytes"
                )
        where = f"{key} ({name} index)"
        tags = seg.manifest.index_tags
        if tags is not None and seg.codec.encrypted and stored[-TAG_BYTES:] != tags.get(name):
            raise DataLoss(
                f"{where}: the stored index is not the one written for this position (index blobs "
                f"swapped or copied in the bucket)"
            )
        crc = seg.manifest.index_crcs.get(name) if seg.manifest.index_crcs else None
        plain = seg.codec.decrypt_only(stored, where, crc)
        if self.on_verified is not None:
            self.on_verified(seg, name, stored)
        self.indexes.put(seg.cache_key(name), plain, len(plain) + 64)
        return plain

    # -- data --------------------------------------------------------------------
    @overload
    def read(
        self, seg: OpenSegment, start: int, end: int, views: Literal[False] = False
    ) -> Iterator[bytes]: ...

    @overload
    def read(self, seg: OpenSegment, start: int, end: int, views: bool) -> Iterator[bytes | memoryview]: ...

    def read(
        self, seg: OpenSegment, start: int, end: int, views: bool = False
    ) -> Iterator[bytes | memoryview]:
        """Original bytes [start, end] (inclusive; ``end`` is clamped to the segment).
        With ``views`` the pieces are memoryviews into cached chunks (no copy); callers
        that keep them must not expect ``bytes``.

        Only a sequential read prefetches the chunks after the ones it reads (``_schedule_prefetch``):
        one that starts at the segment's start or continues one of its recent reads (starts after
        that read's first byte and at most at its end: the next window of a shim, or the broker's
        next fetch, which starts at the first batch the previous one did not return whole), or
        that has already served a chunk's size. A random read downloads only the chunks it needs."""
        index = seg.manifest.chunk_index
        chunks = index.chunks_for_range(start, end)
        end = min(end, index.original_file_size - 1)
        # None while the read is not known to be sequential; then the highest chunk id prefetched
        # for it (or for the read it continues)
        prefetched = self._continues(seg, start)
        reached = start
        i = 0
        try:
            while i < len(chunks):
                for data in self._chunks_from(seg, chunks, i):
                    chunk = chunks[i]
                    lo = max(start - chunk.original_position, 0)
                    hi = min(end - chunk.original_position + 1, chunk.original_size)
                    if prefetched is None and reached - start >= index.original_chunk_size:
                        prefetched = -1
                    if prefetched is not None:
                        prefetched = self._schedule_prefetch(seg, chunk.id, prefetched)
                    piece: bytes | memoryview
                    if lo == 0 and hi == len(data):
                        piece = data
                    else:
                        piece = memoryview(data)[lo:hi] if views else data[lo:hi]
                    # Hold no chunk while the next one is fetched and decoded: one the cache
                    # evicted would otherwise stay in memory outside its accounting.
                    del data
                    reached = chunk.original_position + hi
                    yield piece
                    del piece
                    i += 1
        finally:
            if reached > start:
                with self._prefetch_lock:
                    seg.recent_reads.append((start, reached, -1 if prefetched is None else prefetched))

    def _continues(self, seg: OpenSegment, start: int) -> int | None:
        """For a sequential read from ``start`` (at the segment's start, or continuing one of its
        recent reads: see ``read``) the highest chunk id already scheduled for prefetch for it
        (-1: none); None for a read at a random place."""
        with self._prefetch_lock:
            marks = [mark for first, after, mark in seg.recent_reads if first < start <= after]
            if start == 0:  # what the segment before's prefetch already scheduled of this one
                marks.append(seg.prefetched_to)
        return max(marks) if marks else None

    def _chunks_from(self, seg: OpenSegment, chunks: Sequence[Chunk], i: int) -> Iterator[CachedChunk]:
        """Decoded chunks starting at ``chunks[i]``: one from the
        cache or from another reader's download, or a whole run downloaded with one request and yielded chunk
        by chunk as each is decoded (the first byte does not wait for the whole run)."""
        key = seg.cache_key(chunks[i].id)
        data = self.chunks.get(key)
        if data is not None:
            return iter([data])
        # Claim a run of contiguous chunks that are neither cached nor being loaded.
        run = self._run(seg, chunks[i:])
        claimed, waiting = self._loading.claim([seg.cache_key(c.id) for c in run])
        if waiting:
            return iter([waiting[key].result()])
        return self._load_run(seg, run[: len(claimed)])

    def _run(self, seg: OpenSegment, chunks: Sequence[Chunk]) -> list[Chunk]:
        """The longest prefix of ``chunks`` that is contiguous, not cached, and within
        ``max_range_bytes`` both stored and decoded (what one request holds in memory)."""
        run: list[Chunk] = []
        stored = decoded = 0
        limit = self.settings.max_range_bytes
        for c in chunks:
            if run and (
                stored + c.transformed_size > limit
                or decoded + c.original_size > limit
                or c.id != run[-1].id + 1
                or len(run) >= MAX_RUN_CHUNKS
                or self.chunks.contains(seg.cache_key(c.id))
            ):
                break
            run.append(c)
            stored += c.transformed_size
            decoded += c.original_size
        return run

    def _load_run(self, seg: OpenSegment, run: list[Chunk]) -> Iterator[CachedChunk]:
        """Verify, decode, cache and yield the claimed chunks ``run`` one by one (each from
        the disk cache or downloaded, contiguous missing ones with one request), resolving
        each chunk's single-flight future. A reader that stops early still loads the rest
        of the run (at most ``max_range_bytes``) so that readers waiting on those chunks
        get them."""
        done = [0]  # chunks of the run decoded (and resolved) so far
        chunks = self._produce_run(seg, run, done)
        try:
            for decoded in chunks:
                yield decoded
                del decoded  # not held while the next chunk is decoded
        except GeneratorExit:
            try:
                collections.deque(chunks, maxlen=0)  # keeps no chunk
            except Exception as e:
                for c in run[done[0] :]:
                    self._loading.fail(seg.cache_key(c.id), e)
            raise
        except BaseException as e:
            for c in run[done[0] :]:
                self._loading.fail(seg.cache_key(c.id), e)
            raise

    def _produce_run(self, seg: OpenSegment, run: list[Chunk], done: list[int]) -> Iterator[CachedChunk]:
        key = seg.key(fkeys.LOG)
        disk = self.disk if self.disk is not None and self.disk.enabled else None
        forgets = self._forgets
        i = 0
        while i < len(run):
            entry = self._disk_entry(seg, run[i]) if disk is not None else None
            if disk is not None and entry is not None:
                stored = disk.get(entry, run[i].transformed_size)
                if stored is not None:
                    try:
                        decoded = self._decode_chunk(seg, key, run[i], stored, run[i].transformed_position)
                    except DataLoss as e:  # the cached file is damaged: download the chunk
                        disk.invalid(entry, str(e))
                    else:
                        disk.verified()
                        del stored
                        done[0] += 1
                        yield decoded
                        del decoded
                        i += 1
                        continue
            # the longest stretch of chunks from run[i] that are not on disk: one request
            j = i + 1
            entries = [entry]
            while j < len(run):
                nxt = self._disk_entry(seg, run[j]) if disk is not None else None
                if disk is not None and nxt is not None:
                    if disk.contains(nxt):
                        break
                    disk.missed()
                entries.append(nxt)
                j += 1
            stored = self._download(seg, key, run[i:j])
            for c, entry in zip(run[i:j], entries, strict=True):
                decoded = self._decode_chunk(seg, key, c, stored, run[i].transformed_position)
                done[0] += 1
                yield decoded
                del decoded
                if disk is not None and entry is not None and forgets == self._forgets:
                    # verified: keep the stored bytes (after the reader got the chunk)
                    lo = c.transformed_position - run[i].transformed_position
                    disk.put(entry, memoryview(stored)[lo : lo + c.transformed_size])
            del stored
            i = j

    def _download(self, seg: OpenSegment, key: str, run: list[Chunk]) -> bytes:
        """The stored bytes of contiguous chunks, with one ranged GET."""
        first, last = run[0], run[-1]
        want = last.transformed_end - first.transformed_position
        if want == 0:
            return b""
        try:
            stored = self.store.get_range(key, first.transformed_position, last.transformed_end - 1)
        except ObjectNotFound:
            raise NotFound(
                f"segment {seg.base}: data object {key} is missing (the manifest exists)"
            ) from None
        except InvalidRange:
            stored = b""
        if len(stored) != want:
            raise DataLoss(
                f"{key}: truncated: chunks {first.id}..{last.id} need {want} bytes at "
                f"{first.transformed_position}, got {len(stored)}"
            )
        return stored

    def _disk_entry(self, seg: OpenSegment, c: Chunk) -> str | None:
        """The disk cache entry of a stored chunk: named by what changes with its bytes
        (copy attempt or manifest digest, position, sizes, GCM tag or CRC32C). None for a
        chunk nothing verifies (plaintext without CRCs): it is never cached on disk."""
        if seg.codec.encrypted:
            tags = seg.manifest.chunk_tags
            check = tags[c.id].hex() if tags is not None else "gcm"
        elif seg.manifest.chunk_crcs is not None:
            check = f"crc{seg.manifest.chunk_crcs[c.id]:08x}"
        else:
            return None
        return DiskChunkCache.entry(
            seg.base,
            f"{seg.version}/{c.id}/{c.transformed_position}/{c.transformed_size}/{c.original_size}/{check}",
        )

    def _decode_chunk(self, seg: OpenSegment, key: str, c: Chunk, stored: bytes, base: int) -> CachedChunk:
        """Verify and decode chunk ``c`` (at ``base`` + its position in ``stored``), cache it and
        hand it to the readers waiting for it."""
        crcs = seg.manifest.chunk_crcs
        tags = seg.manifest.chunk_tags
        lo, hi = c.transformed_position - base, c.transformed_end - base
        # a chunk of a longer run is a view into the run (no copy); decode returns its own bytes
        piece = stored if lo == 0 and hi == len(stored) else memoryview(stored)[lo:hi]
        where = f"{key} chunk {c.id}"
        if tags is not None and seg.codec.encrypted and piece[-TAG_BYTES:] != tags[c.id]:
            raise DataLoss(
                f"{where}: the stored chunk is not the one written at this position (chunks swapped or "
                f"copied in the bucket)"
            )
        crc = crcs[c.id] if crcs else None
        decoded = seg.codec.decode(piece, c.original_size, where, crc)
        if self.on_verified is not None:
            self.on_verified(seg, c.id, piece)
        self.chunks.put(seg.cache_key(c.id), decoded, len(decoded))
        self._loading.resolve(seg.cache_key(c.id), decoded)
        return decoded

    def _schedule_prefetch(self, seg: OpenSegment, chunk_id: int, scheduled: int) -> int:
        """Prefetches the window after chunk ``chunk_id`` of a sequential read for which chunks up
        to ``scheduled`` are already scheduled (each read keeps its own mark, so a reader behind
        another in the same segment is read ahead too); returns the read's new mark."""
        if (
            self._prefetch is None
            or self.settings.prefetch_bytes <= 0
            or self.settings.chunk_cache_bytes <= 0
        ):
            return scheduled
        index = seg.manifest.chunk_index
        chunk = index.chunk(chunk_id)
        # what the prefetch window reaches beyond this segment's end
        left = index.original_file_size - chunk.original_position - chunk.original_size
        with self._prefetch_lock:
            window = self._prefetch_window(seg, index.original_chunk_size)
            n = max(1, min(window // index.original_chunk_size, MAX_RUN_CHUNKS))
            last = min(chunk_id + n, index.chunk_count - 1)
            beyond = window - left
            next_bytes = 0
            find_next = None
            if self.settings.prefetch_next_segment and beyond > seg.next_prefetched_bytes:
                next_bytes = seg.next_prefetched_bytes = beyond
                if seg.next_segment is None:
                    find_next = seg.next_segment = concurrent.futures.Future()
            next_segment = seg.next_segment
            if last <= scheduled:
                todo: list[Chunk] = []
            else:
                todo = self._not_loaded(seg, max(chunk_id + 1, scheduled + 1), last)
                scheduled = last
        try:
            if todo:
                self._prefetch.submit(self._prefetch_run, seg, todo)
            if find_next is not None:  # first, so no prefetch thread waits for it to be picked up
                self._prefetch.submit(self._find_next_segment, seg, find_next)
            if next_bytes and next_segment is not None:
                self._prefetch.submit(self._prefetch_next_segment, seg, next_segment, next_bytes)
        except RuntimeError:  # executor shut down
            pass
        return scheduled

    def _prefetch_window(self, seg: OpenSegment, chunk_size: int) -> int:
        """Bytes to read ahead of a sequential read of ``seg`` (under ``_prefetch_lock``):
        ``prefetch_bytes``, or less when so many partitions are read at once that each one's
        chunk in use and window would not fit in its share of the chunk cache. 48 partitions
        catching up at once, each 4 MiB + 16 MiB ahead, would want 960 MiB of a 256 MiB cache:
        prefetched chunks were evicted before they were read and downloaded again
        (docs/operations.md, "Many partitions read at once"). The caller reads at least one
        chunk ahead whatever this returns."""
        now = time.monotonic()
        active = self._active_readers
        active[seg.partition] = now
        if now - self._active_pruned >= 1.0:
            self._active_pruned = now
            for partition in [p for p, t in active.items() if now - t > ACTIVE_READER_S]:
                del active[partition]
        share = self.settings.chunk_cache_bytes // len(active) - chunk_size
        return min(self.settings.prefetch_bytes, share)

    def _not_loaded(self, seg: OpenSegment, first: int, last: int) -> list[Chunk]:
        """Chunks ``first..last`` of ``seg`` neither cached nor being loaded."""
        return [
            seg.manifest.chunk_index.chunk(j)
            for j in range(first, last + 1)
            if not self.chunks.contains(seg.cache_key(j)) and not self._loading.in_flight(seg.cache_key(j))
        ]

    def _prefetch_run(self, seg: OpenSegment, chunks: Sequence[Chunk]) -> None:
        i = 0
        while i < len(chunks):
            run = self._run(seg, chunks[i:])
            claimed, _ = self._loading.claim([seg.cache_key(c.id) for c in run])
            if claimed:
                try:
                    collections.deque(self._load_run(seg, run[: len(claimed)]), maxlen=0)  # keeps no chunk
                except Exception as e:  # the reader that needs the chunk will report it
                    log.debug("prefetch of %s failed: %s", seg.base, e)
                    return
            i += max(len(claimed), 1)

    def _prefetch_next_segment(
        self, seg: OpenSegment, next_segment: concurrent.futures.Future[str | None], nbytes: int
    ) -> None:
        """Opens the segment after ``seg`` (its base key, once ``_find_next_segment`` found it)
        and loads its indexes and first ``nbytes``. A guess: nothing is served from it before
        a request names that segment, whose open checks the manifest against the request as
        always; any failure is left to that request."""
        try:
            base = next_segment.result()
            if base is None:
                return
            nxt = self.open_base(base)
            for name in INDEXES_PREFETCHED:
                if name in nxt.manifest.indexes:
                    self.read_index(nxt, name)
            index = nxt.manifest.chunk_index
            if index.chunk_count == 0:
                return
            last = index.chunks_for_range(0, min(nbytes, index.original_file_size) - 1)[-1].id
            with self._prefetch_lock:
                first = nxt.prefetched_to + 1
                last = min(last, first + MAX_RUN_CHUNKS - 1)
                nxt.prefetched_to = max(nxt.prefetched_to, last)
            todo = self._not_loaded(nxt, first, last)
        except Exception as e:
            log.debug("prefetch of the segment after %s failed: %s", seg.base, e)
            return
        if todo:
            self._prefetch_run(nxt, todo)

    def next_segment_metadata(self, seg: OpenSegment) -> fkeys.SegmentMetadata | None:
        """What a fetch needs to read the partition's segment after ``seg``: the one base key
        ``_next_segment`` finds (the prefetch's lookup when it ran, else this call's own LIST),
        its manifest opened and checked as for any read, and it must follow ``seg`` (same topic
        id and partition, start offset = ``seg``'s end offset + 1). None when any of that fails
        or takes longer than ``NEXT_SEGMENT_WAIT_S``: it is a hint for read-ahead (rsm.proto
        ``want_next_segment``), never what a read of ``seg`` depends on."""
        with self._prefetch_lock:
            found = seg.next_segment
            mine = found is None
            if mine:
                found = seg.next_segment = concurrent.futures.Future()
        assert found is not None
        if mine:
            self._find_next_segment(seg, found)
        try:
            base = found.result(timeout=NEXT_SEGMENT_WAIT_S)
        except concurrent.futures.TimeoutError:
            return None
        this = SegmentIdentity.of_manifest(seg.manifest)
        if base is None or this is None or this.end_offset is None:
            return None
        nxt = self.open_base(base)
        follows = SegmentIdentity.of_manifest(nxt.manifest)
        topic = nxt.manifest.topic_name
        if (
            follows is None
            or topic is None
            or follows.end_offset is None
            or (follows.topic_id, follows.partition) != (this.topic_id, this.partition)
            or follows.start_offset != this.end_offset + 1
        ):
            return None
        assert follows.topic_id is not None and follows.partition is not None
        assert follows.segment_id is not None and follows.start_offset is not None
        # the key must name the segment its manifest holds (open_base checks that only for keys
        # under the configured prefix); what precedes that name is the segment's prefix
        main = fkeys.main_path_of(
            topic, follows.topic_id, follows.partition, follows.start_offset, follows.segment_id
        )
        if not base.endswith(main):
            return None
        prefix = base[: -len(main)]
        custom = None
        if prefix != self.layout.partition_prefix(follows.topic_id, follows.partition):
            custom = custom_metadata.encode({custom_metadata.OBJECT_PREFIX: prefix})
        return fkeys.SegmentMetadata(
            topic_id=follows.topic_id,
            topic_name=topic,
            partition=follows.partition,
            segment_id=follows.segment_id,
            start_offset=follows.start_offset,
            end_offset=follows.end_offset,
            segment_size=nxt.manifest.original_size,
            custom_metadata=custom,
        ).validate()

    def _find_next_segment(self, seg: OpenSegment, found: concurrent.futures.Future[str | None]) -> None:
        try:
            found.set_result(self._next_segment(seg))
        except Exception as e:
            log.debug("no prefetch of the segment after %s: %s", seg.base, e)
            found.set_result(None)

    def _next_segment(self, seg: OpenSegment) -> str | None:
        """The base key of the partition's segment that starts right after ``seg`` ends, if
        exactly one is stored under the same prefix (a LIST of that offset's keys); None
        otherwise."""
        found = SegmentIdentity.of_manifest(seg.manifest)
        if found is None or found.end_offset is None:
            return None
        directory = seg.base[: seg.base.rindex("/") + 1]
        suffix = f".{fkeys.MANIFEST}"
        bases = [
            o.key[: -len(suffix)]
            for o in self.store.list(f"{directory}{found.end_offset + 1:020d}-")
            if o.key.endswith(suffix)
        ]
        return bases[0] if len(bases) == 1 else None
