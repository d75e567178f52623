"""The disk chunk cache: what a consumer re-reading a segment after a sidecar restart
downloads, how fast it reads, and what it costs in disk and CPU, next to the raw
throughput of the same operations on the same bytes measured in the same run.

    .venv/bin/python benchmarks/disk_cache.py [--size-mib 64] [--chunk-mib 4] [--rounds 5]

One segment of JSON-like record batches is copied with zstd + AES-GCM into a local store,
then read the way the broker reads it (1 MiB fetches from start to end, the sidecar's
reader with its default caches and 4 prefetch threads) in these runs:

Each round (median of ``--rounds`` reported):

* cold: empty memory and disk caches; every chunk is downloaded (ranged GETs counted in
  bytes through the store).
* warm, memory: the same reader again (chunks in the memory chunk cache).
* after restart, disk (page cache): a new reader and store (a restarted sidecar) on the
  same disk cache directory, whose files are still in the page cache.
* after restart, disk (dropped): the same, with the cache files dropped from the page
  cache (``posix_fadvise(DONTNEED)``), so the chunks come from the device.

CPU seconds are the process's user + system time of the run (all threads). The machine
is shared and noisy: compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import zstandard
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from benchmarks.pipeline import FileSource, best, read_chunks
from benchmarks.shim import drop_from_page_cache
from benchmarks.synthetic import add_segment_options, encryption_key, segment_of_options
from rsm_sidecar.config import Config
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.keys import SegmentMetadata
from rsm_sidecar.segment.access import SegmentAccess
from rsm_sidecar.segment.disk_cache import DiskChunkCache
from rsm_sidecar.segment.settings import CopySettings, ReaderSettings
from tests.counting_store import CountingStore

MiB = 1024 * 1024


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cache_files(path: str) -> list[str]:
    return [
        os.path.join(d, n) for d, _, names in os.walk(path) if os.path.basename(d) != ".tmp" for n in names
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    add_segment_options(ap, size_mib=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scan-entries", type=int, default=10_000)
    args = ap.parse_args()
    work, seg_path, size, chunk = segment_of_options("rsm-bench-diskcache-", args)
    mib = size / MiB
    store_root, disk = os.path.join(work, "store"), os.path.join(work, "disk-cache")
    cfg = Config(
        {
            "storage": {"key_prefix": "bench/", "local": {"root": store_root}},
            "encryption": {"enabled": True, "active_key_id": "k", "keys": encryption_key(work)},
            "fetch": {"disk_cache": {"path": disk, "bytes": "1GiB"}},
        },
        environ={},
    )
    settings = ReaderSettings.from_config(cfg)  # the sidecar's defaults plus the disk cache
    prefetch = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="prefetch")

    events: dict[int, collections.Counter[tuple[str, str]]] = {}

    def access() -> SegmentAccess:
        """A sidecar's segment access, as after a (re)start: new store, empty memory caches."""
        counter: collections.Counter[tuple[str, str]] = collections.Counter()

        def on_event(cache: str, event: str) -> None:
            counter[(cache, event)] += 1

        a = SegmentAccess(
            cfg,
            settings,
            store=CountingStore(store_root, fsync=False),
            prefetch=prefetch,
            on_cache_event=on_event,
        )
        events[id(a)] = counter
        return a

    first = access()
    md = SegmentMetadata("MWJ6FHTfRYy67jzwZdeqSQ", "bench", 0, "B000000000000000000001", 0, 1000, size)
    first.copier(
        CopySettings(chunk_size=chunk, compression=True, compression_heuristic=False),
        concurrent.futures.ThreadPoolExecutor(2),
    ).copy(md, FileSource(seg_path), b"0\n0\n")
    stored_path = os.path.join(store_root, *first.layout.base(md).split("/")) + "." + fkeys.LOG
    stored_size = os.path.getsize(stored_path)
    print(
        f"segment: {mib:.0f} MiB of JSON-like record batches, {args.chunk_mib} MiB chunks, zstd + AES-GCM, "
        f"stored as {stored_size / MiB:.1f} MiB ({stored_size / size * 100:.1f}%); {os.cpu_count()} CPUs\n"
    )

    # -- raw limits on the same bytes, same run -----------------------------------------------
    seg = first.reader.open(md)
    sealed = Path(stored_path).read_bytes()  # the raw limits run from memory, as in pipeline.py
    pieces = [sealed[c.transformed_position : c.transformed_end] for c in seg.manifest.chunk_index.chunks()]
    assert seg.manifest.encryption is not None
    data_key = first.keyring.unwrap(seg.manifest.encryption.key_id, seg.manifest.encryption.wrapped_key, "k")
    aes, aad = AESGCM(data_key), seg.manifest.encryption.aad
    zd = zstandard.ZstdDecompressor()

    def decode_all() -> None:
        for p, c in zip(pieces, seg.manifest.chunk_index.chunks(), strict=True):
            zd.decompress(aes.decrypt(p[:12], p[12:], aad), max_output_size=c.original_size)

    def read_stored_cold() -> None:
        drop_from_page_cache(Path(stored_path))
        for _ in read_chunks(stored_path, chunk):
            pass

    raw = {
        "disk read, page cache (stored bytes)": best(lambda: [None for _ in read_chunks(stored_path, chunk)]),
        "disk read, dropped from page cache": best(read_stored_cold),
        "AES-GCM decrypt + zstd decompress, 1 thread": best(decode_all),
    }
    print(f"{'raw operation (same bytes)':46s} {'MiB/s (original)':>17s} {'MiB/s (stored)':>15s}")
    for name, secs in raw.items():
        print(f"{name:46s} {mib / secs:17.0f} {stored_size / MiB / secs:15.0f}")

    # -- the runs ------------------------------------------------------------------------------
    def fetch_all(a: SegmentAccess) -> tuple[float, float, int]:
        """Read the segment as the broker does (1 MiB fetches); seconds, CPU seconds, bytes
        downloaded from the store."""
        reader = a.reader
        before = a.store.downloaded  # type: ignore[attr-defined]
        c0, t0 = cpu_seconds(), time.perf_counter()
        got = 0
        for pos in range(0, size, MiB):
            s = reader.open(md)
            for piece in reader.read(s, pos, min(pos + MiB, size) - 1):
                got += len(piece)
        t, c = time.perf_counter() - t0, cpu_seconds() - c0
        assert got == size, (got, size)
        return t, c, a.store.downloaded - before  # type: ignore[attr-defined]

    labels = (
        "cold (empty caches)",
        "warm: memory chunk cache",
        "after restart: disk (page cache)",
        "after restart: disk (dropped)",
    )
    results: dict[str, list[tuple[float, float, int, int]]] = {label: [] for label in labels}
    for _ in range(args.rounds):
        shutil.rmtree(disk, ignore_errors=True)
        cold = access()
        runs = [(labels[0], cold, False), (labels[1], cold, False)]
        runs += [(labels[2], access(), False), (labels[3], access(), True)]
        for label, a, drop in runs:
            if drop:
                for p in cache_files(disk):
                    drop_from_page_cache(Path(p))
            hits_before = events[id(a)][("disk", "hit")]
            t, c, downloaded = fetch_all(a)
            results[label].append((t, c, downloaded, events[id(a)][("disk", "hit")] - hits_before))
    print(
        f"\n{f'whole segment in 1 MiB fetches, median of {args.rounds}':44s} {'MiB/s':>7s} {'CPU s':>6s} "
        f"{'downloaded MiB':>15s} {'disk hits':>10s}"
    )
    for label in labels:
        rs = results[label]
        t, c = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
        print(
            f"{label:44s} {mib / t:7.0f} {c:6.2f} {max(r[2] for r in rs) / MiB:15.2f} "
            f"{max(r[3] for r in rs):10d}"
        )
    files = cache_files(disk)
    used = sum(os.path.getsize(p) for p in files)
    print(
        f"\ndisk cache: {len(files)} files, {used / MiB:.1f} MiB on disk ({used / stored_size * 100:.0f}% "
        f"of the stored .log, {used / size * 100:.1f}% of the original); nothing decrypted is written"
    )
    t0 = time.perf_counter()
    again = access()
    elapsed = time.perf_counter() - t0
    entries = len(again.reader.disk) if again.reader.disk is not None else 0
    print(
        f"start-up scan of the cache directory: {entries} entries in {elapsed * 1000:.1f} ms "
        f"(store and reader construction included)"
    )
    scan_dir = os.path.join(work, "scan")
    filler = DiskChunkCache(scan_dir, 1 << 40)
    for i in range(args.scan_entries):
        filler.put(DiskChunkCache.entry(f"segment-{i // 64}", str(i)), b"x" * 1024)
    t0 = time.perf_counter()
    scanned = DiskChunkCache(scan_dir, 1 << 40)
    print(
        f"start-up scan of a cache directory of {len(scanned)} entries ({args.scan_entries // 64} segments): "
        f"{(time.perf_counter() - t0) * 1000:.0f} ms"
    )
    after = [r for label in labels[2:] for r in results[label]]
    manifest = os.path.getsize(stored_path[: -len(fkeys.LOG)] + fkeys.MANIFEST)
    print(
        f"bytes of .log downloaded after the restarts: {sum(r[2] for r in after)}; each restart reads the "
        f"manifest once ({manifest} bytes, one GET)"
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
