"""`rsm-sidecar serve`: the gRPC server with health checking, Prometheus metrics and a
graceful shutdown (SIGTERM/SIGINT: report NOT_SERVING, refuse new calls, wait up to
`server.shutdown_grace_seconds` for in-flight copies and fetches).

Who may connect: a Unix socket is created mode 0600 and locked (``<socket>.lock``), so a
second sidecar cannot take it over; a TCP address must be on the loopback interface
unless clients must present a certificate (mTLS) or
``server.allow_plaintext_non_loopback`` says the network is private. Metrics listen on
127.0.0.1 unless ``metrics.listen`` names a host."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import logging
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from types import FrameType
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.segment.journal import lock_exclusively
from rsm_sidecar.service.fetch_channel import ALPN_PROTOCOL, FetchChannel
from rsm_sidecar.service.listener import Listener
from rsm_sidecar.service.metrics_http import serve_metrics, split_listen
from rsm_sidecar.service.servicer import RemoteStorageServicer
from rsm_sidecar.service.settings import ServiceSettings
from rsm_sidecar.service.sidecar import Sidecar
from rsm_sidecar.service.tls import ServerTls

log = logging.getLogger(__name__)
SERVICE_NAME = "rsm.v1.RemoteStorage"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def stream_window_options(window: int) -> list[tuple[str, int]]:
    """gRPC core's options for ``server.stream_window_bytes``: a fixed window of that size, or
    (0) its own sizing. Left to itself, gRPC core sets each stream's window to the larger of
    4 MiB and twice the bandwidth-delay product it measures with HTTP/2 pings; on a loaded host
    the pings' answers come late, the product looks large, and a stream-mode copy's bytes pile
    up in the transport ahead of the copy."""
    if window == 0:
        return []
    return [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", window)]


#: longest path of a Unix socket (sun_path is 108 bytes on Linux, with its terminating NUL)
MAX_SOCKET_PATH = 107


def private_grpc_dir() -> str:
    """A new directory only the sidecar's user can enter, for the gRPC server's socket: in the
    temporary directory, or in /tmp when that one's path is too long for a socket."""
    base = tempfile.gettempdir()
    if len(os.path.join(base, "rsm-grpc-xxxxxxxx", "grpc.sock")) > MAX_SOCKET_PATH:
        base = "/tmp"
    return tempfile.mkdtemp(prefix="rsm-grpc-", dir=base)


