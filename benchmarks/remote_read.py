"""Remote reads side by side: the local log, Kafka's own ``LocalTieredStorage``, and rsm-sidecar.

Kafka's own perf tools (``kafka-producer-perf-test``, ``kafka-consumer-perf-test``, from the
devstack distribution) write and read one partition of ``--records`` records of
``--record-size`` bytes (JSON-like lines, as an order topic carries) in ``--segment-mib``
segments. Each remote case gets a fresh broker (same distribution, same settings except the
``RemoteStorageManager``), produces, waits until every closed segment is in remote storage
and deleted locally, and then consumes everything twice:

* ``local log``: a topic without tiered storage on the ``LocalTieredStorage`` broker, read
  right after it was written (page cache): the ceiling.
* ``LocalTieredStorage``: Kafka's in-process reference plugin (``kafka-storage`` test jar
  from Maven Central; no transforms, plain files): what a remote read costs the broker
  without us.
* ``rsm-sidecar zstd+AES`` and ``rsm-sidecar plain`` (compression and encryption off):
  ours, through the shim and the sidecar, local-directory storage, default settings (the
  sidecar's fetch channel over the Unix socket; the shim reads ahead 8 MiB);
  ``rsm-sidecar zstd+AES
  no-readahead`` (case ``ours-no-readahead``): the same with the shim's
  ``rsm.config.fetch.readahead.bytes = 0``, one request per fetch.
* ``rsm-sidecar zstd+AES TCP+mTLS`` (case ``ours-tcp``): the sidecar where Strimzi puts it, not
  in the broker's pod: in its own network namespace (``benchmarks/netns.py``: a veth pair, its
  own TCP stack; needs root), reached over TCP with mutual TLS (a test CA's certificates), the
  shim copying in **stream** mode, no shared filesystem; ``rsm-sidecar zstd+AES TCP``
  (case ``ours-tcp-plaintext``): the same without TLS, to show what TLS costs.

Every broker reads a local (untiered) topic of the same size before its remote reads (the
``local log`` case on the ``LocalTieredStorage`` broker, an unreported warm-up on ours), so no
cold read pays for JIT-compiling the broker's fetch path and the others not. The broker's
CPU-seconds include its idle activity (about 0.2 CPU-s per second here: KRaft, the remote log
metadata consumer), which a slower read accrues longer: "above idle" subtracts the idle rate
measured over 5 s before each read times the read's wall time.

*cold*: the sidecar restarted (empty caches) and every stored object dropped from the page
cache (``posix_fadvise(DONTNEED)``; the same for ``LocalTieredStorage``'s files); *warm*: read
again at once. Reported per read: MB/s and records/s as ConsumerPerformance measures them
(fetch time, without the group join), the broker's and the sidecar's CPU-seconds
(``/proc/<pid>/stat``), bytes the sidecar served per byte consumed
(``rsm_bytes{kind="fetch_served"}``) and the share of them sent over the fetch channel
(``kind="fetch_channel"``; the rest went over gRPC), and bytes it received from object storage
per byte consumed (``rsm_storage_bytes_read``).

    .venv/bin/python benchmarks/remote_read.py [--records 2000000] [--record-size 200]
        [--segment-mib 16] [--fetch-size 1048576] [--compression none|lz4|zstd]
        [--cases local,lts,ours,ours-plain,ours-no-readahead,ours-tcp,ours-tcp-plaintext]
        [--readahead-mib 8] [--warm-up local|remote] [--warm-up-records N] [--warm-up-reads N]
        [--jfr DIR] [--profile-sidecar DIR] [--thread-cpu] [--jvm-option OPTION ...]

``--warm-up remote`` also has every broker read a tiered topic of a quarter of the records
through its plugin before the measured reads, each read made cold as the measured cold read is
(a broker that has served remote reads for a while has JIT-compiled that path, reconnections to a
restarted sidecar included; the default warm-up reads only a local topic).

``--jfr DIR`` records a JFR profile of each broker (``-XX:StartFlightRecording``) into DIR,
for ``jfr print --events jdk.ExecutionSample`` or JDK Mission Control, with a sample every
millisecond; each read prints its start and end time to select its samples.
``--thread-cpu`` prints each read's CPU-seconds of the broker's and the sidecar's threads by
name (``/proc/<pid>/task``: GC and JIT threads too, which a JFR sample does not show).
``--profile-sidecar DIR`` samples the sidecar with py-spy (``pip install py-spy``) during each
read into ``DIR/<case>-<temperature>.txt`` (folded stacks, one line per stack with its count);
with ``--profile-gil`` only the thread holding the GIL is sampled: where the interpreter's own
time goes, without the C code that runs beside it (zstd, AES, gRPC's sends release the GIL).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.maven import maven_jar
from benchmarks.netns import NetNs
from benchmarks.synthetic import value
from devstack.common import default_cache_dir, free_port
from devstack.kafka import KafkaBroker, KafkaDistribution
from devstack.kafka_tools import tool_command
from devstack.stack import CONFIG_DIR, LocalStack, read_properties

MiB = 1024 * 1024
LTS_CLASS = "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"
#: The broker version of every case. LocalTieredStorage must match the broker's version (4.3.1's
#: does not load into 4.4.0: ``LogContext`` moved to ``common.utils.internals``), and the newest
#: ``kafka-storage`` test jar on Maven Central is 4.3.1's (4.4.0's is not published).
DEFAULT_VERSION = "4.3.1"


# -- measuring ----------------------------------------------------------------------------------
def cpu_seconds(pid: int | None) -> float:
    """user + system CPU of a process so far."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int | None) -> dict[str, float]:
    """CPU-seconds of a process's threads so far, summed by thread name with digits dropped
    ("GC Thread#0" and "GC Thread#1" are one "GC Thread#")."""
    out: dict[str, float] = {}
    if pid is None:
        return out
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        key = re.sub(r"[0-9]+", "", name)
        out[key] = out.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def thread_cpu_line(before: dict[str, float], after: dict[str, float], top: int = 8) -> str:
    spent = {k: after[k] - before.get(k, 0.0) for k in after}
    ranked = sorted(spent.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{k} {v:.2f}" for k, v in ranked if v >= 0.01)


def machine_ticks() -> tuple[int, int, int]:
    """(busy, iowait, total) clock ticks of all cores so far (``/proc/stat``)."""
    ticks = Path("/proc/stat").read_text().split()[1:9]
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, ticks)
    busy = user + nice + system + irq + softirq + steal
    return busy, iowait, busy + idle + iowait


