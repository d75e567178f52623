"""Sequential prefetch only behind sequential reads, through the real gRPC service on a
local-directory store (a second sidecar, so nothing of the copy is in its caches).

A read at a random place downloads the chunks it needs and nothing more: before, every read
also loaded the next ``cache.prefetch_bytes`` (16 MiB by default, for a 1 MiB read), which a
consumer seeking around a segment paid for in object-store bytes and in CPU taken from the
reads it waited for. A read from the segment's start, one that continues an earlier read (the
broker's next fetch, a shim's next window) and a long read still prefetch."""

from __future__ import annotations

import os

from tests.service.rsm_client import metadata, seg_id
from tests.service.test_prefetch_next_segment import KeyCountingStore, _copy, _settled

KiB = 1024
CHUNK = 64 * KiB
PREFETCH = 4 * CHUNK
STORED_CHUNK = CHUNK + 28  # uncompressed: IV + GCM tag


def _log(n_lines: int) -> bytes:
    return b"".join(b"%08d %s\n" % (i, os.urandom(24).hex().encode()) for i in range(n_lines))


def _segment(start_sidecar, tmp_path):
    settings = dict(encryption=True, segment__chunk_size=CHUNK, segment__compression=False)
    writer = start_sidecar(**settings)
    log = _log(40_000)  # about 2.2 MiB: 35 chunks
    md = metadata(seg_id(1), 0, 39_999, size=len(log))
    _copy(writer, tmp_path, "seg", md, log)
    store = KeyCountingStore(tmp_path / "remote", fsync=False)
    # one chunk per storage request, so that what was read is what was asked for or prefetched
    reader = start_sidecar(
        store=store, cache__prefetch_bytes=PREFETCH, fetch__max_range_bytes=STORED_CHUNK, **settings
    )
    return reader, store, md, log


def _chunks_read(store: KeyCountingStore, since: int = 0) -> set[int]:
    """Ids of the stored chunks the reads of the segment's data object covered."""
    out: set[int] = set()
    for first, n in store.read_of(seg_id(1), ".log", since):
        out.update(range(first // STORED_CHUNK, (first + n - 1) // STORED_CHUNK + 1))
    return out


def test_random_reads_download_only_their_chunks_and_sequential_ones_prefetch(start_sidecar, tmp_path):
    sc, store, md, log = _segment(start_sidecar, tmp_path)

    # three reads at random places, inside one chunk each, and one across a chunk boundary
    reads = [(10 * CHUNK + 100, 10 * CHUNK + 999), (3 * CHUNK + 5, 3 * CHUNK + 5000)]
    reads += [(20 * CHUNK + 7, 20 * CHUNK + 60_000), (27 * CHUNK - 500, 27 * CHUNK + 500)]
    for lo, hi in reads:
        assert sc.client.fetch(md, lo, hi) == log[lo : hi + 1]
    _settled(store)
    assert _chunks_read(store) == {10, 3, 20, 26, 27}

    # the same reads again: from the chunk cache, and still no prefetch
    since = len(store.ranges)
    for lo, hi in reads:
        assert sc.client.fetch(md, lo, hi) == log[lo : hi + 1]
    _settled(store)
    assert _chunks_read(store, since) == set()

    # a read that continues one of them (the broker's next fetch starts at the first batch the
    # previous one did not return whole, inside it) loads the prefetch window after it
    since = len(store.ranges)
    lo, hi = 10 * CHUNK + 900, 11 * CHUNK + 10
    assert sc.client.fetch(md, lo, hi) == log[lo : hi + 1]
    _settled(store)
    assert _chunks_read(store, since) == {11, 12, 13, 14, 15}

    # and so does a read that starts right where another ended (a shim's next window)
    since = len(store.ranges)
    lo, hi = 3 * CHUNK + 5001, 3 * CHUNK + 6000
    assert sc.client.fetch(md, lo, hi) == log[lo : hi + 1]
    _settled(store)
    assert _chunks_read(store, since) == {4, 5, 6, 7}


def test_a_read_from_the_start_and_a_long_read_prefetch(start_sidecar, tmp_path):
    sc, store, md, log = _segment(start_sidecar, tmp_path)

    assert sc.client.fetch(md, 0, 999) == log[:1000]
    _settled(store)
    assert _chunks_read(store) == {0, 1, 2, 3, 4}

    # a long read from a random place: once it has served a chunk's size, it reads ahead
    since = len(store.ranges)
    lo, hi = 16 * CHUNK + 1, 19 * CHUNK
    assert sc.client.fetch(md, lo, hi) == log[lo : hi + 1]
    _settled(store)
    # chunks 16-19 asked for; from chunk 18 on (a chunk's size served) each is followed by the
    # prefetch window of 4 chunks: 19-22, then 20-23
    assert _chunks_read(store, since) == set(range(16, 24))