class SidecarServer:
    def __init__(self, cfg: Config, sidecar: Sidecar | None = None):
        self.cfg = cfg
        self.settings = settings = ServiceSettings.from_config(cfg)
        if not settings.server.listen.startswith("unix:"):
            split_listen(settings.server.listen, "server.listen")
        window = settings.server.stream_window_bytes
        self.sidecar = sidecar or Sidecar.from_config(cfg)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(
                max_workers=settings.server.max_workers, thread_name_prefix="rpc"
            ),
            options=[
                ("grpc.max_receive_message_length", 4 * 1024 * 1024),
                ("grpc.max_send_message_length", 4 * 1024 * 1024),
                ("grpc.so_reuseport", 0),
                *stream_window_options(window),
            ],
            maximum_concurrent_rpcs=None,
        )
        self.servicer = RemoteStorageServicer(self.sidecar)
        self.server.add_generic_rpc_handlers((self.servicer.handlers(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self._socket_lock: int | None = None
        self.tls: ServerTls | None = None
        self.address = self._bind(settings.server.listen)
        self._metrics_server: WSGIServer | None = None
        self._stopped = threading.Event()

    def _bind(self, listen: str) -> str:
        """Checks who may connect to ``listen``, binds the listener there, and the gRPC server to
        a socket in a private directory of its own (listener.py: the listener hands gRPC's
        connections over)."""
        tls = self.settings.server.tls
        cert, key, ca = tls.cert_file, tls.key_file, tls.client_ca_file
        if bool(cert) != bool(key):
            raise ConfigError("server.tls.cert_file and server.tls.key_file must be set together")
        if ca and not cert:
            raise ConfigError("server.tls.client_ca_file needs server.tls.cert_file and server.tls.key_file")
        if cert and key:
            # read again when renewed in place (tls.py); checked now, so bad files fail start-up
            # the fetch channel's protocol first: a client offering both gets it, gRPC's offer only h2
            self.tls = ServerTls(cert, key, ca or None, [ALPN_PROTOCOL, "h2"])
        socket_path = None
        if listen.startswith("unix:"):
            socket_path = Path(
                listen[len("unix://") :] if listen.startswith("unix://") else listen[len("unix:") :]
            )
            if not socket_path.is_absolute():
                raise ConfigError(
                    f"server.listen: {listen!r}: the socket path must be absolute (unix:///path)"
                )
            try:
                socket_path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(
                    f"server.listen: cannot create {socket_path.parent}: {e.strerror}"
                ) from None
            self._socket_lock = lock_exclusively(
                socket_path.with_name(socket_path.name + ".lock"), "server.listen"
            )
        else:
            host, _ = split_listen(listen, "server.listen")
            if not is_loopback(host) and not ca and not self.settings.server.allow_plaintext_non_loopback:
                raise ConfigError(
                    f"server.listen: {listen} is not a loopback address and clients are not authenticated: "
                    "anyone who reaches it could read, overwrite and delete every tiered segment. Require "
                    "client certificates (server.tls.cert_file, server.tls.key_file, "
                    "server.tls.client_ca_file), use a Unix socket or 127.0.0.1, or set "
                    "server.allow_plaintext_non_loopback = true on a network only the broker can reach"
                )
        self._grpc_dir = private_grpc_dir()
        grpc_socket = os.path.join(self._grpc_dir, "grpc.sock")
        old_umask = os.umask(0o077)
        try:
            self.server.add_insecure_port(f"unix://{grpc_socket}")
        except RuntimeError as e:
            raise ConfigError(f"cannot listen on the gRPC server's own socket {grpc_socket}: {e}") from None
        finally:
            os.umask(old_umask)
        try:
            self.listener = Listener(
                listen,
                self.tls,
                grpc_socket,
                FetchChannel(self.servicer),
                self.sidecar.metrics.tls_refusals,
            )
        except OSError as e:
            raise ConfigError(f"server.listen: cannot listen on {listen}: {e.strerror or e}") from None
        return self.listener.address

    def _sweep(self) -> None:
        """What killed or failed copies left: journal entries and the store's temp files."""
        journal = self.sidecar.copier.journal
        if journal is not None:
            cleaned = journal.sweep()
            if cleaned:
                log.info("settled %d copy journal entries of interrupted copies", cleaned)
        try:
            self.sidecar.store.remove_leftovers()
        except Exception as e:
            log.warning("could not remove the temp files of interrupted writes: %s", e)

    def _sweep_periodically(self) -> None:
        interval = self.settings.copy.journal_sweep_seconds
        while True:
            try:
                self._sweep()
            except Exception as e:  # the next sweep tries again
                log.warning("the sweep of interrupted copies failed: %s", e)
            if self._stopped.wait(interval):
                return

    def start(self) -> None:
        # the first sweep runs beside serving, not before it: a journal of thousands of entries
        # (each a GET and deletes) must not delay start-up (CopyJournal.sweep is safe beside copies)
        threading.Thread(target=self._sweep_periodically, name="leftover-sweep", daemon=True).start()
        listen = self.settings.metrics.listen
        if listen:
            self._metrics_server = serve_metrics(listen, "metrics.listen", self.sidecar.metrics.registry)
        self.server.start()
        self.listener.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "rsm-sidecar serving on %s (storage: %s, encryption: %s)",
            self.address,
            self.sidecar.store.describe(),
            f"active key {self.sidecar.keyring.active_id}" if self.sidecar.keyring else "off",
            extra={"fields": {"listen": self.address}},
        )

    def stop(self, grace: float | None = None) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.settings.server.shutdown_grace_seconds if grace is None else grace
        log.info("shutting down: draining in-flight calls for up to %.0fs", grace)
        self.health.enter_graceful_shutdown()
        self.listener.stop()
        grpc_drained = self.server.stop(grace)
        self.listener.fetch_channel.drain(grace)  # beside gRPC's drain, in the same grace
        grpc_drained.wait()
        shutil.rmtree(self._grpc_dir, ignore_errors=True)
        self.servicer.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self.sidecar.close()
        if self._socket_lock is not None:
            os.close(self._socket_lock)
            self._socket_lock = None
        log.info("stopped")

    def serve_forever(self) -> None:
        done = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("received %s", signal.Signals(signum).name)
            done.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start()
        # Python runs signal handlers in the main thread, and only between bytecodes: when
        # the kernel delivers SIGTERM to another thread (gRPC's, the metrics server's), a
        # main thread blocked in an untimed wait would never run the handler.
        while not done.wait(0.5):
            pass
        self.stop()
