"""What the sidecar spends per MiB it serves over its fetch channel, without a broker: ``--partitions``
partitions of tiered segments (the benchmarks' JSON-like records in 4 MiB chunks, zstd + AES-GCM, as
the sidecar stores them) read at once, each by a client thread asking for sequential windows as the
shim's read-ahead does (``--window-mib``: 64 MiB shared by 2 x 12 partitions is 2.67 MiB), over TCP
+ mutual TLS (or ``--transport unix``); cold (sidecar restarted, its store dropped from the page
cache) then warm. Printed per read: MiB/s, the sidecar's CPU-seconds and milliseconds per MiB served,
and the floor measured in the same run (``benchmarks/floor.py``) with the ratio to it; with
``--profile DIR`` a py-spy profile of the sidecar per read (``--native`` adds C frames, ``--gil`` the
thread holding the GIL only, whose total is then the GIL's share of the sidecar's CPU).

    .venv/bin/python -m benchmarks.sidecar_serve [--partitions 12] [--mib 16] [--window-mib 2.67]
        [--transport tcp-mtls|unix] [--chunk-cache-mib 128] [--profile DIR] [--native] [--gil]

A client in another process over loopback shares the cores: compare the sidecar's CPU per MiB, not
the MiB/s. The broker's side is ``remote_read_partitions.py``.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.floor import measure as measure_floor
from benchmarks.remote_read import cpu_seconds, drop_page_cache
from benchmarks.synthetic import encryption_toml, value
from devstack.cluster import parallel
from devstack.tls import TestCA
from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.config import Config
from rsm_sidecar.format.keys import KeyLayout
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
from rsm_sidecar.segment.settings import CopySettings
from rsm_sidecar.storage.factory import open_store
from rsm_sidecar.transform.keyring import Keyring, write_key_pair
from tests.service.rsm_client import FetchChannelClient
from tests.service.sidecar_process import SidecarProcess
from tests.tiered_writer import TieredWriter

MiB = 1024 * 1024
HOST = "sidecar.test"


def write_store(
    workdir: Path, payload: list[bytes], partitions: int, mib: int
) -> list[list[pb.SegmentMetadata]]:
    """``mib`` MiB of records per partition in 4 MiB segments; their metadata, per partition."""
    write_key_pair(workdir / "k.pub", workdir / "k.priv", 2048)
    cfg = Config.load(workdir / "sidecar.toml", environ={})
    writer = TieredWriter(
        open_store(cfg),
        KeyLayout(cfg["storage.key_prefix"]),
        Keyring.from_config(cfg),
        "bench",
        settings=CopySettings(chunk_size=4 * MiB),
    )
    out: list[list[pb.SegmentMetadata]] = []
    for p in range(partitions):
        mds, offset, batches, size, total = [], 0, [], 0, 0
        while total < mib * MiB:
            recs = [
                SimpleRecord(None, payload[(offset + i) % len(payload)], 1_700_000_000_000) for i in range(50)
            ]
            b = build_batch(recs, base_offset=offset)
            batches.append(b)
            size += len(b)
            total += len(b)
            offset += len(recs)
            if size >= 4 * MiB or total >= mib * MiB:
                md = writer.write_segment(p, batches)
                m = pb.SegmentMetadata()
                md.fill_proto(m)
                m.ClearField("custom_metadata")  # the sidecar's own key prefix, which the writer used
                mds.append(m)
                batches, size = [], 0
        out.append(mds)
    writer.close()
    return out


def config(workdir: Path, transport: str, chunk_cache_mib: int) -> str:
    listen = f"unix://{workdir}/run/rsm.sock" if transport == "unix" else "127.0.0.1:0"
    tls = (
        ""
        if transport == "unix"
        else f"""
[server.tls]
cert_file = "{workdir}/server.pem"
key_file = "{workdir}/server.key"
client_ca_file = "{workdir}/ca.pem"
"""
    )
    return f"""
