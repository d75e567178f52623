"""Start-up of ``rsm-sidecar serve`` with a full disk chunk cache and a large copy journal: the time
until it answers health checks as SERVING, and until the journal sweep has settled every entry.

    .venv/bin/python benchmarks/sidecar_startup.py [--cache-entries 1000,10000,100000]
        [--journal-entries 100,1000,10000] [--storage local,s3] [--runs 3] [--entry-kib 4]

Each setting gets a fresh directory: the disk chunk cache (``fetch.disk_cache.path``) filled with
``--cache-entries`` files of ``--entry-kib`` KiB in the cache's own layout (one segment
directory per 16 entries), and the copy journal (``copy.journal_dir``) with ``--journal-entries``
entries, each the leftover of an interrupted copy: a ``.log`` and an ``.indexes`` object in the
store without a manifest, which the sweep must delete (one manifest GET and two deletes each).
The sidecar is started ``--runs`` times on the same directories (the journal refilled each time;
the page cache stays warm after the first start: the median is of warm starts) and reports:

* time to serving: from the process start to the first SERVING health answer;
* time to settled: until the journal directory holds no entry;
* the peak RSS of the process while it started.

A baseline start with an empty cache and journal in the same run is the floor (Python imports,
keys, gRPC): compare the growth against it. The machine is shared: quote medians.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devstack.common import free_port

ENTRIES_PER_SEGMENT = 16


def fill_cache(path: Path, entries: int, entry_bytes: int) -> None:
    """``entries`` files in the layout of rsm_sidecar/segment/disk_cache.py, oldest first."""
    path.mkdir(parents=True, exist_ok=True)
    (path / ".tmp").mkdir(exist_ok=True)
    data = os.urandom(entry_bytes)
    t0 = time.time() - entries
    for i in range(entries):
        seg = hashlib.sha256(b"segment %d" % (i // ENTRIES_PER_SEGMENT)).hexdigest()[:32]
        name = hashlib.sha256(b"entry %d" % i).hexdigest()[:40] + ".chunk"
        d = path / seg
        if i % ENTRIES_PER_SEGMENT == 0:
            d.mkdir(exist_ok=True)
        f = d / name
        f.write_bytes(data)
        os.utime(f, (t0 + i, t0 + i))


def fill_journal(journal: Path, store, entries: int) -> None:
    """``entries`` journal entries, each with the data objects of an interrupted copy."""
    journal.mkdir(parents=True, exist_ok=True)
    for i in range(entries):
        base = f"tiered/startup-QmVuY2hCZW5jaEJlbmNoQg/{i % 10}/{i:020d}-{uuid.uuid4().hex[:22]}"
        store.put(f"{base}.log", b"partial")
        store.put(f"{base}.indexes", b"partial")
        entry = uuid.uuid4().hex
        (journal / f"{entry}.json").write_text(json.dumps({"base": base, "attempt": uuid.uuid4().hex}))


def rss_peak_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def start_once(config: Path, env: dict[str, str], journal: Path, socket: Path, timeout: float = 600) -> dict:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    log = open(config.with_suffix(".log"), "wb")  # a pipe nobody reads would block its logging
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rsm_sidecar.cli.main", "serve", "--config", str(config)],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    log.close()
    serving = settled = None
    peak = 0
    try:
        with grpc.insecure_channel(f"unix://{socket}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while time.monotonic() - t0 < timeout:
                if proc.poll() is not None:
                    tail = config.with_suffix(".log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"the sidecar exited: {tail}")
                peak = max(peak, rss_peak_kib(proc.pid))
                if serving is None:
                    with contextlib.suppress(grpc.RpcError):
                        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=0.5)
                        if resp.status == health_pb2.HealthCheckResponse.SERVING:
                            serving = time.monotonic() - t0
                if settled is None and not any(journal.glob("*.json")):
                    settled = time.monotonic() - t0
                if serving is not None and settled is not None:
                    break
                time.sleep(0.02)
    finally:
        peak = max(peak, rss_peak_kib(proc.pid))
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    return {"serving_s": serving, "settled_s": settled, "peak_rss_mib": peak / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-entries", default="1000,10000,100000")
    ap.add_argument("--journal-entries", default="100,1000,10000")
    ap.add_argument("--storage", default="local,s3")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--entry-kib", type=int, default=4)
    ap.add_argument("--work", type=Path)
    args = ap.parse_args(argv)
    from rsm_sidecar.config import Config
    from rsm_sidecar.storage.factory import open_store
    from rsm_sidecar.transform.keyring import write_key_pair

    work = args.work or Path(tempfile.mkdtemp(prefix="sidecar-startup-"))
    keys = work / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    write_key_pair(keys / "pub.pem", keys / "priv.pem", 2048, overwrite=True)
    rows = []
    try:
        for storage in args.storage.split(","):
            with contextlib.ExitStack() as stack:
                storage_env = {"RSM__STORAGE__LOCAL__ROOT": str(work / "remote")}
                if storage == "s3":
                    from devstack.s3server import SeaweedS3Server

                    srv = SeaweedS3Server(
                        work / "seaweed", access_key="su-access", secret_key="su-secret-key"
                    )
                    stack.callback(srv.stop)
                    srv.start()
                    srv.create_bucket("startup")
                    storage_env = {
                        "RSM__STORAGE__S3__BUCKET": "startup",
                        "RSM__STORAGE__S3__ENDPOINT_URL": srv.endpoint_url,
                        "RSM__STORAGE__S3__REGION": "us-east-1",
                        "RSM__STORAGE__S3__ADDRESSING_STYLE": "path",
                        "RSM__STORAGE__S3__ACCESS_KEY_ID": srv.access_key,
                        "RSM__STORAGE__S3__SECRET_ACCESS_KEY": srv.secret_key,
                    }
                settings = [(0, 0)]
                settings += [(int(c), 0) for c in args.cache_entries.split(",")]
                settings += [(0, int(j)) for j in args.journal_entries.split(",")]
                for cache_n, journal_n in settings:
                    d = work / f"{storage}-c{cache_n}-j{journal_n}"
                    socket = d / "rsm.sock"
                    env = {
                        "RSM__STORAGE__BACKEND": storage,
                        "RSM__SERVER__LISTEN": f"unix://{socket}",
                        "RSM__METRICS__LISTEN": f"127.0.0.1:{free_port()}",
                        "RSM__COPY__JOURNAL_DIR": str(d / "journal"),
                        "RSM__FETCH__DISK_CACHE__PATH": str(d / "cache"),
                        "RSM__FETCH__DISK_CACHE__BYTES": str(2 * max(1, cache_n) * args.entry_kib * 1024),
                        "RSM__ENCRYPTION__ACTIVE_KEY_ID": "k",
                        "RSM__ENCRYPTION__KEYS__k__PUBLIC_KEY_FILE": str(keys / "pub.pem"),
                        "RSM__ENCRYPTION__KEYS__k__PRIVATE_KEY_FILE": str(keys / "priv.pem"),
                        **storage_env,
                    }
                    config = d / "sidecar.toml"
                    d.mkdir(parents=True, exist_ok=True)
                    config.write_text('[storage]\nkey_prefix = "tiered/"\n')
                    fill_cache(d / "cache", cache_n, args.entry_kib * 1024)
                    store = open_store(Config.load(config, environ=env))
                    results = []
                    for _ in range(args.runs):
                        fill_journal(d / "journal", store, journal_n)
                        results.append(start_once(config, env, d / "journal", socket))
                    store.close()
                    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
                    rows.append((storage, cache_n, journal_n, med))
                    print(
                        f"{storage}: cache {cache_n:,} entries, journal {journal_n:,}: serving after "
                        f"{med['serving_s']:.2f} s, journal settled after {med['settled_s']:.2f} s, "
                        f"peak RSS {med['peak_rss_mib']:.0f} MiB",
                        flush=True,
                    )
                    shutil.rmtree(d / "cache", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"median of {args.runs} starts; cache entries of {args.entry_kib} KiB")
    heads = ("storage", "disk cache entries", "journal entries", "time to serving s", "journal settled s")
    print("| " + " | ".join(heads) + " | peak RSS MiB |")
    print("|---|---|---|---|---|---|")
    for storage, c, j, m in rows:
        cells = (storage, f"{c:,}", f"{j:,}", f"{m['serving_s']:.2f}", f"{m['settled_s']:.2f}")
        print("| " + " | ".join(cells) + f" | {m['peak_rss_mib']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
