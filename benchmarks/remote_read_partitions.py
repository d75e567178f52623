"""Many partitions read at once: a catch-up consumer over 12 and 48 partitions of tiered data, with
Kafka's own ``LocalTieredStorage`` and with rsm-sidecar (docs/performance.md, "Many partitions
read at once"). A sibling of
``benchmarks/remote_read.py`` (one partition), built from its pieces.

    .venv/bin/python benchmarks/remote_read_partitions.py [--partitions 12,48] [--cases lts,ours]
        [--records 3000000] [--record-size 200] [--segment-mib 4] [--brokers 1] [--transport unix]
        [--storage local]
        [--kafka-version 4.3.1] [--sidecar-env RSM__KEY=VALUE ...] [--broker-property KEY=VALUE ...]
        [--warm-up-reads N] [--thread-cpu] [--jfr DIR] [--jvm-option OPTION ...] [--shim-jar JAR]
        [--profile-sidecar DIR]

Since Kafka 4.2 (KAFKA-14915) one FetchRequest starts remote reads for every partition it covers,
on the broker's ``remote.log.reader.threads`` pool (10 threads by default, left at its default
here); ``kafka-consumer-perf-test`` subscribes to the whole topic, so each of its fetches asks for
up to ``max.partition.fetch.bytes`` (1 MiB) of every partition. Each case gets a fresh broker (Kafka
4.3.1 by default: ``LocalTieredStorage``'s test jar must match the broker and 4.4.0's is not on
Maven Central; ``--kafka-version 4.4.0 --cases ours`` runs ours alone on 4.4), produces
``--records`` records over the partitions, waits until every closed segment of every partition is
tiered and deleted locally, reads a local topic of the same size once (JIT warm-up, not reported;
``--warm-up-reads N`` also reads a tiered topic of a quarter of the records N times, each cold),
then reads the tiered topic cold and warm. Cold: the topic was never read (no cache of the
sidecar or the broker holds it: the storage bytes per byte consumed show it) and its stored
objects are dropped from the page cache, as ``LocalTieredStorage``'s directory is (written back
first: ``LocalTieredStorage`` and SeaweedFS leave them dirty, ``remote_read.drop_page_cache``).
``--reconnect-before-cold`` also restarts the sidecars before each cold read (as this benchmark
did until 2026-11-30): the broker then reconnects, and over TCP + mTLS the new TLS session makes
the JVM recompile netty's TLS path (docs/design.md), a cost of each reconnection rather than of
a cold read. Reported per read:

* MB/s as ConsumerPerformance measures it;
* how busy the machine's cores were during the read (``/proc/stat``: 100 % means the consumer,
  broker and sidecar shared out all of it, and the read was bound by CPU, not by waiting);
* broker and sidecar CPU-seconds (``/proc``);
* the sidecar's peak RSS (``VmHWM``, reset before the cold read), the most fetch
  streams it served at once (``rsm_in_flight{op="fetch"}``, sampled every 0.2 s) and the bound
  docs/operations.md §4 gives for that many streams with the settings of the run;
* RESOURCE_EXHAUSTED answers of the sidecar (``rsm_operations_total{outcome="RESOURCE_EXHAUSTED"}``);
* consumer fetch latency: the broker's ``FetchConsumer`` request time p50/p99 (JMX
  ``kafka.network:type=RequestMetrics,name=TotalTimeMs,request=FetchConsumer``, read with Kafka's
  ``JmxTool`` right after the read: an exponentially decaying sample, so it reflects that read
  far more than the warm-up minutes before) and the consumer's own ``fetch-latency-avg``;
* Kafka's remote read time, mean and p99 (JMX
  ``kafka.log.remote:type=RemoteLogManager,name=RemoteLogReaderFetchRateAndTimeMs``: one sample
  per partition read from remote storage, the plugin's ``fetchLogSegment`` and the batches read
  from it; the mean is this read's, from the timer's count and mean before and after). A fetch
  request waits for the slowest of its partitions' remote reads, so this is where a plugin's
  latency shows;
* bytes the sidecar received from storage per byte consumed and its chunk cache's hit ratio (a
  cache too small for that many sequential readers downloads and decodes chunks again).
* the broker's CPU against ``LocalTieredStorage``'s in the same run (both read the same records),
  and, with ``--thread-cpu``, its JIT compiler threads' CPU-seconds during the read;
* the sidecar's CPU per MiB it served, and after all reads the floor of that measured now on the
  same records (``benchmarks/floor.py``: AES-GCM decryption, zstd decompression and a TLS socket's
  send on one core) with each read's ratio to it;
* with ``--profile-sidecar DIR --profile-gil``, the share of the sidecar's CPU spent holding the
  GIL (py-spy's samples of the thread holding it, against the process's CPU-seconds).

``--thread-cpu`` prints each read's CPU-seconds by thread name of the (first) broker and sidecar
(Python threads are all ``python``; gRPC's C core runs ``event_engine``), and
``--profile-sidecar DIR`` samples the (first) sidecar with py-spy during each read
(``remote_read.py``'s profiler; raw folded stacks, one file per read; ``--profile-gil``: only the
thread holding the GIL).

The sidecar runs with the product's default chunk cache (``cache.chunk_bytes``, 256 MiB), not the
local stack's 128 MiB. ``--sidecar-env`` and ``--broker-property`` change one setting of ours (e.g.
``RSM__CACHE__CHUNK_BYTES=512MiB``, ``rsm.config.fetch.readahead.max.bytes=201326592``), to size
the defaults against these figures.

``--brokers N`` (N >= 3) runs each case on ``devstack/cluster.py``'s cluster instead: one KRaft
controller, N brokers (one sidecar each, sharing the object store; ``LocalTieredStorage``'s
brokers share its directory), the topic at replication factor 3; the consumer reads from every
leader at once. Broker and sidecar CPU are summed over the nodes, RSS and fetch streams are the
highest of one sidecar, and the broker's request-time percentiles are not read (one JMX port per
JVM is not wired into the cluster). ``--transport tcp-mtls`` (one broker) runs the sidecar in a
network namespace of its own, reached over TCP with mutual TLS in stream mode, as Strimzi
deploys it (``benchmarks/netns.py``, as ``remote_read.py``'s ``ours-tcp``; needs root).

``--storage s3`` has the sidecar store into a local S3 server (SeaweedFS, ``devstack/s3server.py``,
as ``make demo STORAGE=s3``) instead of a local directory (``--storage local``, the default);
``LocalTieredStorage`` keeps its directory. With ``--transport tcp-mtls`` the S3 server listens on
our end of the namespace's veth pair, so the sidecar's GETs cross the same virtual link as its
answers to the broker, and no process relays them. A cold read drops the server's data files from
the page cache (SeaweedFS keeps no cache of object data of its own: its S3 chunk cache is off by
default). Printed after the table for each read of ours: S3 GET requests and MiB downloaded per
MiB consumed, the remote read p99 (a GET's latency shows there; Kafka's decaying sample, so the
warm read's still holds the cold read's) and the S3 server's CPU-seconds (not in the sidecar's).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.floor import measure as measure_floor
from benchmarks.netns import NetNs
from benchmarks.netns import available as netns_available
from benchmarks.remote_read import (
    MiB,
    broker_jvm_options,
    cold_sidecar,
    consume,
    cpu_seconds,
    drop_page_cache,
    lts_properties,
    machine_ticks,
    produce,
    run_tool,
    sidecar_profiler,
    start_run,
    stop_profiler,
    thread_cpu,
    thread_cpu_line,
)
from devstack.cluster import ClusterStack
from devstack.common import free_port
from devstack.kafka import KafkaBroker, KafkaDistribution
from devstack.stack import LocalStack

DEFAULT_VERSION = "4.3.1"
FETCH_REQUEST_TIME = "kafka.network:type=RequestMetrics,name=TotalTimeMs,request=FetchConsumer"
REMOTE_READ_TIME = "kafka.log.remote:type=RemoteLogManager,name=RemoteLogReaderFetchRateAndTimeMs"


@dataclass
class PartRead:
    case: str
    partitions: int
    temperature: str
    mb_s: float
    broker_cpu: float
    sidecar_cpu: float | None = None
    sidecar_peak_rss_mib: float | None = None
    max_fetch_streams: int | None = None
    rss_bound_mib: float | None = None
    resource_exhausted: int | None = None
    fetch_p50_ms: float | None = None
    fetch_p99_ms: float | None = None
    fetch_latency_avg_ms: float | None = None
    machine_busy: float | None = None
    remote_read_mean_ms: float | None = None
    remote_read_p99_ms: float | None = None
    downloaded_per_byte: float | None = None
    chunk_hit_ratio: float | None = None
    #: the broker's JIT compiler threads' CPU-seconds during the read (``--thread-cpu``)
    broker_jit_cpu: float | None = None
    #: MiB the sidecars served during the read (``rsm_bytes{kind="fetch_served"}``)
    served_mib: float | None = None
    #: seconds a sidecar thread held the GIL during the read (``--profile-gil``: py-spy's samples)
    gil_seconds: float | None = None
    #: storage GET requests of the sidecars per MiB consumed (``rsm_storage_requests{op="GET"}``)
    gets_per_mib: float | None = None
    #: the S3 server's CPU-seconds during the read (``--storage s3``)
    storage_server_cpu: float | None = None

    @property
    def sidecar_ms_per_mib(self) -> float | None:
        if self.sidecar_cpu is None or not self.served_mib:
            return None
        return 1000 * self.sidecar_cpu / self.served_mib

    @property
    def gil_share(self) -> float | None:
        if self.gil_seconds is None or not self.sidecar_cpu:
            return None
        return self.gil_seconds / self.sidecar_cpu


def jmx_options(port: int) -> list[str]:
    return [
        "-Dcom.sun.management.jmxremote",
        f"-Dcom.sun.management.jmxremote.port={port}",
        f"-Dcom.sun.management.jmxremote.rmi.port={port}",
        "-Dcom.sun.management.jmxremote.authenticate=false",
        "-Dcom.sun.management.jmxremote.ssl=false",
        "-Djava.rmi.server.hostname=127.0.0.1",
    ]


def jmx_attributes(
    dist: KafkaDistribution, jmx_port: int, object_name: str, attributes: str
) -> dict[str, float]:
    """Numeric attributes of one broker MBean, through Kafka's JmxTool (empty when it is not there)."""
    argv = dist.java_command(
        "org.apache.kafka.tools.JmxTool",
        [
            "--jmx-url", f"service:jmx:rmi:///jndi/rmi://127.0.0.1:{jmx_port}/jmxrmi",
            "--object-name", object_name, "--attributes", attributes,
            "--one-time", "true", "--report-format", "properties",
        ],
        jvm_options=["-Xmx256m"],
    )  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout
    return {k: float(v) for k, v in re.findall(r"([A-Za-z0-9]+)=([0-9.]+)\s*$", out, re.M) if k in attributes}


