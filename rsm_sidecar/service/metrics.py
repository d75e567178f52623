"""Prometheus metrics of the sidecar. Every metric is listed in docs/operations.md."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import prometheus_client as prom
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rsm_sidecar.segment.disk_cache import DiskChunkCache
from rsm_sidecar.segment.journal import CopyJournal
from rsm_sidecar.storage.base import ObjectStore


class SizedCache(Protocol):
    """What the cache gauges read: ``ByteLRU`` and ``DiskChunkCache``."""

    @property
    def size_bytes(self) -> int: ...

    def __len__(self) -> int: ...


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, registry: prom.CollectorRegistry | None = None):
        self.registry = registry or prom.CollectorRegistry()
        r = self.registry
        self.operations = prom.Counter(
            "rsm_operations",
            "RPCs handled, by operation and outcome (OK or the gRPC status name).",
            ["op", "outcome"],
            registry=r,
        )
        self.latency = prom.Histogram(
            "rsm_operation_seconds",
            "RPC duration in seconds (for fetches: until the stream ends).",
            ["op"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_byte = prom.Histogram(
            "rsm_fetch_first_byte_seconds",
            "Fetch: time from the call to its first message.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = prom.Gauge("rsm_in_flight", "RPCs in progress, by operation.", ["op"], registry=r)
        self.bytes = prom.Counter(
            "rsm_bytes",
            "Bytes moved: copy_original (segment bytes received), copy_stored "
            "(bytes written to storage), fetch_served (original bytes sent), fetch_channel (the part of "
            "fetch_served sent over the fetch channel; the rest went over gRPC), index_served.",
            ["kind"],
            registry=r,
        )
        self.tls_refusals = prom.Counter(
            "rsm_tls_handshake_failures",
            "TLS handshakes the sidecar's listener refused or that failed, by reason (see "
            "docs/operations.md: client_certificate_untrusted, client_certificate_expired, "
            "client_certificate_invalid, no_client_certificate, server_certificate_refused, not_tls, "
            "no_common_protocol, closed, timeout, other).",
            ["reason"],
            registry=r,
        )
        self.segments = prom.Counter(
            "rsm_segments_copied", "Segments copied, by whether zstd was applied.", ["compressed"], registry=r
        )
        self.cache_events = prom.Counter(
            "rsm_cache_events",
            "Cache hits, misses and evictions by cache (manifest, index, chunk, disk); "
            "verification_failure of disk cache entries.",
            ["cache", "event"],
            registry=r,
        )
        self._caches: dict[str, SizedCache] = {}
        self._disk: DiskChunkCache | None = None
        self._stores: list[ObjectStore] = []
        self._journal: CopyJournal | None = None
        r.register(_DynamicCollector(self))

    def track_cache(self, name: str, cache: SizedCache) -> None:
        self._caches[name] = cache

    def track_disk_cache(self, cache: DiskChunkCache) -> None:
        self.track_cache("disk", cache)
        self._disk = cache

    def track_journal(self, journal: CopyJournal) -> None:
        self._journal = journal

    def track_store(self, store: ObjectStore) -> None:
        self._stores.append(store)

    def cache_event(self, cache: str, event: str) -> None:
        self.cache_events.labels(cache, event).inc()


class _DynamicCollector:
    def __init__(self, metrics: Metrics):
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        size = GaugeMetricFamily("rsm_cache_bytes", "Bytes held by each cache.", labels=["cache"])
        for name, cache in self.m._caches.items():
            size.add_metric([name], cache.size_bytes)
        yield size
        entries = GaugeMetricFamily("rsm_cache_entries", "Entries held by each cache.", labels=["cache"])
        for name, cache in self.m._caches.items():
            entries.add_metric([name], len(cache))
        yield entries
        if self.m._disk is not None:
            on = GaugeMetricFamily(
                "rsm_disk_cache_enabled",
                "1 while the disk chunk cache works; 0 after an I/O error turned it off.",
            )
            on.add_metric([], 1 if self.m._disk.enabled else 0)
            yield on
        reqs = CounterMetricFamily(
            "rsm_storage_requests",
            "Requests sent to object storage by backend and operation.",
            labels=["backend", "op"],
        )
        for store in self.m._stores:
            for op, n in sorted(store.requests.items()):
                reqs.add_metric([store.name, op], n)
        yield reqs
        received = CounterMetricFamily(
            "rsm_storage_bytes_read",
            "Bytes received from object storage (whole and ranged GETs) by backend.",
            labels=["backend"],
        )
        for store in self.m._stores:
            received.add_metric([store.name], store.bytes_read)
        yield received
        if self.m._journal is not None:
            pending = GaugeMetricFamily(
                "rsm_copy_leftovers",
                "Interrupted copies whose objects are still in storage, waiting for the journal sweep.",
            )
            pending.add_metric([], self.m._journal.leftovers())
            yield pending
