"""Copy throughput, time to first byte and index fetch cost through the REAL shim.

A small Java harness (``benchmarks/shim/Harness.java``, single-file source launch) loads the
shaded shim jar next to Kafka's ``kafka-clients``/``kafka-storage-api`` jars from the devstack
distribution and calls ``copyLogSegmentData`` / ``fetchLogSegment(md, start)`` / ``fetchIndex``
exactly as a broker does. The sidecar runs as its own process (``devstack.sidecar``), configured
by ``devstack.stack.LocalStack`` from ``config/sidecar.toml`` + ``RSM__`` environment: Unix socket,
local-directory storage, zstd + AES-GCM. The same bytes are read from a local file by the same
JVM in the same run, so the ratios are meaningful on a noisy shared machine; the seconds are not.

    .venv/bin/python benchmarks/shim.py [--size-mib 512] [--samples 60] [--copies 3]
                                        [--sidecar-env RSM__KEY=VALUE ...] [--transport unix|tcp-mtls]

``--transport tcp-mtls``: the sidecar in its own network namespace (``benchmarks/netns.py``, needs
root) reached over TCP with mutual TLS, as a sidecar in another pod is (Strimzi); stream mode
then sends every byte of a copy over TLS, while path mode still reads the broker's files (the
namespace shares the filesystem), so the copy table compares the two on the same machine.

What is measured:

* copy: one segment of ``--size-mib`` of realistic v2 record batches (JSON-like values,
  uncompressed by the producer, so zstd applies) with its offset/time/transaction indexes and
  producer snapshot, copied ``--copies`` times in each transfer mode (a new segment id each
  time, as the broker does); next to reading the same file (page cache) and a plain file copy
  with fsync (the sidecar's local store fsyncs too).
* fetch: 1 MiB reads at random positions (read 1 MiB then close, like
  ``RemoteLogManager.read``). *cold*: no chunk of the read's range in the sidecar's chunk cache
  (the sidecar is restarted and each cold read uses its own group of chunks, far enough from
  the others that sequential prefetch never loads it) and the stored object dropped from the
  page cache (``posix_fadvise(DONTNEED)``); compared with the local file dropped from the page
  cache the same way. *warm*: the same position read again (chunks cached by the sidecar),
  compared with the local file read again from the page cache.
* fetchIndex(OFFSET/TIMESTAMP/TRANSACTION): the first call after a sidecar restart (manifest
  load, RSA unwrap of the data key for OFFSET, the first of the three) and repeated calls (the
  sidecar's index cache), next to reading the local index file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.netns import NetNs
from benchmarks.remote_read import scrape
from benchmarks.synthetic import batches
from devstack.common import free_port
from devstack.kafka import KafkaDistribution, _java_executable
from devstack.stack import SHIM_JAR, LocalStack
from rsm_sidecar.config import Config
from rsm_sidecar.kafka.snapshot import encode_producer_snapshot
from rsm_sidecar.kafka.txnindex import AbortedTxn, encode_txn_index

MiB = 1024 * 1024
HARNESS = Path(__file__).resolve().parent / "shim" / "Harness.java"
INDEX_INTERVAL_BYTES = 4096  # Kafka's index.interval.bytes default


# -- the segment ------------------------------------------------------------------------------


def write_segment(directory: Path, total_bytes: int) -> tuple[Path, int]:
    """``<dir>/00000000000000000000.{log,index,timeindex,txnindex}`` and the producer snapshot of
    the next offset: an 8 MiB template of distinct batches repeated with base offsets rewritten
    (the batch CRC does not cover them), so offsets increase through the whole segment and the
    indexes are what Kafka would have written. Returns the .log path and the last offset."""
    template = list(batches(min(total_bytes, 8 * MiB)))
    log_path = directory / f"{0:020d}.log"
    offset_index, time_index = bytearray(), bytearray()
    position = next_offset = 0
    since_entry = INDEX_INTERVAL_BYTES  # Kafka indexes the first batch once the interval is passed
    ts = 1_700_000_000_000
    with open(log_path, "wb") as f:
        while position < total_bytes:
            for b in template:
                buf = bytearray(b)
                struct.pack_into(">q", buf, 0, next_offset)
                last_delta = struct.unpack_from(">i", buf, 23)[0]
                if since_entry >= INDEX_INTERVAL_BYTES:
                    offset_index += struct.pack(">ii", next_offset, position)
                    time_index += struct.pack(">qi", ts + next_offset + last_delta, next_offset + last_delta)
                    since_entry = 0
                f.write(buf)
                position += len(buf)
                since_entry += len(buf)
                next_offset += last_delta + 1
                if position >= total_bytes:
                    break
    last_offset = next_offset - 1
    (directory / f"{0:020d}.index").write_bytes(bytes(offset_index))
    (directory / f"{0:020d}.timeindex").write_bytes(bytes(time_index))
    step = max(1, last_offset // 40)
    (directory / f"{0:020d}.txnindex").write_bytes(
        encode_txn_index(
            AbortedTxn(1000 + i, o, o + 50, o + 51) for i, o in enumerate(range(0, last_offset - 60, step))
        )
    )
    (directory / f"{last_offset + 1:020d}.snapshot").write_bytes(encode_producer_snapshot([]))
    return log_path, last_offset


def drop_from_page_cache(path: Path) -> None:
    """Evict a file's clean pages (flushing it first), so the next read goes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# -- the harness ------------------------------------------------------------------------------


