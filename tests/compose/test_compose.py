"""The docker-compose demo cluster, checked without a Docker engine.

* docker-compose.yml is validated and normalized by docker compose itself
  (``docker compose config``; see tooling.py), and every test below reads that normalized
  form: what Docker would run, not the YAML as written;
* the Dockerfiles are parsed and linted by BuildKit's own code; every file they copy exists
  and is sent in the build context;
* the sidecar's settings are config/sidecar.toml plus the compose ``RSM__`` environment,
  loaded by ``rsm_sidecar.config.Config`` (the code ``rsm-sidecar serve`` runs);
* the broker's settings are rendered by docker/kafka/render-properties.sh (the script the
  broker container runs) from docker/kafka/server.properties and
  config/broker-tiered.properties, with the compose environment;
* every ``rsm-sidecar ...`` command parses with the real CLI parser;
* the images' helper scripts (health check, unless-exists, the demo producer) run here.

What needs Docker (building the images, starting the containers) is not tested here;
docker/README.md says what was run.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devstack import compose_tools as tooling
from devstack.common import free_port
from rsm_sidecar.config import Config
from tests.compose.conftest import compose_config, compose_env, tool

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
SIDECAR_TOML = REPO / "config" / "sidecar.toml"
BROKER_TIERED = REPO / "config" / "broker-tiered.properties"
CLUSTER_PROPS = REPO / "config" / "cluster.properties"
RENDER = REPO / "docker" / "kafka" / "render-properties.sh"
#: the single combined node (NODE_ROLE=combined: the remote topology, docker-compose.remote.yml)
KAFKA_BASE = REPO / "docker" / "kafka" / "server.properties"
#: the cluster's brokers and controller (NODE_ROLE=broker, controller)
BROKER_BASE = REPO / "docker" / "kafka" / "broker.properties"
CONTROLLER_BASE = REPO / "docker" / "kafka" / "controller.properties"
SIDECAR_MOUNT = "/etc/rsm-sidecar/sidecar.toml"
TIERED_MOUNT = "/etc/rsm-sidecar/broker-tiered.properties"
CLUSTER_MOUNT = "/etc/rsm-sidecar/cluster.properties"
#: the three brokers and their sidecars: kafka-<n> dials sidecar-<n>
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
SIDECARS = ("sidecar-1", "sidecar-2", "sidecar-3")
PAIRS = tuple(zip(BROKERS, SIDECARS))

SERVICES = {
    "seaweedfs",
    "keys-init",
    *SIDECARS,
    "controller",
    *BROKERS,
    "registry",
    "iceberg-rest",
    "demo-producer",
    "iceberg-convert",
    "iceberg-current",
    "spark-master",
    "spark-worker",
    "iceberg-follow",
}
ONE_SHOT = {"keys-init", "demo-producer", "iceberg-convert", "iceberg-current"}
#: service -> {dependency: condition}: the start order the demo needs
START_ORDER = {
    **{
        sidecar: {"keys-init": "service_completed_successfully", "seaweedfs": "service_healthy"}
        for sidecar in SIDECARS
    },
    **{broker: {sidecar: "service_healthy", "controller": "service_started"} for broker, sidecar in PAIRS},
    "iceberg-rest": {"seaweedfs": "service_healthy"},
    "demo-producer": {**{b: "service_healthy" for b in BROKERS}, "registry": "service_healthy"},
    "iceberg-convert": {
        "demo-producer": "service_completed_successfully",
        "iceberg-rest": "service_healthy",
        "registry": "service_healthy",
        "spark-worker": "service_healthy",
    },
    "spark-worker": {"spark-master": "service_healthy"},
    "iceberg-follow": {"iceberg-convert": "service_completed_successfully"},
    "iceberg-current": {"iceberg-convert": "service_completed_successfully"},
}
DOCKERFILE = REPO / "docker" / "Dockerfile"
#: service -> the docker/Dockerfile target its image is built from
BUILD_TARGETS = {
    "seaweedfs": "seaweedfs",
    "keys-init": "sidecar",
    **{sidecar: "sidecar" for sidecar in SIDECARS},
    "controller": "kafka",
    **{broker: "kafka" for broker in BROKERS},
    "registry": "registry",
    "iceberg-rest": "iceberg-rest",
    "demo-producer": "jobs",
    "iceberg-convert": "jobs",
    "iceberg-current": "jobs",
    "spark-master": "jobs",
    "spark-worker": "jobs",
    "iceberg-follow": "jobs",
}
#: JVM variables of start-broker.sh that are not broker properties
KAFKA_IMAGE_NON_PROPERTIES = {
    "KAFKA_HEAP_OPTS",
    "KAFKA_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS",
    "KAFKA_LOG4J_OPTS",
    "KAFKA_JMX_OPTS",
    "KAFKA_GC_LOG_OPTS",
}


# -- fixtures (compose, project, services: conftest.py) ---------------------------------------
_tool = tool
_compose_env = compose_env


@pytest.fixture(scope="module")
def dockerfiles(services) -> dict[str, dict]:
    """BuildKit's view of every Dockerfile compose builds: path -> report."""
    check = _tool(tooling.ensure_dockerfilecheck)
    out = {}
    for svc in services.values():
        build = svc.get("build")
        if not build:
            continue
        path = str(Path(build["context"]) / build.get("dockerfile", "Dockerfile"))
        if path not in out:
            proc = subprocess.run(
                [str(check), "-context", build["context"], "-file", path],
                capture_output=True,
                text=True,
                timeout=120,
            )
            out[path] = json.loads(proc.stdout)
    return out


def _env(svc: dict) -> dict[str, str]:
    return {k: ("" if v is None else str(v)) for k, v in (svc.get("environment") or {}).items()}


def _mounts(svc: dict) -> dict[str, dict]:
    """target -> volume entry."""
    return {v["target"]: v for v in svc.get("volumes", [])}


def _rsm_env(svc: dict) -> dict[str, str]:
    return {k: v for k, v in _env(svc).items() if k.startswith("RSM__")}


def _sidecar_config(svc: dict) -> Config:
    return Config.load(SIDECAR_TOML, environ=_rsm_env(svc))


