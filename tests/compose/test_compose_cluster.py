"""docker-compose.yml really running: every image built from docker/Dockerfile, the whole
cluster (a KRaft controller, three brokers, three sidecars) started with `docker compose up` on
podman (devstack.containers prepares the engine: apt, settings, a debootstrap-made
debian:bookworm-slim), and checked as a user would:

* the demo producer's records, replicated on the three brokers, went through the leaders'
  shims and sidecars into SeaweedFS and read back from remote storage with the same digests
  (its `demo OK`);
* `rsm-sidecar inspect ls/verify` inside a sidecar container agree with the bucket as the
  host sees it over S3, and every segment verifies;
* the Iceberg job wrote every record of the tiered demo-orders segments to the REST catalog
  (read back on the host with PyIceberg), as an application of the compose Spark master whose
  executor ran on the worker; the follower keeps converting on the same cluster and serves its
  metrics; the current-state table beside it holds one row per key, the key's latest record;
* every sidecar's health check and metrics endpoint answer, and the sidecars' fetch counters
  grow when a consumer on the host reads from offset 0;
* the sidecar of a topic's leader, killed with SIGKILL while its broker tiers the topic, comes
  back, and every record of that topic is tiered and reads back; `down -v` leaves no container
  or volume.

The images are built in the background while the rest of the suite runs (tests/podman_images.py);
the cold build's time, the wait for it and the cached rebuild are printed (`-s` shows them)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import subprocess
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from devstack import common
from devstack.containers import ComposeProject, PodmanService
from tests import podman_images

REPO = Path(__file__).resolve().parents[2]
PROJECT = "rsm-compose-test"
BOOTSTRAP = "127.0.0.1:29092"  # broker 1; the metadata names the other two (29093, 29094)
S3_ENDPOINT = "http://127.0.0.1:8333"
S3_CREDENTIALS = {"aws_access_key_id": "demo-access", "aws_secret_access_key": "demo-secret-key"}
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
SIDECARS = ("sidecar-1", "sidecar-2", "sidecar-3")
#: each sidecar's metrics, published on the host
METRICS_URLS = tuple(f"http://127.0.0.1:{port}/metrics" for port in (9096, 9097, 9098))
SIDECAR_CONFIG = "/etc/rsm-sidecar/sidecar.toml"
ONE_SHOTS = ("keys-init", "demo-producer", "iceberg-convert", "iceberg-current")
# the first test also builds every image and starts the cluster (cold: see the module docstring)
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2700)]


class Compose(ComposeProject):
    """The compose CLI on the podman service, for this test's project."""

    def __init__(self, service: PodmanService):
        super().__init__(service, PROJECT)

    def exec(self, service: str, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.run("exec", "-T", service, *argv, timeout=timeout, check=False)


#: a podman call per poll: every 3 s unless a caller says otherwise
wait_for = functools.partial(common.wait_for, interval=3.0)


@pytest.fixture(scope="module")
def compose(tmp_path_factory):
    service = podman_images.podman_service()  # the images, built in the background
    c = Compose(service)
    c.run("down", "-v", "--remove-orphans", timeout=300, check=False)  # leftovers of a killed run
    t2 = time.monotonic()
    try:
        up_log = tmp_path_factory.getbasetemp() / "compose-up.log"
        with open(up_log, "w") as out:
            up = subprocess.Popen([*c.argv, "up", "-d"], cwd=REPO, env=c.env, stdout=out, stderr=out)
        healthy_at: dict[str, datetime] = {}  # when `ps` first showed each service healthy

        def one_shots_done():
            if up.poll() not in (None, 0):
                raise AssertionError(f"docker compose up -d failed:\n{up_log.read_text()[-4000:]}")
            rows = c.containers()
            for service, row in rows.items():
                if row.get("Health") == "healthy":
                    healthy_at.setdefault(service, datetime.now(UTC).replace(tzinfo=None))
            done = {s: rows.get(s, {}).get("State") == "exited" for s in ONE_SHOTS}
            return up.poll() is not None and all(done.values())

        wait_for(
            "the demo producer and the Iceberg jobs to finish",
            one_shots_done,
            1200,
            interval=1.0,
            diagnose=lambda: "".join(c.logs(s)[-3000:] for s in ONE_SHOTS[1:]),
        )
        assert up.wait() == 0, f"docker compose up -d failed:\n{up_log.read_text()[-4000:]}"
        print(f"cluster up and the one-shot jobs done in {time.monotonic() - t2:.1f}s")
        _print_services(c, healthy_at)
        yield c
    finally:
        for name in (*SIDECARS, *BROKERS, "controller", *ONE_SHOTS[1:]):
            (tmp_path_factory.getbasetemp() / f"compose-{name}.log").write_text(c.logs(name))
        c.run("down", "-v", "--remove-orphans", timeout=600, check=False)
        left, volumes = c.leftovers()
        assert not left and not volumes, f"down -v left containers {left} and volumes {volumes}"


def _print_services(compose: Compose, healthy_at: dict[str, datetime]) -> None:
    """Per service: image, its size, and seconds from container start until `ps` first showed
    it healthy, polled every second (docker/README.md quotes these)."""

    def parse(stamp: str) -> datetime:  # podman: 2026-11-26T06:08:31.123456789Z (or +00:00)
        m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?", stamp)
        assert m, stamp
        return datetime.fromisoformat(f"{m.group(1)}.{(m.group(2) or '0')[:6].ljust(6, '0')}")

    for service, row in sorted(compose.containers().items()):
        info = json.loads(
            subprocess.run(
                ["podman", "inspect", row["ID"]], env=compose.env, capture_output=True, text=True
            ).stdout
        )[0]
        size = subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.Size}}", info["Image"]],
            env=compose.env,
            capture_output=True,
            text=True,
        ).stdout.strip()
        state = info["State"]
        if service in healthy_at:
            ready = f"{(healthy_at[service] - parse(state['StartedAt'])).total_seconds():.0f}s to healthy"
        else:
            ready = "no health check"
        print(f"  {service:16} {row['Image']:32} {int(size or 0) / 1e6:7.0f} MB  {ready}")