def scrape(url: str | None) -> dict[str, float]:
    """The sidecar's counters this benchmark reads, by sample name with labels."""
    if url is None:
        return {}
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(
            r'(rsm_bytes_total\{kind="fetch_(?:served|channel)"\}|rsm_storage_bytes_read_total\{[^}]*\}'
            r'|rsm_operations_total\{op="fetch",[^}]*\}) (\S+)',
            line,
        )
        if m:
            name = {
                'rsm_bytes_total{kind="fetch_served"}': "served",
                'rsm_bytes_total{kind="fetch_channel"}': "channel",
            }.get(m.group(1)) or {"rsm_stora": "downloaded", "rsm_opera": "calls"}[m.group(1)[:9]]
            out[name] = out.get(name, 0.0) + float(m.group(2))
    return out


def drop_page_cache(root: Path) -> None:
    """Every file under ``root`` out of the page cache, each written back first: DONTNEED leaves
    dirty pages in memory, and Kafka's ``LocalTieredStorage`` and SeaweedFS do not fsync what they
    write (the sidecar's local store does). Without the write-back a 12-partition
    ``LocalTieredStorage`` directory, just tiered, stayed wholly resident (61 of 61 MiB, 2026-12-07),
    and so did 15 of SeaweedFS's 19 MiB."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@dataclass
class Read:
    case: str
    temperature: str
    mb_s: float
    records_s: float
    consumed_mb: float
    broker_cpu: float
    broker_cpu_above_idle: float = 0.0
    sidecar_cpu: float | None = None
    served_per_byte: float | None = None
    channel_share: float | None = None
    downloaded_per_byte: float | None = None
    calls_per_mib: float | None = None
    fetch_latency_ms: float | None = None
    fetches: float | None = None
    machine_busy: float = 0.0
    machine_iowait: float = 0.0
    notes: list[str] = field(default_factory=list)


# -- Kafka's tools --------------------------------------------------------------------------------
def run_tool(dist: KafkaDistribution, name: str, args: list[str], timeout: float = 1800) -> str:
    proc = subprocess.run(
        tool_command(dist, name, args), capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def create_topic(
    dist: KafkaDistribution, bootstrap: str, topic: str, segment_bytes: int, tiered: bool
) -> None:
    configs = {
        "segment.bytes": segment_bytes,
        "retention.ms": -1,
        "file.delete.delay.ms": 1000,
    }
    if tiered:
        configs.update({"remote.storage.enable": "true", "local.retention.ms": 1000})
    args = ["--bootstrap-server", bootstrap, "--create", "--topic", topic, "--partitions", "1"]
    args += ["--replication-factor", "1"]
    for k, v in configs.items():
        args += ["--config", f"{k}={v}"]
    run_tool(dist, "kafka-topics", args, timeout=120)


def produce(
    dist: KafkaDistribution, bootstrap: str, topic: str, args: argparse.Namespace, payload: Path
) -> None:
    run_tool(
        dist,
        "kafka-producer-perf-test",
        [
            "--topic", topic, "--num-records", str(args.records), "--throughput", "-1",
            "--payload-file", str(payload),
            "--producer-props", f"bootstrap.servers={bootstrap}", "acks=1", "linger.ms=20",
            "batch.size=262144", f"compression.type={args.compression}",
        ],
    )  # fmt: skip


def consume(
    dist: KafkaDistribution, bootstrap: str, topic: str, args: argparse.Namespace
) -> tuple[float, float, float, dict[str, float]]:
    """(fetch MB/s, fetch records/s, MB consumed) as ConsumerPerformance reports them, and its
    consumer's fetch metrics (``--print-metrics``: ``fetch-latency-avg``, ``fetch-total``, ...)."""
    count_flag = "--num-records" if dist.version_tuple >= (4, 0, 0) else "--messages"
    out = run_tool(
        dist,
        "kafka-consumer-perf-test",
        [
            "--bootstrap-server", bootstrap, "--topic", topic, count_flag, str(args.records),
            "--fetch-size", str(args.fetch_size), "--timeout", "120000",
            "--group", f"bench-{uuid.uuid4().hex[:8]}", "--print-metrics",
        ],
    )  # fmt: skip
    lines = [line for line in out.splitlines() if line.strip()]
    at = next(i for i, line in enumerate(lines) if line.startswith("start.time"))
    header, row = lines[at], lines[at + 1]
    metrics = fetch_metrics(lines[at + 2 :])
    cols = dict(zip([h.strip() for h in header.split(",")], [c.strip() for c in row.split(",")], strict=True))
    consumed_records = float(cols["data.consumed.in.nMsg"])
    if consumed_records < args.records:
        raise RuntimeError(f"{topic}: consumed {consumed_records:.0f} of {args.records} records")
    mb_s, rec_s, mb = (float(cols[c]) for c in ("fetch.MB.sec", "fetch.nMsg.sec", "data.consumed.in.MB"))
    return mb_s, rec_s, mb, metrics


