"""Measured resource bounds: what a cancelled fetch reads from storage, and the
sidecar's memory while it copies a 1 GiB segment."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tests.counting_store import CountingStore
from tests.service.rsm_client import SegmentFilesOnDisk, metadata, seg_id
from tests.service.sidecar_process import SidecarProcess, write_config

MiB = 1024 * 1024


#: chunk size, prefetch window and largest run of :func:`counted_sidecar` and the memory tests
CHUNK, PREFETCH, MAX_RANGE = 4 * MiB, 16 * MiB, 8 * MiB


def counted_sidecar(start_sidecar, tmp_path):
    """A sidecar (``start_sidecar``) on a :class:`CountingStore`, encrypting, chunks of
    :data:`CHUNK`, prefetching :data:`PREFETCH`, runs of at most :data:`MAX_RANGE`, with one
    64 MiB segment copied: the store (its count starts after the copy), the sidecar and the
    segment's metadata."""
    store = CountingStore(tmp_path / "remote", fsync=False)
    sc = start_sidecar(
        store=store,
        encryption=True,
        segment__chunk_size=CHUNK,
        segment__compression=False,
        cache__prefetch_bytes=PREFETCH,
        fetch__max_range_bytes=MAX_RANGE,
    )
    md = sc.client.copy_a_segment(tmp_path / "seg", 64 * MiB)
    store.downloaded = 0
    return store, sc, md