def _exit_code(compose: Compose, service: str) -> int:
    return int(compose.containers()[service]["ExitCode"])


def test_one_shot_jobs_succeeded_and_demo_read_back_from_remote(compose):
    for service in ONE_SHOTS:
        assert _exit_code(compose, service) == 0, f"{service}:\n{compose.logs(service)[-4000:]}"
    demo = compose.logs("demo-producer")
    assert "demo OK" in demo, demo[-4000:]
    # every topic read back in full with matching digests, and served (partly) from remote
    for topic in ("demo-orders", "demo-clicks", "demo-raw"):
        assert f"{topic}: 30,000 of 30,000 records read back" in demo, demo[-4000:]


def test_long_running_services_are_healthy(compose):
    services = (
        "seaweedfs",
        *SIDECARS,
        "controller",
        *BROKERS,
        "registry",
        "iceberg-rest",
        "spark-master",
        "spark-worker",
        "iceberg-follow",
    )
    # a health check still "starting" (first probe not yet passed: iceberg-follow probes every
    # 10 s) is waited for, as `docker compose up --wait` would; "unhealthy" or stopped fails at once
    deadline = time.monotonic() + 120
    while True:
        rows = compose.containers()
        for service in services:
            assert rows[service]["State"] == "running", rows[service]
            assert rows[service]["Health"] in ("healthy", "starting"), rows[service]
        starting = [s for s in services if rows[s]["Health"] == "starting"]
        if not starting:
            break
        assert time.monotonic() < deadline, f"health checks still starting after 120 s: {starting}"
        time.sleep(2)
    for sidecar in SIDECARS:
        probe = compose.exec(sidecar, "rsm-healthcheck", "127.0.0.1:9095")
        assert probe.returncode == 0, probe.stdout + probe.stderr
    # the three brokers are one cluster: each is in the metadata, with the controller's quorum
    from confluent_kafka.admin import AdminClient

    assert sorted(AdminClient({"bootstrap.servers": BOOTSTRAP}).list_topics(timeout=30).brokers) == [1, 2, 3]


def _inspect(compose: Compose, *args: str) -> dict:
    proc = compose.exec("sidecar-1", "rsm-sidecar", "inspect", *args, "-c", SIDECAR_CONFIG, "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _bucket_keys() -> set[str]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=S3_ENDPOINT, region_name="us-east-1", **S3_CREDENTIALS)
    keys: set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="tiered-storage"):
        keys.update(obj["Key"] for obj in page.get("Contents", []))
    return keys