def fetch_request_percentiles(dist: KafkaDistribution, jmx_port: int) -> tuple[float | None, float | None]:
    """The broker's FetchConsumer total request time, p50 and p99 (ms)."""
    found = jmx_attributes(dist, jmx_port, FETCH_REQUEST_TIME, "50thPercentile,99thPercentile")
    return found.get("50thPercentile"), found.get("99thPercentile")


def remote_read_timer(dist: KafkaDistribution, jmx_port: int) -> dict[str, float]:
    """Kafka's timer of its remote reads (one per partition read from remote storage: the
    plugin's ``fetchLogSegment`` and reading the batches from it): Count, Mean, 99thPercentile."""
    return jmx_attributes(dist, jmx_port, REMOTE_READ_TIME, "Count,Mean,99thPercentile")


def create_topic(
    dist: KafkaDistribution, bootstrap: str, topic: str, args, partitions: int, tiered: bool
) -> None:
    rf = "3" if args.brokers >= 3 else "1"
    args_ = ["--bootstrap-server", bootstrap, "--create", "--topic", topic, "--partitions", str(partitions)]
    args_ += ["--replication-factor", rf, "--config", f"segment.bytes={args.segment_mib * MiB}"]
    args_ += ["--config", "retention.ms=-1", "--config", "file.delete.delay.ms=1000"]
    if tiered:
        args_ += ["--config", "remote.storage.enable=true", "--config", "local.retention.ms=1000"]
    run_tool(dist, "kafka-topics", args_, timeout=120)


