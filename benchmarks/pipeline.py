"""Copy and fetch throughput of the sidecar pipeline, next to the raw throughput of the
same operations on the same bytes measured in the same run, and the chunk index's
bytes per chunk for compressed segments.

    .venv/bin/python benchmarks/pipeline.py [--size-mib 256] [--chunk-mib 4]

The machine is shared and noisy: compare the ratios (pipeline / raw), not seconds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import google_crc32c
import zstandard
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from benchmarks.synthetic import add_segment_options, encryption_key, segment_of_options
from rsm_sidecar.config import Config
from rsm_sidecar.format.chunk_index import encode_sizes, encode_transformed_chunks
from rsm_sidecar.format.keys import SegmentMetadata
from rsm_sidecar.segment.access import SegmentAccess
from rsm_sidecar.segment.settings import CopySettings, ReaderSettings

MiB = 1024 * 1024


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best(fn, repeat: int = 2) -> float:
    return min(timed(fn) for _ in range(repeat))


def read_chunks(path: str, chunk: int):
    with open(path, "rb") as f:
        while data := f.read(chunk):
            yield data


class FileSource:
    """The segment file read in 1 MiB pieces, as path mode reads it; empty indexes."""

    def __init__(self, path: str):
        self.path = path
        self.log_size = os.path.getsize(path)

    def log_pieces(self, size: int):
        return read_chunks(self.path, MiB)

    def index_files(self):
        return {"offset": b"", "timestamp": b"", "producerSnapshot": b"", "transaction": None}


def main() -> None:
    ap = argparse.ArgumentParser()
    add_segment_options(ap, size_mib=256)
    ap.add_argument("--parallelism", type=int, default=2)
    args = ap.parse_args()
    work, seg_path, size, chunk = segment_of_options("rsm-bench-", args)
    mib = size / MiB
    chunks = list(read_chunks(seg_path, chunk))  # the raw baselines run from memory
    print(
        f"segment: {mib:.0f} MiB of uncompressed JSON-like record batches, chunk {args.chunk_mib} MiB, "
        f"{os.cpu_count()} CPUs\n"
    )

    # -- raw baselines on the same bytes ------------------------------------------------
    key, aad = os.urandom(32), os.urandom(32)
    aes = AESGCM(key)
    zc = zstandard.ZstdCompressor(level=3, write_content_size=True)
    zd = zstandard.ZstdDecompressor()
    compressed = [zc.compress(c) for c in chunks]
    sealed = [os.urandom(12) for _ in chunks]
    sealed = [iv + aes.encrypt(iv, c, aad) for iv, c in zip(sealed, compressed)]
    pool = concurrent.futures.ThreadPoolExecutor(args.parallelism)
    raw = {
        "disk read (page cache)": best(lambda: [None for _ in read_chunks(seg_path, chunk)]),
        "disk write + fsync (new file)": best(
            lambda: _write(os.path.join(work, f"copy-{os.urandom(4).hex()}.bin"), chunks)
        ),
        "zstd-3 compress, 1 thread": best(lambda: [zc.compress(c) for c in chunks]),
        f"zstd-3 compress, {args.parallelism} threads": best(
            lambda: list(pool.map(lambda c: zstandard.ZstdCompressor(level=3).compress(c), chunks))
        ),
        "zstd decompress": best(lambda: [zd.decompress(c) for c in compressed]),
        "AES-256-GCM encrypt": best(lambda: [aes.encrypt(b"\0" * 12, c, aad) for c in chunks]),
        "AES-256-GCM decrypt": best(lambda: [aes.decrypt(s[:12], s[12:], aad) for s in sealed]),
        "CRC32C": best(lambda: [google_crc32c.value(c) for c in compressed]),
    }
    ratio = sum(map(len, compressed)) / size
    print(f"{'raw operation (same bytes)':40s} {'MiB/s':>8s}")
    for name, secs in raw.items():
        print(f"{name:40s} {mib / secs:8.0f}")
    print(f"zstd-3 compressed size: {ratio * 100:.1f}% of the original\n")

    # -- the pipeline ------------------------------------------------------------------
    keys = encryption_key(work)
    transform_pool = concurrent.futures.ThreadPoolExecutor(8)
    print(
        f"{'pipeline (local store, fsync on)':40s} {'copy MiB/s':>10s} {'seq fetch':>10s} "
        f"{'1MiB rand p50 ms':>17s} {'stored %':>9s}"
    )
    n = 0
    for compression, encryption in ((False, False), (True, False), (False, True), (True, True)):
        n += 1
        cfg = Config(
            {
                "storage": {"key_prefix": "bench/", "local": {"root": os.path.join(work, f"store{n}")}},
                "encryption": {"enabled": encryption, "active_key_id": "k", "keys": keys},
            },
            environ={},
        )
        access = SegmentAccess(cfg, ReaderSettings(chunk_cache_bytes=0, prefetch_bytes=0))
        copier = access.copier(
            CopySettings(
                chunk_size=chunk,
                compression=compression,
                compression_heuristic=False,
                parallelism=args.parallelism,
            ),
            transform_pool,
        )
        md = SegmentMetadata("MWJ6FHTfRYy67jzwZdeqSQ", "bench", 0, f"B{n:021d}", 0, 1000, segment_size=size)
        t = timed(lambda copier=copier, md=md: copier.copy(md, FileSource(seg_path), b"0\n0\n"))
        reader = access.reader
        seg = reader.open(md)
        stored = seg.manifest.stored_log_size
        tf = timed(lambda reader=reader, seg=seg: [None for _ in reader.read(seg, 0, size - 1)])
        rng = random.Random(1)
        lat = []
        for _ in range(30):
            s = rng.randrange(0, size - MiB)
            lat.append(timed(lambda reader=reader, seg=seg, s=s: b"".join(reader.read(seg, s, s + MiB - 1))))
        lat.sort()
        label = (
            f"{'zstd' if compression else 'no compression'} + {'AES-GCM' if encryption else 'no encryption'}"
        )
        print(
            f"{label:40s} {mib / t:10.0f} {mib / tf:10.0f} {lat[len(lat) // 2] * 1000:17.1f} "
            f"{stored / size * 100:9.1f}"
        )

    # -- chunk index size for compressed segments ---------------------------------------
    print(
        f"\n{'chunk index (compressed)':28s} {'chunks':>7s} {'binary B/chunk':>15s} {'manifest B/chunk':>17s}"
    )
    for chunk_kib in (256, 1024, 4096):
        c = chunk_kib * 1024
        sizes = [len(zc.compress(x)) for x in read_chunks(seg_path, c)]
        binary = len(encode_sizes(sizes))
        text = len(encode_transformed_chunks(sizes))
        print(
            f"{f'{chunk_kib} KiB chunks, {mib:.0f} MiB':28s} {len(sizes):7d} {binary / len(sizes):15.2f} "
            f"{text / len(sizes):17.2f}"
        )


def _write(path: str, chunks) -> None:
    with open(path, "wb") as f:
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())


if __name__ == "__main__":
    main()
