"""The sidecar's address (``server.listen``): accepts every connection, completes its TLS handshake
when TLS is on, and hands it to the fetch channel (a connection that starts with its preface) or to
the gRPC server (one that starts with HTTP/2's), which listens only on a socket of its own.

Why the sidecar, not gRPC, owns the address: the fetch channel and gRPC then share one address, one
port, one set of certificates and one client authentication (nothing new to open in a network
policy or a Service); and every handshake is seen here, so a refused one is logged with the peer
and the reason (``rsm_tls_handshake_failures_total``), which gRPC core does only in its own
unstructured lines without the peer. The certificates are read again when they change
(``tls.py``).

One thread per connection. A connection that sends neither preface within
``HANDSHAKE_TIMEOUT_SECONDS`` (TLS included) is closed; so are connections beyond
``MAX_CONNECTIONS``.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from pathlib import Path

from prometheus_client import Counter

from rsm_sidecar.service import grpc_relay
from rsm_sidecar.service.fetch_channel import PREFACE, FetchChannel, read_exactly
from rsm_sidecar.service.tls import ServerTls

log = logging.getLogger(__name__)

#: the first bytes of every HTTP/2 client connection (RFC 9113 §3.4)
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PREFACE_BYTES = len(PREFACE)
assert PREFACE_BYTES <= len(H2_PREFACE)
#: time a new connection has to complete its handshake and send its preface
HANDSHAKE_TIMEOUT_SECONDS = 10.0
#: connections served at once; more are closed at once (each is a thread)
MAX_CONNECTIONS = 1024
#: a refused handshake is logged once per peer host and reason in this long (the rest counted)
REFUSAL_LOG_SECONDS = 60.0
#: how long ``accept`` waits before checking whether the listener was stopped
ACCEPT_POLL_SECONDS = 0.5

#: the reasons of ``rsm_tls_handshake_failures_total``: (label, what the log line says)
REFUSALS = {
    "client_certificate_untrusted": "the client's certificate is not signed by server.tls.client_ca_file",
    "client_certificate_expired": "the client's certificate has expired or is not valid yet",
    "client_certificate_invalid": "the client's certificate was refused",
    "no_client_certificate": "the client sent no certificate (server.tls.client_ca_file requires one)",
    "server_certificate_refused": "the client refused the sidecar's certificate (server.tls.cert_file)",
    "not_tls": "the client does not speak TLS (a plaintext client on a TLS port?)",
    "no_common_protocol": "the client and the sidecar share no TLS version, cipher or ALPN protocol",
    "closed": "the client closed the connection during the handshake",
    "timeout": f"no handshake within {HANDSHAKE_TIMEOUT_SECONDS:g} s",
    "other": "the handshake failed",
}


def classify_refusal(err: BaseException) -> tuple[str, str]:
    """(the reason's label, a detail from the error) of a failed server-side handshake."""
    if isinstance(err, TimeoutError):
        return "timeout", ""
    if isinstance(err, ssl.SSLCertVerificationError):
        detail = err.verify_message or str(err)
        if "expired" in detail or "not yet valid" in detail:
            return "client_certificate_expired", detail
        if "issuer" in detail or "self-signed" in detail or "self signed" in detail:
            return "client_certificate_untrusted", detail
        return "client_certificate_invalid", detail
    if isinstance(err, (ssl.SSLEOFError, ConnectionResetError, BrokenPipeError)) or (
        isinstance(err, ssl.SSLZeroReturnError)
    ):
        return "closed", str(err)
    if isinstance(err, ssl.SSLError):
        reason = (err.reason or "").upper()
        if "PEER_DID_NOT_RETURN_A_CERTIFICATE" in reason or "CERTIFICATE_REQUIRED" in reason:
            return "no_client_certificate", reason
        if "ALERT" in reason and any(
            k in reason for k in ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_EXPIRED", "DECRYPT_ERROR")
        ):
            return "server_certificate_refused", reason
        if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNEXPECTED_MESSAGE"):
            return "not_tls", reason
        if (
            "NO_SHARED_CIPHER" in reason
            or "UNSUPPORTED_PROTOCOL" in reason
            or "NO_APPLICATION_PROTOCOL" in reason
        ):
            return "no_common_protocol", reason
        if "CERTIFICATE" in reason:
            return "client_certificate_invalid", reason
        return "other", reason or str(err)
    if isinstance(err, OSError):
        return "closed", str(err)
    return "other", f"{type(err).__name__}: {err}"


class Listener:
    """Accepts connections on ``address`` (``host:port`` or ``unix:///path``)."""

    def __init__(
        self,
        address: str,
        tls: ServerTls | None,
        grpc_socket_path: str,
        fetch_channel: FetchChannel,
        refusals: Counter,
    ):
        self.tls = tls
        self.grpc_socket_path = grpc_socket_path
        self.fetch_channel = fetch_channel
        self.refusals = refusals
        self._stopped = threading.Event()
        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}
        self._logged_lock = threading.Lock()
        self.sock, self.address = self._bind(address)
        self._thread: threading.Thread | None = None

    @staticmethod
    def _bind(address: str) -> tuple[socket.socket, str]:
        if address.startswith("unix:"):
            path = address[len("unix://") :] if address.startswith("unix://") else address[len("unix:") :]
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if os.path.exists(path) and Path(path).is_socket():
                os.unlink(path)  # a killed sidecar's: the caller holds the socket's lock
            old_umask = os.umask(0o077)  # created 0600
            try:
                sock.bind(path)
            finally:
                os.umask(old_umask)
            os.chmod(path, 0o600)
            sock.listen(512)
            return sock, address
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(512)
        bound = sock.getsockname()[1]
        return sock, f"{address.rpartition(':')[0]}:{bound}"

    def start(self) -> None:
        self.sock.settimeout(ACCEPT_POLL_SECONDS)
        self._thread = threading.Thread(target=self._accept_loop, name="listener", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops accepting at once: a client connecting from now on is refused (``UNAVAILABLE``,
        which it retries) rather than relayed to a gRPC server that is draining, which would
        cancel its call. Connections already accepted go on (gRPC's drain ends its own)."""
        self._stopped.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes ``accept`` now, not at its next poll
        except OSError:
            pass  # not listening (never started) or already shut
        if self._thread is not None:
            self._thread.join()
        self.sock.close()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, addr = self.sock.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if self._stopped.is_set():
                    return
                log.warning("accepting a connection failed: %s", e)
                time.sleep(0.1)
                continue
            if self._stopped.is_set():
                conn.close()  # accepted as the listener stopped: refused like the ones after it
                return
            peer = _describe_peer(addr)
            if not self._connections.acquire(blocking=False):
                log.warning("%d connections are open; closing the one from %s", MAX_CONNECTIONS, peer)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, peer), name=f"conn {peer}", daemon=True).start()

    def _serve(self, raw: socket.socket, peer: str) -> None:
        try:
            if raw.family != socket.AF_UNIX:
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
            conn = raw
            if self.tls is not None:
                conn = self.tls.context().wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
                try:
                    conn.do_handshake()
                except (OSError, ssl.SSLError) as e:
                    self._refused(peer, e)
                    _close_gently(conn)
                    return
            try:
                first = read_exactly(conn, PREFACE_BYTES)
            except (OSError, Exception) as e:
                log.debug("connection from %s ended before its first bytes: %s", peer, e)
                conn.close()
                return
            if first == PREFACE:
                conn.sendall(PREFACE)  # the client learns it reached a fetch channel (rsm.proto)
                self.fetch_channel.serve(conn, peer)
            elif first is not None and first == H2_PREFACE[:PREFACE_BYTES]:
                conn.settimeout(None)
                grpc_relay.relay(conn, first, self.grpc_socket_path, peer)
            else:
                if first is not None:
                    log.info(
                        "connection from %s speaks neither gRPC nor the fetch channel (first bytes %r); "
                        "closed",
                        peer,
                        first,
                    )
                conn.close()
        finally:
            self._connections.release()

    def _refused(self, peer: str, err: BaseException) -> None:
        """Counts a failed handshake and logs it, once per peer host and reason per
        ``REFUSAL_LOG_SECONDS`` (a client retrying every few ms must not flood the log)."""
        reason, detail = classify_refusal(err)
        self.refusals.labels(reason).inc()
        host = peer.rsplit(":", 1)[0]
        now = time.monotonic()
        with self._logged_lock:
            last, suppressed = self._logged.get((host, reason), (-REFUSAL_LOG_SECONDS, 0))
            if now - last < REFUSAL_LOG_SECONDS:
                self._logged[(host, reason)] = (last, suppressed + 1)
                return
            self._logged[(host, reason)] = (now, 0)
            if len(self._logged) > 10_000:
                self._logged.clear()
        level = logging.DEBUG if reason == "closed" else logging.WARNING
        more = f" ({suppressed} more since the last such line)" if suppressed else ""
        log.log(
            level,
            "TLS handshake with %s refused: %s%s%s",
            peer,
            REFUSALS[reason],
            f" ({detail})" if detail else "",
            more,
            extra={
                "fields": {"peer": peer, "tls_refusal": reason, "detail": detail, "suppressed": suppressed}
            },
        )


#: how long a refused connection is drained before it is closed (``_close_gently``)
LINGER_SECONDS = 1.0


def _close_gently(sock: socket.socket) -> None:
    """Closes a connection whose handshake failed so that the client reads the TLS alert saying
    why: a plain close with the client's bytes unread sends a reset, and a reset makes the client's
    kernel drop the alert it has not read yet (the client then sees only "connection reset")."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(LINGER_SECONDS)
        deadline = time.monotonic() + LINGER_SECONDS
        while time.monotonic() < deadline and sock.recv(65536):
            pass
    except OSError:
        pass
    finally:
        sock.close()


def _describe_peer(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = addr[0]
        return f"[{host}]:{addr[1]}" if ":" in str(host) else f"{host}:{addr[1]}"
    return "unix:" + (addr if isinstance(addr, str) and addr else "local")
