"""The keys of the copier and the reader of stored segments, declared once, as the fields of
``CopySettings`` and ``ReaderSettings`` (what :mod:`.copy` and :mod:`.reader` are given).

Light on purpose: every ``Config()`` loads this module, so it imports nothing but the
configuration code.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rsm_sidecar.config import Settings, setting

if TYPE_CHECKING:
    from rsm_sidecar.config import Config

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class CopySettings(Settings):
    """How the copier cuts, compresses and uploads a segment, and what it hands back to the
    broker (``segment.*``, ``copy.parallelism``, ``copy.upload_rate_limit``)."""

    chunk_size: int = setting(
        "size",
        4 * MiB,
        "Size of the original chunks a segment is cut into; each is compressed/encrypted on its own, "
        "so a ranged fetch downloads whole chunks.",
        key="segment.chunk_size",
        min=1024,
        max=1024 * MiB,
    )
    compression: bool = setting("bool", True, "Compress chunks with zstd.", key="segment.compression")
    compression_heuristic: bool = setting(
        "bool",
        True,
        "Skip zstd for segments whose record batches are already compressed by the producer (decided "
        "from the batch headers of the first chunk).",
        key="segment.compression_heuristic",
    )
    compression_level: int = setting(
        "int",
        3,
        "zstd compression level (higher: smaller, slower).",
        key="segment.compression_level",
        min=-7,
        max=22,
    )
    custom_metadata_fields: tuple[str, ...] = setting(
        "list",
        ("REMOTE_SIZE", "OBJECT_PREFIX"),
        "KIP-917 fields returned to the broker with each copy (Aiven-compatible tags). OBJECT_PREFIX "
        "lets fetch and delete find segments written under an older `storage.key_prefix`.",
        key="segment.custom_metadata_fields",
        choices=("REMOTE_SIZE", "OBJECT_PREFIX", "OBJECT_KEY"),
    )
    custom_metadata_max_bytes: int = setting(
        "int",
        128,
        "The broker's `remote.log.metadata.custom.metadata.max.bytes`; start-up fails if the "
        "configured fields could exceed it.",
        key="segment.custom_metadata_max_bytes",
        min=0,
    )
    parallelism: int = setting(
        "int", 2, "Chunks of one segment transformed concurrently.", key="copy.parallelism", min=1, max=64
    )
    upload_rate_limit: int = setting(
        "size",
        0,
        "Bytes per second that all copies of this sidecar together may upload (`.log` chunks and "
        "`.indexes`), so that tiering a backlog cannot saturate the broker's network; at most one "
        "second of budget is saved up while idle. 0: no limit. Aiven's "
        "`upload.rate.limit.bytes.per.second`; the broker's own limit is "
        "`remote.log.manager.copy.max.bytes.per.second`.",
        key="copy.upload_rate_limit",
        min=0,
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "custom_metadata_fields", tuple(self.custom_metadata_fields))


@dataclasses.dataclass(frozen=True)
class ReaderSettings(Settings):
    """How stored segments are read: caches, read-ahead, ranged GETs, which segments are
    trusted (``cache.*``, ``fetch.max_range_bytes``, ``fetch.accept_unauthenticated_segments``,
    ``fetch.disk_cache.*``).

    ``from_config`` gives the sidecar's reader settings. Every other reader of a configuration
    (inspect, the Iceberg job's executors) starts from these and changes only ``CACHE_FIELDS``
    (``with_caches``), so what may be read and how is the same for all of them."""

    manifest_cache_bytes: int = setting(
        "size",
        32 * MiB,
        "Parsed segment manifests kept in memory (bytes of JSON).",
        key="cache.manifest_bytes",
        min=0,
    )
    index_cache_bytes: int = setting(
        "size", 64 * MiB, "Plain index files kept in memory.", key="cache.index_bytes", min=0
    )
    chunk_cache_bytes: int = setting(
        "size",
        256 * MiB,
        "Decoded (plain) chunks kept in memory; 0 disables the chunk cache.",
        key="cache.chunk_bytes",
        min=0,
    )
    prefetch_bytes: int = setting(
        "size",
        16 * MiB,
        "Sequential prefetch: after a sequential fetch reads a chunk, the next chunks up to this many"
        " original bytes are loaded into the chunk cache in the background; 0 disables. A fetch is "
        "sequential when it starts at the segment's start, continues one of the segment's last 16 "
        "fetches (starts after its first byte and at most at its end), or has served a chunk's size; "
        "a fetch at a random place downloads only the chunks it needs. Near a segment's end the "
        "window reaches into the partition's next segment (the one starting at this one's end offset "
        "+ 1, found with one LIST when exactly one is stored): its manifest, its offset, time and "
        "transaction indexes and its first chunks, so the broker's first reads of it do not wait for "
        "the object store. While several partitions are read sequentially at once (each within the "
        "last 5 s), each gets an equal share of `cache.chunk_bytes` for its chunk in use and its "
        "window, so the window shrinks to fit (at least one chunk): prefetched chunks are not evicted"
        " before they are read.",
        key="cache.prefetch_bytes",
        min=0,
    )
    max_range_bytes: int = setting(
        "size",
        8 * MiB,
        "Largest single ranged GET a fetch issues; contiguous chunks up to this size are read in one "
        "request. Each fetch stream and each of the 4 prefetch threads holds at most one such range "
        "in memory (docs/operations.md, Memory).",
        key="fetch.max_range_bytes",
        min=1024,
    )
    accept_unauthenticated: bool = setting(
        "bool",
        False,
        "Read segments whose manifest carries no rsm-sidecar authenticator: written by Aiven's plugin"
        " or by rsm-sidecar before 0.2, or unencrypted while encryption is enabled. For migrations "
        "only: whoever can write the bucket can then plant, swap or rearrange such segments.",
        key="fetch.accept_unauthenticated_segments",
    )
    disk_cache_path: str = setting(
        "path",
        "",
        "Directory of the disk chunk cache: stored chunks (as downloaded, still compressed and "
        "encrypted; never plaintext) kept across restarts and verified again on every use. Created "
        "0700, files 0600. Empty: no disk cache. An unusable directory or a full disk turns the cache"
        " off with one warning.",
        key="fetch.disk_cache.path",
    )
    disk_cache_bytes: int = setting(
        "size",
        1024 * MiB,
        "Capacity of the disk chunk cache (sum of its file sizes); least recently used chunks are "
        "evicted beyond it. Each sidecar bounds what it wrote or read; sidecars sharing a directory "
        "may together use the sum of their capacities.",
        key="fetch.disk_cache.bytes",
        min=1024,
    )
    #: whether prefetch continues into the partition's next segment: yes for the broker's
    #: reads (the sidecar); no for a Spark executor, whose next task may read another segment
    prefetch_next_segment: bool = False

    @classmethod
    def from_config(cls, cfg: Config, prefix: str | None = None) -> ReaderSettings:
        return dataclasses.replace(super().from_config(cfg, prefix), prefetch_next_segment=True)

    def with_caches(self, **sizes: int | str | bool) -> ReaderSettings:
        """These settings with other cache and read-ahead sizes (members of ``CACHE_FIELDS``
        only: anything else is how segments are read and stays the configuration's)."""
        unknown = set(sizes) - CACHE_FIELDS
        if unknown:
            raise TypeError(f"not cache settings: {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **sizes)  # type: ignore[arg-type]


#: the ``ReaderSettings`` members that only size caches and read-ahead: the one thing a reader
#: other than the sidecar chooses for itself (``ReaderSettings.with_caches``)
CACHE_FIELDS = frozenset(
    {
        "manifest_cache_bytes",
        "index_cache_bytes",
        "chunk_cache_bytes",
        "prefetch_bytes",
        "disk_cache_path",
        "disk_cache_bytes",
        "prefetch_next_segment",
    }
)


CONFIG_KEYS = CopySettings.keys() + ReaderSettings.keys()
