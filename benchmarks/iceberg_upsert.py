"""What a current-state table (``iceberg convert --mode upsert``) costs: the first conversion of
a topic, then rounds of new records, in each merge mode (merge-on-read, copy-on-write), and what
reading the table costs after them.

Set-up (not timed): a real Apicurio registry (devstack.registry) with ``bench.Event`` of
``iceberg_decode.py``; ``--records`` Confluent-framed Protobuf values (~92 bytes) over
``--keys`` keys (``key-<8 digits>``, drawn at random; a key's partition is its number modulo
``--partitions``, as a producer's partitioner keeps a key in one partition), 1 % of them
tombstones, tiered by the sidecar's own copy code (zstd chunks, AES-256-GCM) into a local
directory, ``--segment-mb`` segments. One ``local[2]`` SparkSession, warmed up on a small topic.

Timed:

1. the append conversion of the topic (``--mode append``: the reference rate of the same run);
2. the first upsert conversion (every record reduced to the latest per key, merged into an
   empty table);
3. per merge mode, ``--rounds`` rounds of ``--round-percent`` % new records (the same key
   distribution) tiered and converted: records/s, files and bytes the round's snapshot added
   (data and delete files), and what it removed (copy-on-write rewrites whole data files). The
   copy-on-write table starts as a copy of the first conversion's table (registered on the same
   metadata: the first conversion runs once);
4. the read cost after the first conversion, after the rounds, and after ``maintain --compact``:
   a full scan through Spark (every column, into the ``noop`` sink) and through PyIceberg
   (``scan().to_arrow()``), with the data files, delete files and position deletes a scan reads.

    .venv/bin/python benchmarks/iceberg_upsert.py [--records 10000000] [--keys 1000000]
        [--rounds 3] [--round-percent 1] [--partitions 2] [--segment-mb 32]
        [--modes merge-on-read,copy-on-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devstack

from iceberg_convert import (
    RECORDS_PER_BATCH,
    BenchRun,
    _protobuf_values,
    cpu_seconds,
    per_record,
    sidecar_config,
)
from iceberg_decode import PROTO

TOPIC = "bench-keyed"
MODES = ("merge-on-read", "copy-on-write")
TOMBSTONE_SHARE = 0.01


class KeyedTopic:
    """Records over a fixed set of keys, tiered segment by segment as rounds ask for them."""

    def __init__(
        self, cfg_file: Path, registry_url: str, topic: str, keys: int, partitions: int, segment_mb: int
    ):
        from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

        from rsm_sidecar.config import Config
        from rsm_sidecar.format.keys import KeyLayout
        from rsm_sidecar.segment.settings import CopySettings
        from rsm_sidecar.storage.factory import open_store
        from rsm_sidecar.transform.keyring import Keyring
        from tests.tiered_writer import TieredWriter

        client = SchemaRegistryClient({"url": registry_url})
        self.value_of = _protobuf_values(client.register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF")))
        cfg = Config.load(cfg_file, environ={})
        self.writer = TieredWriter(
            open_store(cfg),
            KeyLayout("tiered/"),
            Keyring.from_config(cfg),
            topic,
            settings=CopySettings(chunk_size=4 * 1024 * 1024),
        )
        self.keys, self.partitions, self.segment_bytes = keys, partitions, segment_mb << 20
        self.next_offset = [0] * partitions
        self.rnd = random.Random(1)
        self.produced = 0

    def produce(self, records: int) -> None:
        """``records`` more records, each partition's ending with a complete segment."""
        from rsm_sidecar.kafka.builder import SimpleRecord, build_batch

        pending: list[list] = [[] for _ in range(self.partitions)]
        batches: list[list[bytes]] = [[] for _ in range(self.partitions)]
        sizes = [0] * self.partitions

        def flush_batch(p: int) -> None:
            b = build_batch(pending[p], base_offset=self.next_offset[p])
            self.next_offset[p] += len(pending[p])
            pending[p] = []
            batches[p].append(b)
            sizes[p] += len(b)

        def flush_segment(p: int) -> None:
            self.writer.write_segment(p, batches[p])
            batches[p], sizes[p] = [], 0

        for _ in range(records):
            k = self.rnd.randrange(self.keys)
            p = k % self.partitions
            i = self.produced
            self.produced += 1
            value = None if self.rnd.random() < TOMBSTONE_SHARE else self.value_of(i, self.rnd)
            pending[p].append(SimpleRecord(b"key-%08d" % k, value, 1_700_000_000_000 + i, ()))
            if len(pending[p]) == RECORDS_PER_BATCH:
                flush_batch(p)
                if sizes[p] >= self.segment_bytes:
                    flush_segment(p)
        for p in range(self.partitions):
            if pending[p]:
                flush_batch(p)
            if batches[p]:
                flush_segment(p)


