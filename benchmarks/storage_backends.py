"""Storage backend throughput and request counts, next to raw local disk.

    .venv/bin/python -m benchmarks.storage_backends [--size-mib 64] [--repeat 3] [--reads 40]

For each backend (local directory, SeaweedFS over S3, fake-gcs-server over the GCS JSON API,
Azurite over the Blob API; the servers are started here on loopback and stopped at the end) it
uploads an object of ``--size-mib`` through ``open_writer`` in 1 MiB writes (as the copy
pipeline does), then reads ``--reads`` random ranges of 1 MiB and of 4 MiB. Raw local disk is
measured in the same run on the same bytes: a file written in 1 MiB writes plus fsync, and
``os.pread`` of the same ranges. It prints throughput (median of ``--repeat`` uploads; reads
over all ranges) and how many storage requests one upload and one 1 MiB ranged read cost.

The servers write to the same local disk, so the figures are an upper bound of what the
backend code can push, not a prediction for a real bucket (where latency per request, not
bandwidth, dominates small reads). Not a timed test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
os.environ.setdefault("NO_GCE_CHECK", "true")

from devstack.azurite import AzuriteServer
from devstack.common import BucketServer
from devstack.gcsserver import FakeGcsServer
from devstack.s3server import SeaweedS3Server
from rsm_sidecar.storage.base import ObjectStore

MiB = 1024 * 1024
WRITE = 1 * MiB


def payload(size: int) -> bytes:
    rnd = random.Random(42)
    return rnd.randbytes(size)  # incompressible, like compressed/encrypted chunks


def ranges(size: int, length: int, count: int, seed: int) -> list[tuple[int, int]]:
    rnd = random.Random(seed)
    return [(s, s + length - 1) for s in (rnd.randrange(0, size - length) for _ in range(count))]


MIN_READ_SECONDS = 0.5


def timed_rounds(fn) -> float:
    """The seconds one round of ``fn`` takes, averaged over as many rounds as fit in
    MIN_READ_SECONDS (at least one), so fast backends are not timed on a few milliseconds."""
    rounds = 0
    t0 = time.perf_counter()
    while True:
        fn()
        rounds += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= MIN_READ_SECONDS:
            return elapsed / rounds


def measure_raw(workdir: Path, data: bytes, repeat: int, reads: dict[int, list]) -> dict:
    out: dict = {"upload": [], "read": {}}
    path = workdir / "raw.bin"
    for _ in range(repeat):
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for i in range(0, len(data), WRITE):
                f.write(data[i : i + WRITE])
            f.flush()
            os.fsync(f.fileno())
        out["upload"].append(time.perf_counter() - t0)
    fd = os.open(path, os.O_RDONLY)
    try:
        for length, rs in reads.items():
            out["read"][length] = timed_rounds(
                lambda rs=rs: [os.pread(fd, end - start + 1, start) for start, end in rs]
            )
    finally:
        os.close(fd)
    return out


def measure_store(store: ObjectStore, key: str, data: bytes, repeat: int, reads: dict[int, list]) -> dict:
    out: dict = {"upload": [], "read": {}, "upload_requests": None, "read_requests": {}}
    for _ in range(repeat):
        before = store.requests
        t0 = time.perf_counter()
        with store.open_writer(key) as w:
            for j in range(0, len(data), WRITE):
                w.write(data[j : j + WRITE])
            w.commit()
        out["upload"].append(time.perf_counter() - t0)
        after = store.requests
        out["upload_requests"] = {
            k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)
        }
    assert store.size(key) == len(data)
    for length, rs in reads.items():
        before = sum(store.requests.values())
        for start, end in rs:
            assert len(store.get_range(key, start, end)) == end - start + 1
        out["read_requests"][length] = (sum(store.requests.values()) - before) / len(rs)
        out["read"][length] = timed_rounds(lambda rs=rs: [store.get_range(key, s, e) for s, e in rs])
    # spot-check the bytes once
    start, end = reads[min(reads)][0]
    assert store.get_range(key, start, end) == data[start : end + 1]
    store.delete(key)
    return out


def fmt_rate(nbytes: float, seconds: float) -> str:
    return f"{nbytes / MiB / seconds:8.0f}" if seconds > 0 else "     inf"


Store = TypeVar("Store", bound=ObjectStore)
#: the object each backend's run writes and reads
KEY = "bench/object"


@contextlib.contextmanager
def bucket_store(server: BucketServer, make_store: Callable[[], Store]) -> Iterator[Store]:
    """``make_store()`` on the bucket ``bench`` of ``server`` (started here), checked; at the
    end the store is closed and the server stopped."""
    with server:
        server.create_bucket("bench")
        store = make_store()
        try:
            store.check()
            yield store
        finally:
            store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reads", type=int, default=40, help="ranged reads per range size")
    ap.add_argument("--backends", default="local,s3,gcs,azure")
    args = ap.parse_args(argv)
    size = args.size_mib * MiB
    data = payload(size)
    reads = {MiB: ranges(size, MiB, args.reads, 1), 4 * MiB: ranges(size, 4 * MiB, args.reads, 2)}
    wanted = set(args.backends.split(","))
    results: dict[str, dict] = {}
    notes: list[str] = []

    with tempfile.TemporaryDirectory(prefix="rsm-bench-") as tmp:
        work = Path(tmp)
        results["raw local disk"] = measure_raw(work, data, args.repeat, reads)

        if "local" in wanted:
            from rsm_sidecar.storage.local import LocalObjectStore

            store = LocalObjectStore(work / "local-store")
            store.check()
            results["local dir"] = measure_store(store, KEY, data, args.repeat, reads)

        if "s3" in wanted:
            from rsm_sidecar.storage.s3 import S3ObjectStore
            from rsm_sidecar.storage.s3_settings import S3Settings

            server = SeaweedS3Server(work / "seaweedfs")

            def s3_store() -> S3ObjectStore:
                return S3ObjectStore(
                    S3Settings(
                        bucket="bench",
                        endpoint_url=server.endpoint_url,  # the ports are final once it has started
                        region="us-east-1",
                        addressing_style="path",
                        access_key_id="bench",
                        secret_access_key="bench",
                    )
                )

            with bucket_store(server, s3_store) as store:
                results["s3 (SeaweedFS)"] = measure_store(store, KEY, data, args.repeat, reads)
                c = store.settings
                notes.append(
                    f"s3: part_size {c.part_size // MiB} MiB, {c.max_parts_in_flight} parts in "
                    f"flight, checksum {store.checksum_algorithm}; SeaweedFS RSS after: "
                    f"{(server.rss_bytes() or 0) / MiB:.0f} MiB"
                )

        if "gcs" in wanted:
            from rsm_sidecar.storage.gcs import GcsObjectStore
            from rsm_sidecar.storage.gcs_settings import GcsSettings

            gcs = FakeGcsServer(work / "fake-gcs", backend="filesystem")
            with bucket_store(
                gcs,
                lambda: GcsObjectStore(
                    GcsSettings(bucket="bench", endpoint_url=gcs.endpoint_url, credentials="anonymous")
                ),
            ) as store:
                results["gcs (fake-gcs-server)"] = measure_store(store, KEY, data, args.repeat, reads)
                notes.append(
                    f"gcs: chunk_size {store.settings.chunk_size // MiB} MiB, CRC32C on; fake-gcs-server "
                    f"(filesystem backend) RSS after: {(gcs.rss_bytes() or 0) / MiB:.0f} MiB"
                )

        if "azure" in wanted:
            from rsm_sidecar.storage.azure import AzureObjectStore
            from rsm_sidecar.storage.azure_settings import AzureSettings

            azurite = AzuriteServer(work / "azurite")

            def azure_store() -> AzureObjectStore:
                return AzureObjectStore(
                    AzureSettings(
                        container="bench",
                        account_name=azurite.account,
                        account_key=azurite.account_key,
                        endpoint_url=azurite.endpoint_url,
                    )
                )

            with bucket_store(azurite, azure_store) as store:
                results["azure (Azurite)"] = measure_store(store, KEY, data, args.repeat, reads)
                c = store.settings
                notes.append(
                    f"azure: block_size {c.block_size // MiB} MiB, {c.max_blocks_in_flight} blocks in "
                    f"flight, Content-MD5 {'on' if c.checksum else 'off'}; Azurite (blobs on disk) RSS "
                    f"after: {(azurite.rss_bytes() or 0) / MiB:.0f} MiB"
                )

    print(
        f"\nobject {args.size_mib} MiB written in 1 MiB pieces, median of {args.repeat} uploads; "
        f"{args.reads} random ranged reads per size\n"
    )
    header = (
        f"{'backend':24} {'upload MiB/s':>12} {'read 1MiB MiB/s':>16} {'read 4MiB MiB/s':>16} "
        f"{'requests/upload':>16} {'requests/1MiB read':>19}"
    )
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        up = statistics.median(r["upload"])
        req_up = r.get("upload_requests")
        req_txt = "-" if req_up is None else str(sum(req_up.values()))
        rr = r.get("read_requests", {}).get(MiB)
        print(
            f"{name:24} {fmt_rate(size, up):>12} {fmt_rate(MiB * args.reads, r['read'][MiB]):>16} "
            f"{fmt_rate(4 * MiB * args.reads, r['read'][4 * MiB]):>16} {req_txt:>16} "
            f"{'-' if rr is None else f'{rr:g}':>19}"
        )
    print()
    for name, r in results.items():
        if r.get("upload_requests"):
            detail = ", ".join(f"{k} {v}" for k, v in sorted(r["upload_requests"].items()))
            print(f"  {name}: one {args.size_mib} MiB upload = {detail}")
    for n in notes:
        print("  " + n)
    print("  raw local disk: write + fsync of the same bytes; reads are os.pread from the page cache")
    return 0


if __name__ == "__main__":
    sys.exit(main())
