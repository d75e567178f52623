"""`rsm-sidecar serve`: the gRPC server with health checking, Prometheus metrics and a
graceful shutdown (SIGTERM/SIGINT: report NOT_SERVING, refuse new calls, wait up to
`server.shutdown_grace_seconds` for in-flight copies and fetches)."""

from __future__ import annotations

import concurrent.futures
import logging
import signal
import threading

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rsm_sidecar._proto.rsm.v1 import rsm_pb2_grpc
from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.service.servicer import RemoteStorageServicer
from rsm_sidecar.service.sidecar import Sidecar

log = logging.getLogger(__name__)
SERVICE_NAME = "rsm.v1.RemoteStorage"


def _read(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {path}: {e.strerror}") from None


class SidecarServer:
    def __init__(self, cfg: Config, sidecar: Sidecar | None = None):
        self.cfg = cfg
        self.sidecar = sidecar or Sidecar.from_config(cfg)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=cfg["server.max_workers"], thread_name_prefix="rpc"),
            options=[("grpc.max_receive_message_length", 4 * 1024 * 1024),
                     ("grpc.max_send_message_length", 4 * 1024 * 1024),
                     ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=None)
        rsm_pb2_grpc.add_RemoteStorageServicer_to_server(RemoteStorageServicer(self.sidecar), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.address = self._bind(cfg["server.listen"])
        self._metrics_server = None
        self._stopped = threading.Event()

    def _bind(self, listen: str) -> str:
        cert, key, ca = (self.cfg["server.tls.cert_file"], self.cfg["server.tls.key_file"],
                         self.cfg["server.tls.client_ca_file"])
        if bool(cert) != bool(key):
            raise ConfigError("server.tls.cert_file and server.tls.key_file must be set together")
        if ca and not cert:
            raise ConfigError("server.tls.client_ca_file needs server.tls.cert_file and server.tls.key_file")
        try:
            if cert:
                creds = grpc.ssl_server_credentials(
                    [(_read(key, "server.tls.key_file"), _read(cert, "server.tls.cert_file"))],
                    root_certificates=_read(ca, "server.tls.client_ca_file") if ca else None,
                    require_client_auth=bool(ca))
                port = self.server.add_secure_port(listen, creds)
            else:
                port = self.server.add_insecure_port(listen)
        except RuntimeError as e:
            raise ConfigError(f"server.listen: cannot listen on {listen}: {e}") from None
        if listen.startswith("unix:"):
            return listen
        host = listen.rsplit(":", 1)[0]
        return f"{host}:{port}"

    def _sweep_journal(self) -> None:
        journal = self.sidecar.copier.journal
        interval = self.cfg["copy.journal_sweep_seconds"]
        while not self._stopped.wait(interval):
            journal.sweep()

    def start(self) -> None:
        journal = self.sidecar.copier.journal
        if journal is not None:
            cleaned = journal.sweep()  # before serving: nothing of this process is in flight yet
            if cleaned:
                log.info("removed the leftovers of %d interrupted copies", cleaned)
            threading.Thread(target=self._sweep_journal, name="journal-sweep", daemon=True).start()
        listen = self.cfg["metrics.listen"]
        if listen:
            host, _, port = listen.rpartition(":")
            try:
                self._metrics_server, _ = prometheus_client.start_http_server(
                    int(port), addr=host or "0.0.0.0", registry=self.sidecar.metrics.registry)
            except (OSError, ValueError) as e:
                raise ConfigError(f"metrics.listen: cannot serve metrics on {listen}: {e}") from None
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("rsm-sidecar serving on %s (storage: %s, encryption: %s)", self.address,
                 self.sidecar.store.describe(),
                 f"active key {self.sidecar.keyring.active_id}" if self.sidecar.keyring else "off",
                 extra={"fields": {"listen": self.address}})

    def stop(self, grace: float | None = None) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.cfg["server.shutdown_grace_seconds"] if grace is None else grace
        log.info("shutting down: draining in-flight calls for up to %.0fs", grace)
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self.sidecar.close()
        log.info("stopped")

    def serve_forever(self) -> None:
        done = threading.Event()

        def on_signal(signum, frame):
            log.info("received %s", signal.Signals(signum).name)
            done.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        done.wait()
        self.stop()