def summary(table) -> dict[str, int]:
    from rsm_sidecar.iceberg.committing.markers import summary_properties

    props = summary_properties(table.current_snapshot())
    return {k: int(v) for k, v in props.items() if v.lstrip("-").isdigit()}


def read_cost(spark, catalog, name: str) -> dict:
    """A full scan of every column through Spark and through PyIceberg, and what it reads."""
    table = catalog.load_table(tuple(name.split(".")[1:]))
    s = summary(table)
    t0 = time.perf_counter()
    spark.table(name).write.format("noop").mode("overwrite").save()
    spark_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rows = table.scan().to_arrow().num_rows
    pyiceberg_s = time.perf_counter() - t0
    return {
        "rows": rows,
        "spark_s": spark_s,
        "pyiceberg_s": pyiceberg_s,
        "data_files": s.get("total-data-files", 0),
        "delete_files": s.get("total-delete-files", 0),
        "position_deletes": s.get("total-position-deletes", 0),
        "bytes": s.get("total-files-size", 0),
    }


def markdown_table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--round-percent", type=float, default=1.0, help="new records per round, %% of --records")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--segment-mb", type=int, default=32)
    ap.add_argument("--modes", default=",".join(MODES), help="merge modes to measure, comma-separated")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    assert set(modes) <= set(MODES), modes

    from rsm_sidecar.iceberg.job import ConvertJob, load_config
    from rsm_sidecar.iceberg.maintenance import maintain
    from rsm_sidecar.iceberg.session.catalogs import LocalCatalog
    from rsm_sidecar.iceberg.session.spark import spark_session

    run = BenchRun("iceberg-upsert-bench-", keep=args.keep)
    workdir, reg = run.workdir, run.registry
    spark = None
    try:
        cfg_file = sidecar_config(workdir, reg.ccompat_url)
        t0 = time.perf_counter()
        topic = KeyedTopic(cfg_file, reg.ccompat_url, TOPIC, args.keys, args.partitions, args.segment_mb)
        topic.produce(args.records)
        warm = KeyedTopic(cfg_file, reg.ccompat_url, "warmup-keyed", 5_000, 2, 1)
        warm.produce(20_000)
        print(
            f"set-up: {args.records:,} records over {args.keys:,} keys in {args.partitions} partition(s) "
            f"tiered in {time.perf_counter() - t0:.1f}s"
        )
        reg_pid = reg.proc.pid if reg.proc else None
        catalog_dir = LocalCatalog(workdir / "catalog")
        spark = spark_session(catalog_dir, app_name="iceberg-upsert-bench")
        catalog = catalog_dir.prepare().pyiceberg()

        def job(name: str, table: str, mode: str = "upsert") -> ConvertJob:
            cfg, storage = load_config(cfg_file, {}, {"iceberg.table": table, "iceberg.mode": mode})
            return ConvertJob(cfg, storage, name, spark=spark, log=lambda line: None)

        for mode in ("append", "upsert"):  # JVM/JIT and Python worker warm-up
            job("warmup-keyed", f"warmup_{mode}", mode).run()

        def timed(j: ConvertJob, records: int) -> tuple[float, dict, str]:
            cpu0 = cpu_seconds(reg_pid)
            t0 = time.perf_counter()
            res = j.run()
            took = time.perf_counter() - t0
            cpu = {k: v - cpu0[k] for k, v in cpu_seconds(reg_pid).items()}
            assert res.records == records, (res.records, records)
            return took, res.merged, per_record(cpu, records)

        rows: list[list[str]] = []
        reads: list[list[str]] = []

        def write_row(what: str, mode: str, records: int, took: float, merged: dict, table: str, cpu: str):
            s = summary(catalog.load_table(("kafka", table)))
            rows.append(
                [
                    what,
                    mode,
                    f"{records:,}",
                    f"{took:.1f}",
                    f"{records / took:,.0f}",
                    " / ".join(f"{merged[k]:,}" for k in ("inserted", "updated", "deleted"))
                    if merged
                    else "",
                    f"{s.get('added-data-files', 0)} / {s.get('added-delete-files', 0)}",
                    f"{s.get('added-files-size', 0) / 1e6:.1f}",
                    f"{s.get('deleted-data-files', 0)} / {s.get('removed-files-size', 0) / 1e6:.1f}",
                ]
            )
            print(f"  {what}, {mode}: {took:.1f}s = {records / took:,.0f} records/s; CPU per record: {cpu}")

        def read_row(after: str, mode: str, table: str) -> None:
            r = read_cost(spark, catalog, f"rsm.kafka.{table}")
            reads.append(
                [
                    after,
                    mode,
                    f"{r['rows']:,}",
                    f"{r['spark_s']:.1f}",
                    f"{r['pyiceberg_s']:.1f}",
                    f"{r['data_files']} / {r['delete_files']}",
                    f"{r['position_deletes']:,}",
                    f"{r['bytes'] / 1e6:.1f}",
                ]
            )
            print(f"  read after {after}, {mode}: {r}")

        took, merged, cpu = timed(job(TOPIC, "appended", "append"), args.records)
        write_row("first conversion (append table)", "append", args.records, took, merged, "appended", cpu)
        took, merged, cpu = timed(job(TOPIC, "current_mor"), args.records)
        write_row("first conversion", "(empty table)", args.records, took, merged, "current_mor", cpu)
        read_row("first conversion", "merge-on-read", "current_mor")
        tables = {"merge-on-read": "current_mor"}
        if "copy-on-write" in modes:
            first = catalog.load_table(("kafka", "current_mor")).metadata_location
            catalog.register_table(("kafka", "current_cow"), first)
            spark.sql(
                "ALTER TABLE rsm.kafka.current_cow SET TBLPROPERTIES ('write.merge.mode'='copy-on-write', "
                "'write.update.mode'='copy-on-write', 'write.delete.mode'='copy-on-write')"
            )
            tables["copy-on-write"] = "current_cow"
        per_round = int(args.records * args.round_percent / 100)
        for r in range(args.rounds):
            topic.produce(per_round)
            for mode in modes:
                took, merged, cpu = timed(job(TOPIC, tables[mode]), per_round)
                write_row(f"round {r + 1}", mode, per_round, took, merged, tables[mode], cpu)
        for mode in modes:
            read_row(f"{args.rounds} rounds", mode, tables[mode])
        for mode in modes:
            cfg, storage = load_config(
                cfg_file, {}, {"iceberg.table": tables[mode], "iceberg.mode": "upsert"}
            )
            t0 = time.perf_counter()
            res = maintain(cfg, storage, TOPIC, compact=True, spark=spark, log=lambda line: None)
            took = time.perf_counter() - t0
            print(f"  maintain --compact, {mode}: {took:.1f}s {res.compacted}")
            read_row(f"maintain --compact (itself {took:.0f}s)", mode, tables[mode])

        print(
            f"{dt.date.today()}, local[2], {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
            f"{args.records:,} records over {args.keys:,} keys, rounds of {per_round:,}:"
        )
        markdown_table(
            [
                "conversion",
                "merge mode",
                "records",
                "s",
                "records/s",
                "keys inserted / updated / deleted",
                "files added (data / delete)",
                "MB added",
                "data files / MB removed",
            ],
            rows,
        )
        print()
        markdown_table(
            [
                "read after",
                "merge mode",
                "rows",
                "Spark full scan s",
                "PyIceberg full scan s",
                "files read (data / delete)",
                "position deletes",
                "MB",
            ],
            reads,
        )
    finally:
        run.close(spark)


if __name__ == "__main__":
    main()