def wait_all_tiered(
    brokers: Sequence[KafkaBroker], topic: str, partitions: int, timeout: float = 1800
) -> float:
    """Until every replica of every partition keeps only its active segment locally (followers
    too: they delete what the leader tiered); returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        local = [
            len([f for f in d.iterdir() if f.name.endswith(".log")])
            for b in brokers
            for d in (b.partition_dir(topic, p) for p in range(partitions))
            if d.exists()
        ]
        if local and all(n == 1 for n in local):
            return time.monotonic() - t0
        time.sleep(1)
    raise TimeoutError(f"{topic}: closed segments still local after {timeout:.0f} s")


class SidecarWatch:
    """Samples the sidecar's fetch streams in flight while a read runs (every 0.2 s); counters
    before/after. A sample asks /metrics for ``rsm_in_flight`` alone: the whole page, rendered in
    Python five times a second, was a fifth of the sidecar's interpreter time in a warm read
    (py-spy ``--profile-gil``), a cost only the sidecar cases paid; sampled once a second instead,
    the peak of 10-15 streams read as 6."""

    INTERVAL_S = 0.2

    def __init__(self, url: str):
        self.url = url
        self.max_streams = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def metrics(self, only: str | None = None) -> dict[str, float]:
        """The figures this watch reads; with ``only``, from that metric family alone."""
        url = self.url if only is None else f"{self.url}?name[]={only}"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(r'rsm_in_flight\{op="fetch"\} (\S+)', line)
            if m:
                out["in_flight"] = float(m.group(1))
            m = re.match(r'rsm_operations_total\{[^}]*outcome="RESOURCE_EXHAUSTED"[^}]*\} (\S+)', line)
            if m:
                out["exhausted"] = out.get("exhausted", 0.0) + float(m.group(1))
            m = re.match(r"rsm_storage_bytes_read_total\{[^}]*\} (\S+)", line)
            if m:
                out["downloaded"] = out.get("downloaded", 0.0) + float(m.group(1))
            m = re.match(r'rsm_storage_requests_total\{[^}]*op="GET"[^}]*\} (\S+)', line)
            if m:
                out["gets"] = out.get("gets", 0.0) + float(m.group(1))
            m = re.match(r'rsm_bytes_total\{kind="fetch_served"\} (\S+)', line)
            if m:
                out["served"] = float(m.group(1))
            m = re.match(r'rsm_cache_events_total\{cache="chunk",event="(hit|miss)"\} (\S+)', line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            try:
                streams = self.metrics("rsm_in_flight").get("in_flight", 0)
                self.max_streams = max(self.max_streams, int(streams))
            except OSError:
                pass

    def __enter__(self) -> SidecarWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def reset_peak_rss(pid: int) -> None:
    """``VmHWM`` starts again from the current RSS (``clear_refs`` 5, Linux 4.0+)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_bound_mib(streams: int, chunk_cache_mib: float) -> float:
    """docs/operations.md §4 "Memory" for ``streams`` fetch streams and no copy, with the
    settings the benchmark runs (the chunk cache, config/sidecar.toml's prefetch 16 MiB and 4 MiB
    chunks) and the code's defaults (manifest 32 MiB, index 64 MiB, fetch.max_range_bytes 8 MiB):
    base 85 + caches + streams x (R + C + 2 MiB) + 4 prefetch threads x (R + C)."""
    r, c = 8, 4
    return 85 + (32 + 64 + chunk_cache_mib) + streams * (r + c + 2) + 4 * (r + c)