def test_inspect_in_the_sidecar_agrees_with_the_bucket(compose):
    listing = _inspect(compose, "ls")
    assert not listing["errors"]
    segments = listing["segments"]
    topics = {s["topic"] for s in segments}
    assert {"demo-orders", "demo-clicks", "demo-raw"} <= topics
    keys = _bucket_keys()
    manifests = {k for k in keys if k.endswith(".rsm-manifest")}
    assert len(manifests) == len(segments), (len(manifests), len(segments))
    for seg in segments:
        assert any(seg["segment_id"] in k for k in manifests), seg
    verified = _inspect(compose, "verify", "--topic", "demo-orders", "--deep")
    assert verified["summary"]["failed"] == 0 and verified["summary"]["ok"] >= 2, verified["summary"]


def _catalog():
    from pyiceberg.catalog import load_catalog

    return load_catalog(
        "compose",
        type="rest",
        uri="http://127.0.0.1:8181",
        **{
            "s3.endpoint": S3_ENDPOINT,
            "s3.region": "us-east-1",
            "s3.path-style-access": "true",
            "s3.access-key-id": S3_CREDENTIALS["aws_access_key_id"],
            "s3.secret-access-key": S3_CREDENTIALS["aws_secret_access_key"],
        },
    )


def test_iceberg_table_holds_every_tiered_demo_orders_record(compose):
    tiered = [s for s in _inspect(compose, "ls", "--topic", "demo-orders")["segments"]]
    expected = sum(s["end_offset"] - s["start_offset"] + 1 for s in tiered)
    table = _catalog().load_table("kafka.demo_orders")
    rows = table.scan(selected_fields=("kafka",)).to_arrow()
    offsets = sorted(r["offset"] for r in rows.column("kafka").to_pylist())
    assert len(offsets) == expected > 0
    assert offsets == sorted({o for s in tiered for o in range(s["start_offset"], s["end_offset"] + 1)})


def test_the_current_state_table_holds_the_latest_record_of_every_customer(compose):
    """``iceberg-current`` kept ``kafka.demo_orders_current``: one row per key (the customer),
    its latest record among the offsets it converted, as the append table (kept by the
    follower) has them."""
    from rsm_sidecar.iceberg.committing import markers as mk

    catalog = _catalog()
    current = catalog.load_table("kafka.demo_orders_current")
    upto = mk.read_state(current).next_offsets
    assert upto and current.properties["rsm.mode"] == "upsert"

    def append_table_covers():
        table = catalog.load_table("kafka.demo_orders")
        have = mk.read_state(table).next_offsets
        return table if all(have.get(p, 0) >= n for p, n in upto.items()) else None

    appended = wait_for("the follower to convert what iceberg-current did", append_table_covers, 300)
    latest: dict[bytes, tuple] = {}
    for r in appended.scan(selected_fields=("key", "val", "kafka")).to_arrow().to_pylist():
        k, where = r["key"]["__raw__"], (r["kafka"]["partition"], r["kafka"]["offset"])
        if where[1] < upto.get(where[0], 0) and (k not in latest or where > latest[k][0]):
            latest[k] = (where, r["val"] is None)
    want = {k: where for k, (where, tombstone) in latest.items() if not tombstone}
    rows = current.scan(selected_fields=("key", "val", "kafka")).to_arrow().to_pylist()
    got = {r["key"]["__raw__"]: (r["kafka"]["partition"], r["kafka"]["offset"]) for r in rows}
    assert len(got) == len(rows) > 0  # one row per key
    assert got == want
    assert all(r["val"]["order_id"] for r in rows)  # the decoded columns of the append table


def test_the_iceberg_jobs_ran_on_the_spark_cluster(compose):
    """The master lists the conversion as a finished application and the follower as a running
    one, each with its executor on the worker; the follower's rounds succeed."""
    probe = (
        "import json, urllib.request; "
        "print(json.dumps(json.load(urllib.request.urlopen('http://127.0.0.1:8080/json/', timeout=10))))"
    )
    proc = compose.exec("spark-master", "python", "-c", probe)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    master = json.loads(proc.stdout)
    assert [w["state"] for w in master["workers"]] == ["ALIVE"]
    done = [a["name"] for a in master["completedapps"]]
    running = [a["name"] for a in master["activeapps"]]
    assert "rsm-iceberg-demo-orders" in done, master
    assert "rsm-iceberg-follow-demo-orders" in running, master

    def follower_rounds():
        with urllib.request.urlopen("http://127.0.0.1:9099/metrics", timeout=10) as r:
            text = r.read().decode()
        ok = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("rsm_iceberg_follow_rounds_total{")
            and ('outcome="nothing_new"' in line or 'outcome="committed"' in line)
        )
        failed = [
            line for line in text.splitlines() if 'rsm_iceberg_follow_rounds_total{outcome="failed"}' in line
        ]
        assert failed and float(failed[0].rsplit(" ", 1)[1]) == 0, text
        return ok >= 1

    wait_for(
        "a follower round",
        follower_rounds,
        300,
        interval=5,
        diagnose=lambda: compose.logs("iceberg-follow")[-3000:],
    )


