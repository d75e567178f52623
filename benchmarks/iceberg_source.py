"""Records/s of the ``rsm-tiered`` Spark data source, next to the convert job's own read+decode
of the same segments in the same run and Spark session, and what filters save.

Set-up (not timed): the topic of ``iceberg_convert.py`` (a real Apicurio registry, framed
Protobuf values of ~100 bytes, ``--records`` in ``--partitions`` partitions, segments of
``--segment-mb`` stored by the sidecar's copy code: zstd chunks, AES-256-GCM). One ``local[2]``
SparkSession, warmed up on a small topic.

Timed, each ``--repeat`` times (best reported), every query written to Spark's ``noop`` sink:

1. **limit**: the convert job's DataFrame (``ConvertJob.dataframe``: the same tasks, read and
   decoded by ``mapInArrow``) - the same work without the data source API;
2. **data source, whole topic**: ``read_topic(...)`` with no filter;
3. **data source, filtered**: one partition; 1 % of one partition's offsets; the first tenth of
   the ingest times - with the tasks Spark ran.

    .venv/bin/python benchmarks/iceberg_source.py [--records 1000000] [--partitions 2]
        [--segment-mb 32] [--repeat 2]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devstack

from iceberg_convert import TOPIC, BenchRun, topic_and_warmup, topic_arguments


def main() -> None:
    args = topic_arguments(__doc__.split("\n\n")[0]).parse_args()

    from rsm_sidecar.iceberg.job import ConvertJob, load_config
    from rsm_sidecar.iceberg.session.catalogs import LocalCatalog
    from rsm_sidecar.iceberg.session.spark import spark_session
    from rsm_sidecar.iceberg.source import read_topic

    run = BenchRun("iceberg-source-bench-")
    workdir, reg = run.workdir, run.registry
    spark = None
    try:
        cfg_file, avg = topic_and_warmup(workdir, reg.ccompat_url, args, TOPIC, "warmup")
        print(
            f"set-up: {args.records:,} records (values {avg:.0f} B, framed Protobuf), "
            f"{args.partitions} partition(s), {args.segment_mb} MiB segments"
        )
        spark = spark_session(LocalCatalog(workdir / "catalog"), app_name="iceberg-source-bench")

        def noop(df) -> float:
            t0 = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            return time.perf_counter() - t0

        def job_frame(topic: str, table: str):
            cfg, storage = load_config(cfg_file, {}, {"iceberg.table": table})
            job = ConvertJob(cfg, storage, topic, spark=spark, log=lambda line: None)
            return job.dataframe(spark, job.prepare())

        def source(topic: str):
            return read_topic(spark, topic, cfg_file)

        noop(job_frame("warmup", "warmup"))  # JVM/JIT and Python worker warm-up
        noop(source("warmup"))
        per_part = args.records // args.partitions
        first_ingest = source(TOPIC).where("kafka.partition = 0 AND kafka.offset = 0")
        t_start = first_ingest.select("kafka.ingest_timestamp").first()[0]
        last = source(TOPIC).where(f"kafka.partition = 0 AND kafka.offset = {per_part - 1}")
        t_end = last.select("kafka.ingest_timestamp").first()[0]
        t_tenth = t_start + (t_end - t_start) / 10
        filters = {
            "one partition": "kafka.partition = 1",
            "1% of one partition's offsets": (
                f"kafka.partition = 0 AND kafka.offset BETWEEN {per_part // 2} "
                f"AND {per_part // 2 + per_part // 100 - 1}"
            ),
            "first tenth of the ingest times": (
                f"kafka.ingest_timestamp < TIMESTAMP '{t_tenth.isoformat()}'"
            ),
        }
        best: dict[str, float] = {}
        for r in range(args.repeat):
            timings = {
                "limit: convert job's read+decode": noop(job_frame(TOPIC, f"noop_{r}")),
                "data source, whole topic": noop(source(TOPIC)),
            }
            for name, where in filters.items():
                df = source(TOPIC).where(where)
                timings[f"data source, {name}"] = noop(df)
                if r == 0:
                    tasks = df.rdd.getNumPartitions()
                    rows = df.count()
                    print(f"  {name}: {rows:,} rows, {tasks} task(s) read")
            for name, dt in timings.items():
                best[name] = min(best.get(name, dt), dt)
                print(f"  run {r}: {name}: {dt:.2f}s")
        limit = best["limit: convert job's read+decode"]
        print(
            f"best of {args.repeat} (local[2], {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}):"
        )
        for name, dt in best.items():
            whole = name.startswith("limit") or name.endswith("whole topic")
            rate = f" = {args.records / dt:,.0f} records/s" if whole else ""
            print(f"  {name}: {dt:.2f}s{rate} ({dt / limit:.2f}x the limit's time)")
    finally:
        run.close(spark)


if __name__ == "__main__":
    main()
