"""The remote topology really running (docker-compose.remote.yml on podman, driven by
devstack.remote_topology): a broker built from docker/Dockerfile's strimzi-kafka target (on the
kafka target's image, standing in for Strimzi's) and the sidecar image run read-only, non-root,
without capabilities, as two containers that share no volume; the shim streams to the sidecar
over TCP with mutual TLS (certificates from a test CA, laid out as cert-manager's Secrets), the
sidecar stores in S3 on SeaweedFS. The sidecar runs the Helm chart's rendered configuration and
the broker the shim settings of the Strimzi example (test_helm_chart.py and
test_strimzi_examples.py check both files).

Checked as a user would: records produced, tiered and read back from offset 0 one by one; the
sidecar killed with SIGKILL and started again while a consumer reads from remote storage, and
the consumer goes on without a gap; the chart's probe answers over mTLS and nothing without a
client certificate gets in; the shim image mounted as an image volume reaches the sidecar; every
metric the dashboard and the alerts name exists on this sidecar's /metrics and on the broker's
JMX exporter (run with deploy/strimzi/kafka-metrics.yaml's rules).

Images are the compose test's (tests/podman_images.py builds rsm-sidecar:dev,
rsm-sidecar-kafka:dev and rsm-sidecar-seaweedfs:dev in the background while the suite runs): only
the two small targets are new here. `-s` prints the timings.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from devstack.common import free_ports, wait_for
from devstack.remote_topology import (
    Topology,
    consume_from_zero,
    create_tiered_topic,
    metric_sum,
    produce,
    wait_until_local_log_starts_after,
    wait_until_tiered,
)
from tests import podman_images
from tests.deploy.conftest import CHART, REPO, STRIMZI
from tests.deploy.k8s import helm_template
from tests.deploy.test_monitoring import dashboard_queries, metric_names, rules

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

#: the compose project; RSM_IMAGE_TAG builds and runs images under another tag than the compose test's
PROJECT = os.environ.get("RSM_REMOTE_TEST_PROJECT", "rsm-remote-test")
TOPIC, COUNT = "remote-topology", 24_000  # about 6 MiB: 6 segments of 1 MiB
RECORD_BYTES = 266  # devstack.remote_topology.record(): key and value


@pytest.fixture(scope="module")
def topology(tmp_path_factory, jmx_exporter):
    service = podman_images.podman_service()  # the compose images, built in the background
    work = tmp_path_factory.mktemp("remote-topology")
    kafka, metrics, s3, broker_metrics = free_ports(4)
    override = _jmx_exporter_override(work, jmx_exporter, broker_metrics)
    topo = Topology(
        service,
        PROJECT,
        ports={"kafka": kafka, "metrics": metrics, "s3": s3},
        extra_files=[override],
        image_tag=os.environ.get("RSM_IMAGE_TAG"),
        # a /24 of its own, apart from the demo's (podman refuses two networks on one subnet)
        subnet_prefix=f"10.213.{random.randrange(100, 250)}",
    )
    topo.broker_metrics_url = f"http://127.0.0.1:{broker_metrics}/metrics"
    topo.down()  # leftovers of a killed run
    try:
        print(f"images built in {topo.build():.1f}s")
        print(f"sidecar and broker healthy {topo.up():.1f}s after `up`")
        yield topo
    finally:
        for name in ("rsm-sidecar", "kafka", "certs-init"):
            (work / f"{name}.log").write_text(topo.logs(name))
        topo.down()
        left, _ = topo.compose.leftovers()
        assert not left, f"down left containers {left}"


def _jmx_exporter_override(work: Path, agent: Path, port: int) -> Path:
    """The broker with the Prometheus JMX exporter agent and the rules of
    deploy/strimzi/kafka-metrics.yaml, as Strimzi runs it (metricsConfig: jmxPrometheusExporter)."""
    (cm,) = [d for d in yaml.safe_load_all((STRIMZI / "kafka-metrics.yaml").read_text()) if d]
    agent_opts = "-javaagent:/opt/jmx-exporter/agent.jar=9404:/opt/jmx-exporter/config.yml"
    rules = work / "kafka-metrics-config.yml"
    rules.write_text(cm["data"]["kafka-metrics-config.yml"])
    override = work / "jmx-exporter.override.yml"
    override.write_text(
        yaml.safe_dump(
            {
                "services": {
                    "kafka": {
                        "environment": {"KAFKA_OPTS": agent_opts},
                        "volumes": [
                            f"{agent}:/opt/jmx-exporter/agent.jar:ro",
                            f"{rules}:/opt/jmx-exporter/config.yml:ro",
                        ],
                        "ports": [f"127.0.0.1:{port}:9404"],
                    }
                }
            }
        )
    )
    return override


@pytest.fixture(scope="module")
def produced(topology) -> dict:
    """TOPIC with COUNT records, tiered from offset 0 (at least 5 segments)."""
    t0 = time.monotonic()
    create_tiered_topic(topology.bootstrap, TOPIC)
    digest = produce(topology.bootstrap, TOPIC, COUNT)
    segments = wait_until_tiered(topology, TOPIC, 5)
    print(f"{COUNT:,} records produced and {len(segments)} segments tiered in {time.monotonic() - t0:.1f}s")
    wait_until_local_log_starts_after(topology, TOPIC, segments[-1]["end_offset"])
    return {"digest": digest, "segments": segments}


def _inspect(topology, container: str) -> dict:
    """`podman inspect` of a service's container (compose v2+ names it <project>-<service>-1)."""
    cid = topology.containers()[container]["ID"]
    out = subprocess.run(["podman", "inspect", cid], env=topology.podman_env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)[0]


