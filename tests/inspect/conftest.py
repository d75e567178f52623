"""A real tiered-storage stack per test module (broker + Java shim + sidecar on
local-directory storage) and a runner for `rsm-sidecar inspect` as a subprocess with the
sidecar's own configuration and environment.

A module sets ``stack_env`` (a module-scoped fixture) to start its sidecar with extra
``RSM__...`` settings, e.g. its own keys."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from devstack.stack import LocalStack
from tests.helpers import BROKER_JVM_OPTIONS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack_env() -> dict[str, str]:
    return {}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stack_env):
    st = LocalStack(
        tmp_path_factory.mktemp("inspect-stack"), sidecar_env=stack_env, broker_jvm_options=BROKER_JVM_OPTIONS
    )
    st.start()
    try:
        yield st
    finally:
        st.stop()


@pytest.fixture(scope="module")
def store(stack):
    return stack.object_store()


@dataclasses.dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    stdout_bytes: bytes

    def json(self):
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as e:
            raise AssertionError(
                f"inspect {' '.join(self.args)} printed no JSON document ({e}):\n"
                f"{self.stdout[:2000]}\nstderr:\n{self.stderr[-2000:]}"
            ) from None

    def expect(self, code: int) -> Result:
        assert self.returncode == code, (
            f"inspect {' '.join(self.args)} exited {self.returncode}, expected {code}\n"
            f"stdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"
        )
        return self


class InspectCli:
    """``python -m rsm_sidecar.cli.main inspect <command> --config <sidecar.toml> ...`` with
    the sidecar's environment as the stack runs it now (after restarts, the new one)."""

    def __init__(self, stack: LocalStack):
        self.stack = stack

    def env(self, overrides: Mapping[str, str | None] | None = None) -> dict[str, str]:
        _, sidecar_env = self.stack.sidecar_config_env()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RSM__")}
        env.update(sidecar_env)
        for k, v in (overrides or {}).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def popen_args(self, command: str, *args: str) -> list[str]:
        config, _ = self.stack.sidecar_config_env()
        return [
            sys.executable,
            "-m",
            "rsm_sidecar.cli.main",
            "inspect",
            command,
            "--config",
            str(config),
            *args,
        ]

    def __call__(
        self, command: str, *args: str, env: Mapping[str, str | None] | None = None, timeout: float = 300
    ) -> Result:
        argv = self.popen_args(command, *args)
        p = subprocess.run(
            argv, cwd=REPO, env=self.env(env), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        return Result(
            [command, *args],
            p.returncode,
            p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"),
            p.stdout,
        )


@pytest.fixture(scope="module")
def inspect_cli(stack) -> InspectCli:
    return InspectCli(stack)