def sidecar_env(args) -> dict[str, str]:
    """The sidecar's environment: ``--sidecar-env``, over the product's default chunk cache
    (``cache.chunk_bytes``, 256 MiB; the local stack's config/sidecar.toml keeps 128 MiB for the
    demo), so a warm read finds what a sidecar as shipped would keep."""
    from rsm_sidecar.segment.settings import ReaderSettings

    default = {f.name: f.default for f in dataclasses.fields(ReaderSettings)}["chunk_cache_bytes"]
    return {"RSM__CACHE__CHUNK_BYTES": str(default), **dict(kv.split("=", 1) for kv in args.sidecar_env)}


def chunk_cache_mib(args) -> float:
    from rsm_sidecar.config import parse_size

    return parse_size(sidecar_env(args)["RSM__CACHE__CHUNK_BYTES"], "RSM__CACHE__CHUNK_BYTES") / MiB


def measured(
    case, partitions, temperature, dist, brokers, topic, args, jmx_port=None, sidecars=(), storage_pid=None
):
    """One read by the consumer; ``brokers`` the cluster's (or the one), ``sidecars`` (pid,
    metrics URL) of each sidecar (none for ``LocalTieredStorage``), ``storage_pid`` the S3
    server's."""
    b0 = sum(cpu_seconds(b.pid) for b in brokers)
    s0 = sum(cpu_seconds(pid) for pid, _ in sidecars)
    st0 = cpu_seconds(storage_pid) if storage_pid else None
    watches = [SidecarWatch(url) for _, url in sidecars]
    before = [w.metrics() for w in watches]
    for w in watches:
        w.__enter__()
    timer0 = remote_read_timer(dist, jmx_port) if jmx_port is not None else {}
    threads0 = [thread_cpu(b.pid) for b in brokers[:1]] if args.thread_cpu else []
    sidecar_threads0 = [thread_cpu(pid) for pid, _ in sidecars[:1]] if args.thread_cpu else []
    spy = sidecar_profiler(args, sidecars[0][0] if sidecars else None, f"{case}-{partitions}-{temperature}")
    ticks0 = machine_ticks()
    started = time.time()
    try:
        mb_s, _, mb, fetch = consume(dist, ",".join(b.bootstrap_servers for b in brokers), topic, args)
    finally:
        stop_profiler(spy)
        for w in watches:
            w.__exit__()
    jit = None
    for b, t0 in zip(brokers, threads0):
        t1 = thread_cpu(b.pid)
        jit = sum(v - t0.get(k, 0.0) for k, v in t1.items() if "CompilerThre" in k)
        print(f"  {case} ({temperature}): broker threads CPU-s: {thread_cpu_line(t0, t1)}")
    for (pid, _), t0 in zip(sidecars, sidecar_threads0):
        print(f"  {case} ({temperature}): sidecar threads CPU-s: {thread_cpu_line(t0, thread_cpu(pid))}")
    if args.jfr:  # to select the read's samples
        print(f"  {case} ({temperature}): read from {started:.3f} to {time.time():.3f} (epoch s)", flush=True)
    r = PartRead(case, partitions, temperature, mb_s, sum(cpu_seconds(b.pid) for b in brokers) - b0)
    r.broker_jit_cpu = jit
    if storage_pid and st0 is not None:
        r.storage_server_cpu = cpu_seconds(storage_pid) - st0
    if spy is not None and getattr(args, "profile_gil", False):
        r.gil_seconds = profiled_seconds(args, f"{case}-{partitions}-{temperature}")
    ticks = [after - before for after, before in zip(machine_ticks(), ticks0)]
    r.machine_busy = ticks[0] / ticks[2] if ticks[2] else None
    if jmx_port is not None:
        r.fetch_p50_ms, r.fetch_p99_ms = fetch_request_percentiles(dist, jmx_port)
        timer = remote_read_timer(dist, jmx_port)
        reads = timer.get("Count", 0) - timer0.get("Count", 0)
        if reads > 0:  # this read's mean, from the timer's lifetime count and mean before and after
            total = timer["Mean"] * timer["Count"] - timer0.get("Mean", 0) * timer0.get("Count", 0)
            r.remote_read_mean_ms = total / reads
            r.remote_read_p99_ms = timer.get("99thPercentile")
    r.fetch_latency_avg_ms = fetch.get("fetch-latency-avg")
    if watches:
        after = [w.metrics() for w in watches]

        def grown(key: str) -> float:
            return sum(a.get(key, 0) - b.get(key, 0) for a, b in zip(after, before))

        r.sidecar_cpu = sum(cpu_seconds(pid) for pid, _ in sidecars) - s0
        # the sidecar with the highest peak, and the bound for the most streams one served
        r.sidecar_peak_rss_mib = max(vm_hwm_mib(pid) for pid, _ in sidecars)
        r.max_fetch_streams = max(w.max_streams for w in watches)
        r.rss_bound_mib = rss_bound_mib(max(1, r.max_fetch_streams), chunk_cache_mib(args))
        r.resource_exhausted = int(grown("exhausted"))
        r.downloaded_per_byte = grown("downloaded") / (mb * MiB)
        r.gets_per_mib = grown("gets") / mb
        r.served_mib = grown("served") / MiB
        hits, misses = grown("hit"), grown("miss")
        r.chunk_hit_ratio = hits / (hits + misses) if hits + misses else None
    print(f"  {r}", flush=True)
    return r