def test_cancelled_fetch_reads_at_most_the_run_in_flight_plus_the_prefetch_window(start_sidecar, tmp_path):
    store, sc, md = counted_sidecar(start_sidecar, tmp_path)
    chunk, prefetch, max_range = CHUNK, PREFETCH, MAX_RANGE
    stream = sc.client.fetch_stream(md)
    first = next(stream)
    assert len(first.data) == MiB
    stream.cancel()
    time.sleep(2)  # prefetches already submitted finish
    read = store.downloaded
    overhead = 28 * (64 * MiB // chunk)
    bound = max_range + prefetch + overhead
    print(
        f"\ncancelled after 1 MiB of a 64 MiB segment: read {read / MiB:.1f} MiB from storage "
        f"(bound {bound / MiB:.1f} MiB: one run of {max_range // MiB} MiB + prefetch {prefetch // MiB} MiB)"
    )
    assert read <= bound
    time.sleep(1)
    assert store.downloaded == read, "storage reads continued after the cancel"
    full = sc.client.fetch(md)  # the rest still reads correctly
    assert len(full) == 64 * MiB


class PeakRss:
    """Samples a process's RSS every 20 ms while the ``with`` block runs."""

    def __init__(self, sidecar: SidecarProcess):
        self.sidecar = sidecar
        self.baseline = self.peak = 0
        self.threads_at_peak = 0  # every transform thread that compressed holds a zstd context
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def _sample(self):
        try:
            while not self._stop.is_set():
                rss = self.sidecar.rss()
                if rss > self.peak:
                    self.peak = rss
                    self.threads_at_peak = self.sidecar.ps.num_threads()
                time.sleep(0.02)
        except BaseException as e:  # a sampler that died would report the baseline as the peak
            self.failure = e

    def __enter__(self) -> PeakRss:
        self.baseline = self.peak = self.sidecar.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.failure is not None:
            raise AssertionError(f"the RSS sampler failed: {self.failure!r}") from self.failure
        self.peak = max(self.peak, self.sidecar.rss())


@pytest.mark.slow
def test_copying_a_1_gib_segment_keeps_memory_bounded(tmp_path):
    """The sidecar runs as its own process (as in production); its RSS is sampled every
    20 ms while a 1 GiB segment is copied in path mode and in stream mode."""
    cfg = write_config(
        tmp_path / "sidecar.toml",
        tmp_path / "remote",
        f"""
[segment]
chunk_size = "4MiB"
compression_heuristic = false
[copy]
parallelism = 2
allowed_dirs = ["{tmp_path}"]
""",
    )
    sidecar = SidecarProcess(cfg)
    try:
        client = sidecar.client
        files = SegmentFilesOnDisk(str(tmp_path / "seg"), log_size=1024 * MiB, txn=False)
        results = {}
        for mode in ("path", "stream"):
            md = metadata(seg_id(1 if mode == "path" else 2), size=files.log_size)
            with PeakRss(sidecar) as rss:
                t0 = time.monotonic()
                reqs = files.path_request(md) if mode == "path" else files.stream_requests(md)
                resp = client.copy(reqs, timeout=600)
                elapsed = time.monotonic() - t0
            growth = rss.peak - rss.baseline
            results[mode] = (growth, elapsed, resp.stored_bytes, rss.baseline, rss.threads_at_peak)
        for mode, (growth, elapsed, stored, baseline, threads) in results.items():
            print(
                f"\n1 GiB copy ({mode} mode): RSS +{growth / MiB:.1f} MiB over a "
                f"{baseline / MiB:.0f} MiB baseline, "
                f"{1024 / elapsed:.0f} MiB/s, {stored / MiB:.0f} MiB stored; {threads} threads at the peak"
            )
        for mode, (growth, _, _, _, threads) in results.items():
            assert growth <= 64 * MiB, f"{mode} mode: RSS +{growth / MiB:.1f} MiB, {threads} threads"
    finally:
        sidecar.stop()


def documented_memory_bound(
    base: int,
    readers: int,
    *,
    manifest_cache: int,
    index_cache: int,
    chunk_cache: int,
    prefetch: int,
    max_range: int,
    chunk: int,
    max_concurrent: int,
    prefetch_threads: int = 4,
) -> int:
    """docs/operations.md "Memory" for a sidecar that only serves fetches: base + caches +
    per concurrent fetch (one ranged GET, one decoded chunk outside the cache, two 1 MiB
    messages) + the prefetch threads' downloads in flight."""
    caches = manifest_cache + index_cache + chunk_cache
    fetches = min(readers, max_concurrent) * (max(max_range, chunk) + chunk + 2 * MiB)
    prefetching = (
        prefetch_threads * (max(max_range, chunk) + chunk) if prefetch > 0 and chunk_cache > 0 else 0
    )
    return base + caches + fetches + prefetching


#: the caches of :func:`copied_segments`' sidecar: small, so the measured growth is the fetches'
MANIFEST_CACHE = INDEX_CACHE = MiB
CHUNK_CACHE = 64 * MiB


def small_caches_memory_bound(base: int, readers: int, max_concurrent: int) -> int:
    """:func:`documented_memory_bound` for :func:`copied_segments`' sidecar."""
    return documented_memory_bound(
        base,
        readers,
        manifest_cache=MANIFEST_CACHE,
        index_cache=INDEX_CACHE,
        chunk_cache=CHUNK_CACHE,
        prefetch=PREFETCH,
        max_range=MAX_RANGE,
        chunk=CHUNK,
        max_concurrent=max_concurrent,
    )


def copied_segments(
    tmp_path, rsa_keys, max_concurrent: int, segment_size: int, segments: int, fetch_lines: str = ""
):
    """The config of an encrypting sidecar with small caches (:data:`CHUNK_CACHE`...), and
    ``segments`` segments of ``segment_size`` copied into its storage by another sidecar process,
    so that the process measured has only fetched: the config, the segment's files and the
    segments' metadata."""
    public, private = rsa_keys["A"]
    cfg = write_config(
        tmp_path / "sidecar.toml",
        tmp_path / "remote",
        f"""
[segment]
chunk_size = {CHUNK}
compression_heuristic = false
[copy]
allowed_dirs = ["{tmp_path}"]
[cache]
manifest_bytes = {MANIFEST_CACHE}
index_bytes = {INDEX_CACHE}
chunk_bytes = {CHUNK_CACHE}
prefetch_bytes = {PREFETCH}
[fetch]
max_range_bytes = {MAX_RANGE}
max_concurrent = {max_concurrent}
{fetch_lines}
[encryption]
enabled = true
active_key_id = "A"
[encryption.keys.A]
public_key_file = "{public}"
private_key_file = "{private}"
""",
        # threads for every fetch stream beside the copies and the 8 kept for health checks
        server=f"max_workers = {max(64, 16 + max_concurrent + 8)}",
    )
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), log_size=segment_size, txn=False)
    mds = [metadata(seg_id(i + 1), size=segment_size) for i in range(segments)]
    writer = SidecarProcess(cfg)  # copies run in another process: the bound measured is the fetch path's
    try:
        for md in mds:
            writer.client.copy(files.path_request(md), timeout=300)
    finally:
        writer.stop()
    return cfg, files, mds