# -- the containers ------------------------------------------------------------------------------
def test_broker_and_sidecar_share_no_volume(topology):
    sidecar, broker = _inspect(topology, "rsm-sidecar"), _inspect(topology, "kafka")

    def sources(c):
        return {m.get("Name") or m["Source"] for m in c["Mounts"]}

    assert not sources(sidecar) & sources(broker), (sources(sidecar), sources(broker))
    assert {m["Destination"] for m in broker["Mounts"]} >= {"/mnt/rsm-tls", "/var/lib/kafka/data"}


def test_sidecar_runs_read_only_non_root_without_capabilities(topology):
    c = _inspect(topology, "rsm-sidecar")
    assert c["HostConfig"]["ReadonlyRootfs"] is True
    assert c["Config"]["User"] == "10001:10001"
    assert not c["EffectiveCaps"], c["EffectiveCaps"]
    proc = topology.exec("rsm-sidecar", "sh", "-c", "id -u; touch /etc/rsm-sidecar/x")
    assert proc.stdout.split()[0] == "10001"
    assert proc.returncode != 0 and "Read-only file system" in proc.stderr
    image = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Config.User}}", c["Image"]],
        env=topology.podman_env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert image == "10001:10001"  # numeric: runAsNonRoot can verify it


def test_broker_runs_the_strimzi_kafka_image_with_stream_mode_over_mtls(topology):
    proc = topology.exec(
        "kafka", "sh", "-c", "cat /opt/kafka/config/server.properties; ls /opt/kafka/plugins/rsm-sidecar"
    )
    props = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert props["remote.log.storage.manager.class.path"] == "/opt/kafka/plugins/rsm-sidecar/*"
    assert proc.stdout.splitlines()[-1] == "rsm-sidecar-shim.jar"
    assert props["rsm.config.transfer.mode"] == "stream"
    assert props["rsm.config.sidecar.target"] == "rsm-sidecar.kafka.svc:9095"
    assert props["rsm.config.tls.enabled"] == "true"
    assert props["rsm.config.tls.key.file"] == "/mnt/rsm-tls/tls.key"


