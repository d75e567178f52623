"""What every inspect command works with, built from the sidecar's own configuration
file (``--config``, with ``RSM__...`` environment overrides): the sidecar's segment access
(:class:`~rsm_sidecar.segment.access.SegmentAccess`) with the keyring loaded only when a
command needs keys, and a segment reader whose caches are off, so memory stays bounded by
one ranged GET (``fetch.max_range_bytes``) whatever the segment size."""

from __future__ import annotations

import os

from rsm_sidecar.config import Config
from rsm_sidecar.errors import InvalidArgument
from rsm_sidecar.segment.access import SegmentAccess
from rsm_sidecar.segment.reader import ReaderSettings
from rsm_sidecar.storage.base import ObjectStore


class UsageError(InvalidArgument):
    """A command-line argument that cannot be used as given (exit code 2)."""


class InspectContext(SegmentAccess):
    def __init__(self, cfg: Config, store: ObjectStore | None = None):
        settings = ReaderSettings(
            manifest_cache_bytes=4 * 1024 * 1024,
            index_cache_bytes=0,
            chunk_cache_bytes=0,
            prefetch_bytes=0,
            max_range_bytes=cfg["fetch.max_range_bytes"],
        )
        super().__init__(cfg, settings, store=store, lazy_keys=True)

    @classmethod
    def load(cls, config_path: str | os.PathLike[str] | None) -> InspectContext:
        return cls(Config.load(config_path))