def _fetch_served() -> float:
    """Bytes the three sidecars served to remote reads so far."""
    total = 0.0
    for url in METRICS_URLS:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        total += sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("rsm_bytes_total{") and 'kind="fetch_served"' in line
        )
    return total


def _consume_all(topic: str, expected: int) -> tuple[int, bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"compose-test-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    digest, n, deadline = hashlib.sha256(), 0, time.monotonic() + 180
    try:
        while n < expected and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert not msg.error(), msg.error()
            assert msg.offset() == n, f"offset {msg.offset()} after {n} records"
            digest.update(msg.key() or b"")
            digest.update(msg.value() or b"")
            n += 1
    finally:
        consumer.close()
    return n, digest.digest()


def test_metrics_answer_and_count_a_host_consumer_reading_from_remote(compose):
    before = _fetch_served()
    n, _ = _consume_all("demo-raw", 30000)
    assert n == 30000
    assert _fetch_served() > before, "the host consumer's early records did not come through a sidecar"


def test_sidecar_killed_while_tiering_loses_nothing(compose):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, count = "restart-check", 60000  # about 9 MiB: 9 segments of 1 MiB
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    config = {
        "remote.storage.enable": "true",
        "segment.bytes": str(1 << 20),
        "local.retention.ms": "1000",
    }
    for fut in admin.create_topics([NewTopic(topic, 1, config=config)]).values():  # on 3 brokers
        fut.result(60)

    def leader_of_partition_0():
        # the new topic may be in the metadata before its partition (a broker not updated yet)
        partition = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(0)
        return partition.leader if partition is not None and partition.leader > 0 else None

    leader = wait_for(f"{topic} to have a leader", leader_of_partition_0, 60, interval=0.5)
    sidecar = f"sidecar-{leader}"  # the sidecar of the broker that tiers the topic
    producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 20, "compression.type": "none"})
    digest = hashlib.sha256()
    for i in range(count):
        key, value = f"k{i}".encode(), hashlib.sha256(str(i).encode()).digest() * 4
        digest.update(key)
        digest.update(value)
        producer.produce(topic, key=key, value=value)
        if i == count // 2:
            compose.run("kill", "-s", "KILL", sidecar)  # mid-run, while segments roll
        producer.poll(0)
    assert producer.flush(60) == 0
    compose.run("start", sidecar)
    wait_for(
        f"{sidecar} to be healthy again",
        lambda: compose.containers()[sidecar].get("Health") == "healthy",
        180,
        diagnose=lambda: compose.logs(sidecar)[-3000:],
    )

    def tiered_segments():
        segs = sorted(_inspect(compose, "ls", "--topic", topic)["segments"], key=lambda s: s["start_offset"])
        contiguous = all(a["end_offset"] + 1 == b["start_offset"] for a, b in zip(segs, segs[1:]))
        return segs if len(segs) >= 6 and segs[0]["start_offset"] == 0 and contiguous else None

    def what_was_tiered() -> str:  # on a timeout: the listed ranges and what the two sides logged last
        try:
            ranges = [
                (s["start_offset"], s["end_offset"])
                for s in _inspect(compose, "ls", "--topic", topic)["segments"]
            ]
        except Exception as e:  # the listing's own failure is part of the story
            ranges = [f"inspect ls failed: {e}"]
        broker = f"kafka-{leader}"
        logs = f"{sidecar}:\n{compose.logs(sidecar)[-2000:]}\n{broker}:\n{compose.logs(broker)[-4000:]}"
        return f"listed: {ranges}\n{logs}"

    # every closed segment, the ones rolled while the sidecar was down included, gets tiered
    wait_for(
        f"{topic} to be tiered from offset 0 without a gap",
        tiered_segments,
        300,
        interval=5,
        diagnose=what_was_tiered,
    )
    verified = _inspect(compose, "verify", "--topic", topic, "--deep")
    assert verified["summary"]["failed"] == 0, verified
    n, read_digest = _consume_all(topic, count)
    assert (n, read_digest) == (count, digest.digest())