def test_only_the_sidecar_holds_its_fixed_address_and_the_rest_lease_from_another_range(topology):
    """The sidecar's fixed .10 (its Service's address) lies outside the range podman leases to
    the other containers, so no container started before it can have taken .10 (which once
    failed `up` with "requested ip address ... is already allocated")."""
    prefix = topology.compose.env["RSM_REMOTE_SUBNET_PREFIX"]

    def address(service: str) -> str:
        (ip,) = {n["IPAddress"] for n in _inspect(topology, service)["NetworkSettings"]["Networks"].values()}
        return ip

    assert address("rsm-sidecar") == f"{prefix}.10"
    broker = address("kafka")
    assert broker.startswith(f"{prefix}.") and int(broker.rsplit(".", 1)[1]) >= 129, broker
    (network,) = {n for n in _inspect(topology, "kafka")["NetworkSettings"]["Networks"]}
    out = subprocess.run(
        ["podman", "network", "inspect", network], env=topology.podman_env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    (subnet,) = json.loads(out.stdout)[0]["subnets"]
    assert subnet["lease_range"]["start_ip"] == f"{prefix}.129", subnet


def test_broker_resolves_its_advertised_name_without_dns(topology):
    """The broker's remote log metadata clients bootstrap from its own advertised PLAINTEXT
    listener; its /etc/hosts names it (as Kubernetes writes a pod's), so a slow or failed DNS
    cannot leave those clients unable to reach their broker, which in Kafka 4.4 ends in a
    stuck broker (docs/operations.md)."""
    proc = topology.exec(
        "kafka", "sh", "-c", "cat /opt/kafka/config/server.properties; echo ---; cat /etc/hosts"
    )
    config, hosts = proc.stdout.split("---\n")
    props = dict(line.split("=", 1) for line in config.splitlines() if "=" in line)
    listeners = dict(entry.split("://") for entry in props["advertised.listeners"].split(","))
    advertised = listeners["PLAINTEXT"].rsplit(":", 1)[0]
    networks = _inspect(topology, "kafka")["NetworkSettings"]["Networks"]
    (address,) = {n["IPAddress"] for n in networks.values()}
    names = {
        name for line in hosts.splitlines() if line.split()[:1] == [address] for name in line.split()[1:]
    }
    assert advertised in names, (advertised, address, hosts)


# -- produce, tier, read back ---------------------------------------------------------------------
def test_records_read_back_from_offset_zero_across_a_sidecar_kill(topology, produced):
    """One consumer reads the topic from offset 0, record by record, with small fetches, so that
    it reads from remote storage as it goes. A third of the way in the sidecar gets SIGKILL and
    is started again 2 s later: until then no error is allowed; while it is gone the consumer may
    get fetch errors (or not notice, reading what the shim read ahead) and fetches the same
    offset again. Every record
    arrives once, in order, with the digest produced; the bytes came through the sidecar; copies
    go on after the restart (new mTLS connections), and what is stored verifies."""
    before = metric_sum(topology.metrics(), "rsm_bytes_total", kind="fetch_served")
    kill_at = COUNT // 3
    state: dict[str, float] = {"last": time.monotonic(), "max_gap": 0.0}
    errors: list[str] = []

    def on_record(n: int) -> None:
        now = time.monotonic()
        if "killed" in state:
            state["max_gap"] = max(state["max_gap"], now - state["last"])
        state["last"] = now
        if n == kill_at:
            topology.kill_sidecar()
            state["killed"] = time.monotonic()
            threading.Timer(2.0, topology.start_sidecar).start()

    def on_error(error: str) -> None:
        assert "killed" in state, f"a fetch failed before the sidecar was killed: {error}"
        errors.append(error)

    # cert-manager renews both certificates in place (new keys, same paths, the kubelet's atomic
    # ..data swap) before the kill: the running sidecar serves the new one at its next handshake,
    # without a restart; the broker's shim goes on with its (still valid) one until it reads its
    # files again (tls.reload.interval.ms; tests/e2e/test_remote_sidecar.py covers the shim's side)
    topology.renew_certificates()
    assert topology.served_certificate_is_current(), "the running sidecar still serves the old certificate"
    t0 = time.monotonic()
    n, digest = consume_from_zero(topology.bootstrap, TOPIC, COUNT, on_record=on_record, on_error=on_error)
    assert (n, digest) == (COUNT, produced["digest"])
    print(
        f"{n:,} records read back from offset 0 in {time.monotonic() - t0:.1f}s; the longest wait for a "
        f"record after the kill was {state['max_gap']:.1f}s, with {len(errors)} fetch errors: "
        f"{sorted(set(errors))[:2]}"
    )
    # the kill happened while the consumer read (it may not have had to wait: the shim reads ahead
    # up to fetch.readahead.bytes over the wire, so the 2 s outage can fall inside what it holds);
    # that it read from remote storage is what the restarted sidecar's counters show below
    assert "killed" in state, "the consumer finished before the kill"
    wait_for("the sidecar to be healthy again", lambda: topology.health("rsm-sidecar") == "healthy", 120)
    assert topology.served_certificate_is_current(), "the restarted sidecar serves the old certificate"
    served = metric_sum(topology.metrics(), "rsm_bytes_total", kind="fetch_served")
    # the restarted sidecar's counters start at 0: what it served after the kill alone. The shim
    # reads ahead within a segment and into the next one's first window, never further: every
    # segment starting two or more segments after the one the kill fell in came from it
    segments = sorted(produced["segments"], key=lambda s: s["start_offset"])
    killed_in = next(i for i, s in enumerate(segments) if s["end_offset"] >= kill_at)
    after = segments[killed_in + 2 :]
    assert after, "the topic is too short for the kill to be a third of the way in"
    must_serve = sum(s["end_offset"] - s["start_offset"] + 1 for s in after) * RECORD_BYTES
    assert served >= must_serve * 0.9, (served, before, must_serve)
    # copies go on after the restart: a new topic gets tiered
    create_tiered_topic(topology.bootstrap, f"{TOPIC}-more")
    produce(topology.bootstrap, f"{TOPIC}-more", 6_000)
    wait_until_tiered(topology, f"{TOPIC}-more", 1)
    verified = topology.inspect("verify", "--deep")
    assert verified["summary"]["failed"] == 0 and verified["summary"]["ok"] >= len(produced["segments"])


# -- probes, mTLS, the shim image -----------------------------------------------------------------
def test_the_charts_probe_answers_over_mtls_and_nothing_gets_in_without_a_client_certificate(topology, helm):
    objects = helm_template(helm, CHART, "-f", str(REPO / "deploy/compose/remote/values.yaml"))
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    probe = ds["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    ok = topology.exec("rsm-sidecar", *probe)
    assert ok.returncode == 0 and "rsm.v1.RemoteStorage SERVING" in ok.stdout, ok.stdout + ok.stderr
    flags = dict(zip(probe[2::2], probe[3::2]))
    anonymous = topology.exec(
        "rsm-sidecar", "rsm-healthcheck", probe[1], "--ca", flags["--ca"], "--authority", flags["--authority"]
    )
    assert anonymous.returncode == 1, anonymous.stdout
    plaintext = topology.exec("rsm-sidecar", "rsm-healthcheck", probe[1], "--timeout", "2")
    assert plaintext.returncode == 1, plaintext.stdout


def _image(topology, name: str) -> str:
    tag = topology.compose.env.get("RSM_IMAGE_TAG", "dev")
    return f"{name}:{tag}"


def test_shim_image_holds_only_the_jar_and_works_as_an_image_volume(topology):
    env = topology.podman_env
    image = _image(topology, "rsm-sidecar-shim")
    cid = subprocess.run(
        ["podman", "create", image, "x"], env=env, capture_output=True, text=True, check=True
    )
    try:
        export = subprocess.run(
            ["podman", "export", cid.stdout.strip()], env=env, capture_output=True, check=True
        ).stdout
    finally:
        subprocess.run(["podman", "rm", cid.stdout.strip()], env=env, capture_output=True)
    import io

    with tarfile.open(fileobj=io.BytesIO(export)) as tar:
        files = [m.name for m in tar.getmembers() if m.isfile() and m.size]
    assert files == ["rsm-sidecar-shim.jar"], files
    # the broker image with the shim image mounted as Strimzi's image volume mounts it, and the
    # client certificate: the shim's connectivity check reaches the sidecar over mTLS (a client
    # without a certificate is refused: test_the_charts_probe_answers_over_mtls...)
    network = f"{PROJECT}_default"
    base = [
        "podman",
        "run",
        "--rm",
        "--network",
        network,
        "--mount",
        f"type=image,source={image},destination=/mnt/rsm-sidecar-shim",
        "-v",
        f"{PROJECT}_broker-tls:/mnt/rsm-tls:ro",
        "--entrypoint",
        "java",
        _image(topology, "rsm-sidecar-strimzi-kafka"),
        "-jar",
        "/mnt/rsm-sidecar-shim/rsm-sidecar-shim.jar",
        "rsm-sidecar.kafka.svc:9095",
        "tls.enabled=true",
        "tls.ca.file=/mnt/rsm-tls/ca.crt",
    ]
    with_cert = subprocess.run(
        [*base, "tls.cert.file=/mnt/rsm-tls/tls.crt", "tls.key.file=/mnt/rsm-tls/tls.key"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert with_cert.returncode == 0, with_cert.stdout + with_cert.stderr


# -- the metrics the dashboard and the alerts name ------------------------------------------------
def _families(text: str) -> dict[str, set[str]]:
    """metric family -> the sample names it exposes (`rsm_operations` -> {rsm_operations_total, ...})."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        names = out.setdefault(fam.name, set())
        names.update(s.name for s in fam.samples)
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(fam.type, [""])
        names.update(fam.name + s for s in suffixes)
    return out


def _named() -> set[str]:
    names: set[str] = set()
    for q in dashboard_queries():
        names |= metric_names(q)
    for r in rules():
        names |= metric_names(r["expr"])
    return names


def test_every_sidecar_metric_of_the_dashboard_and_alerts_exists(topology, produced):
    text = topology.metrics()
    exposed = set().union(*_families(text).values())
    wanted = {n for n in _named() if n.startswith("rsm_")}
    assert len(wanted) >= 12
    assert not wanted - exposed, f"not on the sidecar's /metrics: {sorted(wanted - exposed)}"
    # and with the label values the queries select, after this traffic
    for labels in ({"op": "copy", "outcome": "OK"}, {"op": "fetch"}, {"op": "fetch_index"}):
        assert metric_sum(text, "rsm_operations_total", **labels) > 0, labels
    assert metric_sum(text, "rsm_cache_events_total", cache="chunk", event="miss") > 0
    assert metric_sum(text, "rsm_fetch_first_byte_seconds_count") > 0
    assert metric_sum(text, "rsm_disk_cache_enabled") == 1


def test_every_broker_metric_of_the_dashboard_and_alerts_exists(topology, produced):
    """The JMX MBeans kafka.server:type=BrokerTopicMetrics,name=Remote... as the JMX exporter
    exposes them with deploy/strimzi/kafka-metrics.yaml's rules: each name, as the broker's
    total (no topic label) and per topic where the query asks for it."""
    import urllib.request

    def scrape():
        try:
            with urllib.request.urlopen(topology.broker_metrics_url, timeout=30) as r:
                return r.read().decode()
        except OSError:
            return None

    text = wait_for("the broker's JMX exporter", scrape, 60)
    exposed = set().union(*_families(text).values())
    wanted = {n for n in _named() if n.startswith("kafka_")}
    assert len(wanted) >= 7
    assert not wanted - exposed, f"not exported by the broker: {sorted(wanted - exposed)}"
    from prometheus_client.parser import text_string_to_metric_families

    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    totals = {s.name for s in samples if "topic" not in s.labels}
    per_topic = {s.name: s.value for s in samples if s.labels.get("topic") == TOPIC}
    # the broker's totals, which the alerts select with topic=""
    assert {
        "kafka_server_brokertopicmetrics_remotecopylagsegments",
        "kafka_server_brokertopicmetrics_remotecopyerrors_total",
        "kafka_server_brokertopicmetrics_remotefetcherrors_total",
    } <= totals
    # per topic, after this test's traffic
    assert per_topic["kafka_server_brokertopicmetrics_remotelogsizebytes"] > 0
    assert per_topic["kafka_server_brokertopicmetrics_remotecopybytes_total"] > 0
    assert per_topic["kafka_server_brokertopicmetrics_remotefetchbytes_total"] > 0
