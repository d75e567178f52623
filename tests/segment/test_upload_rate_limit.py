"""copy.upload_rate_limit: all copies of a sidecar together store at most that many bytes per
second. Real copies (incompressible, unencrypted segments into a local-directory store, so
stored bytes = original bytes + nothing) are timed against the limit."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time

import pytest

from rsm_sidecar.config import Config
from rsm_sidecar.errors import Cancelled
from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.rate_limit import RateLimiter
from rsm_sidecar.segment.settings import CopySettings
from rsm_sidecar.segment.sources import BytesSource
from rsm_sidecar.storage.local import LocalObjectStore

MiB = 1024 * 1024
LIMIT = 4 * MiB
POOL = concurrent.futures.ThreadPoolExecutor(4)
INDEXES = {"offset": b"\x00" * 8, "timestamp": b"\x01" * 12, "producerSnapshot": b"snap", "transaction": None}


def _metadata(n: int, size: int) -> SegmentMetadata:
    sid = f"rate{n:018d}"[:22].ljust(22, "A")
    return SegmentMetadata(
        "MWJ6FHTfRYy67jzwZdeqSQ", "rate-topic", 0, sid, n * 100, n * 100 + 99, segment_size=size
    )


def _copier(tmp_path, limit: int) -> tuple[SegmentCopier, LocalObjectStore]:
    store = LocalObjectStore(tmp_path, fsync=False)
    settings = CopySettings(chunk_size=1 * MiB, compression=False, upload_rate_limit=limit)
    return SegmentCopier(store, KeyLayout("rate"), None, settings, POOL), store


def _stored_bytes(store: LocalObjectStore) -> int:
    return sum(obj.size for obj in store.list("rate"))


def test_one_copy_stores_at_the_limit(tmp_path):
    copier, store = _copier(tmp_path, LIMIT)
    data = os.urandom(12 * MiB)
    t0 = time.monotonic()
    copier.copy(_metadata(1, len(data)), BytesSource(data, dict(INDEXES)), b"0\n1\n0 0\n")
    elapsed = time.monotonic() - t0
    rate = _stored_bytes(store) / elapsed
    assert 0.9 * LIMIT <= rate <= 1.1 * LIMIT, f"{rate / MiB:.2f} MiB/s under a {LIMIT / MiB:.0f} MiB/s limit"


def test_concurrent_copies_share_one_budget(tmp_path):
    copier, store = _copier(tmp_path, LIMIT)
    sources = [os.urandom(6 * MiB) for _ in range(3)]
    t0 = time.monotonic()
    threads = [
        threading.Thread(
            target=copier.copy, args=(_metadata(i, len(d)), BytesSource(d, dict(INDEXES)), b"0\n1\n0 0\n")
        )
        for i, d in enumerate(sources, start=10)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    assert len([o for o in store.list("rate") if o.key.endswith(".rsm-manifest")]) == 3
    rate = _stored_bytes(store) / elapsed
    assert 0.9 * LIMIT <= rate <= 1.1 * LIMIT, f"{rate / MiB:.2f} MiB/s for three copies together"


def test_without_a_limit_copies_are_not_slowed(tmp_path):
    copier, store = _copier(tmp_path, 0)
    data = os.urandom(12 * MiB)
    t0 = time.monotonic()
    copier.copy(_metadata(2, len(data)), BytesSource(data, dict(INDEXES)), b"0\n1\n0 0\n")
    assert time.monotonic() - t0 < 12 * MiB / LIMIT / 2  # far faster than the limited copy


def test_a_waiting_copy_is_cancelled_promptly_and_beats_meanwhile():
    limiter = RateLimiter(1 * MiB)
    beats = []
    limiter.acquire(1 * MiB)  # debt of about a second
    cancel_at = time.monotonic() + 1.2
    t0 = time.monotonic()
    with pytest.raises(Cancelled, match="upload budget"):
        limiter.acquire(
            8 * MiB, is_cancelled=lambda: time.monotonic() > cancel_at, heartbeat=lambda: beats.append(1)
        )
    assert time.monotonic() - t0 < 2.5  # not the 9 s the budget asked for
    assert len(beats) >= 2


def test_idle_budget_saves_up_one_second_at_most():
    now = [0.0]
    limiter = RateLimiter(1 * MiB, clock=lambda: now[0])
    now[0] = 100.0  # idle for 100 s
    assert limiter.acquire(1 * MiB) == 0.0  # one second's worth at once
    assert limiter.acquire(MiB // 2) == pytest.approx(0.5)  # and no more


def test_the_limit_comes_from_the_configuration():
    cfg = Config({"storage": {"local": {"root": "/unused"}}, "copy": {"upload_rate_limit": "8MiB"}})
    assert CopySettings.from_config(cfg).upload_rate_limit == 8 * MiB
    assert (
        CopySettings.from_config(Config({"storage": {"local": {"root": "/unused"}}})).upload_rate_limit == 0
    )