@pytest.mark.slow
def test_concurrent_readers_stay_within_the_documented_memory_bound(tmp_path, rsa_keys):
    """1, 3 and 6 concurrent remote readers (whole-segment streams, then random ranges) of
    encrypted 256 MiB segments, against the real sidecar process with small caches; its
    RSS, sampled every 20 ms, stays under the bound docs/operations.md gives for this
    configuration, with the idle RSS of the freshly started process as the base."""
    max_concurrent, segment_size, segments = 32, 256 * MiB, 4
    cfg, files, mds = copied_segments(tmp_path, rsa_keys, max_concurrent, segment_size, segments)
    with open(files.log_path, "rb") as f:
        head = f.read(MiB)

    sidecar = SidecarProcess(cfg)
    try:
        time.sleep(1)
        base = sidecar.rss()

        def whole_segment(i: int) -> None:
            n = 0
            for r in sidecar.client.fetch_stream(mds[i % segments], timeout=300):
                if n == 0:
                    assert r.data == head[: len(r.data)]
                n += len(r.data)
            assert n == segment_size

        def random_ranges(i: int) -> None:
            rnd = random.Random(i)
            until = time.monotonic() + 4
            while time.monotonic() < until:
                start = rnd.randrange(segment_size)
                length = rnd.randrange(1, 16 * MiB)
                got = sum(
                    len(r.data) for r in sidecar.client.fetch_stream(mds[i % segments], start, start + length)
                )
                assert got == min(length + 1, segment_size - start)

        results = []
        for readers in (1, 3, 6):
            bound = small_caches_memory_bound(base, readers, max_concurrent)
            for kind, read in (("whole segments", whole_segment), ("random ranges", random_ranges)):
                errors = []

                def run(i, read=read, errors=errors):
                    try:
                        read(i)
                    except Exception as e:
                        errors.append(e)

                threads = [threading.Thread(target=run, args=(i,)) for i in range(readers)]
                with PeakRss(sidecar) as rss:
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                assert not errors, errors[0]
                results.append((readers, kind, rss.peak, bound))
                print(
                    f"\n{readers} readers, {kind}: peak RSS {rss.peak / MiB:.0f} MiB "
                    f"(+{(rss.peak - base) / MiB:.0f} over the idle {base / MiB:.0f} MiB), "
                    f"documented bound {bound / MiB:.0f} MiB (+{(bound - base) / MiB:.0f})"
                )
        for readers, kind, peak, bound in results:
            assert peak <= bound, (
                f"{readers} readers ({kind}): peak RSS {peak / MiB:.0f} MiB exceeds the documented "
                f"bound {bound / MiB:.0f} MiB"
            )
    finally:
        sidecar.stop()


@pytest.mark.slow
def test_fetch_channel_streams_stay_within_the_documented_memory_bound(tmp_path, rsa_keys):
    """12, then 48 fetch channel streams at once (the shim's path) from a real sidecar process,
    each stalled after its first frame until all are open (a receive buffer of 64 KiB: each
    stream's reader blocks on the socket with its run and chunk in hand, as behind a broker that
    stops reading), then read to their end: every stream byte-exact, and the sidecar's RSS,
    sampled every 20 ms, under the bound docs/operations.md gives for that many streams.

    The streams read disjoint chunks (up to 12 per segment, two chunks apart): a stream that
    stalls while it holds a chunk's load makes another stream that needs that chunk wait until
    it reads on or is cut off (fetch.idle_timeout_seconds; operations.md), and here every
    stream waits for all the others to open."""
    from tests.service.rsm_client import FetchChannelClient

    max_concurrent, segment_size, segments, span = 52, 96 * MiB, 4, 5 * MiB
    cfg, files, mds = copied_segments(
        tmp_path,
        rsa_keys,
        max_concurrent,
        segment_size,
        segments,
        # the first streams stay stalled while the last ones open (over a minute on a loaded machine)
        fetch_lines="idle_timeout_seconds = 600",
    )
    with open(files.log_path, "rb") as f:
        original = f.read()

    sidecar = SidecarProcess(cfg)
    try:
        time.sleep(1)
        base = sidecar.rss()
        results = []
        for readers in (12, 48):
            bound = small_caches_memory_bound(base, readers, max_concurrent)
            all_open = threading.Barrier(readers + 1, timeout=120)
            errors: list[BaseException] = []

            def read(i: int, all_open=all_open, errors=errors, readers=readers) -> None:
                # chunks 2k and 2k+1 of segment i % 4 (k = i // 4), from an odd offset
                start = (i // segments) * 2 * CHUNK + 1000 + 13 * i
                md = mds[i % segments]
                client = FetchChannelClient(sidecar.address, timeout=120, receive_buffer=64 * 1024)
                try:
                    client.request(md, start, start + span - 1)
                    got = bytearray()
                    frames = client.frames()
                    kind, payload = next(frames)
                    assert kind == b"D", kind
                    got += payload
                    all_open.wait()  # every stream open and stalled behind its reader
                    all_open.wait()  # the sampler has seen them all stalled for a while
                    for kind, payload in frames:
                        if kind == b"D":
                            got += payload
                    assert bytes(got) == original[start : start + span], f"stream {i}: wrong bytes"
                except BaseException as e:
                    errors.append(e)
                    all_open.abort()
                finally:
                    client.close()

            threads = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
            with PeakRss(sidecar) as rss:
                for t in threads:
                    t.start()
                try:
                    all_open.wait()
                    time.sleep(1.0)
                    all_open.wait()
                except threading.BrokenBarrierError:
                    pass
                for t in threads:
                    t.join()
            assert not errors, errors[0]
            results.append((readers, rss.peak, bound))
            print(
                f"\n{readers} fetch channel streams: peak RSS {rss.peak / MiB:.0f} MiB "
                f"(+{(rss.peak - base) / MiB:.0f} over the idle {base / MiB:.0f} MiB), "
                f"documented bound {bound / MiB:.0f} MiB (+{(bound - base) / MiB:.0f})"
            )
        for readers, peak, bound in results:
            assert peak <= bound, (
                f"{readers} streams: peak RSS {peak / MiB:.0f} MiB exceeds the documented "
                f"bound {bound / MiB:.0f} MiB"
            )
    finally:
        sidecar.stop()
