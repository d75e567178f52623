"""A copy backlog: 200 partitions with segments waiting to be tiered at once, copied the way a Kafka
4.x broker copies them, through one ``rsm-sidecar serve`` process.

    .venv/bin/python benchmarks/copy_backlog.py [--partitions 200] [--segments 2] [--segment-mib 8]
        [--copiers 10] [--rate-limits 0,64MiB] [--storage local|s3]

A gRPC load generator plays the broker rather than a real broker with 200 partitions: it issues
copies exactly as the broker's ``RLMCopyTask`` does (path mode, one call per segment, the
segments of a partition one after another, ``--copiers`` partitions at a time: the copier pool of
``remote.log.manager.copier.thread.pool.size``, 10 by default on Kafka 4.x), and it measures the
sidecar alone with nothing else competing for the two cores. A real broker would first have to
be given the backlog (200 x 16 MiB of produce, local retention, the task interval between
partition runs), and its own scheduling would decide what the figures show.

Each segment is the same ``--segment-mib`` file of JSON-like record batches (zstd + AES-GCM as
the sidecar's defaults, 4 MiB chunks; a new segment id per copy), read by the sidecar from the
page cache as a broker's recently written segments are. Reported for each ``--rate-limits``
setting (``copy.upload_rate_limit``, 0 = none):

* throughput: original MiB/s over the whole backlog and stored MiB/s, against the physical
  limit measured in the same run (zstd-3 + AES-GCM of the same bytes on all cores, in process);
* memory: the sidecar's peak RSS (``VmHWM``) and its RSS before the backlog;
* fairness: the time of each copy (min / median / max: copies running at once share the cores and
  the rate budget), and when the partitions were done (first, median, last): with 10 copier
  threads the broker tiers 10 partitions at a time, so the last partition waits for the others.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.synthetic import encryption_toml, write_segment
from devstack.common import free_port
from rsm_sidecar.config import parse_size
from rsm_sidecar.transform.keyring import write_key_pair
from tests.service.rsm_client import Client, SegmentFilesOnDisk, metadata, seg_id
from tests.service.sidecar_process import SidecarProcess

MiB = 1024 * 1024


def physical_limit(data: bytes, chunk: int = 4 * MiB) -> float:
    """MiB/s of zstd-3 + AES-256-GCM over ``data`` on every core at once (the copy's CPU work)."""
    from rsm_sidecar.transform.chunks import ChunkCodec

    codec = ChunkCodec(True, os.urandom(32), b"aad")
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    cores = os.cpu_count() or 1
    with concurrent.futures.ThreadPoolExecutor(cores) as pool:
        list(pool.map(codec.encode, pieces))  # warm the per-thread contexts
        t0 = time.monotonic()
        list(pool.map(codec.encode, pieces * cores))
        return len(data) * cores / MiB / (time.monotonic() - t0)


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def run_backlog(work: Path, args: argparse.Namespace, limit: int, source: SegmentFilesOnDisk) -> dict:
    cfg = work / f"sidecar-{limit}.toml"
    remote = work / f"remote-{limit}"
    remote.mkdir()
    cfg.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
[metrics]
listen = "127.0.0.1:{free_port()}"
[log]
format = "json"
[storage]
backend = "local"
[storage.local]
root = "{remote}"
fsync = false
[copy]
allowed_dirs = ["{work / "logs"}"]
journal_dir = "{work / f"journal-{limit}"}"
upload_rate_limit = {limit}
{encryption_toml(work)}"""
    )
    sidecar = SidecarProcess(cfg)
    before = sidecar.rss()
    tasks: queue.Queue[int] = queue.Queue()
    for p in range(args.partitions):
        tasks.put(p)
    copies: list[tuple[float, float]] = []  # (seconds, MiB)
    done_at: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def copier() -> None:
        client = Client(sidecar.address)
        try:
            while True:
                try:
                    p = tasks.get_nowait()
                except queue.Empty:
                    return
                for s in range(args.segments):  # one partition's segments, one after another
                    n = p * args.segments + s
                    md = metadata(
                        seg_id(n), start=s * 1000, end=s * 1000 + 999, size=source.log_size, partition=p
                    )
                    c0 = time.monotonic()
                    try:
                        client.copy(source.path_request(md), timeout=900)
                    except Exception as e:
                        with lock:
                            errors.append(str(e)[:200])
                        continue
                    with lock:
                        copies.append((time.monotonic() - c0, source.log_size / MiB))
                with lock:
                    done_at.append(time.monotonic() - t0)
        finally:
            client.close()

    samples = []
    threads = [threading.Thread(target=copier) for _ in range(args.copiers)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        samples.append(sidecar.rss())
        time.sleep(0.25)
    elapsed = time.monotonic() - t0
    peak = vm_kib(sidecar.proc.pid, "VmHWM") * 1024
    sidecar.stop()
    stored = sum(f.stat().st_size for f in remote.rglob("*") if f.is_file())
    shutil.rmtree(remote, ignore_errors=True)
    durations = sorted(d for d, _ in copies)
    original = sum(m for _, m in copies)
    return {
        "limit": limit,
        "elapsed": elapsed,
        "copies": len(copies),
        "errors": errors,
        "original_mib_s": original / elapsed,
        "stored_mib_s": stored / MiB / elapsed,
        "rss_before": before / MiB,
        "rss_peak": peak / MiB,
        "rss_sampled_peak": max(samples) / MiB if samples else 0,
        "copy_s": (durations[0], statistics.median(durations), durations[-1]) if durations else (0, 0, 0),
        "done_s": (min(done_at), statistics.median(done_at), max(done_at)) if done_at else (0, 0, 0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=200)
    ap.add_argument("--segments", type=int, default=2, help="segments waiting per partition")
    ap.add_argument("--segment-mib", type=int, default=8)
    ap.add_argument("--copiers", type=int, default=10, help="the broker's copier threads")
    ap.add_argument("--rate-limits", default="0,64MiB", help="copy.upload_rate_limit settings to run")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="copy-backlog-"))
    try:
        write_key_pair(str(work / "k.pub"), str(work / "k.priv"), 2048)
        src_dir = work / "logs" / "partition"
        write_segment(str(work / "template.log"), args.segment_mib * MiB)
        data = (work / "template.log").read_bytes()[: args.segment_mib * MiB]
        source = SegmentFilesOnDisk(str(src_dir), log=data)
        limit_mib_s = physical_limit(data)
        limits = [parse_size(r, "--rate-limits") for r in args.rate_limits.split(",")]
        results = [run_backlog(work, args, lim, source) for lim in limits]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = args.partitions * args.segments * args.segment_mib
    print(
        f"{args.partitions} partitions x {args.segments} segments of {args.segment_mib} MiB ({total:,} MiB), "
        f"{args.copiers} copier threads, path mode, zstd + AES-GCM, local store; physical limit (zstd-3 + "
        f"AES-GCM of the same bytes on {os.cpu_count()} cores): {limit_mib_s:.0f} MiB/s"
    )
    print(
        "| copy.upload_rate_limit | wall s | original MiB/s | stored MiB/s | RSS before / peak MiB "
        "| copy s min / median / max | partitions done s first / median / last | errors |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        lim = f"{r['limit'] / MiB:.0f} MiB/s" if r["limit"] else "none"
        c, d = r["copy_s"], r["done_s"]
        print(
            f"| {lim} | {r['elapsed']:.1f} | {r['original_mib_s']:.0f} | {r['stored_mib_s']:.1f} | "
            f"{r['rss_before']:.0f} / {r['rss_peak']:.0f} | {c[0]:.2f} / {c[1]:.2f} / {c[2]:.2f} | "
            f"{d[0]:.1f} / {d[1]:.1f} / {d[2]:.1f} | {len(r['errors'])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
