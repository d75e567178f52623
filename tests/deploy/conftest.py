"""The tools and schemas of the deployment tests, built by `make k8s-tools` (part of `make deps`;
devstack/k8s_tools.py): a missing one is built here, a tool that cannot be built fails the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack import k8s_tools
from devstack.compose_tools import ToolUnavailable

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "rsm-sidecar"
STRIMZI = REPO / "deploy" / "strimzi"


def tool(fn):
    try:
        return fn()
    except ToolUnavailable as e:
        pytest.fail(f"{e} (make deps builds it: make k8s-tools)")


@pytest.fixture(scope="session")
def helm() -> Path:
    return tool(k8s_tools.ensure_helm)


@pytest.fixture(scope="session")
def promtool() -> Path:
    return tool(k8s_tools.ensure_promtool)


@pytest.fixture(scope="session")
def crd_dirs() -> list[Path]:
    """Strimzi's, cert-manager's and the Prometheus operator's CRDs: <dir>/<Kind>.yaml."""
    return [tool(k8s_tools.ensure_strimzi_crds), tool(k8s_tools.ensure_go_module_crds)]


@pytest.fixture(scope="session")
def jmx_exporter() -> Path:
    return tool(k8s_tools.ensure_jmx_exporter)
