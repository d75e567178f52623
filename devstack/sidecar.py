"""Run rsm-sidecar as its own process (as next to a production broker), for the local
stack, the demo and the end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.common import REPO_ROOT, kill_process, terminate_process


class SidecarProcess:
    """``rsm-sidecar serve --config <config>`` with ``env`` overrides (RSM__...), logs in
    ``<workdir>/logs/sidecar.log``. ``tls`` (trusted CAs, client key, client certificate, all
    PEM) and ``authority`` (the name its certificate holds) are what the health check dials a
    TLS sidecar with; ``prefix`` runs it under another command (``ip netns exec NS``)."""

    def __init__(
        self,
        config: Path,
        workdir: Path,
        env: Mapping[str, str],
        target: str,
        tls: tuple[bytes, bytes, bytes] | None = None,
        authority: str | None = None,
        prefix: Sequence[str] = (),
    ):
        self.config = Path(config)
        self.workdir = Path(workdir)
        self.env = dict(env)
        self.target = target  # what clients dial: host:port or unix:///path
        self.tls = tls
        self.authority = authority
        self.prefix = list(prefix)
        self._proc: subprocess.Popen | None = None

    @property
    def log_file(self) -> Path:
        return self.workdir / "logs" / "sidecar.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 60) -> SidecarProcess:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_file, "ab")
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self._proc = subprocess.Popen(
            [
                *self.prefix,
                sys.executable,
                "-m",
                "rsm_sidecar.cli.main",
                "serve",
                "--config",
                str(self.config),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.wait_serving(timeout)
        return self

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"rsm-sidecar exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                with self.channel() as ch:
                    resp = health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=1
                    )
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        raise RuntimeError(
            f"rsm-sidecar not serving on {self.target} after {timeout:.0f}s:\n{self.log_tail()}"
        )

    def channel(self) -> grpc.Channel:
        """A channel to the sidecar, with the client certificate when it speaks TLS."""
        if self.tls is None:
            return grpc.insecure_channel(self.target)
        options = [("grpc.ssl_target_name_override", self.authority)] if self.authority else []
        return grpc.secure_channel(self.target, grpc.ssl_channel_credentials(*self.tls), options=options)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30) -> None:
        if self._proc is not None:
            terminate_process(self._proc, timeout)

    def kill(self) -> None:
        if self._proc is not None:
            kill_process(self._proc)