class Harness:
    """The Java harness process: one command per line, one ``RESULT {json}`` line per answer."""

    def __init__(
        self, dist: KafkaDistribution, target: str, log_file: Path, config: dict[str, str] | None = None
    ):
        lib = dist.lib_dir
        jars = [SHIM_JAR] + [lib / f"{a}-{dist.version}.jar" for a in ("kafka-clients", "kafka-storage-api")]
        jars += sorted(lib.glob("slf4j-api-*.jar"))[:1]
        missing = [str(j) for j in jars if not j.exists()]
        if missing:
            raise SystemExit(f"missing jars: {missing} (run `make deps`)")
        self.log = open(log_file, "ab")
        self.proc = subprocess.Popen(
            [_java_executable(), "-Xmx1g", "-cp", os.pathsep.join(map(str, jars)), str(HARNESS), target]
            + [f"{k}={v}" for k, v in (config or {}).items()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )
        ready = self._answer()
        if not ready.get("ready"):
            raise RuntimeError(f"harness did not start: {ready}")

    def _answer(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the harness exited ({self.proc.wait()}); see {self.log.name}")
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT ") :])

    def __call__(self, *args) -> dict:
        self.proc.stdin.write(" ".join(map(str, args)) + "\n")
        self.proc.stdin.flush()
        r = self._answer()
        if "error" in r:
            raise RuntimeError(f"{args[0]} failed: {r['error']}")
        return r

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


# -- statistics and printing --------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(p / 100 * len(v)) - 1))]


def ms(s: float) -> str:
    return f"{s * 1000:8.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--samples", type=int, default=60, help="random 1 MiB reads (each cold, warm and local)")
    ap.add_argument("--copies", type=int, default=3, help="copies per transfer mode")
    ap.add_argument("--index-rounds", type=int, default=3, help="sidecar restarts for first-call index costs")
    ap.add_argument(
        "--kafka-version", default=None, help="Kafka jars to run the shim with (devstack default)"
    )
    ap.add_argument("--workdir", default=None, help="kept after the run if given (else a temp dir, removed)")
    ap.add_argument(
        "--settle",
        type=float,
        default=0.5,
        help="seconds between a cold read and the next read (the prefetch it started finishes)",
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=2000,
        help="untimed fetches before the random reads: JIT warm-up of the shim's call path, as in a "
        "broker that has been serving for a while (with 300, the warm p50 was 0.5-1.1 ms higher: "
        "docs/operations.md)",
    )
    ap.add_argument(
        "--sidecar-env",
        action="append",
        default=[],
        metavar="RSM__KEY=VALUE",
        help="extra sidecar setting (repeatable), e.g. RSM__FETCH__MAX_RANGE_BYTES=4MiB",
    )
    ap.add_argument(
        "--verbose",
        action="store_true",
        help="print every random read (position, times, bytes returned by the first read())",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--transport",
        choices=("unix", "tcp-mtls"),
        default="unix",
        help="how the shim reaches the sidecar: its Unix socket, or TCP + mTLS into a network namespace",
    )
    args = ap.parse_args()
    if not SHIM_JAR.exists():
        raise SystemExit(f"{SHIM_JAR} is missing: run `make shim`")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rsm-shim-bench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    dist = KafkaDistribution.ensure(args.kafka_version)
    seg_dir = work / "segment"
    seg_dir.mkdir(exist_ok=True)
    print(f"writing a {args.size_mib} MiB segment of record batches in {seg_dir} ...", flush=True)
    log_path, last_offset = write_segment(seg_dir, args.size_mib * MiB)
    size = log_path.stat().st_size

    metrics_port = free_port()
    ns = NetNs("tcp-mtls-shim-bench") if args.transport == "tcp-mtls" else None
    host = ns.inner_ip if ns else "127.0.0.1"
    extra_env = {"RSM__METRICS__LISTEN": f"{host}:{metrics_port}"}
    extra_env.update(kv.split("=", 1) for kv in args.sidecar_env)
    metrics_url = f"http://{host}:{metrics_port}/metrics"
    # path mode reads the segment (and the warm-up segment) from the work directory
    extra_env.setdefault("RSM__COPY__ALLOWED_DIRS", str(work))
    stack = LocalStack(
        work / "stack",
        sidecar_env=extra_env,
        sidecar_tls=ns is not None,
        sidecar_host=host,
        sidecar_prefix=ns.exec_prefix if ns else (),
    )
    if ns:
        ns.__enter__()
    stack.start_storage()
    cfg_path, env = stack.sidecar_config_env()
    cfg = Config.load(cfg_path, environ=env)
    chunk, prefetch = cfg["segment.chunk_size"], cfg["cache.prefetch_bytes"]
    harness = None
    try:
        stack.start_sidecar()
        tls = {k[len("rsm.config.") :]: str(v) for k, v in stack.broker_properties().items() if ".tls." in k}
        harness = Harness(dist, stack.sidecar_target, work / "harness.log", tls)
        print(
            f"segment: {size / MiB:.0f} MiB, offsets 0..{last_offset}, indexes "
            f"{(seg_dir / f'{0:020d}.index').stat().st_size // 1024} KiB offset / "
            f"{(seg_dir / f'{0:020d}.timeindex').stat().st_size // 1024} KiB time / "
            f"{(seg_dir / f'{0:020d}.txnindex').stat().st_size} B txn; sidecar: chunk {chunk // MiB} MiB, "
            f"chunk cache {cfg['cache.chunk_bytes'] // MiB} MiB, prefetch {prefetch // MiB} MiB, "
            f"compression {cfg['segment.compression']}, encryption {cfg['encryption.enabled']}, "
            f"fetch.max_range_bytes {cfg['fetch.max_range_bytes'] // MiB} MiB, "
            f"storage {cfg['storage.backend']}; shim on Kafka {dist.version} jars; {os.cpu_count()} CPUs; "
            f"transport {args.transport}",
            flush=True,
        )
        results = run(
            args, harness, stack, seg_dir, log_path, last_offset, size, chunk, prefetch, work, metrics_url
        )
    finally:
        if harness is not None:
            harness.close()
        stack.stop()
        if ns:
            ns.close()
    report(results, size)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


def remote_object(stack: LocalStack, segment_id: str, suffix: str) -> Path:
    found = list(stack.remote_root.rglob(f"*-{segment_id}.{suffix}"))
    if len(found) != 1:
        raise RuntimeError(f"expected one remote .{suffix} object of segment {segment_id}, found {found}")
    return found[0]


def restart_sidecar(stack: LocalStack, harness: Harness, segment_id: str) -> float:
    """Restart the sidecar (empty caches) and reconnect; returns the time of the first call on the
    segment afterwards, a transaction-index fetch (manifest load + RSA unwrap of the data key)."""
    stack.restart_sidecar()
    harness("ping")
    return harness("index", segment_id, "TRANSACTION")["seconds"]


def run(
    args,
    harness: Harness,
    stack: LocalStack,
    seg_dir: Path,
    log_path: Path,
    last_offset: int,
    size: int,
    chunk: int,
    prefetch: int,
    work: Path,
    metrics_url: str,
) -> dict:
    out: dict = {"copy": {"path": [], "stream": []}, "local_read": [], "file_copy": []}
    # -- copy --------------------------------------------------------------------------------
    print("copy ...", flush=True)
    warm_dir = work / "warmup-segment"
    warm_dir.mkdir(exist_ok=True)
    _, warm_last = write_segment(warm_dir, 16 * MiB)
    for mode in ("path", "stream"):  # untimed: first-call costs (class loading, JIT, thread pools)
        harness("delete", harness("copy", mode, warm_dir, 0, warm_last)["segment_id"])
    harness("readfile", log_path)  # into the page cache, as a just-rolled broker segment is
    copy_target = work / "copy.bin"
    kept = None
    for i in range(args.copies):
        out["local_read"].append(harness("readfile", log_path)["seconds"])
        out["file_copy"].append(harness("copyfile", log_path, copy_target)["seconds"])
        copy_target.unlink()
        for mode in ("path", "stream") if i % 2 == 0 else ("stream", "path"):
            r = harness("copy", mode, seg_dir, 0, last_offset)
            stored = sum(p.stat().st_size for p in stack.remote_root.rglob(f"*-{r['segment_id']}.*"))
            out["copy"][mode].append(r["seconds"])
            out["stored_bytes"] = stored
            if kept is not None:
                out.setdefault("delete", []).append(harness("delete", kept)["seconds"])
            kept = r["segment_id"]
    remote_log = remote_object(stack, kept, "log")

    # -- random 1 MiB reads ---------------------------------------------------------------------
    print("random 1 MiB reads ...", flush=True)
    warm_pos = size // 2
    for i in range(args.warmup):
        harness("fetch", kept, warm_pos + (i % 7) * 1000, MiB)
        harness("local", log_path, warm_pos + (i % 7) * 1000, MiB)
        harness("index", kept, "OFFSET")
    rng = random.Random(args.seed)
    n_chunks = math.ceil(size / chunk)
    window = 2 + max(1, prefetch // chunk)  # a read spans <= 2 chunks, then prefetch loads the next ones
    groups = list(range(0, n_chunks - 1, window))
    fetch = {"cold": [], "warm": [], "local_cold": [], "local_warm": []}
    first_after_restart = []
    pending: list[int] = []
    while len(fetch["cold"]) < args.samples:
        if not pending:
            first_after_restart.append(restart_sidecar(stack, harness, kept))
            pending = groups[:]
            rng.shuffle(pending)
        g = pending.pop()
        start = min(g * chunk + rng.randrange(chunk), size - MiB)
        drop_from_page_cache(remote_log)
        downloaded = scrape(metrics_url).get("downloaded", 0.0)
        cold = harness("fetch", kept, start, MiB, log_path)
        time.sleep(args.settle)  # let the prefetch the cold read started finish before the next read
        warm = harness("fetch", kept, start, MiB, log_path)
        cold["downloaded"] = scrape(metrics_url).get("downloaded", 0.0) - downloaded
        if not (cold["verified"] and warm["verified"] and cold["bytes"] == warm["bytes"] == MiB):
            raise RuntimeError(f"fetch at {start} returned wrong bytes: {cold} {warm}")
        drop_from_page_cache(log_path)
        local_cold = harness("local", log_path, start, MiB)
        local_warm = harness("local", log_path, start, MiB)
        if args.verbose:
            print(
                f"  {start:>10d} cold ttfb {cold['ttfb'] * 1e3:6.1f} full {cold['seconds'] * 1e3:6.1f} "
                f"first read {cold['first_read_bytes']:>8d} | warm ttfb {warm['ttfb'] * 1e3:6.1f} full "
                f"{warm['seconds'] * 1e3:6.1f} first read {warm['first_read_bytes']:>8d}",
                flush=True,
            )
        for name, r in (
            ("cold", cold),
            ("warm", warm),
            ("local_cold", local_cold),
            ("local_warm", local_warm),
        ):
            fetch[name].append(r)
        time.sleep(0.1)
    out["fetch"] = fetch
    out["first_after_restart"] = first_after_restart

    # -- fetchIndex ------------------------------------------------------------------------------
    print("fetchIndex ...", flush=True)
    types = {"OFFSET": "index", "TIMESTAMP": "timeindex", "TRANSACTION": "txnindex"}
    idx: dict = {t: {"first": [], "warm": [], "local": [], "bytes": 0} for t in types}
    for _ in range(args.index_rounds):
        stack.restart_sidecar()
        harness("ping")  # reconnect outside the measurement
        for t in types:  # the broker's RemoteIndexCache fetches the three in this order on a miss
            r = harness("index", kept, t)
            idx[t]["first"].append(r["seconds"])
            idx[t]["bytes"] = r["bytes"]
    for _ in range(20):
        for t, suffix in types.items():
            idx[t]["warm"].append(harness("index", kept, t)["seconds"])
            f = seg_dir / f"{0:020d}.{suffix}"
            idx[t]["local"].append(harness("local", f, 0, f.stat().st_size)["seconds"])
    out["index"] = idx
    out.setdefault("delete", []).append(harness("delete", kept)["seconds"])
    return out


def report(r: dict, size: int) -> None:
    mib = size / MiB
    local_read = statistics.median(r["local_read"])
    print(
        f"\n== copyLogSegmentData of {mib:.0f} MiB (median of {len(r['copy']['path'])}; stored "
        f"{r['stored_bytes'] / MiB:.0f} MiB after zstd + AES-GCM) =="
    )
    print(f"{'':34s}{'MiB/s':>9s}{'seconds':>9s}{'vs local read':>15s}{'vs file copy':>14s}")
    file_copy = statistics.median(r["file_copy"])
    rows = [
        ("local file read (page cache)", local_read),
        ("plain file copy + fsync", file_copy),
        ("shim copy, path mode", statistics.median(r["copy"]["path"])),
        ("shim copy, stream mode", statistics.median(r["copy"]["stream"])),
    ]
    for name, s in rows:
        print(f"{name:34s}{mib / s:9.0f}{s:9.2f}{s / local_read:14.1f}x{s / file_copy:13.1f}x")
    print("(ratios are time ratios: how many times longer than the baseline)")

    f = r["fetch"]
    n = len(f["cold"])
    print(f"\n== 1 MiB read at a random position, then close ({n} positions; ms) ==")
    print(
        f"{'':44s}{'TTFB p50':>9s}{'TTFB p99':>9s}{'full p50':>9s}{'full p99':>9s}{'TTFB p50 vs local':>19s}"
    )
    pairs = [
        ("local file, not in page cache", "local_cold", None),
        ("shim, cold (chunk not cached, not in p.c.)", "cold", "local_cold"),
        ("local file, page cache", "local_warm", None),
        ("shim, warm (chunk cache hit)", "warm", "local_warm"),
    ]
    for name, key, base in pairs:
        ttfb = [x["ttfb"] for x in f[key]]
        full = [x["seconds"] for x in f[key]]
        ratio = ""
        if base:
            b = pct([x["ttfb"] for x in f[base]], 50)
            ratio = f"{pct(ttfb, 50) / b:17.1f}x"
        print(
            f"{name:44s}{ms(pct(ttfb, 50))} {ms(pct(ttfb, 99))} {ms(pct(full, 50))} "
            f"{ms(pct(full, 99))}{ratio}"
        )
    got = [x["downloaded"] for x in f["cold"]]
    print(
        f"bytes read from storage per cold read (its chunks, and any prefetch within --settle and the "
        f"warm read): median {statistics.median(got) / MiB:.1f} MiB, max {max(got) / MiB:.1f} MiB"
    )
    far = r["first_after_restart"]
    print(
        f"first fetchIndex of the segment after a sidecar restart (manifest load, RSA unwrap): "
        f"median {statistics.median(far) * 1000:.0f} ms over {len(far)} restarts"
    )
    print(
        "(local TTFB = the whole 1 MiB: a file read returns it in one call; the shim's first read "
        "returns the first gRPC message)"
    )

    print("\n== fetchIndex, open + read all + close (ms) ==")
    print(
        f"{'':14s}{'bytes':>9s}{'first after restart':>21s}{'warm p50':>10s}{'warm p99':>10s}"
        f"{'local file p50':>16s}{'warm vs local':>15s}"
    )
    for t, v in r["index"].items():
        lp = pct(v["local"], 50)
        print(
            f"{t:14s}{v['bytes']:9d}{statistics.median(v['first']) * 1000:21.2f}"
            f"{pct(v['warm'], 50) * 1000:10.2f}{pct(v['warm'], 99) * 1000:10.2f}"
            f"{lp * 1000:16.2f}{pct(v['warm'], 50) / lp:14.1f}x"
        )
    print(
        f"(first after restart: OFFSET includes the manifest load and the data key's RSA unwrap; "
        f"deleteLogSegmentData: median {statistics.median(r['delete']) * 1000:.0f} ms)"
    )


if __name__ == "__main__":
    main()
