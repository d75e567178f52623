"""Prefetch windows shrink when many partitions are read at once, through the real gRPC
service on a local-directory store (a second sidecar, so nothing of the copy is cached).

With 48 partitions catching up at once on one broker, each reader's 16 MiB prefetch window
wanted several times the 256 MiB chunk cache: prefetched chunks were evicted before they were
read and downloaded again (0.62 storage bytes per byte consumed against 0.20 at 12 partitions;
docs/operations.md, "Many partitions read at once"). Each partition read in the last few
seconds now gets an equal share of the chunk cache for its chunk in use and its window, and at
least one chunk is read ahead."""

from __future__ import annotations

from tests.service.rsm_client import metadata, seg_id
from tests.service.test_prefetch_next_segment import KeyCountingStore, _copy, _settled
from tests.service.test_prefetch_random_reads import CHUNK, STORED_CHUNK, _log

PREFETCH = 4 * CHUNK
CACHE = 10 * CHUNK
PARTITIONS = 4


def _chunks_read(store: KeyCountingStore, partition: int, since: int = 0) -> set[int]:
    out: set[int] = set()
    for first, n in store.read_of(seg_id(100 + partition), ".log", since):
        out.update(range(first // STORED_CHUNK, (first + n - 1) // STORED_CHUNK + 1))
    return out


def test_each_partition_read_at_once_gets_a_share_of_the_chunk_cache(start_sidecar, tmp_path):
    settings = dict(encryption=True, segment__chunk_size=CHUNK, segment__compression=False)
    writer = start_sidecar(**settings)
    logs, mds = [], []
    for p in range(PARTITIONS):
        log = _log(40_000)  # about 2.2 MiB: 35 chunks
        md = metadata(seg_id(100 + p), 0, 39_999, size=len(log), partition=p)
        _copy(writer, tmp_path, f"seg{p}", md, log)
        logs.append(log)
        mds.append(md)
    store = KeyCountingStore(tmp_path / "remote", fsync=False)
    # one chunk per storage request, a chunk cache of 10 chunks, a window of 4
    sc = start_sidecar(
        store=store,
        cache__prefetch_bytes=PREFETCH,
        cache__chunk_bytes=CACHE,
        fetch__max_range_bytes=STORED_CHUNK,
        **settings,
    )

    # partition 0 alone: the whole window (its chunk and 4 ahead fit in the cache)
    assert sc.client.fetch(mds[0], 0, 1000) == logs[0][:1001]
    _settled(store)
    assert _chunks_read(store, 0) == {0, 1, 2, 3, 4}

    # the others start while it is read: a share of the cache each, less the chunk in use
    # (10/2 - 1 = 4 chunks ahead, 10/3 - 1 = 2, then 10/4 - 1 = 1)
    ahead = {}
    for p in range(1, PARTITIONS):
        since = len(store.ranges)
        assert sc.client.fetch(mds[p], 0, 1000) == logs[p][:1001]
        _settled(store)
        ahead[p] = _chunks_read(store, p, since)
    assert ahead == {1: {0, 1, 2, 3, 4}, 2: {0, 1, 2}, 3: {0, 1}}

    # the four read on in turns, to the next chunk boundary per fetch (a fetch of 1 MiB of 4 MiB
    # chunks stays in one chunk 3 times in 4), as a consumer fetching them all at once:
    # every byte right, and no chunk downloaded twice (with 4 chunks ahead each, 20 of 10 would
    # be wanted at once and prefetched chunks evicted before they were read)
    since = len(store.ranges)
    pos = [1001] * PARTITIONS
    while any(pos[p] < len(logs[p]) for p in range(PARTITIONS)):
        for p in range(PARTITIONS):
            if pos[p] < len(logs[p]):
                hi = min((pos[p] // CHUNK + 1) * CHUNK, len(logs[p])) - 1
                assert sc.client.fetch(mds[p], pos[p], hi) == logs[p][pos[p] : hi + 1]
                pos[p] = hi + 1
    _settled(store)
    for p in range(PARTITIONS):
        ids = [first // STORED_CHUNK for first, _ in store.read_of(seg_id(100 + p), ".log", since)]
        assert len(ids) == len(set(ids)), f"partition {p}: chunks downloaded twice: {sorted(ids)}"
