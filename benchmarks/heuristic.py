"""What the compression heuristic does on segments that mix producer-compressed and
uncompressed batches.

    .venv/bin/python benchmarks/heuristic.py

For each mix: the share of batch bytes already compressed (lz4 and zstd producers), our
decision (zstd when less than half of the first chunk's batch bytes are compressed),
Aiven's decision (first batch only), and what zstd would save on the whole segment and
what it costs in CPU. The heuristic is right when it skips zstd where the saving is
small and the CPU large.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import zstandard

from benchmarks.synthetic import batches
from rsm_sidecar.kafka.batch import Compression
from rsm_sidecar.kafka.reader import scan_batch_headers
from rsm_sidecar.transform.heuristic import batches_already_compressed, compressed_share

MiB = 1024 * 1024
CHUNK = 4 * MiB


def main() -> None:
    zc = zstandard.ZstdCompressor(level=3)
    print(
        f"{'batches compressed':>18s} {'codec':>5s} {'bytes compr.':>12s} {'ours':>6s} {'Aiven':>6s} "
        f"{'zstd saves':>10s} {'zstd MiB/s':>10s} {'zstd s/GiB':>10s}"
    )
    for codec in (Compression.LZ4, Compression.ZSTD):
        for share in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0):
            seg = b"".join(
                batches(32 * MiB, compressed_share=share, codec=codec, seed=int(share * 100) + codec)
            )
            head = seg[:CHUNK]
            ours = "zstd" if not batches_already_compressed(head) else "skip"
            first = scan_batch_headers(head, max_batches=1).headers[0]
            aiven = "zstd" if first.compression == Compression.NONE else "skip"
            chunks = [seg[i : i + CHUNK] for i in range(0, len(seg), CHUNK)]
            t0 = time.perf_counter()
            out = sum(len(zc.compress(c)) for c in chunks)
            secs = time.perf_counter() - t0
            byte_share = compressed_share(seg)
            print(
                f"{share * 100:17.0f}% {codec.name.lower():>5s} {byte_share * 100:11.0f}%"
                f" {ours:>6s} {aiven:>6s} "
                f"{(1 - out / len(seg)) * 100:9.0f}% {len(seg) / MiB / secs:10.0f} "
                f"{secs * 1024 * MiB / len(seg):10.2f}"
            )


if __name__ == "__main__":
    main()
