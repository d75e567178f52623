"""The Strimzi examples (deploy/strimzi/) validated against Strimzi's CRDs (generated from
io.strimzi:api by Strimzi's own CRD generator, devstack/k8s_tools.py) and cert-manager's, and
checked to fit together: the shim class is in the shim jar, the class path is the image volume's
mount, every shim key exists (docs/shim.md), the TLS files come from the client certificate's
Secret, the sidecar endpoint is the Helm chart's Service for rsm-sidecar-values.yaml and is in the
sidecar's certificate, the broker configuration uses no option Strimzi forbids. How Strimzi turns
tieredStorage into broker properties is what the remote topology runs
(tests/deploy/test_topology.py)."""

from __future__ import annotations

import functools
import re
import subprocess
import zipfile

import pytest

from devstack import k8s_tools
from tests.deploy.conftest import CHART, REPO, STRIMZI
from tests.deploy.k8s import Invalid, by_kind, helm_template, load_all, one, validate

pytestmark = pytest.mark.integration

SHIM_JAR = REPO / "java-shim" / "target" / "rsm-sidecar-shim.jar"


@pytest.fixture(scope="module")
def examples() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for path in sorted(STRIMZI.glob("*.yaml")):
        if path.name == "rsm-sidecar-values.yaml":
            continue
        for obj in load_all(path):
            out.setdefault(obj["kind"], []).append(obj)
    return out


@pytest.fixture(scope="module")
def kafka(examples) -> dict:
    (k,) = examples["Kafka"]
    return k


@pytest.fixture(scope="module")
def broker_pool(examples) -> dict:
    (pool,) = [p for p in examples["KafkaNodePool"] if "broker" in p["spec"]["roles"]]
    return pool


@pytest.fixture(scope="module")
def chart_objects(helm) -> list[dict]:
    return helm_template(helm, CHART, "-f", str(STRIMZI / "rsm-sidecar-values.yaml"))


def test_every_example_validates_against_its_crd(examples, crd_dirs):
    kinds = {kind: len(objs) for kind, objs in examples.items()}
    assert kinds == {
        "Kafka": 1,
        "KafkaNodePool": 2,
        "KafkaTopic": 1,
        "Issuer": 2,
        "Certificate": 2,
        "ConfigMap": 1,
    }
    for objs in examples.values():
        for obj in objs:
            validate(obj, crd_dirs)
            assert obj["metadata"]["namespace"] == "kafka"


def test_the_crds_catch_a_mistake(kafka, crd_dirs):
    import copy

    bad = copy.deepcopy(kafka)
    bad["spec"]["kafka"]["tieredStorage"]["type"] = "aiven"
    with pytest.raises(Invalid, match="tieredStorage/type"):
        validate(bad, crd_dirs)
    bad = copy.deepcopy(kafka)
    bad["spec"]["kafka"]["tieredStorage"]["remoteStorageManager"]["classpath"] = "/x"
    with pytest.raises(Invalid, match="classpath"):
        validate(bad, crd_dirs)


def test_kraft_node_pools_for_controllers_and_brokers(examples, kafka):
    roles = sorted(tuple(p["spec"]["roles"]) for p in examples["KafkaNodePool"])
    assert roles == [("broker",), ("controller",)]
    for pool in examples["KafkaNodePool"]:
        assert pool["metadata"]["labels"]["strimzi.io/cluster"] == kafka["metadata"]["name"]
    (topic,) = examples["KafkaTopic"]
    assert topic["metadata"]["labels"]["strimzi.io/cluster"] == kafka["metadata"]["name"]
    assert topic["spec"]["config"]["remote.storage.enable"] is True
    assert topic["spec"]["config"]["local.retention.ms"] < topic["spec"]["config"]["retention.ms"]


