"""The Helm chart deploy/helm/rsm-sidecar, checked with Helm itself (lint, template, the values
schema) and every rendered object validated as the API server would (tests/deploy/k8s.py: the
Kubernetes API's schemas of the oldest and newest supported release, cert-manager's and the
Prometheus operator's CRDs). The sidecar's rendered configuration is loaded by the sidecar's
own configuration code, and its memory limit is compared with the bound of docs/operations.md §4
computed from that configuration. The chart's configuration really running is
tests/deploy/test_topology.py."""

from __future__ import annotations

import json
import math
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from devstack import helm_schema
from rsm_sidecar.config import Config
from tests.deploy.conftest import CHART, STRIMZI
from tests.deploy.k8s import HELM_KUBE_VERSION, Invalid, by_kind, helm_template, one, validate

pytestmark = pytest.mark.integration

MiB = 1 << 20
#: value sets every check runs on: the defaults, the Strimzi example's, a Deployment, and everything on
VALUE_SETS = {
    "defaults": [],
    "strimzi-example": ["-f", str(STRIMZI / "rsm-sidecar-values.yaml")],
    "deployment": ["--set", "workload.kind=Deployment", "--set", "workload.replicas=4"],
    "everything-on": [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.grafanaDashboard.enabled=true",
        "--set",
        "diskCache.enabled=true",
        "--set",
        "credentialsSecret=rsm-s3-credentials",
        "--set-json",
        'networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]',
        "--set-json",
        'brokers.namespaceSelector={"matchLabels":{"kubernetes.io/metadata.name":"kafka"}}',
        "--set",
        "encryption.keyIds={key-1,key-2}",
        "--set",
        "encryption.activeKeyId=key-2",
    ],
    "no-tls-gcs": [
        "--set",
        "tls.disabled=true",
        "--set",
        "encryption.enabled=false",
        "--set-json",
        'config.storage={"backend":"gcs","gcs":{"bucket":"b","chunk_size":"16MiB"}}',
    ],
}


_renders: dict[tuple[str, ...], list[dict]] = {}


def render(helm: Path, *args: str) -> list[dict]:
    """`helm template` of the chart with ``args``, once per distinct ``args`` in this module
    (a copy: tests may change what they get)."""
    if args not in _renders:
        _renders[args] = helm_template(helm, CHART, *args)
    return json.loads(json.dumps(_renders[args]))


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request, helm) -> tuple[str, list[dict]]:
    return request.param, render(helm, *VALUE_SETS[request.param])


def _workload(objects: list[dict]) -> dict:
    (w,) = by_kind(objects).get("DaemonSet", []) + by_kind(objects).get("Deployment", [])
    return w


def _sidecar_toml(objects: list[dict]) -> str:
    (config,) = [o for o in by_kind(objects)["ConfigMap"] if "sidecar.toml" in o["data"]]
    return config["data"]["sidecar.toml"]


# -- the values schema -------------------------------------------------------------------------------
def test_values_schema_is_generated_from_the_configuration_code():
    assert (CHART / "values.schema.json").read_text() == helm_schema.render(), (
        "values.schema.json is stale: run `.venv/bin/python -m devstack.helm_schema`"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "config.copy.max_concurrent=0"], "config/copy/max_concurrent"),
        (["--set", "config.cache.chunk_byte=1MiB"], "chunk_byte"),
        (["--set", "config.segment.chunk_size=4 MB please"], "config/segment/chunk_size"),
        (["--set", "config.storage.backend=ftp"], "config/storage/backend"),
        (["--set", "config.server.listen=0.0.0.0:1"], "config/server/listen"),
        (["--set", "workload.kind=StatefulSet"], "workload/kind"),
        (["--set", "service.internalTrafficPolicy=Nearby"], "service/internalTrafficPolicy"),
        (["--set", "encryption.activeKeyId=key-9"], 'encryption.activeKeyId "key-9" is not one of'),
        (["--set", "tls.certManager.enabled=false"], "tls.existingSecret"),
    ],
)
def test_bad_values_are_refused_naming_the_value(helm, args, message):
    with pytest.raises(Invalid, match=message.replace("(", r"\(")):
        helm_template(helm, CHART, *args)


