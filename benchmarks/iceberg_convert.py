"""Records/s of ``rsm-sidecar iceberg convert`` on tiered segments of Protobuf, Avro and JSON
values, next to the write-only cost of the same rows, in the same run and Spark session.

Set-up (not timed): a real Apicurio registry (devstack.registry) with the schemas of
``iceberg_decode.py``; per ``--format`` (``both``, the default: Protobuf and Avro; ``all`` adds
JSON) a topic of ``--records`` Confluent-framed values (Protobuf: magic, schema id, ``[0]``
index, ``bench.Event``, ~92 bytes; Avro: magic, schema id, the Avro event with a nested record,
an array, a map, a nullable union and logical types, ~84 bytes; JSON: magic, schema id, the
event as JSON Schema JSON, ~220 bytes), 16-byte keys, two headers, 110 records per producer
batch (a 16 KiB batch.size), split over ``--partitions`` partitions and tiered as segments of
``--segment-mb`` by the sidecar's own copy code (zstd chunks, AES-256-GCM, manifest) into a
local directory, exactly as the sidecar stores them. One ``local[2]`` SparkSession is started
and warmed up on a small topic of each format first.

Timed, each ``--repeat`` times on fresh tables (best reported), the formats one after the other:

1. **convert**: the whole job (``prepare()`` + ``execute()``: markers, listing, planning, schema,
   Spark tasks -> ``mapInArrow`` (fetch, verify, decrypt, decompress, parse, decode, and with
   ``iceberg.writer = arrow`` the Parquet files) -> conditional commit), once per writer
   (``arrow``, ``spark``), with the CPU seconds per record of the Python workers, Spark's JVM and
   the driver; with ``--task-mb`` also with whole segments (``iceberg.task_bytes = 0``);
2. **read+decode** only: the job's DataFrame written to Spark's ``noop`` sink (no Parquet);
3. **write-only**: the same decoded rows, cached in Spark memory beforehand, written to an
   Iceberg table with the same partitioning and write options (the Parquet/Iceberg cost alone).

    .venv/bin/python benchmarks/iceberg_convert.py [--format both|all|protobuf|avro|json] [--records 1000000]
        [--partitions 2] [--segment-mb 32] [--task-mb N] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devstack

from iceberg_decode import AVRO_SCHEMA, JSON_SCHEMA, PROTO, avro_event, make_json_values, proto_event

RECORDS_PER_BATCH = 110
TOPIC = "bench-events"


def make_topic(
    workdir: Path,
    registry_url: str,
    records: int,
    partitions: int,
    segment_mb: int,
    topic: str,
    seed: int = 1,
    fmt: str = "protobuf",
) -> tuple[Path, float]:
    """Tier ``records`` framed Protobuf (or Avro) records; returns the sidecar configuration file
    and the average value size (bytes, framing included)."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from rsm_sidecar.config import Config
    from rsm_sidecar.format.keys import KeyLayout
    from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
    from rsm_sidecar.kafka.records import Header
    from rsm_sidecar.storage.factory import open_store
    from rsm_sidecar.transform.keyring import Keyring, write_key_pair
    from tests.tiered_writer import TieredWriter

    cfg_file = workdir / "sidecar.toml"
    if not (workdir / "k.pub").exists():
        write_key_pair(workdir / "k.pub", workdir / "k.priv", 2048, overwrite=True)
        cfg_file.write_text(f"""
[storage]
backend = "local"
key_prefix = "tiered/"
[storage.local]
root = "{workdir / "remote"}"
[segment]
chunk_size = "4MiB"
[encryption]
enabled = true
active_key_id = "k1"
[encryption.keys.k1]
public_key_file = "{workdir / "k.pub"}"
private_key_file = "{workdir / "k.priv"}"
[iceberg]
partitioning = "day"
[iceberg.catalog.local]
root = "{workdir / "catalog"}"
[iceberg.registry]
url = "{registry_url}"
""")
    client = SchemaRegistryClient({"url": registry_url})
    if fmt == "avro":
        schema_id = client.register_schema(f"{topic}-value", Schema(AVRO_SCHEMA, "AVRO"))
        value_of = _avro_values(schema_id)
    elif fmt == "json":
        schema_id = client.register_schema(f"{topic}-value", Schema(JSON_SCHEMA, "JSON"))
        value_of = _json_values(schema_id)
    else:
        schema_id = client.register_schema(f"{topic}-value", Schema(PROTO, "PROTOBUF"))
        value_of = _protobuf_values(schema_id)
    cfg = Config.load(cfg_file, environ={})
    from rsm_sidecar.segment.settings import CopySettings

    writer = TieredWriter(
        open_store(cfg),
        KeyLayout("tiered/"),
        Keyring.from_config(cfg),
        topic,
        settings=CopySettings(chunk_size=4 * 1024 * 1024),
    )
    rnd = random.Random(seed)
    headers = (Header("trace", b"abc"), Header("src", b"bench"))
    per_part = records // partitions
    t_base = 1_700_000_000_000
    value_bytes = 0
    for p in range(partitions):
        offset = 0
        batches: list[bytes] = []
        size = 0
        while offset < per_part:
            n = min(RECORDS_PER_BATCH, per_part - offset)
            recs = []
            for i in range(offset, offset + n):
                value = value_of(i, rnd)
                value_bytes += len(value)
                recs.append(SimpleRecord(f"key-{p}-{i:010d}".encode(), value, t_base + i, headers))
            b = build_batch(recs, base_offset=offset)
            batches.append(b)
            size += len(b)
            offset += n
            if size >= segment_mb * 1024 * 1024 or offset >= per_part:
                writer.write_segment(p, batches)
                batches, size = [], 0
    writer.close()
    return cfg_file, value_bytes / max(1, per_part * partitions)


