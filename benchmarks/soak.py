"""Soak: 10 concurrent copies and 10 concurrent fetches against one `rsm-sidecar serve`
process for a while, sampling its RSS. Prints the RSS over time (flat = bounded memory),
throughput and error counts; every fetched byte is compared with what was copied.

    .venv/bin/python benchmarks/soak.py [--seconds 120] [--copiers 10] [--readers 10] [--segment-mib 16]

Local storage, encryption on, 4 MiB chunks, 64 MiB chunk cache. Each copier copies new
segments (alternating stream and path mode), each reader fetches whole segments copied
earlier. The figures are relative to the process's idle RSS measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


from benchmarks.synthetic import encryption_toml
from rsm_sidecar.transform.keyring import write_key_pair
from tests.service.rsm_client import Client, SegmentFilesOnDisk, metadata, seg_id
from tests.service.sidecar_process import SidecarProcess, write_config

MiB = 1024 * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=120)
    ap.add_argument("--copiers", type=int, default=10)
    ap.add_argument("--readers", type=int, default=10)
    ap.add_argument("--segment-mib", type=int, default=16)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="rsm-soak-")
    logs = os.path.join(work, "logs")
    os.makedirs(logs)
    write_key_pair(os.path.join(work, "k.pub"), os.path.join(work, "k.priv"), 2048)
    cfg = write_config(
        Path(work) / "sidecar.toml",
        f"{work}/remote",
        f"""
[segment]
chunk_size = "4MiB"
[copy]
allowed_dirs = ["{logs}"]
journal_dir = "{work}/journal"
[cache]
chunk_bytes = "64MiB"
{encryption_toml(work)}""",
    )
    os.makedirs(f"{work}/remote")
    sidecar = SidecarProcess(cfg)
    address = sidecar.address
    idle = sidecar.rss()
    # a pool of segment files the copiers reuse (a new segment id per copy)
    sources = [
        SegmentFilesOnDisk(os.path.join(logs, f"src{i}"), log_size=args.segment_mib * MiB) for i in range(4)
    ]
    contents = [open(s.log_path, "rb").read() for s in sources]
    copied: list[tuple] = []
    lock = threading.Lock()
    stop = threading.Event()
    counts = {"copies": 0, "copy_errors": 0, "fetches": 0, "fetch_errors": 0, "wrong": 0, "fetched_bytes": 0}
    ids = iter(range(10**9))

    def copier(n: int) -> None:
        client = Client(address)
        while not stop.is_set():
            i = next(ids)
            src = i % len(sources)
            md = metadata(seg_id(i), start=i * 100, end=i * 100 + 99, size=sources[src].log_size, partition=n)
            reqs = sources[src].path_request(md) if i % 2 else sources[src].stream_requests(md)
            try:
                client.copy(reqs, timeout=300)
                with lock:
                    counts["copies"] += 1
                    copied.append((md, src))
            except Exception:
                with lock:
                    counts["copy_errors"] += 1
        client.close()

    def reader(n: int) -> None:
        client = Client(address)
        rng = random.Random(n)
        while not stop.is_set():
            with lock:
                pick = rng.choice(copied) if copied else None
            if pick is None:
                time.sleep(0.1)
                continue
            md, src = pick
            try:
                data = client.fetch(md, timeout=300)
                with lock:
                    counts["fetches"] += 1
                    counts["fetched_bytes"] += len(data)
                    counts["wrong"] += data != contents[src]
            except Exception:
                with lock:
                    counts["fetch_errors"] += 1
        client.close()

    threads = [threading.Thread(target=copier, args=(n,)) for n in range(args.copiers)]
    threads += [threading.Thread(target=reader, args=(n,)) for n in range(args.readers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    samples = []
    while time.monotonic() - t0 < args.seconds:
        time.sleep(1)
        samples.append((time.monotonic() - t0, sidecar.rss()))
    stop.set()
    for t in threads:
        t.join(600)
    elapsed = time.monotonic() - t0
    sidecar.stop()

    print(
        f"soak: {args.copiers} copiers + {args.readers} readers, {args.segment_mib} MiB segments, "
        f"{elapsed:.0f} s, encryption on, local storage; idle RSS {idle / MiB:.0f} MiB"
    )
    print(f"{'time s':>7s} {'RSS MiB':>8s} {'over idle':>10s}")
    step = max(1, len(samples) // 10)
    for at, rss in samples[::step]:
        print(f"{at:7.0f} {rss / MiB:8.0f} {(rss - idle) / MiB:+10.0f}")
    half = len(samples) // 2
    first, second = [r for _, r in samples[:half]], [r for _, r in samples[half:]]
    print(
        f"peak first half {max(first) / MiB:.0f} MiB, peak second half {max(second) / MiB:.0f} MiB "
        f"(growth {(max(second) - max(first)) / MiB:+.0f} MiB)"
    )
    print(
        f"copies {counts['copies']} ({counts['copies'] * args.segment_mib / elapsed:.0f} MiB/s), "
        f"copy errors {counts['copy_errors']}; fetches {counts['fetches']} "
        f"({counts['fetched_bytes'] / MiB / elapsed:.0f} MiB/s), fetch errors {counts['fetch_errors']}, "
        f"wrong bytes {counts['wrong']}"
    )


if __name__ == "__main__":
    main()
