"""What every inspect command works with, built from the sidecar's own configuration
file (``--config``, with ``RSM__...`` environment overrides): the sidecar's segment access
(:class:`~rsm_sidecar.segment.access.SegmentAccess`) with the keyring loaded only when a
command needs keys, and a segment reader whose caches are off, so memory stays bounded by
one ranged GET (``fetch.max_range_bytes``) whatever the segment size. Every other reader
setting is the sidecar's own (``ReaderSettings.from_config``), e.g.
``fetch.accept_unauthenticated_segments``."""

from __future__ import annotations

import os

from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError, InvalidArgument
from rsm_sidecar.segment.access import SegmentAccess
from rsm_sidecar.segment.settings import ReaderSettings
from rsm_sidecar.storage.base import ObjectStore


def reader_settings(cfg: Config) -> ReaderSettings:
    """The sidecar's reader settings for ``cfg`` (what may be read, and how) with the caches,
    read-ahead and disk cache off: memory stays one ranged GET."""
    return ReaderSettings.from_config(cfg).with_caches(
        manifest_cache_bytes=4 * 1024 * 1024,
        index_cache_bytes=0,
        chunk_cache_bytes=0,
        prefetch_bytes=0,
        disk_cache_path="",
        prefetch_next_segment=False,
    )


class UsageError(InvalidArgument):
    """A command-line argument that cannot be used as given (exit code 2)."""


class InspectContext(SegmentAccess):
    def __init__(self, cfg: Config, store: ObjectStore | None = None):
        super().__init__(cfg, reader_settings(cfg), store=store, lazy_keys=True)

    @classmethod
    def load(cls, config_path: str | os.PathLike[str] | None) -> InspectContext:
        cfg = Config.load(config_path)
        require_local_root(cfg)
        return cls(cfg)


def require_local_root(cfg: Config) -> None:
    """The tools read what a sidecar stored: a local root that is not a directory is a wrong
    path, not an empty store (``serve`` creates it; the tools never do)."""
    if cfg["storage.backend"] != "local":
        return
    root = os.path.abspath(cfg["storage.local.root"])
    if not os.path.isdir(root):
        what = "is not a directory" if os.path.exists(root) else "does not exist"
        raise ConfigError(
            f"storage.local.root: {root} {what}, so there is nothing to inspect: point "
            f"storage.local.root (or RSM__STORAGE__LOCAL__ROOT) at the directory the sidecar stores in"
        )
