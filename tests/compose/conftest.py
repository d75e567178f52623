"""docker-compose.yml as `docker compose config` normalizes it, shared by the compose tests."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from devstack import compose_tools as tooling

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"


def tool(fn):
    """A validation tool that `make deps` builds (compose-tools); missing is a failure."""
    try:
        return fn()
    except tooling.ToolUnavailable as e:
        pytest.fail(f"{e} (make deps builds it)")


def compose_env() -> dict[str, str]:
    # the file must not depend on the caller's environment: no interpolation from it
    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR")}


def compose_config(
    compose: list[str], file: Path, *options: str, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """``docker compose -f <file> config <options>``, in ``cwd``, without the caller's
    environment (:func:`compose_env`)."""
    return subprocess.run(
        [*compose, "-f", str(file), "config", *options],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=compose_env(),
    )


@pytest.fixture(scope="session")
def compose() -> list[str]:
    return tool(tooling.compose_command)


@pytest.fixture(scope="session")
def project(compose) -> dict:
    proc = compose_config(compose, COMPOSE_FILE, "--format", "json")
    assert proc.returncode == 0, f"docker compose config failed:\n{proc.stderr}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def services(project) -> dict[str, dict]:
    return project["services"]
