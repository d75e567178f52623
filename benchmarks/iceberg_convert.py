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

Each ``arrow`` convert line also splits its time into planning (``prepare()``), the Spark stage
and the commit. After the Spark runs of each repeat, the executor work of a convert (the same
functions a Spark task runs: read, parse, decode, Parquet) runs once more in this process on one
core, without Spark, with the CPU per record of each stage (:class:`StageClock`), for each format:
the table at the end ("executor stages") says where a worker's CPU goes, and the difference to the
workers' CPU in Spark is Spark's own share (task set-up, Arrow transfer, Python worker
round-trips).

    .venv/bin/python benchmarks/iceberg_convert.py [--format both|all|protobuf|avro|json] [--records 1000000]
        [--partitions 2] [--segment-mb 32] [--task-mb N] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devstack

from iceberg_decode import AVRO_SCHEMA, JSON_SCHEMA, PROTO, avro_event, make_json_values, proto_event

from benchmarks.synthetic import encryption_toml

RECORDS_PER_BATCH = 110
TOPIC = "bench-events"


def sidecar_config(workdir: Path, registry_url: str) -> Path:
    """The sidecar configuration of the benchmarks' topics (local directory, zstd + AES-GCM,
    the embedded catalog, the registry), written once per work directory."""
    from rsm_sidecar.transform.keyring import write_key_pair

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
{encryption_toml(workdir, "k1")}[iceberg]
partitioning = "day"
[iceberg.catalog.local]
root = "{workdir / "catalog"}"
[iceberg.registry]
url = "{registry_url}"
""")
    return cfg_file


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
    from rsm_sidecar.transform.keyring import Keyring
    from tests.tiered_writer import TieredWriter

    cfg_file = sidecar_config(workdir, registry_url)
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


class StageClock:
    """CPU seconds of this thread spent in each stage of the executor work, each stage's own
    time only (a stage called from another is taken out of the caller's).

    A stage is a method or function wrapped for the duration of a ``with`` block
    (:meth:`method`, :meth:`generator`): the wrappers read ``time.thread_time`` around each call
    (or each step of a generator), a few per Arrow batch or Kafka batch, never per record."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._stack: list[float] = []
        self._undo: list[tuple[object, str, object]] = []

    def _enter(self) -> float:
        self._stack.append(0.0)
        return time.thread_time()

    def _leave(self, stage: str, t0: float) -> None:
        spent = time.thread_time() - t0
        inner = self._stack.pop()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + spent - inner
        if self._stack:
            self._stack[-1] += spent

    def _replace(self, owner: object, name: str, wrapper: object) -> None:
        self._undo.append((owner, name, vars(owner)[name]))
        setattr(owner, name, wrapper)

    def method(self, owner: object, name: str, stage) -> None:
        """Time ``owner.name`` (``stage``: a name, or a function of the call's arguments that
        returns one)."""
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = self._enter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._leave(stage if isinstance(stage, str) else stage(*args), t0)

        self._replace(owner, name, timed)

    def generator(self, owner: object, name: str, stage: str) -> None:
        """Time each step of the iterators ``owner.name`` returns."""
        fn = getattr(owner, name)

        def steps(it):
            while True:
                t0 = self._enter()
                try:
                    item = next(it)
                except StopIteration:
                    return
                finally:
                    self._leave(stage, t0)
                yield item

        self._replace(owner, name, lambda *args, **kwargs: steps(iter(fn(*args, **kwargs))))

    def __enter__(self) -> StageClock:
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


#: the stages of :func:`executor_stages`, in the order the data goes through them
STAGES = (
    "segment bytes: fetch, verify, decrypt, decompress (this thread)",
    "segment bytes: read ahead (the prefetch thread)",
    "Kafka batches: framing, CRC",
    "records: columnar parse",
    "key decode",
    "value decode",
    "row batch: kafka struct, alignment",
    "Parquet: partition split",
    "Parquet: encode, compress, write",
    "data files: open, close, statistics",
    "the rest",
)


def executor_stages(job, prepared) -> tuple[dict[str, float], int]:
    """CPU seconds per stage (:data:`STAGES`) of the executor work of ``prepared``'s tasks, run
    here on one core as a Spark task of ``iceberg.writer = arrow`` runs it (``read_task`` ->
    ``RowEncoder`` -> ``TaskFileWriter``; the files it writes are deleted, nothing is committed),
    and the records. The first task runs once before, untimed (imports, caches)."""
    from rsm_sidecar.iceberg import stages as executor
    from rsm_sidecar.iceberg.committing.data_files import FileTarget, TaskFileWriter
    from rsm_sidecar.iceberg.mapping.rows import RowEncoder
    from rsm_sidecar.iceberg.reading import segment_tasks
    from rsm_sidecar.iceberg.reading.raw_records import SegmentRowReader
    from rsm_sidecar.segment.reader import SegmentReader

    table = prepared.catalog.load_table(job.identifier)
    target = FileTarget.for_table(table, target_file_size=job.settings.target_file_size, write_id=job.job_id)
    params = job._executor_params(prepared, target)

    def run(tasks) -> int:
        records = 0
        for task in tasks:
            writer = TaskFileWriter(params.files, task.index)
            for out in executor.encoded_batches(params, task):
                records += out.num_rows
                writer.write(out)
            writer.close()
            writer.abort()  # deletes the files: nothing will commit them
        return records

    run(prepared.tasks[:1])
    with StageClock() as clock:
        clock.generator(SegmentReader, "read", STAGES[0])
        clock.generator(segment_tasks, "read_batches", STAGES[2])
        clock.method(SegmentRowReader, "_flush", STAGES[3])
        clock.method(RowEncoder, "_side", lambda enc, side, *rest: STAGES[4 if side is enc.key_side else 5])
        clock.method(RowEncoder, "_encode", STAGES[6])
        clock.method(TaskFileWriter, "write", STAGES[7])
        clock.method(TaskFileWriter, "_write_row_group", STAGES[8])
        for name in ("__init__", "_new_file", "_finish"):
            clock.method(TaskFileWriter, name, STAGES[9])
        process0, thread0 = time.process_time(), time.thread_time()
        records = run(prepared.tasks)
        process1, thread1 = time.process_time(), time.thread_time()
    out = dict.fromkeys(STAGES, 0.0)
    out.update(clock.seconds)
    out[STAGES[1]] = (process1 - process0) - (thread1 - thread0)
    out[STAGES[10]] = (thread1 - thread0) - sum(clock.seconds.values())
    return out, records


def topic_and_warmup(
    workdir: Path, registry_url: str, args: argparse.Namespace, topic: str, warmup: str, fmt: str = "protobuf"
) -> tuple[Path, float]:
    """:func:`make_topic` of the size :func:`topic_arguments` asked for, and a small warm-up
    topic of the same format: the sidecar configuration file and the average value size."""
    made = make_topic(workdir, registry_url, args.records, args.partitions, args.segment_mb, topic, fmt=fmt)
    make_topic(workdir, registry_url, 20_000, 2, 1, warmup, seed=2, fmt=fmt)
    return made


class BenchRun:
    """A benchmark's work directory (``prefix...``) and the Apicurio registry it starts in it;
    :meth:`close` stops what the run started and removes the directory (unless ``keep``)."""

    def __init__(self, prefix: str, keep: bool = False):
        from devstack.registry import ApicurioDistribution, ApicurioRegistry

        self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
        self.keep = keep
        self.registry = ApicurioRegistry(ApicurioDistribution.ensure(), self.workdir / "apicurio").start()

    def close(self, *started) -> None:
        """Stop what else the run started (a Spark session, a cluster: those not None), then the
        registry; remove the work directory, or say where it was kept."""
        for s in started:
            if s is not None:
                s.stop()
        self.registry.stop()
        if self.keep:
            print(f"work directory kept: {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


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

    from rsm_sidecar.iceberg.job import ConvertJob, load_config
    from rsm_sidecar.iceberg.session.catalogs import LocalCatalog
    from rsm_sidecar.iceberg.session.spark import spark_session

    formats = {"both": ("protobuf", "avro"), "all": ("protobuf", "avro", "json")}.get(
        args.format, (args.format,)
    )
    topics = {fmt: TOPIC if fmt == "protobuf" else f"{TOPIC}-{fmt}" for fmt in formats}
    run = BenchRun("iceberg-convert-bench-", keep=args.keep)
    workdir, reg = run.workdir, run.registry
    spark = None
    try:
        avg = {}
        for fmt in formats:
            t0 = time.perf_counter()
            cfg_file, avg[fmt] = topic_and_warmup(
                workdir, reg.ccompat_url, args, topics[fmt], f"warmup-{fmt}", fmt
            )
            print(
                f"set-up: {args.records:,} records (values {avg[fmt]:.0f} B on average, framed {fmt}) in "
                f"{args.partitions} partition(s) tiered in {time.perf_counter() - t0:.1f}s"
            )
        remote = sum(f.stat().st_size for f in (workdir / "remote").rglob("*") if f.is_file())
        print(f"stored: {remote / 1e6:.1f} MB (zstd + AES-GCM, all topics)")
        env = {}
        reg_pid = reg.proc.pid if reg.proc else None

        class TimedJob(ConvertJob):
            """The job, with the seconds of its Spark stage (``iceberg.writer = arrow``)."""

            stage_seconds = 0.0

            def _write_files(self, prepared):
                t0 = time.perf_counter()
                try:
                    return super()._write_files(prepared)
                finally:
                    self.stage_seconds = time.perf_counter() - t0

        def job(topic: str, table: str, writer: str = "arrow", task_bytes: int | None = None) -> TimedJob:
            overrides: dict = {"iceberg.table": table, "iceberg.writer": writer}
            if task_bytes is not None:
                overrides["iceberg.task_bytes"] = task_bytes
            cfg, storage = load_config(cfg_file, env, overrides)
            return TimedJob(cfg, storage, topic, spark=spark, log=lambda line: None)

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
        #: per format: per stage, the µs of CPU per record of each repeat (executor_stages)
        in_process: dict[str, dict[str, list[float]]] = {fmt: {} for fmt in formats}
        #: per format: the workers' µs of CPU per record in each arrow convert (the first case)
        spark_workers: dict[str, list[float]] = {fmt: [] for fmt in formats}

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
                    if writer == "arrow" and n == 0:
                        spark_workers[fmt].append(cpu["workers"] / args.records * 1e6)
                    after = time.perf_counter() - t1
                    split = (
                        f"Spark stage {j.stage_seconds:.2f}s, commit {after - j.stage_seconds:.2f}s"
                        if writer == "arrow"
                        else f"write + commit {after:.2f}s"
                    )
                    print(
                        f"  run {r} {fmt}: {label(writer, tb)} {dt:.2f}s = "
                        f"{args.records / dt:,.0f} records/s ({res.segments} segments, {res.tasks} tasks; "
                        f"planning {t1 - t0:.2f}s, {split}; "
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

                j = job(topics[fmt], f"stages_{fmt}_{r}", task_bytes=task_bytes)
                seconds, records = executor_stages(j, j.prepare())
                assert records == args.records, (records, args.records)
                for stage, sec in seconds.items():
                    in_process[fmt].setdefault(stage, []).append(sec / records * 1e6)
                total = sum(seconds.values()) / records * 1e6
                print(
                    f"  run {r} {fmt}: executor stages in this process, one core: {total:.2f} us per record"
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
        print(
            "executor stages, µs of CPU per record (median of the repeats; one core in this process, "
            f"iceberg.writer = arrow, iceberg.batch_records = {j.settings.batch_records}):"
        )
        print("| stage | " + " | ".join(formats) + " |")
        print("|---|" + "---|" * len(formats))
        for stage in (*STAGES, "total"):
            cells = []
            for fmt in formats:
                per = in_process[fmt]
                values = [sum(v) for v in zip(*per.values())] if stage == "total" else per[stage]
                cells.append(f"{statistics.median(values):.3f}")
            print(f"| {stage} | " + " | ".join(cells) + " |")
        cells = []
        for fmt in formats:
            spark_total = statistics.median(spark_workers[fmt])
            here = statistics.median([sum(v) for v in zip(*in_process[fmt].values())])
            cells.append(f"{spark_total:.2f} ({spark_total - here:+.2f})")
        print("| the workers in Spark (their difference: Spark's share) | " + " | ".join(cells) + " |")
        for fmt in formats:
            what = label("arrow", task_bytes)
            if fmt != "protobuf" and "protobuf" in formats:
                ratio = best[(fmt, what)] / best[("protobuf", what)]
                print(f"{fmt} / protobuf, {what}, same run: {ratio:.2f}x")
    finally:
        run.close(spark)


if __name__ == "__main__":
    main()