def test_the_shim_class_is_the_jar_and_its_class_path_the_image_volume(kafka, broker_pool):
    rsm = kafka["spec"]["kafka"]["tieredStorage"]["remoteStorageManager"]
    with zipfile.ZipFile(SHIM_JAR) as jar:
        assert rsm["className"].replace(".", "/") + ".class" in jar.namelist()
    template = broker_pool["spec"]["template"]
    (volume,) = [v for v in template["pod"]["volumes"] if "image" in v]
    (mount,) = [m for m in template["kafkaContainer"]["volumeMounts"] if m["name"] == volume["name"]]
    assert rsm["classPath"] == mount["mountPath"] + "/*"
    # Strimzi admits additional mounts under /mnt only
    for m in template["kafkaContainer"]["volumeMounts"]:
        assert m["mountPath"].startswith("/mnt/"), m
    # the image the volume names is the Dockerfile's shim target: the jar alone at its root
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert (
        "FROM scratch AS shim\nCOPY --chmod=0644 java-shim/target/rsm-sidecar-shim.jar /rsm-sidecar-shim.jar"
        in dockerfile
    )
    assert "rsm-sidecar-shim" in volume["image"]["reference"]


def _shim_keys() -> dict[str, str]:
    """docs/shim.md's table of keys (checked against ShimConfig.KEYS by the shim's ConfigDocTest)."""
    text = (REPO / "docs" / "shim.md").read_text()
    section = text[text.index("## Configuration keys") : text.index("## Behaviour")]
    return dict(re.findall(r"^\| `([a-z.]+)` \| ([^|]+) \|", section, re.M))


def test_the_shim_config_keys_exist_and_use_stream_mode_and_mtls(kafka, broker_pool, examples):
    config = kafka["spec"]["kafka"]["tieredStorage"]["remoteStorageManager"]["config"]
    keys = _shim_keys()
    assert "sidecar.target" in keys and "tls.key.file" in keys
    for key, value in config.items():
        assert key in keys, f"{key} is not a shim key (docs/shim.md)"
        assert isinstance(value, str), f"{key}: Strimzi's config map takes strings"
    assert config["transfer.mode"] == "stream"  # no file system shared with the sidecar
    assert config["tls.enabled"] == "true"
    # the TLS files are the client certificate's Secret, mounted where the config says
    template = broker_pool["spec"]["template"]
    (secret_volume,) = [v for v in template["pod"]["volumes"] if "secret" in v]
    (mount,) = [m for m in template["kafkaContainer"]["volumeMounts"] if m["name"] == secret_volume["name"]]
    assert {config["tls.ca.file"], config["tls.cert.file"], config["tls.key.file"]} == {
        f"{mount['mountPath']}/{f}" for f in ("ca.crt", "tls.crt", "tls.key")
    }
    (client,) = [
        c for c in examples["Certificate"] if c["spec"]["secretName"] == secret_volume["secret"]["secretName"]
    ]
    assert "client auth" in client["spec"]["usages"]
    assert client["spec"]["privateKey"]["encoding"] == "PKCS8"  # what the shim reads
    assert secret_volume["secret"]["defaultMode"] & 0o007 == 0


