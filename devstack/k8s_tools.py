"""The tools and schemas the Kubernetes deployment tests use (tests/deploy/), fetched once
into the cache by ``make k8s-tools`` (part of ``make deps``) from the registries the project
uses, at pinned versions:

* ``helm`` (:data:`HELM_VERSION`), built from the Go module proxy with ``go install`` into
  ``$RSM_CACHE_DIR/k8s-tools/`` (the module and build cache is the compose tools' one,
  ``$RSM_CACHE_DIR/go``);
* ``promtool``: taken out of Debian's ``prometheus`` package (``apt-get download`` and
  ``dpkg-deb -x``: a 19 MB download, nothing installed, no server started) where apt is there;
  elsewhere built like helm from the Go module proxy (:data:`PROMETHEUS_VERSION`, the Go module
  version of Prometheus 3.x). The Go build pulls about 1.8 GB of modules and took over 15 minutes
  on 2 cores, which is why the package comes first: rule files and ``promtool test rules`` files
  read the same in both;
* the CustomResourceDefinitions the examples and the chart's optional resources are validated
  against:

  - Strimzi's ``Kafka``, ``KafkaNodePool`` and ``KafkaTopic`` (:data:`STRIMZI_VERSION`):
    ``io.strimzi:api`` from Maven Central holds the model classes but no CRD files, so they are
    generated from it with Strimzi's own generator (``io.strimzi:crd-generator``, Maven Central)
    and the arguments Strimzi's build passes (the ``api`` module's pom), as Strimzi makes the
    CRDs it ships. The generator needs Java 21+ (the JRE of ``devstack.registry`` otherwise);
  - cert-manager's ``Issuer`` and ``Certificate`` (:data:`CERT_MANAGER_VERSION`) and the
    Prometheus operator's ``ServiceMonitor`` and ``PrometheusRule``
    (:data:`PROMETHEUS_OPERATOR_VERSION`): the CRD files of their Go modules
    (``deploy/crds/`` and ``example/prometheus-operator-crd/``), downloaded with
    ``go mod download`` from the Go module proxy;

  the Kubernetes API's own schemas come from the ``kubernetes-validate`` package (PyPI, a dev
  dependency), which bundles the JSON schemas generated from each release's OpenAPI document;
* the Prometheus JMX exporter Java agent (:data:`JMX_EXPORTER_VERSION`, Maven Central), which
  the remote topology test runs in the broker with deploy/strimzi/kafka-metrics.yaml's rules,
  as Strimzi does with ``metricsConfig: jmxPrometheusExporter``.

    python -m devstack.k8s_tools      # fetch and build everything, print the paths
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from devstack.common import default_cache_dir, file_lock, made_once, run_checked, user_maven_lock
from devstack.compose_tools import ToolUnavailable, _go_env
from devstack.java import ensure_java

HELM_VERSION = "v3.22.0"
#: Prometheus 3.x is tagged v3.N.M; its Go module is versioned v0.3NN.M (here: Prometheus 3.16.0)
PROMETHEUS_VERSION = "v0.316.0"
STRIMZI_VERSION = "1.2.0"
CERT_MANAGER_VERSION = "v1.21.2"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
JMX_EXPORTER_VERSION = "1.0.1"

#: Strimzi's CRD generator arguments, as the api module's pom passes them (v1 only since 1.0)
_STRIMZI_GENERATOR_ARGS = (
    "--label",
    "app:strimzi",
    "--label",
    "strimzi.io/crd-install:true",
    "--target-kube",
    "1.16+",
    "--crd-api-version",
    "v1",
    "--api-versions",
    "v1",
    "--storage-version",
    "v1",
    "--yaml",
)
STRIMZI_KINDS = {
    "Kafka": "io.strimzi.api.kafka.model.kafka.Kafka",
    "KafkaNodePool": "io.strimzi.api.kafka.model.nodepool.KafkaNodePool",
    "KafkaTopic": "io.strimzi.api.kafka.model.topic.KafkaTopic",
}
#: Go module -> (version, {kind: CRD file in the module})
GO_MODULE_CRDS = {
    "github.com/cert-manager/cert-manager": (
        CERT_MANAGER_VERSION,
        {
            "Issuer": "deploy/crds/cert-manager.io_issuers.yaml",
            "ClusterIssuer": "deploy/crds/cert-manager.io_clusterissuers.yaml",
            "Certificate": "deploy/crds/cert-manager.io_certificates.yaml",
        },
    ),
    "github.com/prometheus-operator/prometheus-operator": (
        PROMETHEUS_OPERATOR_VERSION,
        {
            "ServiceMonitor": "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
            "PrometheusRule": "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
        },
    ),
}


def tools_dir() -> Path:
    path = default_cache_dir() / "k8s-tools"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _once(home: Path, made: Path, make: Callable[[], object]) -> Path:
    """``made`` (a file under ``home``, a tool's directory in :func:`tools_dir`) after ``make()``
    made it, once (:func:`~devstack.common.made_once`, locked by ``<home>.lock``)."""

    def build() -> Path:
        home.mkdir(parents=True, exist_ok=True)
        make()
        return made

    return made_once(home.parent / (home.name + ".lock"), lambda: made if made.exists() else None, build)


def _go_install(package: str, version: str, binary: str) -> Path:
    """``go install package@version`` into ``k8s-tools/<binary>-<version>/``, once."""
    home = tools_dir() / f"{binary}-{version}"

    def install() -> None:
        env = dict(_go_env(), GOBIN=str(home))
        run_checked(
            ["go", "install", f"{package}@{version}"], f"go install {package}@{version}", 3600, env=env
        )

    return _once(home, home / binary, install)


def ensure_helm() -> Path:
    return _go_install("helm.sh/helm/v3/cmd/helm", HELM_VERSION, "helm")


def ensure_promtool() -> Path:
    return _debian_promtool() or _go_install(
        "github.com/prometheus/prometheus/cmd/promtool", PROMETHEUS_VERSION, "promtool"
    )


def _debian_promtool() -> Path | None:
    """``promtool`` out of Debian's ``prometheus`` package, or None where apt cannot fetch it."""
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        return None
    home = tools_dir() / "promtool-debian"
    path = home / "usr" / "bin" / "promtool"
    found = _once(home, path, lambda: _debian_package_promtool(home))
    return found if found.exists() else None


def _debian_package_promtool(home: Path) -> None:
    """Unpack Debian's ``prometheus`` package's ``promtool`` into ``home`` (nothing there when
    apt cannot fetch the package)."""
    download = home / "download"
    download.mkdir(exist_ok=True)
    fetch = ["apt-get", "download", "prometheus"]
    proc = subprocess.run(fetch, cwd=download, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and os.geteuid() == 0:  # a fresh machine has no package lists yet
        subprocess.run(["apt-get", "update"], capture_output=True, timeout=600)
        proc = subprocess.run(fetch, cwd=download, capture_output=True, text=True, timeout=600)
    debs = sorted(download.glob("prometheus_*.deb"))
    if proc.returncode != 0 or not debs:
        print(f"apt-get download prometheus failed, building promtool instead: {proc.stderr.strip()}")
        return
    run_checked(["dpkg-deb", "-x", str(debs[-1]), str(home)], "dpkg-deb -x prometheus")
    for deb in debs:
        deb.unlink()
    (home / "usr" / "bin" / "prometheus").unlink(missing_ok=True)  # only promtool is used


def _maven_copy(artifact: str, target: Path) -> Path:
    group, name, version = artifact.split(":")
    jar = target / f"{name}-{version}.jar"
    if jar.exists():
        return jar
    with file_lock(user_maven_lock()):
        run_checked(
            [
                "mvn",
                "-q",
                "-B",
                "dependency:copy",
                f"-Dartifact={artifact}",
                f"-DoutputDirectory={target}",
            ],
            f"mvn dependency:copy {artifact}",
            timeout=900,
        )
    return jar


def ensure_strimzi_crds() -> Path:
    """``<dir>/<Kind>.yaml`` for :data:`STRIMZI_KINDS`, generated from io.strimzi:api."""
    home = tools_dir() / f"strimzi-crds-{STRIMZI_VERSION}"
    _once(home, home / ".done", lambda: _generate_strimzi_crds(home, home / ".done"))
    return home


def _generate_strimzi_crds(home: Path, done: Path) -> None:
    jars = home / "jars"
    api = _maven_copy(f"io.strimzi:api:{STRIMZI_VERSION}", jars)
    generator = _maven_copy(f"io.strimzi:crd-generator:{STRIMZI_VERSION}", jars)
    java = ensure_java(21, default_cache_dir(), "Strimzi's CRD generator")  # its classes are Java 21
    targets = [f"{cls}={home / (kind + '.yaml')}" for kind, cls in STRIMZI_KINDS.items()]
    run_checked(
        [
            java,
            "-cp",
            f"{api}:{generator}",
            "io.strimzi.crdgenerator.CrdGenerator",
            *_STRIMZI_GENERATOR_ARGS,
            *targets,
        ],
        "Strimzi's CrdGenerator",
        timeout=600,
    )
    done.touch()


def ensure_go_module_crds() -> Path:
    """``<dir>/<Kind>.yaml`` for every kind of :data:`GO_MODULE_CRDS`."""
    home = tools_dir() / "crds"
    done = home / (".done-" + "-".join(v for v, _ in GO_MODULE_CRDS.values()))
    _once(home, done, lambda: _copy_crds(home, done))
    return home


def _copy_crds(home: Path, done: Path) -> None:
    env = _go_env()
    for module, (version, files) in GO_MODULE_CRDS.items():
        out = run_checked(
            ["go", "mod", "download", "-json", f"{module}@{version}"], f"go mod download {module}", env=env
        )
        root = Path(json.loads(out)["Dir"])
        for kind, rel in files.items():
            shutil.copyfile(root / rel, home / f"{kind}.yaml")
    done.touch()


def ensure_jmx_exporter() -> Path:
    home = tools_dir() / "jmx-exporter"
    home.mkdir(parents=True, exist_ok=True)
    with file_lock(home.parent / (home.name + ".lock")):
        return _maven_copy(f"io.prometheus.jmx:jmx_prometheus_javaagent:{JMX_EXPORTER_VERSION}", home)


def ensure_all() -> dict[str, Path]:
    return {
        "helm": ensure_helm(),
        "promtool": ensure_promtool(),
        "strimzi_crds": ensure_strimzi_crds(),
        "crds": ensure_go_module_crds(),
        "jmx_exporter": ensure_jmx_exporter(),
    }


def main() -> int:
    try:
        for name, path in ensure_all().items():
            print(f"{name}: {path}")
    except ToolUnavailable as e:
        print(f"devstack.k8s_tools: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