def _render(env: dict[str, str], *files: Path, awk_dir: Path | None = None) -> subprocess.CompletedProcess:
    path = os.environ["PATH"] if awk_dir is None else f"{awk_dir}:{os.environ['PATH']}"
    return subprocess.run(
        ["sh", str(RENDER), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": path, **env},
    )


def _properties(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


@pytest.fixture(scope="module")
def broker_properties(services) -> dict[str, dict[str, str]]:
    """Each broker container's server.properties, rendered by the container's own script from
    the files its start-up renders (start-broker.sh: base, tiered, cluster)."""
    out = {}
    for broker in BROKERS:
        env = _env(services[broker])
        assert env["CLUSTER_PROPERTIES"] == CLUSTER_MOUNT, broker
        assert env["NODE_ROLE"] == "broker", broker
        proc = _render(env, BROKER_BASE, BROKER_TIERED, CLUSTER_PROPS)
        assert proc.returncode == 0, proc.stderr
        out[broker] = _properties(proc.stdout)
    return out


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# -- the compose file ----------------------------------------------------------------------------
def test_compose_file_validates_against_the_compose_spec(compose):
    """`docker compose config -q`: schema, merge keys, depends_on targets, no unset variables."""
    proc = compose_config(compose, COMPOSE_FILE, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "variable is not set" not in proc.stderr, proc.stderr


def test_compose_rejects_an_invalid_file(compose, tmp_path):
    """The validator is real: an unknown service attribute fails."""
    bad = tmp_path / "compose.yml"
    bad.write_text(COMPOSE_FILE.read_text().replace("stop_grace_period: 30s", "stop_grace_periodd: 30s"))
    proc = compose_config(compose, bad, "--quiet", cwd=tmp_path)
    assert proc.returncode != 0 and "stop_grace_periodd" in proc.stderr


def test_services(services):
    assert set(services) == SERVICES


def test_start_order_and_health_checks(services):
    for name, deps in START_ORDER.items():
        got = {d: c["condition"] for d, c in services[name].get("depends_on", {}).items()}
        assert got == deps, name
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            if cond["condition"] == "service_healthy":
                test = services[dep].get("healthcheck", {}).get("test")
                assert test and test[0] in ("CMD", "CMD-SHELL"), (
                    f"{name} waits for {dep} to be healthy: no health check"
                )
    for name, svc in services.items():
        test = svc.get("healthcheck", {}).get("test") or ["NONE"]
        if test[0] == "CMD":  # podman's Docker API splits a CMD test's arguments at spaces
            assert not [a for a in test[1:] if " " in a], f"{name}: a health check argument has a space"
            if cond["condition"] == "service_completed_successfully":
                assert dep in ONE_SHOT
    for name in ONE_SHOT:
        assert services[name].get("restart", "no") == "no", name
    for name in SERVICES - ONE_SHOT:
        assert services[name].get("healthcheck"), f"{name} has no health check"


def test_every_image_is_built_here_with_the_versions_the_tests_run(services, dockerfiles):
    """No image is pulled but debian:bookworm-slim; each service's software is the version
    devstack runs in the other tests."""
    from devstack.iceberg_rest import FIXTURE_VERSION
    from devstack.kafka import DEFAULT_KAFKA_VERSION
    from devstack.registry import DEFAULT_VERSION as APICURIO_VERSION
    from devstack.s3server import SEAWEEDFS_VERSION

    for name, target in BUILD_TARGETS.items():
        build = services[name]["build"]
        assert Path(build["context"]) / build["dockerfile"] == DOCKERFILE, name
        assert build["target"] == target, name
        assert services[name]["image"].startswith("rsm-sidecar") and services[name]["image"].endswith(":dev")
    for name in (*BROKERS, "controller"):
        assert services[name]["build"]["args"]["KAFKA_VERSION"] == DEFAULT_KAFKA_VERSION, name
    text = DOCKERFILE.read_text()
    assert "ARG KAFKA_VERSION=" + DEFAULT_KAFKA_VERSION in text
    assert f"/fetch/seaweedfs-{SEAWEEDFS_VERSION}/bin/weed" in text
    assert f"/fetch/apicurio-{APICURIO_VERSION} " in text
    assert f"/fetch/iceberg-rest-fixture-{FIXTURE_VERSION}-standalone/lib" in text
    (report,) = dockerfiles.values()
    assert report["args"]["DEBIAN_IMAGE"] == "debian:bookworm-slim"
    for report in dockerfiles.values():
        for stage in report["stages"]:
            base = stage["base"]
            if base in {s["name"] for s in report["stages"]} or base == "scratch":
                continue  # an earlier stage, or no base at all (the shim image)
            assert ":" in base and not base.endswith(":latest"), (
                f"{report['file']}: unpinned base image {base}"
            )


def test_every_referenced_file_exists(services):
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            if vol["type"] == "bind":
                assert Path(vol["source"]).exists(), f"{name}: mounts missing {vol['source']}"
                assert Path(vol["source"]).resolve().is_relative_to(REPO), f"{name}: mounts outside the repo"
        build = svc.get("build")
        if build:
            assert (Path(build["context"]) / build["dockerfile"]).is_file(), name
    # config/ is mounted read-only where it is used
    mounted = {(n, v["target"]): v for n, s in services.items() for v in s.get("volumes", [])}
    for name in (*SIDECARS, "demo-producer", "iceberg-convert"):
        vol = mounted[(name, SIDECAR_MOUNT)]
        assert Path(vol["source"]) == SIDECAR_TOML and vol.get("read_only"), name
    for broker in BROKERS:
        for target, source in ((TIERED_MOUNT, BROKER_TIERED), (CLUSTER_MOUNT, CLUSTER_PROPS)):
            vol = mounted[(broker, target)]
            assert Path(vol["source"]) == source and vol.get("read_only"), (broker, target)


# -- the Dockerfiles -----------------------------------------------------------------------------
def test_dockerfiles_parse_and_pass_the_buildkit_linter(dockerfiles):
    assert list(dockerfiles) == [str(DOCKERFILE)]
    for path, report in dockerfiles.items():
        assert not report.get("error"), f"{path}: {report.get('error')}"
        assert report["warnings"] == [], f"{path}: {report['warnings']}"


def test_dockerfiles_copy_only_what_exists_in_the_build_context(dockerfiles):
    shim = REPO / "java-shim" / "target" / "rsm-sidecar-shim.jar"
    for path, report in dockerfiles.items():
        assert report["ignore_file"].endswith(".dockerignore"), (
            f"{path}: no ignore file: the whole repo is sent"
        )
        for src in report["sources"]:
            if REPO / src["source"] == shim and not shim.exists():
                continue  # built by `make shim` (docker/README.md); the pattern is checked below
            assert src["exists"], f"{path}:{src['line']}: {src['source']} does not exist"
            assert src["in_context"], (
                f"{path}:{src['line']}: {src['source']} is excluded by {report['ignore_file']}"
            )
    (report,) = dockerfiles.values()
    assert "java-shim/target/rsm-sidecar-shim.jar" in {s["source"] for s in report["sources"]}
    ignore = (REPO / ".dockerignore").read_text()
    assert "!java-shim/target/rsm-sidecar-shim.jar" in ignore
    assert ignore.splitlines()[[line.strip() for line in ignore.splitlines()].index("*")] == "*", (
        "the context is an allow-list (.cache/ and .venv/ hold gigabytes)"
    )


def _module_file(module: str) -> Path | None:
    """The repository file of ``module`` (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``)."""
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _imported_at_load(path: Path) -> set[str]:
    """The repository modules ``path`` imports when it is loaded (statements at module level,
    outside ``if TYPE_CHECKING``), with their packages' ``__init__``."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in ("devstack", "rsm_sidecar"):
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {m for m in found if _module_file(m) is not None}


def test_each_fetch_stage_copies_every_module_its_fetcher_imports(dockerfiles):
    """A fetch stage (``RUN /opt/fetch-venv/bin/python -m <module>``) has the files of every
    repository module the fetcher loads, copied in that stage or a stage it is built on; a file
    missing there fails the image build ten minutes into `make test` (ModuleNotFoundError)."""
    (report,) = dockerfiles.values()
    base = {s["name"]: s["base"] for s in report["stages"]}
    copied: dict[str, set[str]] = {}
    for src in report["sources"]:
        if src.get("stage") and src["instruction"] == "COPY" and not src["source"].startswith("/"):
            copied.setdefault(src["stage"], set()).add(src["source"].rstrip("/"))
    runs, stage = [], None
    for line in DOCKERFILE.read_text().splitlines():
        if m := re.match(r"FROM \S+ AS (\S+)", line):
            stage = m.group(1)
        elif m := re.search(r"/opt/fetch-venv/bin/python -m ((?:devstack|rsm_sidecar)[\w.]*)", line):
            runs.append((stage, m.group(1)))
    assert {m for _, m in runs} >= {"devstack.s3server", "devstack.kafka", "devstack.registry"}
    for stage, module in runs:
        chain, s = set(), stage
        while s in base:
            chain |= copied.get(s, set())
            s = base[s]
        needed, todo = set(), [module]
        while todo:
            m = todo.pop()
            if m not in needed:
                needed.add(m)
                todo.extend(_imported_at_load(_module_file(m)))
        for m in sorted(needed):
            rel = _module_file(m).relative_to(REPO).as_posix()
            assert any(rel == c or rel.startswith(c + "/") for c in chain), (
                f"stage {stage}: `python -m {module}` imports {m}, but {rel} is not copied into it"
            )


def test_build_targets_exist(services, dockerfiles):
    for name, svc in services.items():
        build = svc.get("build")
        if build and build.get("target"):
            report = dockerfiles[str(Path(build["context"]) / build["dockerfile"])]
            assert build["target"] in {s["name"] for s in report["stages"]}, name


def test_image_helpers_are_installed_where_compose_calls_them(services, dockerfiles):
    """Commands the services and health checks call exist in their image."""
    (report,) = dockerfiles.values()
    installed = {s["dest"]: s["source"] for s in report["sources"]}
    assert installed["/usr/local/bin/rsm-healthcheck"] == "docker/sidecar/healthcheck.py"
    assert installed["/usr/local/bin/unless-exists"] == "docker/sidecar/unless-exists.sh"
    for sidecar in SIDECARS:
        assert services[sidecar]["healthcheck"]["test"][1] == "rsm-healthcheck"
    assert services["keys-init"]["entrypoint"][0] == "unless-exists"
    dests = {s["source"]: s["dest"] for s in report["sources"]}
    assert dests["docker/kafka/start-broker.sh"] == "/opt/rsm-sidecar/bin/"
    assert dests["docker/kafka/kafka-health.sh"] == "/opt/rsm-sidecar/bin/"
    for name in (*BROKERS, "controller"):
        assert services[name]["healthcheck"]["test"][1] == "/opt/rsm-sidecar/bin/kafka-health.sh"
    assert services["controller"]["healthcheck"]["test"][2] == "--controller"
    assert "/opt/rsm-sidecar/bin/start-broker.sh" in DOCKERFILE.read_text()
    for script in (
        "docker/kafka/start-broker.sh",
        "docker/kafka/kafka-health.sh",
        "docker/kafka/render-properties.sh",
        "docker/sidecar/unless-exists.sh",
        "docker/sidecar/healthcheck.py",
    ):
        assert os.access(REPO / script, os.X_OK), f"{script} is not executable"


# -- sidecar settings: config/sidecar.toml + RSM__ ---------------------------------------------
def test_every_rsm_variable_names_a_configuration_key(services):
    from rsm_sidecar.config import ENV_PREFIX

    users = [n for n, s in services.items() if _rsm_env(s)]
    assert set(users) == {*SIDECARS, "demo-producer", "iceberg-convert", "iceberg-current", "iceberg-follow"}
    for name in users:
        env = _rsm_env(services[name])
        cfg = _sidecar_config(services[name])  # raises ConfigError on an unknown key or a bad value
        for var in env:
            path = cfg._env_to_path(var)
            cfg._find(path)
            assert cfg.is_set(path), f"{name}: {var}"
            assert var.startswith(ENV_PREFIX)


def test_sidecar_configuration_validates_and_points_at_the_compose_services(services):
    svc = services["sidecar-1"]
    cfg = _sidecar_config(svc)
    for sidecar in SIDECARS:  # one configuration, the mounted log directory and journal aside
        assert _rsm_env(services[sidecar]) == _rsm_env(svc), sidecar
    assert cfg["storage.backend"] == "s3"
    # the bucket SeaweedFS creates, at its S3 port, with its identity
    weed = services["seaweedfs"]
    flags = dict(a.lstrip("-").split("=", 1) for a in weed["command"] if a.startswith("-") and "=" in a)
    assert cfg["storage.s3.bucket"] in flags["bucket"].split(",")
    assert cfg["storage.s3.endpoint_url"] == f"http://seaweedfs:{flags['s3.port']}"
    assert cfg["storage.s3.addressing_style"] == "path"
    assert cfg["storage.s3.access_key_id"] == _env(weed)["AWS_ACCESS_KEY_ID"]
    assert cfg["storage.s3.secret_access_key"] == _env(weed)["AWS_SECRET_ACCESS_KEY"]
    # the keyring: the active key's files are where keys-init writes them
    assert cfg["encryption.enabled"]
    keys = cfg.family("encryption.keys")
    active = cfg["encryption.active_key_id"]
    out_dir = _arg(services["keys-init"]["command"], "--out")
    key_id = _arg(services["keys-init"]["command"], "--id")
    assert active == key_id
    assert keys[active] == {
        "public_key_file": f"{out_dir}/{key_id}.public.pem",
        "private_key_file": f"{out_dir}/{key_id}.private.pem",
    }
    assert services["keys-init"]["entrypoint"][1] == keys[active]["private_key_file"]
    keys_volume = _mounts(services["keys-init"])[out_dir]
    assert keys_volume["type"] == "volume" and not keys_volume.get("read_only")
    for name in (*SIDECARS, "iceberg-convert", "iceberg-current"):
        vol = _mounts(services[name])[out_dir]
        assert vol["source"] == keys_volume["source"] and vol.get("read_only"), name
    # metrics published (each sidecar on a host port of its own), on the port the sidecars serve them
    metrics = cfg["metrics.listen"]
    published = set()
    for sidecar in SIDECARS:
        (port,) = services[sidecar]["ports"]
        assert int(port["target"]) == _port(metrics) and port.get("host_ip") == "127.0.0.1", sidecar
        published.add(int(port["published"]))
    assert published == {9096, 9097, 9098}
    # no host port is published twice (compose starts the first service and fails the second)
    host_ports = [
        (p.get("host_ip", "0.0.0.0"), int(p["published"]))
        for svc in services.values()
        for p in svc.get("ports", [])
    ]
    assert len(host_ports) == len(set(host_ports)), sorted(host_ports)
    assert _env(services["demo-producer"])["DEMO_SIDECAR_METRICS"].split(",") == [
        f"http://{sidecar}:{_port(metrics)}/metrics" for sidecar in SIDECARS
    ]
    # each sidecar has its own copy journal
    journals = {_mounts(services[s])[cfg["copy.journal_dir"]]["source"] for s in SIDECARS}
    assert len(journals) == len(SIDECARS)


def test_health_check_asks_the_port_the_sidecar_listens_on(services):
    for sidecar in SIDECARS:
        cfg = _sidecar_config(services[sidecar])
        test = services[sidecar]["healthcheck"]["test"]
        assert _port(test[2]) == _port(cfg["server.listen"])


def test_processes_share_the_sidecar_storage(services):
    """The producer and the Iceberg job see exactly the sidecar's storage and key layout."""
    ref = _sidecar_config(services["sidecar-1"])
    for name in (*SIDECARS, "demo-producer", "iceberg-convert"):
        cfg = _sidecar_config(services[name])
        for key in (
            "storage.backend",
            "storage.key_prefix",
            "storage.hashed_prefix_chars",
            "storage.s3.bucket",
            "storage.s3.endpoint_url",
        ):
            assert cfg[key] == ref[key], (name, key)


# -- broker settings: config/broker-tiered.properties + config/cluster.properties -----------
def test_brokers_get_every_tiered_and_cluster_setting_from_config(services, broker_properties):
    """Each broker: broker-tiered.properties with its placeholders filled, then
    cluster.properties replacing the single-broker values (replication factor 3)."""
    tiered = _properties(BROKER_TIERED.read_text())
    cluster = _properties(CLUSTER_PROPS.read_text())
    assert set(cluster) & set(tiered), "cluster.properties replaces no single-broker value"
    for broker in BROKERS:
        env = _env(services[broker])
        props = broker_properties[broker]
        for key, value in {**tiered, **cluster}.items():
            expected = re.sub(r"\$\{(\w+)\}", lambda m, env=env: env[m.group(1)], value)
            assert props[key] == expected, (broker, key)
        assert not any("${" in v for v in props.values())
        assert props["rlmm.config.remote.log.metadata.topic.replication.factor"] == "3"
        assert props["min.insync.replicas"] == "2"
    ids = [broker_properties[b]["node.id"] for b in BROKERS]
    assert ids == ["1", "2", "3"]
    for broker in BROKERS:
        assert broker_properties[broker]["advertised.listeners"].startswith(f"PLAINTEXT://{broker}:9092,")


def test_compose_sets_no_tiered_setting_anywhere_else(services):
    """One source of truth: neither the compose base files nor the environment (the
    apache/kafka image turns KAFKA_* variables into properties) set a tiered or cluster key;
    the controller's file holds the one key the controller needs, with the brokers' value."""
    owned = set(_properties(BROKER_TIERED.read_text())) | set(_properties(CLUSTER_PROPS.read_text()))
    for base_file in (KAFKA_BASE, BROKER_BASE):
        base = _properties(base_file.read_text())
        assert not set(_properties(BROKER_TIERED.read_text())) & set(base), base_file
        assert not [k for k in base if k.startswith(("remote.", "rsm.config.", "rlmm.config.", "log.local."))]
    assert not set(_properties(CLUSTER_PROPS.read_text())) & set(_properties(BROKER_BASE.read_text()))
    controller = _properties(CONTROLLER_BASE.read_text())
    assert {k for k in controller if k in owned or k.startswith(("remote.", "rsm.", "rlmm."))} == {
        "remote.log.storage.system.enable"
    }
    assert (
        controller["remote.log.storage.system.enable"]
        == _properties(BROKER_TIERED.read_text())["remote.log.storage.system.enable"]
    )
    for name in (*BROKERS, "controller"):
        kafka_vars = {k for k in _env(services[name]) if k.startswith("KAFKA_")}
        assert kafka_vars <= KAFKA_IMAGE_NON_PROPERTIES, name


def test_the_quorum_is_the_controller_service(services, broker_properties):
    controller = _properties(CONTROLLER_BASE.read_text())
    assert controller["process.roles"] == "controller"
    # the controller takes config/cluster.properties too (default replication factor, min ISR)
    env = _env(services["controller"])
    assert env["CLUSTER_PROPERTIES"] == CLUSTER_MOUNT
    vol = _mounts(services["controller"])[CLUSTER_MOUNT]
    assert Path(vol["source"]) == CLUSTER_PROPS and vol.get("read_only")
    rendered = _render(env, CONTROLLER_BASE, CLUSTER_PROPS)
    assert rendered.returncode == 0, rendered.stderr
    assert _properties(rendered.stdout)["default.replication.factor"] == "3"
    voters = controller["controller.quorum.voters"]
    node_id, address = voters.split("@")
    assert node_id == controller["node.id"] and address.split(":")[0] == "controller"
    assert controller["listeners"] == f"CONTROLLER://0.0.0.0:{address.split(':')[1]}"
    assert _env(services["controller"])["NODE_ROLE"] == "controller"
    for broker in BROKERS:
        props = broker_properties[broker]
        assert props["process.roles"] == "broker" and props["controller.quorum.voters"] == voters
        assert props["node.id"] != node_id
    ids = {_env(services[n])["CLUSTER_ID"] for n in (*BROKERS, "controller")}
    assert len(ids) == 1, "every node formats with the same cluster id"


def test_broker_reaches_its_own_sidecar_and_shim(services, broker_properties, dockerfiles):
    (report,) = dockerfiles.values()
    jar = next(s for s in report["sources"] if s["source"].endswith("rsm-sidecar-shim.jar"))
    for broker, sidecar in PAIRS:
        env, props = _env(services[broker]), broker_properties[broker]
        host, port = props["rsm.config.sidecar.target"].rsplit(":", 1)
        assert host == sidecar, broker
        assert int(port) == _port(_sidecar_config(services[sidecar])["server.listen"])
        # the shim jar is alone in SHIM_DIR inside the image
        assert Path(jar["dest"]).parent == Path(env["SHIM_DIR"])
        assert props["remote.log.storage.manager.class.path"] == env["SHIM_DIR"] + "/*"
        # the RLMM's listener exists
        assert f"{props['remote.log.metadata.manager.listener.name']}://" in props["listeners"]
        # clients on the host reach each broker at the port it advertises
        (published,) = services[broker]["ports"]
        assert f"HOST://localhost:{published['published']}" in props["advertised.listeners"]


def test_path_transfer_mode_shares_each_log_dir_with_its_own_sidecar(services, broker_properties):
    volumes = set()
    for broker, sidecar in PAIRS:
        props = broker_properties[broker]
        mode = props["rsm.config.transfer.mode"]
        assert mode in ("path", "stream")
        if mode == "stream":
            continue
        log_dir = props["log.dirs"]
        kafka_vol = _mounts(services[broker])[log_dir]
        sidecar_vol = _mounts(services[sidecar])[log_dir]
        assert kafka_vol["type"] == sidecar_vol["type"] == "volume"
        assert kafka_vol["source"] == sidecar_vol["source"], "the same volume at the same path"
        assert sidecar_vol.get("read_only") and not kafka_vol.get("read_only")
        assert log_dir in _sidecar_config(services[sidecar])["copy.allowed_dirs"]
        volumes.add(kafka_vol["source"])
    assert len(volumes) in (0, len(BROKERS)), "each broker has its own log directory"


def test_cluster_id_is_a_kafka_uuid(services):
    cid = _env(services["kafka-1"])["CLUSTER_ID"]
    assert len(cid) == 22 and len(base64.urlsafe_b64decode(cid + "==")) == 16


def test_published_ports_stay_on_loopback(services):
    for name, svc in services.items():
        for p in svc.get("ports", []):
            assert p.get("host_ip") == "127.0.0.1", f"{name} publishes {p} on every interface"


# -- commands ------------------------------------------------------------------------------------
def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _parse(argv: list[str]):
    from rsm_sidecar.cli.main import build_parser

    assert argv[0] == "rsm-sidecar"
    return build_parser().parse_args(argv[1:])


def test_sidecar_and_keys_commands_parse_with_the_cli(services):
    serve = _parse(services["sidecar-1"]["command"])
    assert serve.command == "serve" and serve.config == SIDECAR_MOUNT
    gen = _parse(services["keys-init"]["command"])
    assert gen.command == "keys" and gen.keys_command == "generate"


def test_iceberg_convert_command_parses_with_the_cli(services):
    from rsm_sidecar.cli.main import build_parser

    argv = services["iceberg-convert"]["command"]
    assert "iceberg" in build_parser()._subparsers._group_actions[0].choices
    args = _parse(argv)
    assert args.config == SIDECAR_MOUNT
    assert args.topic in ("demo-orders", "demo-clicks", "demo-raw")


def test_iceberg_jobs_run_on_the_spark_cluster(services):
    """The Iceberg jobs are applications of the compose Spark master (drivers in client mode,
    reachable by their host names), one core each so that the two that run at once (the
    follower and the current-state conversion, both after the one-shot conversion) fit the
    worker; the follower serves its metrics and reads the copy lag from the broker; the worker
    has the key files; the current-state conversion keeps its own table of the same topic."""
    master = services["spark-master"]["command"]
    worker = services["spark-worker"]["command"]
    assert master[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    assert worker[:3] == ["spark-class", "org.apache.spark.deploy.worker.Worker", "spark://spark-master:7077"]
    assert _arg(master, "--port") == "7077" and _arg(master, "--host") == "spark-master"
    cores = int(_arg(worker, "--cores"))
    for name in ("iceberg-convert", "iceberg-current", "iceberg-follow"):
        svc = services[name]
        assert _sidecar_config(svc)["iceberg.spark.master"] == "spark://spark-master:7077"
        args = _parse(svc["command"])
        conf = dict(c.split("=", 1) for c in args.spark_conf)
        assert conf["spark.driver.host"] == svc["hostname"] == name
        assert int(conf["spark.cores.max"]) * 2 <= cores
        assert args.config == SIDECAR_MOUNT and args.topic == "demo-orders"
    follow = _parse(services["iceberg-follow"]["command"])
    assert follow.follow and follow.bootstrap_server.split(",") == [f"{b}:9092" for b in BROKERS]
    assert (
        follow.metrics_listen.endswith(":9097") and services["iceberg-follow"]["ports"][0]["target"] == 9097
    )
    keys = [v for v in services["spark-worker"]["volumes"] if v["target"] == "/etc/rsm-sidecar/keys"]
    assert keys and keys[0]["source"] == "rsm-keys" and keys[0].get("read_only")
    assert _env(services["iceberg-follow"]) == _env(services["iceberg-convert"])
    assert _env(services["iceberg-current"]) == _env(services["iceberg-convert"])
    assert _parse(services["iceberg-current"]["command"]).mode == "upsert"
    assert _parse(services["iceberg-convert"]["command"]).mode is None  # append, the default


def test_iceberg_settings_point_at_the_catalog_warehouse_and_registry(services):
    svc = services["iceberg-convert"]
    cfg = _sidecar_config(svc)
    rest = _env(services["iceberg-rest"])
    weed = services["seaweedfs"]
    flags = dict(a.lstrip("-").split("=", 1) for a in weed["command"] if a.startswith("-") and "=" in a)
    assert cfg["iceberg.catalog.type"] == "rest"
    assert (
        cfg["iceberg.catalog.rest.uri"]
        == f"http://iceberg-rest:{services['iceberg-rest']['ports'][0]['target']}"
    )
    assert cfg["iceberg.warehouse"] == rest["CATALOG_WAREHOUSE"]
    bucket = cfg["iceberg.warehouse"].removeprefix("s3://").split("/")[0]
    assert bucket in flags["bucket"].split(",") and bucket != cfg["storage.s3.bucket"]
    assert cfg["iceberg.s3.endpoint"] == rest["CATALOG_S3_ENDPOINT"] == cfg["storage.s3.endpoint_url"]
    assert cfg["iceberg.s3.path_style_access"] and rest["CATALOG_S3_PATH__STYLE__ACCESS"] == "true"
    assert (
        cfg["iceberg.s3.access_key_id"]
        == rest["CATALOG_S3_ACCESS__KEY__ID"]
        == _env(weed)["AWS_ACCESS_KEY_ID"]
    )
    assert cfg["iceberg.s3.secret_access_key"] == rest["CATALOG_S3_SECRET__ACCESS__KEY"]
    assert cfg["iceberg.registry.url"] == _env(services["demo-producer"])["DEMO_SCHEMA_REGISTRY"]


def test_demo_producer_settings_match_the_services(services):
    env = _env(services["demo-producer"])
    assert env["DEMO_BOOTSTRAP"].split(",") == [f"{b}:9092" for b in BROKERS]
    assert env["DEMO_SIDECAR_CONFIG"] == SIDECAR_MOUNT
    assert env["DEMO_SCHEMA_REGISTRY"] == "http://registry:8080/apis/ccompat/v7"
    cmd = services["demo-producer"]["command"]
    script = cmd[1]
    demo_mount = next(v for v in services["demo-producer"]["volumes"] if script.startswith(v["target"] + "/"))
    assert (Path(demo_mount["source"]) / script[len(demo_mount["target"]) + 1 :]).is_file()


# -- the scripts inside the images ----------------------------------------------------------------
@pytest.fixture
def awk_dir():
    """The render script under the system awk: Debian's mawk, the awk of the broker image
    (debian:bookworm-slim); test_compose_cluster.py runs it inside the image itself."""
    return None


def test_render_properties_merges_and_fills(tmp_path, awk_dir):
    a = tmp_path / "a.properties"
    b = tmp_path / "b.properties"
    a.write_text("# comment\n! also a comment\n\nx=1\ny = keep \npath=${DIR}/*\n")
    b.write_text("x=2\nz=${DIR}:${PORT}\n")
    proc = _render({"DIR": "/opt/shim", "PORT": "9095"}, a, b, awk_dir=awk_dir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["x=2", "y=keep", "path=/opt/shim/*", "z=/opt/shim:9095"]


def test_render_properties_refuses_unfilled_placeholders_and_bad_lines(tmp_path, awk_dir):
    proc = _render({"SHIM_DIR": "/s"}, BROKER_TIERED, awk_dir=awk_dir)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "rsm.config.sidecar.target: no value for ${SIDECAR_TARGET}" in proc.stderr
    assert "TRANSFER_MODE" in proc.stderr
    bad = tmp_path / "bad.properties"
    bad.write_text("ok=1\nnot a property line\n")
    proc = _render({}, bad, awk_dir=awk_dir)
    assert proc.returncode == 1 and f"{bad}:2: not a key=value line" in proc.stderr


def _start_broker(env: dict[str, str]) -> subprocess.CompletedProcess:
    """docker/kafka/start-broker.sh with ``env`` (its output captured)."""
    script = ["bash", str(REPO / "docker/kafka/start-broker.sh")]
    return subprocess.run(script, env=env, capture_output=True, text=True, timeout=60)


def _fake_image(tmp_path: Path, log_dir: Path) -> dict[str, str]:
    """The files the kafka image has, in tmp_path: the compose base config (with its log dir
    moved), the render script, and a `java` stand-in that records its arguments."""
    home, kafka = tmp_path / "rsm", tmp_path / "kafka"
    (home / "bin").mkdir(parents=True)
    (kafka / "config").mkdir(parents=True)
    shutil.copy2(RENDER, home / "bin" / RENDER.name)
    for base in (KAFKA_BASE, BROKER_BASE, CONTROLLER_BASE):
        (home / base.name).write_text(
            base.read_text().replace("log.dirs=/var/lib/kafka/data", f"log.dirs={log_dir}")
        )
    java = tmp_path / "java"
    java.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/java.calls\n')
    java.chmod(0o755)
    return {
        "RSM_HOME": str(home),
        "KAFKA_HOME": str(kafka),
        "BROKER_TIERED_PROPERTIES": str(BROKER_TIERED),
        "CLUSTER_PROPERTIES": str(CLUSTER_PROPS),
        "JAVA": str(java),
    }


def test_start_broker_renders_formats_and_starts(services, broker_properties, tmp_path):
    """docker/kafka/start-broker.sh (the image's entrypoint) with the compose environment:
    server.properties is the rendered merge, storage is formatted idempotently with the
    cluster id, and Kafka is exec'd on that file with the compose heap options."""
    log_dir = tmp_path / "data"
    log_dir.mkdir()
    env = {"PATH": os.environ["PATH"], **_env(services["kafka-2"]), **_fake_image(tmp_path, log_dir)}
    proc = _start_broker(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "kafka" / "config" / "server.properties"
    assert _properties(out.read_text()) == {**broker_properties["kafka-2"], "log.dirs": str(log_dir)}
    cid = _env(services["kafka-2"])["CLUSTER_ID"]
    classpath, logging = (
        f"{tmp_path}/kafka/libs/*",
        f"-Dlog4j2.configurationFile={tmp_path}/kafka/config/log4j2.properties",
    )
    storage, server = (tmp_path / "java.calls").read_text().splitlines()
    assert storage == (
        f"-Xmx256m {logging} -cp {classpath} kafka.tools.StorageTool "
        f"format --ignore-formatted --cluster-id {cid} --config {out}"
    )
    heap = _env(services["kafka-2"])["KAFKA_HEAP_OPTS"]
    assert (
        server == f"{heap} -XX:+UseG1GC -Djava.awt.headless=true {logging} -cp {classpath} kafka.Kafka {out}"
    )
    # the image runs exactly this script with these defaults
    dockerfile = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["/opt/rsm-sidecar/bin/start-broker.sh"]' in dockerfile
    assert "COPY --chmod=0644 docker/kafka/server.properties /opt/rsm-sidecar/server.properties" in dockerfile
    for base in ("controller", "broker"):
        copy = f"COPY --chmod=0644 docker/kafka/{base}.properties /opt/rsm-sidecar/{base}.properties"
        assert copy in dockerfile
    assert (
        "COPY --chmod=0644 docker/kafka/log4j2.properties /opt/kafka/config/log4j2.properties" in dockerfile
    )
    # without NODE_ROLE (the remote topology's broker): the single combined node of server.properties
    env.pop("NODE_ROLE")
    (tmp_path / "java.calls").unlink()
    proc = _start_broker(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    combined = _properties(out.read_text())
    assert combined["process.roles"] == "broker,controller"
    tiered = _render(env, BROKER_TIERED)
    assert tiered.returncode == 0, tiered.stderr
    assert combined == {
        **_properties(KAFKA_BASE.read_text()),
        **_properties(tiered.stdout),
        "log.dirs": str(log_dir),
    }
    assert _mounts(services["kafka-2"])[TIERED_MOUNT] and _mounts(services["kafka-2"])[CLUSTER_MOUNT]


def test_start_broker_runs_the_controller_from_its_own_file(services, tmp_path):
    """NODE_ROLE=controller (the controller service): controller.properties and
    config/cluster.properties, no tiered-storage file needed, the same format and start."""
    log_dir = tmp_path / "data"
    log_dir.mkdir()
    env = {"PATH": os.environ["PATH"], **_env(services["controller"]), **_fake_image(tmp_path, log_dir)}
    env["BROKER_TIERED_PROPERTIES"] = str(tmp_path / "absent.properties")
    proc = _start_broker(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "kafka" / "config" / "server.properties"
    expected = {**_properties(CONTROLLER_BASE.read_text()), **_properties(CLUSTER_PROPS.read_text())}
    assert _properties(out.read_text()) == {**expected, "log.dirs": str(log_dir)}
    storage, server = (tmp_path / "java.calls").read_text().splitlines()
    assert f"--cluster-id {_env(services['controller'])['CLUSTER_ID']} " in storage
    assert server.startswith(_env(services["controller"])["KAFKA_HEAP_OPTS"] + " ")
    env["NODE_ROLE"] = "observer"
    proc = _start_broker(env)
    assert proc.returncode == 64 and "NODE_ROLE must be combined, broker or controller" in proc.stderr


def test_start_broker_refuses_an_unwritable_log_dir_and_a_missing_placeholder(services, tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        **_env(services["kafka-1"]),
        **_fake_image(tmp_path, tmp_path / "missing"),
    }
    proc = _start_broker(env)
    assert proc.returncode == 1 and "is not writable" in proc.stderr
    assert not (tmp_path / "java.calls").exists()
    env.pop("SIDECAR_TARGET")
    proc = _start_broker(env)
    assert proc.returncode != 0 and "SIDECAR_TARGET" in proc.stderr


def test_unless_exists(tmp_path):
    script = REPO / "docker/sidecar/unless-exists.sh"
    marker = tmp_path / "key.pem"
    ran = subprocess.run(
        ["sh", str(script), str(marker), "sh", "-c", f"echo made > {marker}"], capture_output=True, text=True
    )
    assert ran.returncode == 0 and marker.read_text() == "made\n"
    again = subprocess.run(["sh", str(script), str(marker), "false"], capture_output=True, text=True)
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_keys_init_command_generates_the_keyring_the_sidecar_loads(services, tmp_path):
    """The keys-init command line, run here (with the output directory moved), produces the
    files the sidecar's configuration names, and the keyring loads them."""
    from rsm_sidecar.cli.main import main
    from rsm_sidecar.transform.keyring import Keyring

    argv = list(services["keys-init"]["command"][1:])
    out_dir = _arg(argv, "--out")
    argv[argv.index("--out") + 1] = str(tmp_path)
    argv += ["--bits", "2048"]  # faster than the default 3072 for the test
    assert main(argv) == 0
    env = {k: v.replace(out_dir, str(tmp_path)) for k, v in _rsm_env(services["sidecar-1"]).items()}
    cfg = Config.load(SIDECAR_TOML, environ=env)
    ring = Keyring.from_config(cfg)
    assert ring.active_id == cfg["encryption.active_key_id"]
    assert oct((tmp_path / f"{ring.active_id}.private.pem").stat().st_mode & 0o777) == "0o600"


def test_health_check_script_against_a_real_sidecar(services, tmp_path):
    """docker/sidecar/healthcheck.py against `rsm-sidecar serve` started with
    config/sidecar.toml: SERVING while it runs, exit 1 once it is gone."""
    from devstack.sidecar import SidecarProcess
    from rsm_sidecar.transform.keyring import write_key_pair

    port = free_port()
    key_id = _sidecar_config(services["sidecar-1"])["encryption.active_key_id"]
    write_key_pair(tmp_path / "pub.pem", tmp_path / "priv.pem", 2048)
    env = {
        "RSM__SERVER__LISTEN": f"127.0.0.1:{port}",
        "RSM__METRICS__LISTEN": "",
        "RSM__STORAGE__BACKEND": "local",
        "RSM__STORAGE__LOCAL__ROOT": str(tmp_path / "remote"),
        f"RSM__ENCRYPTION__KEYS__{key_id}__PUBLIC_KEY_FILE": str(tmp_path / "pub.pem"),
        f"RSM__ENCRYPTION__KEYS__{key_id}__PRIVATE_KEY_FILE": str(tmp_path / "priv.pem"),
    }
    (tmp_path / "remote").mkdir()
    sidecar = SidecarProcess(SIDECAR_TOML, tmp_path, env, f"127.0.0.1:{port}")
    script = [sys.executable, str(REPO / "docker/sidecar/healthcheck.py")]
    sidecar.start()
    try:
        ok = subprocess.run([*script, f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "rsm.v1.RemoteStorage SERVING" in ok.stdout
    finally:
        sidecar.stop()
    gone = subprocess.run(
        [*script, f"127.0.0.1:{port}", "--timeout", "1"], capture_output=True, text=True, timeout=30
    )
    assert gone.returncode == 1 and "UNAVAILABLE" in gone.stdout


def test_demo_producer_schemas_compile(tmp_path, monkeypatch):
    """The demo's Protobuf file compiles with the bundled protoc (into a temporary directory
    that is gone once the module is imported) and its Avro schema parses."""
    import tempfile

    import fastavro

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sys.path.insert(0, str(REPO / "docker" / "demo"))
    try:
        import produce

        pb2 = produce.order_module()
        assert list(tmp_path.iterdir()) == []
        o = pb2.Order(order_id="o-1", status=pb2.Order.PAID)
        assert pb2.Order.FromString(o.SerializeToString()).order_id == "o-1"
        schema = fastavro.parse_schema(json.loads((REPO / "docker/demo/click.avsc").read_text()))
        rec = next(produce.clicks(__import__("random").Random(1)))[1]
        fastavro.validation.validate(rec, schema, raise_errors=True)
    finally:
        sys.path.remove(str(REPO / "docker" / "demo"))


def test_sidecar_starts_with_the_compose_configuration(services, tmp_path):
    """`rsm-sidecar serve` with config/sidecar.toml and the sidecar service's environment,
    against SeaweedFS run with the seaweedfs service's identity and buckets; only the S3
    address, the key directory and the listen ports are moved. Start-up checks the bucket,
    writes a probe object and loads the keyring; the health check script then answers
    SERVING and the metrics show the S3 requests."""
    import urllib.request

    from devstack.s3server import SeaweedS3Server
    from devstack.sidecar import SidecarProcess
    from rsm_sidecar.transform.keyring import write_key_pair

    weed = services["seaweedfs"]
    flags = dict(a.lstrip("-").split("=", 1) for a in weed["command"] if a.startswith("-") and "=" in a)
    ident = _env(weed)
    s3 = SeaweedS3Server(
        tmp_path / "s3", access_key=ident["AWS_ACCESS_KEY_ID"], secret_key=ident["AWS_SECRET_ACCESS_KEY"]
    ).start()
    try:
        for bucket in flags["bucket"].split(","):
            s3.create_bucket(bucket)
        svc = services["sidecar-1"]
        env = _rsm_env(svc)
        keys_dir = _arg(services["keys-init"]["command"], "--out")
        key_id = _arg(services["keys-init"]["command"], "--id")
        local_keys = tmp_path / "keys"
        local_keys.mkdir()
        write_key_pair(local_keys / f"{key_id}.public.pem", local_keys / f"{key_id}.private.pem", 2048)
        grpc_port, metrics_port = free_port(), free_port()
        log_dirs = tmp_path / "kafka-data"
        log_dirs.mkdir()
        moved = {
            f"http://seaweedfs:{flags['s3.port']}": s3.endpoint_url,
            keys_dir: str(local_keys),
            env["RSM__COPY__ALLOWED_DIRS"]: str(log_dirs),
        }
        env = {k: next((v.replace(a, b) for a, b in moved.items() if a in v), v) for k, v in env.items()}
        # the compose hosts (0.0.0.0: the broker reaches the sidecar over the compose network)
        # with free ports: the sidecar must accept that listen address as configured
        env["RSM__SERVER__LISTEN"] = env["RSM__SERVER__LISTEN"].rsplit(":", 1)[0] + f":{grpc_port}"
        env["RSM__METRICS__LISTEN"] = env["RSM__METRICS__LISTEN"].rsplit(":", 1)[0] + f":{metrics_port}"
        assert not any("seaweedfs:" in v or v.startswith("/etc/rsm-sidecar") for v in env.values())
        sidecar = SidecarProcess(SIDECAR_TOML, tmp_path, env, f"127.0.0.1:{grpc_port}")
        sidecar.start()
        try:
            ok = subprocess.run(
                [sys.executable, str(REPO / "docker/sidecar/healthcheck.py"), f"127.0.0.1:{grpc_port}"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert ok.returncode == 0, ok.stdout + ok.stderr
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
                metrics = r.read().decode()
            assert 'rsm_storage_requests_total{backend="s3",op="HEAD_BUCKET"} 1.0' in metrics
            assert 'rsm_storage_requests_total{backend="s3",op="PUT"} 1.0' in metrics  # the start-up probe
            log = sidecar.log_file.read_text()
            cfg = _sidecar_config(svc)
            assert f"(storage: s3 bucket {cfg['storage.s3.bucket']} at {s3.endpoint_url}" in log
            assert f"encryption: active key {key_id})" in log
        finally:
            sidecar.stop()
    finally:
        s3.stop()


def test_seaweedfs_accepts_the_compose_command_and_creates_the_buckets(services, tmp_path):
    """The seaweedfs service's `weed mini` arguments, run with the weed 4.48 the tests use
    (only the data directory, the bind address, kept on loopback here, and the ports moved):
    weed accepts every flag, the health-check URL answers 200, and the buckets exist for the
    service's identity without anyone creating them."""
    import urllib.request

    from devstack.common import port_pair
    from devstack.s3server import SeaweedS3Server

    svc = services["seaweedfs"]
    assert 'ENTRYPOINT ["/usr/bin/weed"]' in DOCKERFILE.read_text() and svc["command"][0] == "mini"
    ident = _env(svc)

    class ComposeWeed(SeaweedS3Server):
        def command(self):
            # devstack's port flags give every port a free number (and the admin pair, which
            # only mini runs: its worker dials admin port + 10000 whatever -admin.port.grpc
            # says); the compose flags come after and win (Go's flag package keeps the last
            # value), except where moved back here
            admin, admin_grpc = port_pair(10000)
            moved = {"dir": str(self.data_dir), "ip.bind": "127.0.0.1", "s3.port": str(self.s3)}
            compose_flags = []
            for arg in svc["command"][1:]:
                name = arg.lstrip("-").split("=", 1)[0]
                compose_flags.append(f"-{name}={moved[name]}" if name in moved else arg)
            own = [*self.port_flags(), f"-admin.port={admin}", f"-admin.port.grpc={admin_grpc}"]
            return [str(self.weed), *self.global_flags(), "mini", *own, *compose_flags]

    weed = ComposeWeed(
        tmp_path / "s3", access_key=ident["AWS_ACCESS_KEY_ID"], secret_key=ident["AWS_SECRET_ACCESS_KEY"]
    )
    weed.start()
    try:
        health = next(a for a in svc["healthcheck"]["test"] if a.startswith("http://"))
        path = health.split(":8333", 1)[1]
        with urllib.request.urlopen(weed.endpoint_url + path, timeout=10) as r:
            assert r.status == 200
        flags = dict(a.lstrip("-").split("=", 1) for a in svc["command"] if a.startswith("-") and "=" in a)
        want = set(flags["bucket"].split(","))
        client = weed.client()
        import time

        deadline = time.monotonic() + 30
        while True:
            have = {b["Name"] for b in client.list_buckets()["Buckets"]}
            if want <= have or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert want <= have
        assert weed.is_running()
    finally:
        weed.stop()