def test_the_sidecar_endpoint_is_the_charts_service_and_certificate(kafka, chart_objects, examples):
    config = kafka["spec"]["kafka"]["tieredStorage"]["remoteStorageManager"]["config"]
    host, port = config["sidecar.target"].rsplit(":", 1)
    svc = one(chart_objects, "Service")
    assert host == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert int(port) in {p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc"}
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    (server,) = by_kind(chart_objects)["Certificate"]
    assert host in server["spec"]["dnsNames"]
    # both certificates come from the example's CA issuer: each side trusts the other's
    issuers = {i["metadata"]["name"]: i for i in examples["Issuer"]}
    (client,) = [c for c in examples["Certificate"] if not c["spec"].get("isCA")]
    assert server["spec"]["issuerRef"]["name"] == client["spec"]["issuerRef"]["name"]
    assert "ca" in issuers[client["spec"]["issuerRef"]["name"]]["spec"]


def test_the_sidecars_run_where_the_brokers_run_and_admit_only_them(kafka, broker_pool, chart_objects):
    ds = one(chart_objects, "DaemonSet")["spec"]["template"]["spec"]
    (term,) = broker_pool["spec"]["template"]["pod"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    (expr,) = term["matchExpressions"]
    assert ds["nodeSelector"] == {expr["key"]: expr["values"][0]}
    peer = one(chart_objects, "NetworkPolicy")["spec"]["ingress"][0]["from"][0]
    # the labels Strimzi puts on the cluster's broker pods
    assert peer["podSelector"]["matchLabels"] == {
        "strimzi.io/cluster": kafka["metadata"]["name"],
        "strimzi.io/broker-role": "true",
    }


@functools.cache
def _kafka_cluster_spec_constants() -> str:
    api = k8s_tools.ensure_strimzi_crds() / "jars" / f"api-{k8s_tools.STRIMZI_VERSION}.jar"
    return subprocess.run(
        ["javap", "-constants", "-cp", str(api), "io.strimzi.api.kafka.model.kafka.KafkaClusterSpec"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


def _strimzi_constant(name: str) -> list[str]:
    value = re.search(rf"String {name} = \"([^\"]*)\"", _kafka_cluster_spec_constants()).group(1)
    return [v.strip() for v in value.split(",")]


def test_broker_config_uses_no_option_strimzi_forbids(kafka, crd_dirs):
    forbidden = _strimzi_constant("FORBIDDEN_PREFIXES")
    exceptions = set(_strimzi_constant("FORBIDDEN_PREFIX_EXCEPTIONS"))
    assert "listeners" in forbidden and "advertised." in forbidden
    for key in kafka["spec"]["kafka"]["config"]:
        assert key in exceptions or not any(key.startswith(p) for p in forbidden), key
    # what Strimzi writes itself from tieredStorage must not be repeated in config
    for key in kafka["spec"]["kafka"]["config"]:
        assert not key.startswith(("remote.log.storage.", "remote.log.metadata.manager.", "rsm.config.")), key


def test_metrics_config_is_the_jmx_exporter_configmap(kafka, examples):
    ref = kafka["spec"]["kafka"]["metricsConfig"]
    assert ref["type"] == "jmxPrometheusExporter"
    (cm,) = [
        c
        for c in examples["ConfigMap"]
        if c["metadata"]["name"] == ref["valueFrom"]["configMapKeyRef"]["name"]
    ]
    import yaml

    rules = yaml.safe_load(cm["data"][ref["valueFrom"]["configMapKeyRef"]["key"]])
    assert rules["lowercaseOutputName"] is True and rules["rules"]


def _strimzi_rsm_properties(kafka: dict) -> dict[str, str]:
    """The rsm.config.* lines Strimzi writes from tieredStorage.remoteStorageManager.config
    (KafkaBrokerConfigurationBuilder: each key prefixed, values as given)."""
    config = kafka["spec"]["kafka"]["tieredStorage"]["remoteStorageManager"]["config"]
    return {f"rsm.config.{k}": str(v) for k, v in config.items()}


def test_remote_topology_runs_the_examples_shim_settings(kafka):
    """docker-compose.remote.yml's broker gets deploy/compose/remote/rsm-config.properties: the
    same shim settings as Strimzi gives the example's brokers, the same TLS paths (/mnt/rsm-tls)."""
    path = REPO / "deploy" / "compose" / "remote" / "rsm-config.properties"
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    assert dict(line.split("=", 1) for line in lines) == _strimzi_rsm_properties(kafka)
    import yaml

    compose = yaml.safe_load((REPO / "docker-compose.remote.yml").read_text())
    mounts = dict(v.split(":")[:2][::-1] for v in compose["services"]["kafka"]["volumes"])
    assert mounts["/mnt/rsm-tls"] == "broker-tls"