def _protobuf_values(schema_id: int):
    from rsm_sidecar.iceberg.decoding import framing
    from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema

    cls = ProtoSchema.message_class(
        ProtoSchema.from_sources("bench.proto", {"bench.proto": PROTO}).message_by_name("bench.Event")
    )
    pre = framing.encode_preamble(schema_id, [0])

    def value(i: int, rnd: random.Random) -> bytes:
        return pre + proto_event(cls, i, rnd, 1_700_000_000 + i // 100)

    return value


def _avro_values(schema_id: int):
    import io

    import fastavro

    from rsm_sidecar.iceberg.decoding import framing

    parsed = fastavro.parse_schema(json.loads(AVRO_SCHEMA))
    pre = framing.encode_preamble(schema_id)

    def value(i: int, rnd: random.Random) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, avro_event(i, rnd))
        return pre + buf.getvalue()

    return value


def _json_values(schema_id: int):
    from rsm_sidecar.iceberg.decoding import framing

    pre = framing.encode_preamble(schema_id)

    def value(i: int, rnd: random.Random) -> bytes:
        # the event of iceberg_decode.py (its own id and random draws), one per record
        return pre + make_json_values(1, first=i, seed=rnd.randrange(1 << 30))[0][5:]

    return value


def cpu_seconds(registry_pid: int | None = None) -> dict[str, float]:
    """CPU seconds so far of this driver, Spark's JVM (a child) and its Python workers (the
    JVM's descendants, including those that have exited: counted by the OS in their parent).
    The registry is a Java child too: its CPU is counted apart (``registry``)."""
    import psutil

    me = psutil.Process()
    out = {"driver": sum(me.cpu_times()[:2]), "jvm": 0.0, "workers": 0.0, "registry": 0.0}
    for child in me.children():
        try:
            if "java" not in child.name():
                continue
            if child.pid == registry_pid:
                out["registry"] += sum(child.cpu_times()[:2])
                continue
            t = child.cpu_times()
            out["jvm"] += t.user + t.system
            out["workers"] += t.children_user + t.children_system
            for w in child.children(recursive=True):
                wt = w.cpu_times()
                out["workers"] += wt.user + wt.system
        except psutil.NoSuchProcess:
            continue
    return out


