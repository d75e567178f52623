"""What every inspect command works with, built from the sidecar's own configuration
file (``--config``, with ``RSM__...`` environment overrides): the object store, the key
layout (prefix, hashed prefix), the keyring (loaded only when a command needs keys) and
a segment reader whose caches are off, so memory stays bounded by one ranged GET
(``fetch.max_range_bytes``) whatever the segment size."""

from __future__ import annotations

import os

from rsm_sidecar.config import Config
from rsm_sidecar.errors import InvalidArgument
from rsm_sidecar.format.keys import KeyLayout
from rsm_sidecar.segment.reader import ReaderSettings, SegmentReader
from rsm_sidecar.storage.base import ObjectStore
from rsm_sidecar.storage.factory import open_store
from rsm_sidecar.transform.keyring import Keyring

_UNSET = object()


class UsageError(InvalidArgument):
    """A command-line argument that cannot be used as given (exit code 2)."""


class InspectContext:
    def __init__(self, cfg: Config, store: ObjectStore | None = None):
        self.cfg = cfg
        self.layout = KeyLayout(cfg["storage.key_prefix"], cfg["storage.hashed_prefix_chars"])
        self.store = store if store is not None else open_store(cfg)
        self._keyring = _UNSET
        self._reader: SegmentReader | None = None

    @classmethod
    def load(cls, config_path: str | os.PathLike | None) -> InspectContext:
        return cls(Config.load(config_path))

    @property
    def keyring(self) -> Keyring | None:
        """The configured keyring (None when encryption is off); loaded on first use, so
        commands that never decrypt work without the private keys."""
        if self._keyring is _UNSET:
            self._keyring = Keyring.from_config(self.cfg)
        return self._keyring  # type: ignore[return-value]

    @property
    def reader(self) -> SegmentReader:
        if self._reader is None:
            settings = ReaderSettings(
                manifest_cache_bytes=4 * 1024 * 1024,
                index_cache_bytes=0,
                chunk_cache_bytes=0,
                prefetch_bytes=0,
                max_range_bytes=self.cfg["fetch.max_range_bytes"],
            )
            self._reader = SegmentReader(self.store, self.layout, self.keyring, settings)
        return self._reader

    def close(self) -> None:
        self.store.close()
