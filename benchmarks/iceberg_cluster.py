"""Records/s per executor core of ``rsm-sidecar iceberg convert`` on a Spark standalone cluster,
next to ``local[N]`` with the same number of cores in the same run: the sizing rule of
docs/iceberg.md "On a Spark cluster".

Set-up (not timed): the topic of ``benchmarks/iceberg_convert.py`` (``--records`` framed
Protobuf values of ~92 bytes through a real Apicurio, ``--partitions`` partitions, segments of
``--segment-mb`` tiered by the sidecar's copy code, zstd + AES-GCM, in a local directory) and a
standalone cluster (``devstack.spark_cluster``: a master and ``--workers`` workers of one core,
each running one executor of ``--executor-memory``). The driver is this process (client mode);
on one machine the local paths of the segments and the embedded catalog are the same for every
process, so the difference to ``local[N]`` is the cluster's own cost: executors in their own
JVMs, tasks and results over RPC.

Timed, ``--repeat`` times on fresh tables each (best reported), with a warm-up conversion per
session first:

* ``local[1]`` and the cluster with one executor core (the per-core rate and its limit);
* ``local[N]`` and the cluster with ``N = --workers`` executor cores.

With the CPU seconds per record of the executors (JVMs and Python workers) and of the driver.

    .venv/bin/python benchmarks/iceberg_cluster.py [--records 400000] [--workers 2] [--repeat 2]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devstack

from iceberg_convert import BenchRun, topic_and_warmup, topic_arguments

TOPIC = "bench-cluster"


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds of these processes and their descendants (exited children included)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
            for c in p.children(recursive=True):
                ct = c.cpu_times()
                total += ct.user + ct.system
        except psutil.NoSuchProcess:
            continue
    return total


def main() -> None:
    ap = topic_arguments(__doc__.split("\n\n")[0])
    ap.set_defaults(records=400_000, segment_mb=8)
    ap.add_argument("--workers", type=int, default=2, help="executor cores on the cluster (one per worker)")
    ap.add_argument("--executor-memory", default="768m")
    args = ap.parse_args()

    from devstack.spark_cluster import SparkStandaloneCluster
    from rsm_sidecar.iceberg.job import ConvertJob, load_config
    from rsm_sidecar.iceberg.session.catalogs import LocalCatalog
    from rsm_sidecar.iceberg.session.spark import spark_session

    run = BenchRun("iceberg-cluster-bench-")
    workdir, reg = run.workdir, run.registry
    cluster = SparkStandaloneCluster(workdir / "cluster", workers=args.workers, cores=1, memory="1g").start()
    results: list[tuple[str, int, float, float, float]] = []
    try:
        cfg_file, avg = topic_and_warmup(workdir, reg.ccompat_url, args, TOPIC, "warmup")
        print(
            f"set-up: {args.records:,} records (values {avg:.0f} B, framed Protobuf) in {args.partitions} "
            f"partition(s), {args.segment_mb} MiB segments; cluster of {args.workers} worker(s) x 1 core"
        )
        catalog = LocalCatalog(workdir / "catalog")

        def measure(name: str, master: str, cores: int, executors) -> None:
            extra = {"spark.executor.memory": args.executor_memory, "spark.cores.max": str(cores)}
            if master.startswith("spark://"):
                extra["spark.scheduler.minRegisteredResourcesRatio"] = "1.0"
            spark = spark_session(catalog, master=master, app_name=f"bench-{name}", extra=extra)
            try:

                def job(topic: str, table: str) -> ConvertJob:
                    cfg, storage = load_config(cfg_file, {}, {"iceberg.table": table})
                    return ConvertJob(cfg, storage, topic, spark=spark, log=lambda line: None)

                job("warmup", f"warmup_{name}").run()
                best, cpu_exec, cpu_driver = 0.0, 0.0, 0.0
                for r in range(args.repeat):
                    pids = executors()
                    e0, d0 = tree_cpu(pids), tree_cpu([os.getpid()]) - tree_cpu(pids)
                    t0 = time.perf_counter()
                    res = job(TOPIC, f"events_{name}_{r}").run()
                    dt = time.perf_counter() - t0
                    e1, d1 = tree_cpu(pids), tree_cpu([os.getpid()]) - tree_cpu(pids)
                    assert res.records == args.records, (res.records, args.records)
                    rate = args.records / dt
                    print(
                        f"  {name} run {r}: {dt:.2f}s = {rate:,.0f} records/s ({res.tasks} tasks; CPU per "
                        f"record: executors {(e1 - e0) / args.records * 1e6:.1f} us, driver "
                        f"{(d1 - d0) / args.records * 1e6:.1f} us)"
                    )
                    if rate > best:
                        best = rate
                        cpu_exec = (e1 - e0) / args.records * 1e6
                        cpu_driver = (d1 - d0) / args.records * 1e6
                results.append((name, cores, best, cpu_exec, cpu_driver))
            finally:
                spark.stop()
                time.sleep(2)  # the cluster frees the application's executors

        def cluster_executors() -> list[int]:
            return [pid for pids in cluster.executors().values() for pid in pids]

        def local_jvm() -> list[int]:
            import psutil

            return [
                c.pid for c in psutil.Process().children() if "java" in c.name() and c.pid != reg.proc.pid
            ]

        for cores in sorted({1, args.workers}):
            measure(f"local{cores}", f"local[{cores}]", cores, local_jvm)
            measure(f"cluster{cores}", cluster.master_url, cores, cluster_executors)
        print(
            f"\n| run | executor cores | records/s (best of {args.repeat}) | records/s per core | "
            f"executor CPU per record | driver CPU per record |"
        )
        print("|---|---|---|---|---|---|")
        for name, cores, rate, ce, cd in results:
            kind = (
                f"`local[{cores}]`"
                if name.startswith("local")
                else f"standalone, {cores} executor(s) x 1 core"
            )
            print(f"| {kind} | {cores} | {rate:,.0f} | {rate / cores:,.0f} | {ce:.1f} us | {cd:.1f} us |")
        print(
            f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end "
            "(executor CPU: the executor JVMs and their Python workers; local: Spark's JVM and workers)"
        )
    finally:
        run.close(cluster)


if __name__ == "__main__":
    main()
