"""Freshness of ``rsm-sidecar iceberg convert --follow`` on the real stack: how long after a
segment reaches remote storage its rows are committed to the table.

Set-up: the local stack (a Kafka broker tiering through the shim and the sidecar into a local
directory, zstd + AES-GCM; ``devstack.stack.LocalStack``), one topic with 1 MiB segments and
``local.retention.ms = 1000``, a producer writing ``--mb-per-s`` of ~200-byte records
continuously (a segment rolls about every 1 / mb-per-s seconds), and a follower in this process
at the default settings (``iceberg.follow.interval`` 10 s, ``local[2]`` Spark, the embedded
catalog). The producer starts once the follower's first round (Spark session started)
has found nothing; it runs until ``--segments`` segments are committed.

Per committed segment two figures, as percentiles:

* **manifest → committed**: from the segment's manifest being written (the object's mtime: the
  last object of a copy, so the segment is complete in storage from then on) to the commit that
  made its rows visible;
* **copy start → committed**: from the broker beginning to copy it (``eventTimestampMs``) - what
  the follower's ``rsm_iceberg_follow_freshness_seconds`` histogram observes;
* **newest record → committed** and **oldest record → committed**: from the produce time of the
  segment's newest record (its ``maxTimestampMs``), and of its oldest one (about the previous
  segment's newest), to the commit - what a reader of the table waits for a record, the time
  the segment took to fill (``segment.bytes`` / ``segment.ms``) included.

Then the data files: how many the table has and their sizes, before and after ``iceberg maintain
--compact`` (the trade-off of docs/iceberg.md "Freshness against file size": every round writes
at least one file per partition and time partition it converts).

    .venv/bin/python benchmarks/iceberg_freshness.py [--segments 50] [--mb-per-s 0.5] \
        [--interval 10] [--segment-bytes 1048576] [--segment-ms 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=50)
    ap.add_argument("--mb-per-s", type=float, default=0.5)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--interval", type=float, default=10.0, help="iceberg.follow.interval (s)")
    ap.add_argument("--segment-bytes", type=int, default=1 << 20, help="the topic's segment.bytes")
    ap.add_argument("--segment-ms", type=int, default=0, help="the topic's segment.ms (0: Kafka's default)")
    ap.add_argument("--partitions", type=int, default=1)
    args = ap.parse_args()

    from confluent_kafka import Producer

    from devstack.stack import LocalStack
    from rsm_sidecar.iceberg.follow import Follower, FollowMetrics
    from rsm_sidecar.iceberg.job import load_config
    from tests.e2e.kafka_helpers import create_topic

    workdir = Path(tempfile.mkdtemp(prefix="iceberg-freshness-"))
    stack = LocalStack(workdir / "stack", storage="local").start()
    topic = f"fresh-{uuid.uuid4().hex[:6]}"
    stop = threading.Event()
    try:
        topic_config = {"segment_bytes": args.segment_bytes}
        if args.segment_ms:
            topic_config["segment_ms"] = args.segment_ms
        create_topic(stack.bootstrap_servers, topic, args.partitions, **topic_config)
        cfg_file, env = stack.sidecar_config_env()
        cfg, storage = load_config(
            cfg_file,
            env,
            {
                "iceberg.catalog.local.root": str(workdir / "lake"),
                "iceberg.key.raw": True,
                "iceberg.value.raw": True,
                "iceberg.follow.interval": args.interval,
            },
        )
        remote_root = Path(cfg["storage.local.root"])

        def produce() -> None:
            p = Producer({"bootstrap.servers": stack.bootstrap_servers, "linger.ms": 20})
            per_tick = max(1, int(args.mb_per_s * 1e6 / 200 / 10))
            n = 0
            while not stop.is_set():
                for _ in range(per_tick):
                    # 200 bytes, hex of random bytes: compresses as much as text-like data does
                    value = os.urandom(100).hex().encode()
                    p.produce(topic, key=b"k-%d" % n, value=value)
                    n += 1
                p.poll(0)
                stop.wait(0.1)
            p.flush(30)

        commits: list[tuple[float, list]] = []  # (commit wall clock, committed segments)
        metrics = FollowMetrics()
        follower = Follower(cfg, storage, topic, metrics=metrics, log=lambda line: None)
        record_commit = follower._record_commit

        def observe(prepared, result):
            commits.append((time.time(), [s for plan in prepared.plans for s in plan.chain]))
            record_commit(prepared, result)

        follower._record_commit = observe  # type: ignore[method-assign]
        runner = threading.Thread(target=follower.run, args=(stop,), daemon=True)
        runner.start()
        # the producer starts once the follower's session is up (its first round found nothing)
        while not metrics.registry.get_sample_value(
            "rsm_iceberg_follow_rounds_total", {"outcome": "nothing_new"}
        ):
            if not runner.is_alive():
                raise SystemExit("the follower stopped before its first round")
            time.sleep(0.5)
        producer = threading.Thread(target=produce, daemon=True)
        t0 = time.monotonic()
        producer.start()
        while sum(len(segs) for _, segs in commits) < args.segments:
            if time.monotonic() - t0 > args.timeout:
                raise SystemExit(f"only {sum(len(s) for _, s in commits)} segments in {args.timeout:.0f}s")
            time.sleep(1)
        stop.set()
        runner.join(300)
        producer.join(60)

        from_manifest, from_copy, from_newest, from_oldest = [], [], [], []
        newest_before: dict[int, int] = {}
        for committed_at, segs in commits:
            for seg in sorted(segs, key=lambda s: (s.partition, s.start_offset)):
                if seg.max_timestamp_ms > 0:
                    from_newest.append(committed_at - seg.max_timestamp_ms / 1000)
                    if seg.partition in newest_before:
                        from_oldest.append(committed_at - newest_before[seg.partition] / 1000)
                    newest_before[seg.partition] = seg.max_timestamp_ms
                manifest = next(remote_root.rglob(f"*{seg.segment_id}*.rsm-manifest"), None)
                if manifest is not None:
                    from_manifest.append(committed_at - manifest.stat().st_mtime)
                if seg.copied_ms > 0:
                    from_copy.append(committed_at - seg.copied_ms / 1000)
        rounds = {
            o: int(metrics.registry.get_sample_value("rsm_iceberg_follow_rounds_total", {"outcome": o}) or 0)
            for o in ("committed", "nothing_new", "conflict", "failed")
        }
        print(
            f"{len(from_manifest)} segments committed in {len(commits)} commits over "
            f"{time.monotonic() - t0:.0f}s (producer {args.mb_per_s} MB/s into {args.partitions} "
            f"partition(s), segment.bytes {args.segment_bytes:,}, segment.ms {args.segment_ms or 'default'}, "
            f"iceberg.follow.interval {follower.settings.follow.interval:g}s; rounds {rounds})"
        )
        for name, vals in (
            ("manifest -> committed", from_manifest),
            ("copy start -> committed", from_copy),
            ("newest record -> committed", from_newest),
            ("oldest record -> committed", from_oldest),
        ):
            if vals:
                p50, p90, p99 = (percentile(vals, q) for q in (50, 90, 99))
                print(
                    f"{name:24s} p50 {p50:5.1f}s  p90 {p90:5.1f}s  p99 {p99:5.1f}s  "
                    f"max {max(vals):5.1f}s  mean {statistics.mean(vals):5.1f}s"
                )
        files_table(cfg, storage, topic, follower)
    finally:
        stop.set()
        stack.stop()


def files_table(cfg, storage, topic: str, follower) -> None:
    """The table's data files, then the same after ``maintain --compact``."""
    from rsm_sidecar.iceberg.maintenance import maintain
    from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
    from rsm_sidecar.iceberg.session.spark import open_session

    settings = follower.settings
    spec = CatalogSpec(settings.catalog)

    def files() -> tuple[list[dict], int]:
        table = spec.pyiceberg().load_table((settings.namespace, settings.table_name(topic)))
        fs = table.inspect.files().select(["file_size_in_bytes", "record_count"]).to_pylist()
        return fs, len(table.metadata.snapshots)

    def line(name: str, state: tuple[list[dict], int]) -> None:
        fs, snapshots = state
        sizes = sorted(f["file_size_in_bytes"] for f in fs)
        per_file = sum(f["record_count"] for f in fs) / len(fs)
        print(
            f"{name:24s} {len(fs):4d} data files, size p50 {percentile(sizes, 50) / 1e6:6.2f} MB "
            f"max {sizes[-1] / 1e6:6.2f} MB, {per_file:9,.0f} records per file; {snapshots} snapshots"
        )

    line("after the follower", files())
    spark = open_session(spec, settings.spark, "iceberg-freshness-compact")
    try:
        t0 = time.monotonic()
        maintain(cfg, storage, topic, compact=True, spark=spark, log=lambda _line: None)
        took = time.monotonic() - t0
    finally:
        spark.stop()
    line(f"after compaction ({took:.0f}s)", files())


if __name__ == "__main__":
    main()