def test_helm_lint(helm):
    for name in ("defaults", "strimzi-example"):  # template + validation below covers the others
        args = VALUE_SETS[name]
        proc = subprocess.run(
            [str(helm), "lint", "--strict", "--kube-version", HELM_KUBE_VERSION, str(CHART), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"{name}:\n{proc.stdout}{proc.stderr}"


# -- every object as the API server would take it ---------------------------------------------------
def test_every_object_validates_against_the_kubernetes_and_crd_schemas(rendered, crd_dirs):
    name, objects = rendered
    kinds = {o["kind"] for o in objects}
    assert {"ConfigMap", "Service", "ServiceAccount", "NetworkPolicy", "PodDisruptionBudget"} <= kinds, name
    for obj in objects:
        validate(obj, crd_dirs)
        assert obj["metadata"]["namespace"] == "kafka", obj["kind"]


def test_the_validation_catches_a_misspelt_field(rendered, crd_dirs):
    """The schemas are strict: an unknown field in a pod template or a Certificate is refused."""
    _, objects = rendered
    workload = json.loads(json.dumps(_workload(objects)))
    workload["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFilesytem"] = True
    with pytest.raises(Invalid, match="readOnlyRootFilesytem"):
        validate(workload, crd_dirs)
    for cert in by_kind(objects).get("Certificate", []):
        bad = json.loads(json.dumps(cert))
        bad["spec"]["dnsName"] = ["x"]
        with pytest.raises(Invalid, match="dnsName"):
            validate(bad, crd_dirs)


# -- the pods ------------------------------------------------------------------------------------
RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def test_pods_meet_the_restricted_pod_security_standard(rendered):
    """The Restricted profile's rules (kubernetes.io/docs/concepts/security/pod-security-standards)."""
    name, objects = rendered
    pod = _workload(objects)["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    for vol in pod["volumes"]:
        (kind,) = set(vol) - {"name"}
        assert kind in RESTRICTED_VOLUME_TYPES, f"{name}: volume {vol['name']} is {kind}"
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
        assert sc.get("privileged") is not True and sc["runAsNonRoot"] is True
        assert sc["readOnlyRootFilesystem"] is True
        assert not any(p.get("hostPort") for p in c.get("ports", []))


def test_what_the_sidecar_writes_is_a_volume(rendered):
    """Read-only root: the journal, /tmp and the disk cache are volumes; secrets are read-only."""
    _, objects = rendered
    cfg = tomllib.loads(_sidecar_toml(objects))
    (container,) = _workload(objects)["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    writable = [cfg["copy"]["journal_dir"], "/tmp"]
    if "disk_cache" in cfg.get("fetch", {}):
        writable.append(cfg["fetch"]["disk_cache"]["path"])
    for path in writable:
        assert path in mounts and not mounts[path].get("readOnly"), path
    for path, m in mounts.items():
        if m["name"] in ("tls", "keys", "config"):
            assert m["readOnly"] is True, path


def test_probes_ask_the_grpc_health_service(rendered):
    name, objects = rendered
    (container,) = _workload(objects)["spec"]["template"]["spec"]["containers"]
    cfg = tomllib.loads(_sidecar_toml(objects))
    port = int(cfg["server"]["listen"].rsplit(":", 1)[1])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        p = container[probe]
        if "grpc" in p:  # TLS off: the kubelet's own gRPC probe
            assert "tls" not in cfg["server"], name
            assert p["grpc"] == {"port": port, "service": "rsm.v1.RemoteStorage"}
            continue
        argv = p["exec"]["command"]
        assert argv[:2] == ["rsm-healthcheck", f"127.0.0.1:{port}"]
        flags = dict(zip(argv[2::2], argv[3::2]))
        tls = cfg["server"]["tls"]
        # the sidecar's own certificate: the CA that signs clients signs it too
        assert flags["--ca"] == tls["client_ca_file"]
        assert (flags["--cert"], flags["--key"]) == (tls["cert_file"], tls["key_file"])
        assert flags["--authority"] == "rsm-sidecar.kafka.svc"
        assert float(flags["--timeout"]) < p["timeoutSeconds"]


def test_probe_command_parses_with_the_health_check_script(helm):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "healthcheck", CHART.parents[2] / "docker/sidecar/healthcheck.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (container,) = _workload(render(helm))["spec"]["template"]["spec"]["containers"]
    argv = container["readinessProbe"]["exec"]["command"][1:]
    seen = {}
    module.check = lambda *a: (seen.setdefault("args", a), (True, "ok"))[1]
    assert module.main(argv) == 0
    target, service, timeout, ca, cert, key, authority = seen["args"]
    assert (target, service, ca, authority) == (
        "127.0.0.1:9095",
        "rsm.v1.RemoteStorage",
        "/etc/rsm-sidecar/tls/ca.crt",
        "rsm-sidecar.kafka.svc",
    )


def test_grace_period_covers_the_drain(rendered):
    _, objects = rendered
    cfg = Config(tomllib.loads(_sidecar_toml(objects)))
    pod = _workload(objects)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= cfg["server.shutdown_grace_seconds"] + 5


# -- the sidecar's configuration --------------------------------------------------------------------
def test_rendered_configuration_is_valid_for_the_sidecar(rendered, tmp_path):
    name, objects = rendered
    text = _sidecar_toml(objects)
    (tmp_path / "sidecar.toml").write_text(text)
    cfg = Config.load(tmp_path / "sidecar.toml", environ={})
    assert cfg["server.listen"] == "0.0.0.0:9095" and cfg["metrics.listen"] == "0.0.0.0:9096"
    assert cfg["copy.journal_dir"] == "/var/lib/rsm-sidecar/journal"
    if cfg.is_set("server.tls.cert_file"):
        assert cfg["server.tls.client_ca_file"], "TLS without client certificates (mTLS) on a pod IP"
    else:
        assert cfg["server.allow_plaintext_non_loopback"] is True, name
    if cfg["encryption.enabled"]:
        keys = cfg.family("encryption.keys")
        assert cfg["encryption.active_key_id"] in keys
        pod = _workload(objects)["spec"]["template"]["spec"]
        (secret,) = [v["secret"] for v in pod["volumes"] if v["name"] == "keys"]
        assert secret["defaultMode"] & 0o007 == 0, "the sidecar refuses private keys others can read"
        assert sorted(i["path"] for i in secret["items"]) == sorted(
            Path(f).name for k in keys.values() for f in (k["public_key_file"], k["private_key_file"])
        )


def documented_memory_bound_mib(cfg: Config) -> int:
    """docs/operations.md §4 (with docs/storage.md's upload buffers), in MiB rounded up."""
    chunk = cfg["segment.chunk_size"]
    ranged = max(cfg["fetch.max_range_bytes"], chunk)
    caches = cfg["cache.manifest_bytes"] + cfg["cache.index_bytes"] + cfg["cache.chunk_bytes"]
    upload = {
        "s3": cfg["storage.s3.part_size"] * (cfg["storage.s3.max_parts_in_flight"] + 1)
        + MiB * cfg["storage.s3.max_parts_in_flight"],
        "gcs": 2 * cfg["storage.gcs.chunk_size"],
        "azure": cfg["storage.azure.block_size"] * (cfg["storage.azure.max_blocks_in_flight"] + 1),
    }.get(cfg["storage.backend"], 0)
    window = cfg["server.stream_window_bytes"]
    copies = cfg["copy.max_concurrent"] * ((cfg["copy.parallelism"] + 2) * chunk + upload + window)
    fetches = cfg["fetch.max_concurrent"] * (ranged + chunk + 2 * MiB)
    prefetch = 4 * (ranged + chunk) if cfg["cache.prefetch_bytes"] and cfg["cache.chunk_bytes"] else 0
    zstd = min(64, cfg["copy.max_concurrent"] * cfg["copy.parallelism"]) * 7 * MiB // 2
    return math.ceil((caches + copies + fetches + prefetch + zstd + 85 * MiB) / MiB)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--set", "config.copy.max_concurrent=16", "--set", "config.fetch.max_concurrent=32"],
        ["--set", "config.cache.chunk_bytes=0", "--set", "config.segment.chunk_size=16MiB"],
        ["--set", "config.cache.prefetch_bytes=0", "--set", "config.fetch.max_range_bytes=1MiB"],
        [
            "--set-json",
            'config.storage={"backend":"azure","azure":{"container":"c","block_size":"4MiB","max_blocks_in_flight":4}}',
        ],
        ["--set-json", 'config.storage={"backend":"local","local":{"root":"/data"}}'],
        ["--set", "config.storage.s3.part_size=16MiB", "--set", "resources.memoryHeadroomPercent=0"],
    ],
)
def test_memory_request_and_limit_are_the_documented_bound(helm, args, tmp_path):
    objects = render(helm, *args)
    (tmp_path / "sidecar.toml").write_text(_sidecar_toml(objects))
    bound = documented_memory_bound_mib(Config.load(tmp_path / "sidecar.toml", environ={}))
    headroom = 10 if "resources.memoryHeadroomPercent=0" not in args else 0
    (container,) = _workload(objects)["spec"]["template"]["spec"]["containers"]
    expected = f"{math.ceil(bound * (100 + headroom) / 100)}Mi"
    assert container["resources"]["requests"]["memory"] == expected
    assert container["resources"]["limits"]["memory"] == expected


def test_memory_can_be_set_by_hand(helm):
    objects = helm_template(
        helm, CHART, "--set", "resources.limits.memory=3Gi", "--set", "resources.requests.memory=2Gi"
    )
    (container,) = _workload(objects)["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {
        "requests": {"memory": "2Gi", "cpu": "500m"},
        "limits": {"memory": "3Gi"},
    }


def test_default_memory_limit(helm):
    """The defaults' figure, as docs/kubernetes.md quotes it."""
    (container,) = _workload(render(helm))["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == "1363Mi"


# -- how the brokers reach it ---------------------------------------------------------------------
def test_service_is_node_local_and_named_for_the_shim(rendered):
    _, objects = rendered
    svc = one(objects, "Service")
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    assert (svc["metadata"]["name"], svc["metadata"]["namespace"]) == ("rsm-sidecar", "kafka")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["grpc"]["port"] == 9095
    pod = _workload(objects)["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def test_network_policy_admits_only_the_brokers(rendered):
    name, objects = rendered
    policy = one(objects, "NetworkPolicy")["spec"]
    pod = _workload(objects)["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    grpc = [r for r in policy["ingress"] if {"port": "grpc", "protocol": "TCP"} in r["ports"]]
    (rule,) = grpc
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"] == {
        "strimzi.io/cluster": "my-cluster",
        "strimzi.io/broker-role": "true",
    }
    if name == "everything-on":
        assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}}
        metrics = [r for r in policy["ingress"] if {"port": "metrics", "protocol": "TCP"} in r["ports"]]
        assert len(metrics) == 1
    for r in policy["ingress"]:
        assert r.get("from"), "a rule without peers admits everyone"


def test_certificate_names_the_service_and_serves_client_auth_for_the_probe(rendered):
    name, objects = rendered
    certs = by_kind(objects).get("Certificate", [])
    if name == "no-tls-gcs":
        assert not certs
        return
    (cert,) = certs
    assert "rsm-sidecar.kafka.svc" in cert["spec"]["dnsNames"]
    assert {"server auth", "client auth"} <= set(cert["spec"]["usages"])
    pod = _workload(objects)["spec"]["template"]["spec"]
    (tls,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == cert["spec"]["secretName"]


def test_deployment_places_one_sidecar_on_each_broker_node(helm):
    deployment = one(render(helm, *VALUE_SETS["deployment"]), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 4 and spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    affinity = spec["template"]["spec"]["affinity"]
    (together,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert together["topologyKey"] == "kubernetes.io/hostname"
    assert together["labelSelector"]["matchLabels"]["strimzi.io/broker-role"] == "true"
    (apart,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert apart["labelSelector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_daemonset_rollout_starts_the_new_pod_first(helm):
    ds = one(render(helm), "DaemonSet")
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pdb = one(render(helm), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1


def test_workload_identity_goes_to_the_sidecar_service_account(helm):
    objects = render(helm, "-f", str(STRIMZI / "rsm-sidecar-values.yaml"))
    sa = one(objects, "ServiceAccount")
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    assert sa["automountServiceAccountToken"] is False
    assert _workload(objects)["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_configuration_change_rolls_the_pods(helm):
    a = _workload(render(helm))["spec"]["template"]["metadata"]["annotations"]
    b = _workload(render(helm, "--set", "config.cache.chunk_bytes=64MiB"))["spec"]["template"]
    assert a["checksum/config"] != b["metadata"]["annotations"]["checksum/config"]


def test_monitoring_objects_ship_the_tested_rules_and_dashboard(helm):
    objects = render(helm, *VALUE_SETS["everything-on"])
    rule = one(objects, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    dashboards = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")
    ]
    (dashboard,) = dashboards
    assert json.loads(dashboard["data"]["rsm-sidecar.json"]) == json.loads(
        (CHART / "files/dashboard.json").read_text()
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_remote_topology_runs_the_charts_configuration(helm):
    """docker-compose.remote.yml mounts deploy/compose/remote/sidecar.toml: the chart's ConfigMap
    for deploy/compose/remote/values.yaml, byte for byte."""
    remote = CHART.parents[1] / "compose" / "remote"
    objects = render(helm, "-f", str(remote / "values.yaml"))
    assert (remote / "sidecar.toml").read_text() == _sidecar_toml(objects), (
        "deploy/compose/remote/sidecar.toml is stale: render it again (its values.yaml says how)"
    )
    # and the compose sidecar mounts what the pod mounts, where the pod mounts it
    compose = yaml.safe_load((CHART.parents[2] / "docker-compose.remote.yml").read_text())
    mounts = {v.split(":")[1] for v in compose["services"]["rsm-sidecar"]["volumes"]}
    (container,) = _workload(objects)["spec"]["template"]["spec"]["containers"]
    assert {m["mountPath"] for m in container["volumeMounts"]} - {"/tmp"} == mounts