def read_tiered(
    case,
    dist,
    brokers,
    args,
    payload,
    partitions,
    jmx=None,
    sidecars=None,
    before_cold=None,
    storage_pid=None,
):
    """The case's reads: warm-up on a local topic, the tiered topic produced and tiered, then
    read cold (after ``before_cold``: restart the sidecars, drop the page cache) and warm.
    ``sidecars()`` gives the (pid, metrics URL) of each sidecar as it runs at that moment;
    ``storage_pid`` the S3 server's."""
    bootstrap = ",".join(b.bootstrap_servers for b in brokers)
    warm_up(dist, bootstrap, args, payload, partitions)
    if args.warm_up_reads:
        remote_warm_up(case, dist, brokers, args, payload, partitions, before_cold)
    create_topic(dist, bootstrap, "bench", args, partitions, tiered=True)
    produce(dist, bootstrap, "bench", args, payload)
    took = wait_all_tiered(brokers, "bench", partitions)
    print(f"  {case}, {partitions} partitions: tiered in {took:.0f} s", flush=True)
    if before_cold is not None:
        before_cold()
    reads = []
    for t in ("cold", "warm"):
        running = sidecars() if sidecars else ()
        reads.append(measured(case, partitions, t, dist, brokers, "bench", args, jmx, running, storage_pid))
    return reads


