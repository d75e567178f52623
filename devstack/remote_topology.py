"""The remote topology (docker-compose.remote.yml) on podman: the broker and the sidecar as two
containers sharing no volume, the shim streaming to the sidecar over TCP with mutual TLS, S3 on
SeaweedFS, certificates from a test CA. What ``make compose-demo TOPOLOGY=remote`` runs and
what tests/deploy/test_topology.py drives:

* :class:`Topology`: build (the broker image on top of the ``kafka`` target's), up, health,
  ``inspect`` inside the sidecar container, certificate renewal in place, down;
* :func:`produce`, :func:`consume_from_zero`: a client on the host, record by record;
* :func:`demo`: build, up, produce a topic, wait until it is tiered, read it back from offset 0,
  print what was checked; leaves the cluster running.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from devstack.common import wait_for
from devstack.containers import ComposeProject, PodmanService
from devstack.kafka import create_topics

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.remote.yml"
PROJECT = "rsm-sidecar-remote"
#: the sidecar's configuration inside its container (the chart's mount path)
SIDECAR_CONFIG = "/etc/rsm-sidecar/sidecar.toml"
#: the host ports of docker-compose.remote.yml, and the variables that move them
DEFAULT_PORTS = {"kafka": 29192, "metrics": 29196, "s3": 28333}
PORT_VARIABLES = {
    "kafka": "RSM_REMOTE_KAFKA_PORT",
    "metrics": "RSM_REMOTE_METRICS_PORT",
    "s3": "RSM_REMOTE_S3_PORT",
}


#: what Kafka 4.4 logs when its topic-based remote log metadata manager gave up creating or
#: reaching its topic (``remote.log.metadata.initialization.retry.max.timeout.ms``); the broker
#: then hangs in its own shutdown (docs/operations.md, "A broker stuck after ...")
BROKER_STUCK = "Stopping the server as it failed to initialize topic-based RLMM resources"


def log_problems(log: str, limit: int) -> list[str]:
    """A Kafka log's WARN, ERROR and FATAL lines, each message once (timestamps aside)."""
    seen: set[str] = set()
    problems = []
    for line in log.splitlines():
        level = next((lv for lv in (" WARN ", " ERROR ", " FATAL ") if lv in line), None)
        if level is None:
            continue
        message = line.split(level, 1)[1]
        if message not in seen:
            seen.add(message)
            problems.append(line[:400])
            if len(problems) == limit:
                break
    return problems