def fetch_metrics(lines: list[str]) -> dict[str, float]:
    """The consumer-wide ``consumer-fetch-manager-metrics`` of ``--print-metrics`` output
    (lines ``group:name:{tags} : value``), by name; per-topic and per-partition ones skipped."""
    out: dict[str, float] = {}
    for line in lines:
        m = re.match(r"consumer-fetch-manager-metrics:([a-z-]+):\{client-id=[^,}]*\}\s*:\s*(\S+)", line)
        if m:
            try:
                out[m.group(1)] = float(m.group(2))
            except ValueError:
                pass
    return out


def wait_tiered(broker: KafkaBroker, topic: str, timeout: float = 900) -> float:
    """Until only the active segment is local; returns the seconds waited."""
    t0 = time.monotonic()
    d = broker.partition_dir(topic, 0)
    while time.monotonic() - t0 < timeout:
        if len([p for p in d.iterdir() if p.name.endswith(".log")]) == 1:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise TimeoutError(f"{topic}: closed segments still local after {timeout:.0f} s")


def remote_warm_up(
    dist: KafkaDistribution,
    broker: KafkaBroker,
    args: argparse.Namespace,
    payload: Path,
    name: str,
    make_cold: Callable[[], None],
) -> None:
    """``--warm-up remote``: a tiered topic of a quarter of the records (``--warm-up-records``),
    read ``--warm-up-reads`` times through the broker's RemoteStorageManager and not reported,
    so that the cold read that follows does not pay for JIT-compiling the plugin's read path
    (netty's TLS and gRPC's framing, for the shim over TCP) and LocalTieredStorage's equally.
    On 2 cores the JVM has one C2 compiler thread, and the per-frame methods of netty's TLS and
    HTTP/2 path stayed at C1's profiling tier through a whole first read of 381 MiB (their C2
    compilations came during the next read: ``--jvm-option=-XX:+PrintCompilation``).

    Each warm-up read is made cold as the measured one is (``make_cold``: for ours the sidecar
    restarted, so the shim connects again). Without that the measured cold read was the first
    to reconnect after C2 had compiled netty's TLS path, whose handshake branches C2 had never
    seen taken: the new connection's handshake deoptimized ``SslHandler.wrap``/``unwrap`` and
    ``ReferenceCountedOpenSslEngine.wrap``/``unwrap`` (JFR ``jdk.Deoptimization``:
    ``unstable_if`` in ``mayFinishHandshake``, ``setHandshakeSuccess``) and C2 compiled them
    again during the read, a cost a broker pays at its first reconnect to a sidecar only."""
    n = args.warm_up_records or max(1, args.records // 4)
    small = argparse.Namespace(**{**vars(args), "records": n})
    bs = broker.bootstrap_servers
    create_topic(dist, bs, "warm-up-remote", args.segment_mib * MiB, tiered=True)
    produce(dist, bs, "warm-up-remote", small, payload)
    wait_tiered(broker, "warm-up-remote")
    for i in range(args.warm_up_reads):
        make_cold()
        t0 = thread_cpu(broker.pid)
        mb_s = consume(dist, bs, "warm-up-remote", small)[0]
        compiled = sum(v - t0.get(k, 0.0) for k, v in thread_cpu(broker.pid).items() if "Compiler" in k)
        print(
            f"  {name}: remote warm-up read {i + 1} {mb_s:.1f} MB/s, "
            f"broker JIT {compiled:.2f} CPU-s (not reported)",
            flush=True,
        )


def idle_cpu_rate(broker: KafkaBroker, seconds: float = 5.0) -> float:
    """The broker's CPU-seconds per second while nobody uses it (KRaft, metadata, the remote log
    metadata consumer), measured just before a read."""
    c0, t0 = cpu_seconds(broker.pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(broker.pid) - c0) / (time.monotonic() - t0)


def measured_read(
    case: str,
    temperature: str,
    dist: KafkaDistribution,
    broker: KafkaBroker,
    topic: str,
    args: argparse.Namespace,
    sidecar_pid: int | None = None,
    metrics_url: str | None = None,
) -> Read:
    idle = idle_cpu_rate(broker)
    b0, s0, m0 = cpu_seconds(broker.pid), cpu_seconds(sidecar_pid), scrape(metrics_url)
    k0 = machine_ticks()
    threads0 = (thread_cpu(broker.pid), thread_cpu(sidecar_pid)) if args.thread_cpu else None
    spy = sidecar_profiler(args, sidecar_pid, f"{case}-{temperature}")
    t0, started = time.monotonic(), time.time()
    try:
        mb_s, rec_s, mb, fetch = consume(dist, broker.bootstrap_servers, topic, args)
    finally:
        stop_profiler(spy)
    wall = time.monotonic() - t0
    if threads0 is not None:
        print(
            f"  {case} ({temperature}): broker threads CPU-s: "
            f"{thread_cpu_line(threads0[0], thread_cpu(broker.pid))}",
            flush=True,
        )
        if sidecar_pid is not None:
            print(
                f"  {case} ({temperature}): sidecar threads CPU-s: "
                f"{thread_cpu_line(threads0[1], thread_cpu(sidecar_pid))}",
                flush=True,
            )
    if args.jfr:  # the window to select this read's samples from a recording
        print(f"  {case} ({temperature}): read from {started:.3f} to {time.time():.3f} (epoch s)", flush=True)
    k1 = machine_ticks()
    b1, s1, m1 = cpu_seconds(broker.pid), cpu_seconds(sidecar_pid), scrape(metrics_url)
    r = Read(case, temperature, mb_s, rec_s, mb, b1 - b0)
    total = max(1, k1[2] - k0[2])
    r.machine_busy, r.machine_iowait = (k1[0] - k0[0]) / total, (k1[1] - k0[1]) / total
    r.fetch_latency_ms = fetch.get("fetch-latency-avg")
    r.fetches = fetch.get("fetch-total")
    r.broker_cpu_above_idle = r.broker_cpu - idle * wall
    if sidecar_pid is not None:
        consumed = mb * MiB  # ConsumerPerformance's MB are MiB (bytes / 1024 / 1024)
        r.sidecar_cpu = s1 - s0
        served = m1.get("served", 0) - m0.get("served", 0)
        r.served_per_byte = served / consumed
        r.channel_share = (m1.get("channel", 0) - m0.get("channel", 0)) / served if served else None
        r.downloaded_per_byte = (m1.get("downloaded", 0) - m0.get("downloaded", 0)) / consumed
        r.calls_per_mib = (m1.get("calls", 0) - m0.get("calls", 0)) / mb
    return r


# -- the cases -------------------------------------------------------------------------------------
def lts_jar(cache: Path, version: str) -> Path:
    """Kafka's ``kafka-storage`` test jar (it holds LocalTieredStorage), from Maven Central."""
    artifact = f"org.apache.kafka:kafka-storage:{version}:jar:test"
    return maven_jar(cache, artifact, f"kafka-storage-{version}-test")


def lts_properties(dist: KafkaDistribution, storage: Path) -> dict[str, object]:
    """config/broker-tiered.properties with Kafka's ``LocalTieredStorage`` storing in ``storage``
    instead of the shim."""
    props: dict[str, object] = {
        k: v
        for k, v in read_properties(
            CONFIG_DIR / "broker-tiered.properties",
            {"SHIM_DIR": "unused", "SIDECAR_TARGET": "unused", "TRANSFER_MODE": "path"},
        ).items()
        if not k.startswith("rsm.config.")
    }
    props.update(
        {
            "remote.log.storage.manager.class.name": LTS_CLASS,
            "remote.log.storage.manager.class.path": str(lts_jar(default_cache_dir(), dist.version)),
            "rsm.config.dir": str(storage),
            "rsm.config.delete.on.close": "false",
        }
    )
    return props


def file_name(case: str) -> str:
    """``case`` as a file name: "rsm-sidecar zstd+AES TCP+mTLS" -> "rsm-sidecar-zstd+AES-TCP+mTLS"."""
    return re.sub(r"[^A-Za-z0-9+.-]+", "-", case)


def broker_jvm_options(args: argparse.Namespace, case: str) -> list[str]:
    """``--jvm-option``s, then JFR's profile settings with execution samples every millisecond
    (``method-profiling=max``; the default 10-20 ms gives too few samples in a few seconds' read
    to rank methods) when ``--jfr`` is given. ``{case}`` in an option is the case's name."""
    options = [o.replace("{case}", case) for o in args.jvm_option]
    if args.jfr:
        Path(args.jfr).mkdir(parents=True, exist_ok=True)
        recording = Path(args.jfr).resolve() / f"{case}.jfr"
        options.append(f"-XX:StartFlightRecording=filename={recording},settings=profile,method-profiling=max")
    return options


def sidecar_profiler(args: argparse.Namespace, pid: int | None, name: str) -> subprocess.Popen | None:
    """py-spy sampling the sidecar during one read (``--profile-sidecar DIR``), or None."""
    if not args.profile_sidecar or pid is None:
        return None
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(args.profile_sidecar).resolve() / (file_name(name) + ".txt")
    out.parent.mkdir(parents=True, exist_ok=True)
    spy = subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
            *(["--gil"] if getattr(args, "profile_gil", False) else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.5)  # attached before the read starts
    return spy


def stop_profiler(spy: subprocess.Popen | None) -> None:
    if spy is None:
        return
    spy.send_signal(2)  # py-spy writes its output on SIGINT
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        spy.kill()


def run_lts(
    dist: KafkaDistribution, work: Path, args: argparse.Namespace, payload: Path, cases: set[str]
) -> list[Read]:
    storage = work / "lts-storage"
    props = lts_properties(dist, storage)
    out = []
    with KafkaBroker(
        dist, work / "lts-broker", extra_properties=props, jvm_options=broker_jvm_options(args, "lts")
    ) as broker:
        bs = broker.bootstrap_servers
        if "local" in cases:
            create_topic(dist, bs, "bench-local", args.segment_mib * MiB, tiered=False)
            produce(dist, bs, "bench-local", args, payload)
            out.append(measured_read("local log", "page cache", dist, broker, "bench-local", args))
            say(out[-1])
        if "lts" in cases:
            if args.warm_up == "remote":
                remote_warm_up(
                    dist, broker, args, payload, "LocalTieredStorage", lambda: drop_page_cache(storage)
                )
            create_topic(dist, bs, "bench-lts", args.segment_mib * MiB, tiered=True)
            produce(dist, bs, "bench-lts", args, payload)
            print(f"  LocalTieredStorage: tiered in {wait_tiered(broker, 'bench-lts'):.1f} s", flush=True)
            drop_page_cache(storage)
            out.append(measured_read("LocalTieredStorage", "cold", dist, broker, "bench-lts", args))
            say(out[-1])
            out.append(measured_read("LocalTieredStorage", "warm", dist, broker, "bench-lts", args))
            say(out[-1])
    return out


def cold_sidecar(stack: LocalStack) -> None:
    """What makes a read of ours cold: the sidecar restarted (its caches empty) and the stored
    objects dropped from the page cache (the directory, or the S3 server's data)."""
    stack.restart_sidecar()
    drop_page_cache(stack.stored_dir)


def run_ours(
    name: str,
    transforms: bool,
    dist: KafkaDistribution,
    work: Path,
    args: argparse.Namespace,
    payload: Path,
    readahead: bool = True,
    remote: bool = False,
    tls: bool = True,
) -> list[Read]:
    """``remote``: the sidecar in its own network namespace over TCP, stream mode, with mutual
    TLS unless ``tls`` is false."""
    port = free_port()
    ns = NetNs("tcp-mtls-bench") if remote else None
    host = ns.inner_ip if ns else "127.0.0.1"
    env = {"RSM__METRICS__LISTEN": f"{host}:{port}"}
    if remote and not tls:  # the namespace's veth: a network only the broker reaches
        env["RSM__SERVER__ALLOW_PLAINTEXT_NON_LOOPBACK"] = "true"
    if not transforms:
        env["RSM__SEGMENT__COMPRESSION"] = "false"
    stack = LocalStack(
        work / name,
        kafka_version=dist.version,
        sidecar_env=env,
        encryption=transforms,
        broker_properties={
            "rsm.config.fetch.readahead.bytes": str(args.readahead_mib * MiB) if readahead else "0",
            **dict(kv.split("=", 1) for kv in args.shim),
        },
        transfer_mode="stream" if remote else "path",
        sidecar_tls=remote and tls,
        sidecar_tcp=remote,
        sidecar_host=host,
        sidecar_prefix=ns.exec_prefix if ns else (),
        shim_jar=args.shim_jar,
    )
    out = []
    if ns:
        ns.__enter__()
    try:
        stack.start()
        broker = stack.broker
        assert broker is not None
        extra = broker_jvm_options(args, file_name(name))
        if extra:  # restart the broker with them
            broker.stop()
            broker.jvm_options.extend(extra)
            broker.start()
        bs = broker.bootstrap_servers
        url = f"http://{host}:{port}/metrics"
        # the same history as the LocalTieredStorage broker, whose "local log" read came first:
        # one local read, so the broker's fetch path is JIT-compiled before the remote reads
        create_topic(dist, bs, "bench-local", args.segment_mib * MiB, tiered=False)
        produce(dist, bs, "bench-local", args, payload)
        warmup = measured_read(f"{name} broker warm-up", "local log", dist, broker, "bench-local", args)
        print(f"  {name}: broker warm-up, local read {warmup.mb_s:.1f} MB/s (not reported)", flush=True)
        if args.warm_up == "remote":
            remote_warm_up(dist, broker, args, payload, name, lambda: cold_sidecar(stack))
        create_topic(dist, bs, "bench", args.segment_mib * MiB, tiered=True)
        produce(dist, bs, "bench", args, payload)
        print(f"  {name}: tiered in {wait_tiered(broker, 'bench'):.1f} s", flush=True)
        cold_sidecar(stack)
        for temperature in ("cold", "warm"):
            assert stack.sidecar is not None
            out.append(measured_read(name, temperature, dist, broker, "bench", args, stack.sidecar.pid, url))
            say(out[-1])
    finally:
        stack.stop()
        if ns:
            ns.close()
    return out


# -- report ---------------------------------------------------------------------------------------
def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def say(r: Read) -> None:
    print(
        f"  {r.case} ({r.temperature}): {r.mb_s:.1f} MB/s, {r.records_s:,.0f} records/s, "
        f"broker {r.broker_cpu:.1f} CPU-s ({r.broker_cpu_above_idle:.1f} above idle), "
        f"sidecar {fmt(r.sidecar_cpu, '.1f')} CPU-s",
        flush=True,
    )


def table(reads: list[Read], args: argparse.Namespace) -> str:
    head = (
        "| read | MB/s | records/s | broker CPU-s | broker CPU-s above idle | sidecar CPU-s "
        "| bytes served / byte consumed | of which over the fetch channel "
        "| storage bytes read / byte consumed "
        "| fetch calls / MiB consumed | consumer fetches | consumer fetch latency avg ms "
        "| machine busy (iowait) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {r.case} ({r.temperature}) | {r.mb_s:.1f} | {r.records_s:,.0f} | {r.broker_cpu:.1f} | "
        f"{r.broker_cpu_above_idle:.1f} | "
        f"{fmt(r.sidecar_cpu, '.1f')} | {fmt(r.served_per_byte, '.3f')} | {fmt(r.channel_share, '.0%')} | "
        f"{fmt(r.downloaded_per_byte, '.3f')} | {fmt(r.calls_per_mib, '.2f')} | "
        f"{fmt(r.fetches, '.0f')} | {fmt(r.fetch_latency_ms, '.2f')} | "
        f"{r.machine_busy:.0%} ({r.machine_iowait:.0%}) |"
        for r in reads
    ]
    return head + "\n".join(rows)


def work_and_payload(prefix: str, record_size: int) -> tuple[Path, Path]:
    """A new work directory ``prefix...`` and in it the producers' payload file: 10,000 lines of
    ``record_size`` bytes (:func:`~benchmarks.synthetic.value`, always the same ones)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    rng = random.Random(405)
    payload = work / "payload.txt"
    payload.write_bytes(b"\n".join(value(rng, record_size) for _ in range(10_000)))
    return work, payload


def start_run(
    ap: argparse.ArgumentParser, args: argparse.Namespace, prefix: str, known_cases: set[str], details: str
) -> tuple[set[str], KafkaDistribution, Path, Path]:
    """What a run of this benchmark and of :mod:`benchmarks.remote_read_partitions` does first:
    the ``--cases`` asked for (an unknown one is an error of ``ap``), the Kafka distribution of
    ``--kafka-version``, a new work directory ``prefix...`` with the producers' payload
    (:func:`work_and_payload`), and the run's banner: Kafka's version, the records, ``details``."""
    cases = set(args.cases.split(","))
    if cases - known_cases:
        ap.error(f"unknown cases {sorted(cases - known_cases)}")
    dist = KafkaDistribution.ensure(args.kafka_version)
    work, payload = work_and_payload(prefix, args.record_size)
    print(
        f"Kafka {dist.version}; {args.records:,} records of {args.record_size} B "
        f"({args.records * args.record_size / MiB:.0f} MiB){details}",
        flush=True,
    )
    return cases, dist, work, payload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--record-size", type=int, default=200)
    ap.add_argument("--segment-mib", type=int, default=16)
    ap.add_argument("--fetch-size", type=int, default=1024 * 1024, help="max.partition.fetch.bytes")
    ap.add_argument("--compression", default="none", help="the producer's compression.type")
    ap.add_argument("--cases", default="local,lts,ours,ours-plain,ours-no-readahead")
    ap.add_argument(
        "--kafka-version",
        default=DEFAULT_VERSION,
        help=f"the broker of every case (default {DEFAULT_VERSION}: LocalTieredStorage's jar matches it)",
    )
    ap.add_argument(
        "--readahead-mib",
        type=int,
        default=8,
        help="the shim's read-ahead window (rsm.config.fetch.readahead.bytes) for the ours cases",
    )
    ap.add_argument(
        "--warm-up",
        choices=("local", "remote"),
        default="local",
        help="remote: each broker also tiers and reads a topic of a quarter of the records before "
        "its measured reads, so the cold read does not JIT-compile the plugin's read path",
    )
    ap.add_argument(
        "--warm-up-records",
        type=int,
        default=0,
        help="records of the remote warm-up topic (default: a quarter of --records)",
    )
    ap.add_argument(
        "--warm-up-reads",
        type=int,
        default=1,
        help="how many times the remote warm-up topic is read (default 1)",
    )
    ap.add_argument("--jfr", default=None, help="write a JFR recording of each broker into this directory")
    ap.add_argument(
        "--jvm-option",
        action="append",
        default=[],
        help="one more JVM option of every broker ({case}: the case's name), e.g. -XX:+PrintCompilation",
    )
    ap.add_argument(
        "--thread-cpu",
        action="store_true",
        help="print each read's CPU-seconds by thread name of the broker and the sidecar",
    )
    ap.add_argument(
        "--profile-sidecar",
        default=None,
        metavar="DIR",
        help="sample the sidecar with py-spy during each read into DIR (folded stacks; pip install py-spy)",
    )
    ap.add_argument(
        "--profile-gil",
        action="store_true",
        help="with --profile-sidecar: sample only the thread holding the GIL",
    )
    ap.add_argument(
        "--shim-jar",
        type=Path,
        default=None,
        help="the shim jar of the ours cases (default: java-shim/target/rsm-sidecar-shim.jar)",
    )
    ap.add_argument(
        "--shim",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra broker property for the ours cases (repeatable), e.g. rsm.config.fetch.window.bytes=0",
    )
    args = ap.parse_args(argv)
    cases, dist, work, payload = start_run(
        ap,
        args,
        "remote-read-",
        {"local", "lts", "ours", "ours-plain", "ours-no-readahead", "ours-tcp", "ours-tcp-plaintext"},
        f", {args.segment_mib} MiB segments, one partition, producer compression {args.compression}, "
        f"consumer fetch size {args.fetch_size} B, {args.warm_up} warm-up",
    )
    reads: list[Read] = []
    try:
        if cases & {"local", "lts"}:
            reads += run_lts(dist, work, args, payload, cases)
        if "ours" in cases:
            reads += run_ours("rsm-sidecar zstd+AES", True, dist, work, args, payload)
        if "ours-plain" in cases:
            reads += run_ours("rsm-sidecar plain", False, dist, work, args, payload)
        if "ours-no-readahead" in cases:
            reads += run_ours(
                "rsm-sidecar zstd+AES no-readahead", True, dist, work, args, payload, readahead=False
            )
        if "ours-tcp" in cases:
            reads += run_ours("rsm-sidecar zstd+AES TCP+mTLS", True, dist, work, args, payload, remote=True)
        if "ours-tcp-plaintext" in cases:
            reads += run_ours(
                "rsm-sidecar zstd+AES TCP", True, dist, work, args, payload, remote=True, tls=False
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(reads, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
