"""benchmarks/netns.py: one run at a time holds a namespace's name. Two runs of a benchmark
once shared one: the second deleted the first's namespace and veth pair as a "leftover", and
the first run's broker lost its sidecar for the rest of that run. Real namespaces (needs root)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.netns import NetNs, available
from devstack.common import REPO_ROOT

pytestmark = pytest.mark.skipif(available() is not None, reason=f"network namespaces: {available()}")

NAME = "rsm-test-netns-lock"


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_a_second_run_is_refused_and_the_first_keeps_its_namespace():
    with NetNs(NAME) as ns:
        second = subprocess.run(
            [sys.executable, "-c", f"from benchmarks.netns import NetNs; NetNs({NAME!r}).__enter__()"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        assert second.returncode != 0
        assert f"network namespace {NAME} is in use by another run" in second.stderr
        inside = subprocess.run(
            [*ns.exec_prefix, "ip", "-br", "addr"], capture_output=True, text=True, check=True
        )
        assert ns.inner_ip in inside.stdout  # still there, addressed
    assert NAME not in _namespaces()


def test_a_namespace_left_by_a_killed_run_is_removed():
    subprocess.run(["ip", "netns", "add", NAME], check=True)
    try:
        with NetNs(NAME) as ns:
            inside = subprocess.run([*ns.exec_prefix, "ip", "-br", "addr"], capture_output=True, text=True)
            assert ns.inner_ip in inside.stdout
        assert NAME not in _namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", NAME], capture_output=True, check=False)