def per_record(cpu: dict[str, float], records: int) -> str:
    """``cpu_seconds`` differences as µs of CPU per record, per process kind."""
    return ", ".join(f"{k} {v / records * 1e6:.1f} us" for k, v in cpu.items())


def topic_arguments(description: str) -> argparse.ArgumentParser:
    """The command line of the benchmarks on :func:`make_topic`'s topic."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--segment-mb", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    return ap


def main() -> None:
    ap = topic_arguments(__doc__.split("\n\n")[0])
    ap.add_argument(
        "--task-mb",
        type=int,
        default=None,
        help="iceberg.task_bytes in MiB (default: the setting's default); also converts once more "
        "with whole segments (iceberg.task_bytes = 0) to show what splitting gives",
    )
    ap.add_argument(
        "--format",
        choices=("both", "all", "protobuf", "avro", "json"),
        default="both",
        help="the values' format; both: a topic of Protobuf and one of Avro, converted one after the "
        "other in each run; all: JSON too",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()

    from devstack.registry import ApicurioDistribution, ApicurioRegistry
    from rsm_sidecar.iceberg.job import ConvertJob, load_config
    from rsm_sidecar.iceberg.session.catalogs import LocalCatalog
    from rsm_sidecar.iceberg.session.spark import spark_session

    formats = {"both": ("protobuf", "avro"), "all": ("protobuf", "avro", "json")}.get(
        args.format, (args.format,)
    )
    topics = {fmt: TOPIC if fmt == "protobuf" else f"{TOPIC}-{fmt}" for fmt in formats}
    workdir = Path(tempfile.mkdtemp(prefix="iceberg-convert-bench-"))
    reg = ApicurioRegistry(ApicurioDistribution.ensure(), workdir / "apicurio").start()
    spark = None
    try:
        avg = {}
        for fmt in formats:
            t0 = time.perf_counter()
            cfg_file, avg[fmt] = make_topic(
                workdir, reg.ccompat_url, args.records, args.partitions, args.segment_mb, topics[fmt], fmt=fmt
            )
            make_topic(workdir, reg.ccompat_url, 20_000, 2, 1, f"warmup-{fmt}", seed=2, fmt=fmt)
            print(
                f"set-up: {args.records:,} records (values {avg[fmt]:.0f} B on average, framed {fmt}) in "
                f"{args.partitions} partition(s) tiered in {time.perf_counter() - t0:.1f}s"
            )
        remote = sum(f.stat().st_size for f in (workdir / "remote").rglob("*") if f.is_file())
        print(f"stored: {remote / 1e6:.1f} MB (zstd + AES-GCM, all topics)")
        env = {}
        reg_pid = reg.proc.pid if reg.proc else None

        def job(topic: str, table: str, writer: str = "arrow", task_bytes: int | None = None) -> ConvertJob:
            overrides: dict = {"iceberg.table": table, "iceberg.writer": writer}
            if task_bytes is not None:
                overrides["iceberg.task_bytes"] = task_bytes
            cfg, storage = load_config(cfg_file, env, overrides)
            return ConvertJob(cfg, storage, topic, spark=spark, log=lambda line: None)

        task_bytes = None if args.task_mb is None else args.task_mb << 20
        cases = [("arrow", task_bytes), ("spark", task_bytes)]
        if task_bytes is not None:
            cases.append(("arrow", 0))

        spark = spark_session(LocalCatalog(workdir / "catalog"), app_name="iceberg-convert-bench")
        for fmt in formats:  # JVM/JIT and Python worker warm-up
            job(f"warmup-{fmt}", f"warmup_{fmt}").run()
            job(f"warmup-{fmt}", f"warmup_spark_{fmt}", "spark").run()

        def label(writer: str, task_bytes: int | None) -> str:
            return f"convert, iceberg.writer={writer}" + ("" if task_bytes != 0 else ", whole segments")

        best: dict[tuple[str, str], float] = {}

        def keep(fmt: str, what: str, rate: float) -> None:
            best[(fmt, what)] = max(best.get((fmt, what), 0.0), rate)

        for r in range(args.repeat):
            for fmt in formats:
                for n, (writer, tb) in enumerate(cases):
                    cpu0 = cpu_seconds(reg_pid)
                    t0 = time.perf_counter()
                    table = f"{fmt}_{writer}_{r}" if n < 2 else f"{fmt}_whole_{r}"
                    j = job(topics[fmt], table, writer, tb)
                    prepared = j.prepare()
                    t1 = time.perf_counter()
                    res = j.execute(prepared)
                    dt = time.perf_counter() - t0
                    cpu = {k: v - cpu0[k] for k, v in cpu_seconds(reg_pid).items()}
                    assert res.records == args.records, (res.records, args.records)
                    keep(fmt, label(writer, tb), args.records / dt)
                    print(
                        f"  run {r} {fmt}: {label(writer, tb)} {dt:.2f}s = "
                        f"{args.records / dt:,.0f} records/s ({res.segments} segments, {res.tasks} tasks; "
                        f"planning {t1 - t0:.2f}s, write + commit {time.perf_counter() - t1:.2f}s; "
                        f"CPU per record: {per_record(cpu, args.records)})"
                    )

                j = job(topics[fmt], f"noop_{fmt}_{r}", task_bytes=task_bytes)
                prepared = j.prepare()
                cpu0 = cpu_seconds(reg_pid)
                t0 = time.perf_counter()
                j.dataframe(spark, prepared).write.format("noop").mode("overwrite").save()
                dt = time.perf_counter() - t0
                cpu = {k: v - cpu0[k] for k, v in cpu_seconds(reg_pid).items()}
                keep(fmt, "read+decode (noop sink)", args.records / dt)
                print(
                    f"  run {r} {fmt}: read+decode (noop sink) {dt:.2f}s = "
                    f"{args.records / dt:,.0f} records/s (CPU per record: {per_record(cpu, args.records)})"
                )

            first = formats[0]
            src = spark.table(f"rsm.kafka.{first}_arrow_{r}").cache()
            assert src.count() == args.records
            spark.sql(
                f"CREATE TABLE rsm.kafka.write_{r} USING iceberg "
                f"PARTITIONED BY (days(kafka.ingest_timestamp)) "
                f"AS SELECT * FROM rsm.kafka.{first}_arrow_{r} LIMIT 0"
            )
            t0 = time.perf_counter()
            (
                src.writeTo(f"rsm.kafka.write_{r}")
                .option("distribution-mode", "none")
                .option("fanout-enabled", "true")
                .append()
            )
            dt = time.perf_counter() - t0
            src.unpersist()
            keep(first, "write-only (the rows already decoded)", args.records / dt)
            print(
                f"  run {r} {first}: write-only (cached decoded rows -> Iceberg) {dt:.2f}s = "
                f"{args.records / dt:,.0f} records/s"
            )
        print(
            f"best of {args.repeat}, records/s, local[2], {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f}:"
        )
        print("| measure | " + " | ".join(f"{fmt} ({avg[fmt]:.0f} B values)" for fmt in formats) + " |")
        print("|---|" + "---|" * len(formats))
        for what in dict.fromkeys(w for _, w in best):
            cells = [f"{best[(fmt, what)]:,.0f}" if (fmt, what) in best else "" for fmt in formats]
            print(f"| {what} | " + " | ".join(cells) + " |")
        for fmt in formats:
            what = label("arrow", task_bytes)
            if fmt != "protobuf" and "protobuf" in formats:
                ratio = best[(fmt, what)] / best[("protobuf", what)]
                print(f"{fmt} / protobuf, {what}, same run: {ratio:.2f}x")
    finally:
        if spark is not None:
            spark.stop()
        reg.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work directory kept: {workdir}")


if __name__ == "__main__":
    main()