class Topology:
    """docker-compose.remote.yml as one compose project on a podman service."""

    def __init__(
        self,
        service: PodmanService,
        project: str = PROJECT,
        ports: Mapping[str, int] | None = None,
        extra_files: Sequence[Path] = (),
        image_tag: str | None = None,
        subnet_prefix: str | None = None,
    ):
        self.ports = {**DEFAULT_PORTS, **(ports or {})}
        env = {PORT_VARIABLES[name]: str(port) for name, port in self.ports.items()}
        if image_tag:
            env["RSM_IMAGE_TAG"] = image_tag
        if subnet_prefix:
            env["RSM_REMOTE_SUBNET_PREFIX"] = subnet_prefix  # e.g. "10.213.77": the network's /24
        self.compose = ComposeProject(service, project, files=[COMPOSE_FILE, *extra_files], env=env)
        self.podman_env = service.environment()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports['kafka']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    # -- lifecycle ----------------------------------------------------------------------------
    def build(self) -> float:
        """Every image: the base broker image first (the broker image is built on it)."""
        t0 = time.monotonic()
        self.compose.run(
            "--profile",
            "build",
            "build",
            "kafka-base",
            "shim-image",
            "seaweedfs",
            "rsm-sidecar",
            timeout=2400,
        )
        self.compose.run("build", "kafka", timeout=1200)
        return time.monotonic() - t0

    def up(self, timeout: float = 300) -> float:
        """Start everything; wait until the sidecar and the broker are healthy. A broker that
        gave up on its remote log metadata topic never becomes healthy (Kafka's hang,
        :data:`BROKER_STUCK`): that ends the wait at once, naming it."""
        t0 = time.monotonic()
        self.compose.run("up", "-d", "kafka", "rsm-sidecar", timeout=600)
        polls = 0

        def healthy() -> bool:
            nonlocal polls
            polls += 1
            if all(self.health(s) == "healthy" for s in ("rsm-sidecar", "kafka")):
                return True
            if polls % 10 == 0 and BROKER_STUCK in self.logs("kafka"):
                raise AssertionError(f"the broker is stuck: it logged {BROKER_STUCK!r}\n{self.diagnose()}")
            return False

        wait_for("the sidecar and the broker to be healthy", healthy, timeout, diagnose=self.diagnose)
        return time.monotonic() - t0

    def diagnose(self) -> str:
        """The broker's warnings and errors (each once, the first 30) and both logs' ends."""
        kafka = self.logs("kafka")
        return (
            "the broker's warnings and errors:\n"
            + "\n".join(log_problems(kafka, 30))
            + "\n-- the sidecar's log, its end:\n"
            + self.logs("rsm-sidecar")[-3000:]
            + "\n-- the broker's log, its end:\n"
            + kafka[-3000:]
        )

    def down(self) -> None:
        self.compose.run("down", "-v", "--remove-orphans", timeout=600, check=False)

    def containers(self) -> dict[str, dict]:
        return self.compose.containers()

    def health(self, service: str) -> str | None:
        return self.containers().get(service, {}).get("Health")

    def logs(self, service: str) -> str:
        return self.compose.logs(service)

    def exec(self, service: str, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.compose.run("exec", "-T", service, *argv, timeout=timeout, check=False)

    def kill_sidecar(self) -> None:
        """SIGKILL: no drain, no clean-up (a crashed or OOM-killed pod)."""
        self.compose.run("kill", "-s", "KILL", "rsm-sidecar")

    def start_sidecar(self) -> None:
        self.compose.run("start", "rsm-sidecar")

    def inspect(self, *args: str) -> dict:
        """``rsm-sidecar inspect ... --json`` inside the sidecar container."""
        proc = self.exec("rsm-sidecar", "rsm-sidecar", "inspect", *args, "-c", SIDECAR_CONFIG, "--json")
        if proc.returncode != 0:
            raise AssertionError(
                f"inspect {' '.join(args)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        return json.loads(proc.stdout)

    def tiered_segments(self, topic: str) -> list[dict]:
        """The topic's tiered segments, by start offset."""
        return sorted(self.inspect("ls", "--topic", topic)["segments"], key=lambda s: s["start_offset"])

    def renew_certificates(self) -> None:
        """cert-manager's renewal: new keys and certificates for both sides, swapped in place in
        the volumes the containers mount (the same paths, new files); nothing is restarted."""
        proc = self.compose.run("run", "--rm", "--no-deps", "certs-init", *_certs_command(self), "--renew")
        print(proc.stdout, end="")

    def served_certificate_is_current(self) -> bool:
        """Whether the sidecar presents the certificate its tls.crt holds now (a TLS handshake
        from inside its container, with the sidecar's own certificate as the client's)."""
        proc = self.exec("rsm-sidecar", "python", "-c", _SERVED_CERTIFICATE)
        if proc.returncode != 0:
            raise AssertionError(f"TLS handshake with the sidecar failed:\n{proc.stdout}{proc.stderr}")
        return proc.stdout.strip() == "same"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            return r.read().decode()


_SERVED_CERTIFICATE = """
import socket, ssl
tls = "/etc/rsm-sidecar/tls/"
ctx = ssl.create_default_context(cafile=tls + "ca.crt")
ctx.load_cert_chain(tls + "tls.crt", tls + "tls.key")
ctx.set_alpn_protocols(["h2"])
with socket.create_connection(("127.0.0.1", 9095), timeout=10) as raw:
    with ctx.wrap_socket(raw, server_hostname="rsm-sidecar.kafka.svc") as conn:
        served = conn.getpeercert(binary_form=True)
with open(tls + "tls.crt") as f:
    print("same" if served == ssl.PEM_cert_to_DER_cert(f.read()) else "different")
"""


def _certs_command(topology: Topology) -> list[str]:
    """certs-init's command as the compose file gives it."""
    out = topology.compose.run("config", "--format", "json").stdout
    return list(json.loads(out)["services"]["certs-init"]["command"])


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


# -- clients on the host ----------------------------------------------------------------------------
def record(i: int) -> tuple[bytes, bytes]:
    """Record ``i``: 10-byte key, 256-byte value, compressible like JSON would be."""
    return f"k{i:09d}".encode(), (hashlib.sha256(str(i).encode()).hexdigest() * 4).encode()


def create_tiered_topic(bootstrap: str, topic: str, segment_bytes: int = 1 << 20) -> None:
    from confluent_kafka.admin import NewTopic

    config = {
        "remote.storage.enable": "true",
        "segment.bytes": str(segment_bytes),
        "local.retention.ms": "1000",
        "retention.ms": "-1",
    }
    create_topics(bootstrap, [NewTopic(topic, 1, 1, config=config)], timeout=60)


def produce(bootstrap: str, topic: str, count: int) -> bytes:
    """``count`` records (:func:`record`) to partition 0; the SHA-256 of keys and values."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "none", "acks": "all"}
    )
    digest = hashlib.sha256()
    for i in range(count):
        key, value = record(i)
        digest.update(key + value)
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=0)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(120)
    if left:
        raise AssertionError(f"{left} records not delivered to {topic}")
    return digest.digest()


def consume_from_zero(
    bootstrap: str,
    topic: str,
    count: int,
    timeout: float = 240,
    on_record: Callable[[int], None] | None = None,
    on_error: Callable[[str], None] | None = None,
) -> tuple[int, bytes]:
    """Read partition 0 from offset 0 one record at a time until ``count`` records: each must be
    the next offset (no gap, no duplicate). ``on_record(n)`` runs after the n-th record; a
    consumer error fails the read unless ``on_error`` takes it (the consumer then fetches the
    same offset again). Returns the count read and the SHA-256 of keys and values. Small
    fetches make many remote reads."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"remote-topology-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": 256 * 1024,
            "fetch.max.bytes": 1024 * 1024,
            # little read-ahead: the consumer fetches close to where it reads
            "queued.max.messages.kbytes": 256,
            "queued.min.messages": 100,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    digest, n, deadline = hashlib.sha256(), 0, time.monotonic() + timeout
    try:
        while n < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if on_error is None:
                    raise AssertionError(f"{topic}: consumer error at offset {n}: {msg.error()}")
                on_error(str(msg.error()))
                continue
            if msg.offset() != n:
                raise AssertionError(f"{topic}: offset {msg.offset()} after {n} records")
            digest.update((msg.key() or b"") + (msg.value() or b""))
            n += 1
            if on_record is not None:
                on_record(n)
    finally:
        consumer.close()
    return n, digest.digest()


def wait_until_tiered(topology: Topology, topic: str, min_segments: int, timeout: float = 180) -> list[dict]:
    """At least ``min_segments`` segments tiered, contiguous from offset 0."""

    def contiguous():
        segs = topology.tiered_segments(topic)
        ok = all(a["end_offset"] + 1 == b["start_offset"] for a, b in zip(segs, segs[1:]))
        return segs if len(segs) >= min_segments and segs[0]["start_offset"] == 0 and ok else None

    return wait_for(f"{topic} to be tiered from offset 0", contiguous, timeout, interval=2)


def wait_until_local_log_starts_after(
    topology: Topology, topic: str, offset: int, timeout: float = 120
) -> int:
    """Until the broker's own log of ``topic``-0 starts after ``offset``: the tiered segments left
    its disk (local.retention.ms), so reads of them are remote reads. The broker's first
    retention check runs 30 s after it started (``log.initial.task.delay.ms``), then every
    ``log.retention.check.interval.ms``: a fixed sleep after tiering is not enough on a fast
    start. Returns the local log's first offset."""

    def local_start():
        proc = topology.exec("kafka", "ls", f"/var/lib/kafka/data/{topic}-0", timeout=60)
        bases = [int(name[: -len(".log")]) for name in proc.stdout.split() if name.endswith(".log")]
        return min(bases) if proc.returncode == 0 and bases and min(bases) > offset else None

    return wait_for(f"{topic}-0's local log to start after offset {offset}", local_start, timeout, interval=1)


# -- make compose-demo TOPOLOGY=remote ---------------------------------------------------------------
def demo(service: PodmanService) -> int:
    topology = Topology(service)
    print(f"images built in {topology.build():.0f}s", flush=True)
    print(f"sidecar and broker healthy after {topology.up():.0f}s", flush=True)
    topic, count = f"remote-demo-{int(time.time())}", 40_000
    create_tiered_topic(topology.bootstrap, topic)
    sent = produce(topology.bootstrap, topic, count)
    segments = wait_until_tiered(topology, topic, 6)
    wait_until_local_log_starts_after(topology, topic, segments[-1]["end_offset"])
    before = metric_sum(topology.metrics(), "rsm_bytes_total", kind="fetch_served")
    n, read = consume_from_zero(topology.bootstrap, topic, count)
    served = metric_sum(topology.metrics(), "rsm_bytes_total", kind="fetch_served") - before
    ok = (n, read) == (count, sent)
    print(
        f"\n{topic}: {count:,} records produced, {len(segments)} segments tiered over TCP + mTLS "
        f"(stream mode) into s3://tiered-storage, {n:,} read back from offset 0 "
        f"({'same' if read == sent else 'DIFFERENT'} SHA-256); the sidecar served {served / 2**20:.1f} MiB "
        "from the bucket meanwhile.\n"
        f"The cluster keeps running.\n"
        f"  look:  {topology.compose.hint} ps | logs -f rsm-sidecar kafka\n"
        f"  metrics: {topology.metrics_url}   bootstrap: {topology.bootstrap}   "
        f"S3: http://127.0.0.1:{topology.ports['s3']}\n"
        "  stop:  make compose-down TOPOLOGY=remote",
        flush=True,
    )
    if not ok:
        print("demo FAILED: the records read back differ from those produced", file=sys.stderr)
    return 0 if ok else 1