def remote_warm_up(case, dist, brokers, args, payload: Path, partitions: int, before_cold) -> None:
    """``--warm-up-reads N``: a tiered topic of a quarter of the records over as many partitions,
    read N times, each time cold (``before_cold``), not reported: the plugin's read path is
    JIT-compiled before the reads that count (with ``--reconnect-before-cold``, reconnection to a
    restarted sidecar included: ``remote_warm_up`` in remote_read.py)."""
    small = argparse.Namespace(**{**vars(args), "records": max(1, args.records // 4)})
    bootstrap = ",".join(b.bootstrap_servers for b in brokers)
    create_topic(dist, bootstrap, "warm-up-remote", small, partitions, tiered=True)
    produce(dist, bootstrap, "warm-up-remote", small, payload)
    wait_all_tiered(brokers, "warm-up-remote", partitions)
    for i in range(args.warm_up_reads):
        if before_cold is not None:
            before_cold()
        mb_s = consume(dist, bootstrap, "warm-up-remote", small)[0]
        what = f"remote warm-up read {i + 1} {mb_s:.1f} MB/s (not reported)"
        print(f"  {case}, {partitions} partitions: {what}", flush=True)


def run_lts(dist, work: Path, args, payload: Path, partitions: int) -> list[PartRead]:
    storage = work / f"lts-storage-{partitions}"
    if args.brokers >= 3:
        with ClusterStack(
            work / f"lts-cluster-{partitions}",
            brokers=args.brokers,
            kafka_version=dist.version,
            broker_properties=lts_properties(dist, storage),
            encryption=False,
        ) as cluster:
            brokers = [n.broker for n in cluster.nodes.values() if n.broker is not None]
            return read_tiered(
                "LocalTieredStorage", dist, brokers, args, payload, partitions,
                before_cold=lambda: drop_page_cache(storage),
            )  # fmt: skip
    jmx = free_port()
    with KafkaBroker(
        dist,
        work / f"lts-broker-{partitions}",
        extra_properties=lts_properties(dist, storage),
        jvm_options=jmx_options(jmx) + broker_jvm_options(args, f"lts-{partitions}"),
    ) as b:
        return read_tiered(
            "LocalTieredStorage", dist, [b], args, payload, partitions, jmx,
            before_cold=lambda: drop_page_cache(storage),
        )  # fmt: skip


def warm_up(dist, bootstrap: str, args, payload: Path, partitions: int) -> None:
    """A local topic of the same size read once: the broker's fetch path is JIT-compiled before
    the reads that count (as in remote_read.py)."""
    create_topic(dist, bootstrap, "warm-up", args, partitions, tiered=False)
    produce(dist, bootstrap, "warm-up", args, payload)
    consume(dist, bootstrap, "warm-up", args)


def run_ours(dist, work: Path, args, payload: Path, partitions: int) -> list[PartRead]:
    env = sidecar_env(args)
    props = dict(kv.split("=", 1) for kv in args.broker_property)
    if args.brokers >= 3:
        return run_ours_cluster(dist, work, args, payload, partitions, env, props)
    ns = NetNs("partitions-bench") if args.transport == "tcp-mtls" else None
    host = ns.inner_ip if ns else "127.0.0.1"
    port = free_port()
    stack = LocalStack(
        work / f"ours-{partitions}",
        storage=args.storage,
        # in the namespace, the sidecar reaches the S3 server at our end of the veth pair
        storage_host=ns.outer_ip if ns and args.storage == "s3" else "127.0.0.1",
        kafka_version=dist.version,
        sidecar_env={"RSM__METRICS__LISTEN": f"{host}:{port}", **env},
        broker_properties=props,
        transfer_mode="stream" if ns else "path",
        sidecar_tls=ns is not None,
        sidecar_host=host,
        sidecar_prefix=ns.exec_prefix if ns else (),
        shim_jar=args.shim_jar,
    )
    jmx = free_port()
    if ns:
        ns.__enter__()
    try:
        stack.start_storage()
        stack.start_sidecar()
        stack.broker = KafkaBroker(
            dist,
            stack.workdir / "kafka",
            extra_properties=stack.broker_properties(),
            jvm_options=jmx_options(jmx) + broker_jvm_options(args, f"ours-{partitions}"),
        )
        stack.broker.start()

        def before_cold() -> None:
            if args.reconnect_before_cold:
                cold_sidecar(stack)
            else:
                drop_page_cache(stack.stored_dir)
                assert stack.sidecar is not None and stack.sidecar.pid is not None
                reset_peak_rss(stack.sidecar.pid)

        def sidecars() -> list[tuple[int, str]]:
            assert stack.sidecar is not None and stack.sidecar.pid is not None
            return [(stack.sidecar.pid, f"http://{host}:{port}/metrics")]

        storage_pid = stack.storage_server.pid if stack.storage_server is not None else None
        return read_tiered(
            case_name(args), dist, [stack.broker], args, payload, partitions, jmx, sidecars, before_cold,
            storage_pid,
        )  # fmt: skip
    finally:
        stack.stop()
        if ns:
            ns.close()


def run_ours_cluster(dist, work: Path, args, payload, partitions: int, env, props) -> list[PartRead]:
    with ClusterStack(
        work / f"ours-cluster-{partitions}",
        brokers=args.brokers,
        storage=args.storage,
        kafka_version=dist.version,
        sidecar_env=env,
        broker_properties=props,
        metrics=True,
    ) as cluster:
        nodes = list(cluster.nodes.values())

        def before_cold() -> None:
            for node in nodes:
                if args.reconnect_before_cold:
                    node.restart_sidecar()
                elif node.sidecar is not None and node.sidecar.pid:
                    reset_peak_rss(node.sidecar.pid)
            drop_page_cache(cluster.shared.stored_dir)

        def sidecars() -> list[tuple[int, str]]:
            return [(n.sidecar.pid, n.metrics_url) for n in nodes if n.sidecar is not None and n.sidecar.pid]

        brokers = [n.broker for n in nodes if n.broker is not None]
        server = cluster.shared.storage_server
        return read_tiered(
            case_name(args), dist, brokers, args, payload, partitions, None, sidecars, before_cold,
            server.pid if server is not None else None,
        )  # fmt: skip


def profiled_seconds(args, name: str) -> float:
    """Seconds of samples in the read's py-spy profile (``--profile-gil``: of a thread holding the
    GIL), at the profiler's 250 samples per second (``remote_read.sidecar_profiler``)."""
    from benchmarks.remote_read import file_name

    out = Path(args.profile_sidecar).resolve() / (file_name(name) + ".txt")
    if not out.exists():
        return 0.0
    samples = 0
    for line in out.read_text().splitlines():
        _, _, count = line.rpartition(" ")
        if count.isdigit():
            samples += int(count)
    return samples / 250


def case_name(args) -> str:
    name = "rsm-sidecar TCP+mTLS" if args.transport == "tcp-mtls" else "rsm-sidecar"
    return name + (", S3" if args.storage == "s3" else "")


def s3_lines(reads: list[PartRead]) -> list[str]:
    """``--storage s3``: per read of ours, what it asked of the S3 server and what that cost."""
    return [
        f"  {r.case} ({r.temperature}, {r.partitions} partitions): "
        f"{fmt(r.gets_per_mib, '.2f')} GET requests and {fmt(r.downloaded_per_byte, '.3f')} MiB "
        f"downloaded per MiB consumed, remote read p99 {fmt(r.remote_read_p99_ms, '.1f')} ms, "
        f"S3 server {fmt(r.storage_server_cpu, '.1f')} CPU-s"
        for r in reads
        if r.gets_per_mib is not None
    ]


def cpu_ratio(r: PartRead, lts_cpu: dict) -> str:
    """The read's broker CPU against ``LocalTieredStorage``'s in the same run: both read the same
    records, so their CPU-seconds are CPU per byte."""
    ref = lts_cpu.get((r.partitions, r.temperature))
    if not ref or r.case == "LocalTieredStorage":
        return "-"
    return f"{r.broker_cpu / ref:.2f}x"


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(reads: list[PartRead]) -> str:
    lines = [
        "| read | partitions | MB/s | ratio to LocalTieredStorage | machine busy | broker CPU-s "
        "| sidecar CPU-s "
        "| sidecar peak RSS MiB (bound for its peak streams) | RESOURCE_EXHAUSTED "
        "| fetch request p50 / p99 ms | consumer fetch latency avg ms | remote read mean / p99 ms "
        "| storage bytes / byte consumed | chunk cache hits | broker CPU vs LTS | broker JIT CPU-s "
        "| sidecar ms CPU / MiB served | GIL held / sidecar CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lts = {(r.partitions, r.temperature): r.mb_s for r in reads if r.case == "LocalTieredStorage"}
    lts_cpu = {(r.partitions, r.temperature): r.broker_cpu for r in reads if r.case == "LocalTieredStorage"}
    for r in reads:
        ref = lts.get((r.partitions, r.temperature))
        ratio = f"{r.mb_s / ref:.2f}x" if ref and r.case != "LocalTieredStorage" else "-"
        rss = (
            f"{r.sidecar_peak_rss_mib:.0f} ({r.rss_bound_mib:.0f} for {r.max_fetch_streams})"
            if r.sidecar_peak_rss_mib is not None
            else "-"
        )
        lines.append(
            f"| {r.case} ({r.temperature}) | {r.partitions} | {r.mb_s:.1f} | {ratio} | "
            f"{fmt(r.machine_busy, '.0%')} | {r.broker_cpu:.1f} | "
            f"{fmt(r.sidecar_cpu, '.1f')} | {rss} | {fmt(r.resource_exhausted, 'd')} | "
            f"{fmt(r.fetch_p50_ms, '.1f')} / {fmt(r.fetch_p99_ms, '.1f')} | "
            f"{fmt(r.fetch_latency_avg_ms, '.1f')} | "
            f"{fmt(r.remote_read_mean_ms, '.1f')} / {fmt(r.remote_read_p99_ms, '.1f')} | "
            f"{fmt(r.downloaded_per_byte, '.3f')} | "
            f"{fmt(r.chunk_hit_ratio, '.0%')} | "
            f"{cpu_ratio(r, lts_cpu)} | {fmt(r.broker_jit_cpu, '.2f')} | "
            f"{fmt(r.sidecar_ms_per_mib, '.2f')} | {fmt(r.gil_share, '.0%')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", default="12,48")
    ap.add_argument("--cases", default="lts,ours")
    ap.add_argument("--records", type=int, default=3_000_000)
    ap.add_argument("--record-size", type=int, default=200)
    ap.add_argument("--segment-mib", type=int, default=4)
    ap.add_argument("--fetch-size", type=int, default=MiB, help="max.partition.fetch.bytes")
    ap.add_argument("--compression", default="none", help="the producer's compression.type")
    ap.add_argument(
        "--thread-cpu",
        action="store_true",
        help="each read's CPU-s of the (first) broker's and sidecar's threads, by name",
    )
    ap.add_argument(
        "--profile-sidecar",
        metavar="DIR",
        help="py-spy samples of the (first) sidecar during each read, into DIR",
    )
    ap.add_argument(
        "--profile-gil",
        action="store_true",
        help="with --profile-sidecar: sample only the thread holding the GIL",
    )
    ap.add_argument("--jfr", metavar="DIR", help="a JFR recording of each one-broker case's broker into DIR")
    ap.add_argument(
        "--jvm-option", action="append", default=[], metavar="OPTION", help="a one-broker case's JVM option"
    )
    ap.add_argument(
        "--warm-up-reads",
        type=int,
        default=0,
        help="cold reads of a tiered warm-up topic (a quarter of --records) before the measured ones",
    )
    ap.add_argument(
        "--reconnect-before-cold",
        action="store_true",
        help="restart the sidecars before each cold read (the broker reconnects; see above)",
    )
    ap.add_argument("--kafka-version", default=DEFAULT_VERSION)
    ap.add_argument(
        "--brokers", type=int, default=1, help="1, or a cluster of 3 or more (devstack/cluster.py)"
    )
    ap.add_argument("--transport", default="unix", choices=("unix", "tcp-mtls"), help="the shim's transport")
    ap.add_argument(
        "--storage",
        default="local",
        choices=("local", "s3"),
        help="where the sidecar stores: a local directory, or a local S3 server (SeaweedFS)",
    )
    ap.add_argument(
        "--sidecar-env",
        action="append",
        default=[],
        metavar="RSM__KEY=VALUE",
        help="a sidecar setting (ours)",
    )
    ap.add_argument(
        "--broker-property", action="append", default=[], metavar="KEY=VALUE", help="a broker setting (ours)"
    )
    ap.add_argument(
        "--shim-jar",
        type=Path,
        default=None,
        help="the shim jar of the one-broker ours case (default: java-shim/target/rsm-sidecar-shim.jar)",
    )
    args = ap.parse_args(argv)
    if args.brokers < 1 or args.brokers == 2:
        ap.error("--brokers is 1 or at least 3 (a cluster replicates every topic 3 times)")
    if args.transport == "tcp-mtls" and args.brokers != 1:
        ap.error("--transport tcp-mtls runs with one broker (one network namespace)")
    if args.transport == "tcp-mtls" and netns_available():
        ap.error(f"--transport tcp-mtls: {netns_available()}")
    cases, dist, work, payload = start_run(
        ap,
        args,
        "remote-read-partitions-",
        {"lts", "ours"},
        f" over {args.partitions} partitions, {args.segment_mib} MiB segments, consumer "
        f"max.partition.fetch.bytes {args.fetch_size}, {args.brokers} broker(s), transport "
        f"{args.transport}, storage {args.storage}"
        f"{', sidecars restarted before each cold read' if args.reconnect_before_cold else ''}",
    )
    reads: list[PartRead] = []
    try:
        for n in (int(p) for p in args.partitions.split(",")):
            if "lts" in cases:
                reads += run_lts(dist, work, args, payload, n)
            if "ours" in cases:
                reads += run_ours(dist, work, args, payload, n)
        # the floor of what the sidecar must spend per MiB, measured now on the same records
        floor = measure_floor(payload.read_bytes()) if "ours" in cases else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(reads))
    if args.storage == "s3" and "ours" in cases:
        print()
        print("S3 (SeaweedFS):")
        print("\n".join(s3_lines(reads)))
    if floor is not None:
        print()
        print(floor.line())
        for r in reads:
            if r.sidecar_ms_per_mib is not None:
                ratio = r.sidecar_ms_per_mib / floor.total_ms_per_mib
                print(
                    f"  {r.case} ({r.temperature}, {r.partitions} partitions): sidecar "
                    f"{r.sidecar_ms_per_mib:.2f} ms per MiB served, {ratio:.2f}x the floor"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
