"""The tiered segments of one configuration: its object store, key layout, keyring and
segment reader, built the same way for the sidecar, the inspection CLI, the Iceberg job's
executors and the benchmarks. Only the reader's cache and prefetch settings differ
between them; they are the caller's."""

from __future__ import annotations

import concurrent.futures
import functools
from collections.abc import Callable

from rsm_sidecar.config import Config
from rsm_sidecar.format.keys import KeyLayout
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.journal import CopyJournal
from rsm_sidecar.segment.locks import SegmentLocks
from rsm_sidecar.segment.reader import SegmentReader
from rsm_sidecar.segment.settings import CopySettings, ReaderSettings
from rsm_sidecar.storage.base import ObjectStore
from rsm_sidecar.storage.factory import StorageSettings, open_store
from rsm_sidecar.transform.keyring import Keyring


def key_layout(cfg: Config) -> KeyLayout:
    """The object keys of ``storage.key_prefix`` and ``storage.hashed_prefix_chars``."""
    storage = StorageSettings.from_config(cfg)
    return KeyLayout(storage.key_prefix, storage.hashed_prefix_chars)


class SegmentAccess:
    """Store, key layout, keyring and reader of the configuration ``cfg``.

    The keyring (and the reader, which needs it) is loaded on first use when ``lazy_keys``,
    so that commands that never decrypt work without the private keys; otherwise at once,
    before the store is opened, so that a key problem is reported first."""

    def __init__(
        self,
        cfg: Config,
        reader_settings: ReaderSettings,
        *,
        store: ObjectStore | None = None,
        prefetch: concurrent.futures.Executor | None = None,
        on_cache_event: Callable[[str, str], None] = lambda cache, event: None,
        lazy_keys: bool = False,
    ):
        self.cfg = cfg
        self.layout = key_layout(cfg)
        self.reader_settings = reader_settings
        self.prefetch = prefetch
        self.on_cache_event = on_cache_event
        if not lazy_keys:
            _ = self.keyring
        self.store = store if store is not None else open_store(cfg)
        if not lazy_keys:
            _ = self.reader  # built now, not by whichever thread asks first

    @functools.cached_property
    def keyring(self) -> Keyring | None:
        """The configured keyring; None when encryption is off."""
        return Keyring.from_config(self.cfg)

    @functools.cached_property
    def reader(self) -> SegmentReader:
        return SegmentReader(
            self.store, self.layout, self.keyring, self.reader_settings, self.prefetch, self.on_cache_event
        )

    def copier(
        self,
        settings: CopySettings,
        executor: concurrent.futures.Executor,
        journal: CopyJournal | None = None,
        locks: SegmentLocks | None = None,
    ) -> SegmentCopier:
        """A copier into this store whose rewrites drop the reader's cached copies."""
        return SegmentCopier(
            self.store,
            self.layout,
            self.keyring,
            settings,
            executor,
            journal,
            locks,
            on_rewrite=self.reader.forget,
        )

    def close(self) -> None:
        self.store.close()
