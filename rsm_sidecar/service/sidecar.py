"""The sidecar's components, built once from the configuration and shared by the RPCs."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging

from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.format import custom_metadata
from rsm_sidecar.format.keys import KeyLayout
from rsm_sidecar.segment.access import SegmentAccess
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.journal import CopyJournal
from rsm_sidecar.segment.locks import SegmentLocks
from rsm_sidecar.segment.reader import SegmentReader
from rsm_sidecar.segment.settings import CopySettings, ReaderSettings
from rsm_sidecar.service.metrics import Metrics
from rsm_sidecar.service.settings import ServiceSettings
from rsm_sidecar.storage.base import ObjectStore
from rsm_sidecar.storage.factory import StorageSettings
from rsm_sidecar.transform.keyring import Keyring

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Sidecar:
    cfg: Config
    access: SegmentAccess
    copier: SegmentCopier
    metrics: Metrics
    transform_pool: concurrent.futures.ThreadPoolExecutor
    prefetch_pool: concurrent.futures.ThreadPoolExecutor

    @property
    def store(self) -> ObjectStore:
        return self.access.store

    @property
    def layout(self) -> KeyLayout:
        return self.access.layout

    @property
    def keyring(self) -> Keyring | None:
        return self.access.keyring

    @property
    def reader(self) -> SegmentReader:
        return self.access.reader

    @classmethod
    def from_config(cls, cfg: Config, store: ObjectStore | None = None, check_store: bool = True) -> Sidecar:
        settings, storage = CopySettings.from_config(cfg), StorageSettings.from_config(cfg)
        fields = settings.custom_metadata_fields
        worst = custom_metadata.worst_case_size(fields, storage.key_prefix, storage.hashed_prefix_chars)
        if worst > settings.custom_metadata_max_bytes:
            raise ConfigError(
                f"segment.custom_metadata_fields: {', '.join(fields)} may need {worst} bytes, more than "
                f"segment.custom_metadata_max_bytes = {settings.custom_metadata_max_bytes} "
                f"(the broker's remote.log.metadata.custom.metadata.max.bytes); drop OBJECT_KEY or "
                f"raise both limits"
            )
        metrics = Metrics()
        prefetch_pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="prefetch")
        access = SegmentAccess(
            cfg,
            ReaderSettings.from_config(cfg),
            store=store,
            prefetch=prefetch_pool,
            on_cache_event=metrics.cache_event,
        )
        store, reader = access.store, access.reader
        if check_store:
            store.check()
        metrics.track_store(store)
        for name, cache in (
            ("manifest", reader.manifests),
            ("index", reader.indexes),
            ("chunk", reader.chunks),
        ):
            metrics.track_cache(name, cache)
        if reader.disk is not None:
            metrics.track_disk_cache(reader.disk)
        limits = ServiceSettings.from_config(cfg).copy
        transform_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(64, limits.max_concurrent * settings.parallelism),
            thread_name_prefix="transform",
        )
        locks = SegmentLocks()
        journal = CopyJournal(limits.journal_dir, store, locks) if limits.journal_dir else None
        if journal is not None:
            metrics.track_journal(journal)
        copier = access.copier(settings, transform_pool, journal, locks)
        return cls(cfg, access, copier, metrics, transform_pool, prefetch_pool)

    def close(self) -> None:
        self.prefetch_pool.shutdown(wait=False, cancel_futures=True)
        self.transform_pool.shutdown(wait=True, cancel_futures=True)
        self.access.close()
        if self.copier.journal is not None:
            self.copier.journal.close()