[server]
listen = "{listen}"
{tls}
[metrics]
listen = ""
[storage.local]
root = "{workdir}/remote"
fsync = false
[segment]
chunk_size = "4MiB"
[cache]
chunk_bytes = "{chunk_cache_mib}MiB"
prefetch_bytes = "16MiB"
{encryption_toml(workdir, "k1")}"""


def read_all(
    target: str, ctx: ssl.SSLContext | None, segments: list[list[pb.SegmentMetadata]], window: int
) -> float:
    """Every partition read by its own thread in windows; the MiB read."""
    got = [0]
    lock = threading.Lock()

    def reader(mds: list[pb.SegmentMetadata]) -> None:
        client = FetchChannelClient(target, ctx, HOST if ctx else None)
        for md in mds:
            for start in range(0, md.segment_size_in_bytes, window):
                data, _ = client.fetch(md, start, min(start + window, md.segment_size_in_bytes) - 1)
                with lock:
                    got[0] += len(data)
        client.close()

    parallel(functools.partial(reader, mds) for mds in segments)
    return got[0] / MiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--mib", type=int, default=16, help="MiB of records per partition")
    ap.add_argument("--window-mib", type=float, default=64 / 24)
    ap.add_argument("--transport", choices=("tcp-mtls", "unix"), default="tcp-mtls")
    ap.add_argument("--chunk-cache-mib", type=int, default=128)
    ap.add_argument(
        "--profile", type=Path, help="a py-spy profile of the sidecar per read into this directory"
    )
    ap.add_argument("--native", action="store_true", help="with --profile: C frames too")
    ap.add_argument("--gil", action="store_true", help="with --profile: only the thread holding the GIL")
    ap.add_argument(
        "--perf", type=Path, help="a perf profile (cpu-clock) of the sidecar per read into this directory"
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sidecar-serve-"))
    try:
        rng = random.Random(405)
        payload = [value(rng, 200) for _ in range(10_000)]
        ca = TestCA("serve-bench")
        server, client = ca.issue(HOST, dns=[HOST]), ca.issue("broker")
        for name, data in (
            ("ca.pem", ca.cert_pem),
            ("server.pem", server.cert_pem),
            ("server.key", server.key_pem),
            ("client.pem", client.cert_pem),
            ("client.key", client.key_pem),
        ):
            (work / name).write_bytes(data)
        (work / "sidecar.toml").write_text(config(work, args.transport, args.chunk_cache_mib))
        segments = write_store(work, payload, args.partitions, args.mib)
        ctx = None
        if args.transport == "tcp-mtls":
            ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
            ctx.load_cert_chain(work / "client.pem", work / "client.key")
            ctx.set_alpn_protocols(["rsm-fetch/1"])
        window = int(args.window_mib * MiB)
        print(
            f"{args.partitions} partitions x {args.mib} MiB, windows of {window / MiB:.2f} MiB, "
            f"{args.transport}, chunk cache {args.chunk_cache_mib} MiB",
            flush=True,
        )
        drop_page_cache(work / "remote")
        sidecar = SidecarProcess(work / "sidecar.toml")
        rows = []
        try:
            target = sidecar.address if args.transport == "tcp-mtls" else f"unix://{work}/run/rsm.sock"
            for temperature in ("cold", "warm"):
                spy = None
                if args.profile:
                    args.profile.mkdir(parents=True, exist_ok=True)
                    spy = subprocess.Popen(
                        ["py-spy", "record", "--pid", str(sidecar.proc.pid), "--rate", "250",
                         "--format", "raw",
                         "--output", str(args.profile / f"sidecar-serve-{temperature}.txt"),
                         *([] if args.native else ["--nonblocking"]),
                         *(["--native"] if args.native else []), *(["--gil"] if args.gil else [])],
                        stdout=subprocess.DEVNULL, stderr=open(args.profile / "py-spy.log", "ab"),
                    )  # fmt: skip
                    time.sleep(0.5)
                perf = None
                if args.perf:
                    args.perf.mkdir(parents=True, exist_ok=True)
                    perf = subprocess.Popen(
                        ["perf", "record", "-F", "997", "-e", "cpu-clock", "-g", "-p", str(sidecar.proc.pid),
                         "-o", str(args.perf / f"sidecar-serve-{temperature}.data")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )  # fmt: skip
                    time.sleep(0.5)
                c0, t0 = cpu_seconds(sidecar.proc.pid), time.monotonic()
                mib = read_all(target, ctx, segments, window)
                cpu, secs = cpu_seconds(sidecar.proc.pid) - c0, time.monotonic() - t0
                for profiler in (spy, perf):
                    if profiler is not None:
                        profiler.send_signal(2)
                        profiler.wait(60)
                rows.append((temperature, mib, secs, cpu))
                print(f"  {temperature}: {mib:.0f} MiB in {secs:.1f} s, sidecar {cpu:.2f} CPU-s", flush=True)
        finally:
            sidecar.stop()
        floor = measure_floor(b"\n".join(payload))
        print()
        print("| read | MiB | MiB/s | sidecar CPU-s | sidecar ms per MiB | x floor |")
        print("|---|---|---|---|---|---|")
        for temperature, mib, secs, cpu in rows:
            ms = 1000 * cpu / mib
            ratio = ms / floor.total_ms_per_mib
            print(f"| {temperature} | {mib:.0f} | {mib / secs:.0f} | {cpu:.2f} | {ms:.2f} | {ratio:.2f}x |")
        print()
        print(floor.line())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
