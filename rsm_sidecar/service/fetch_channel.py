"""The fetch channel: a fetch's bytes as raw frames on a connection of their own, beside gRPC
(rsm.proto, "The fetch channel", has the protocol).

Why: over TCP + mTLS gRPC's Python server costs per message what the bytes themselves do not: each
1 MiB message is a generator step, a serialization copy and a batch of C-core operations run
under the interpreter's lock, and on the broker's side netty's HTTP/2 framing, flow control and
gRPC's deframer add to the TLS decryption (docs/design.md, "The fetch channel"). Here a range is
served by one thread per connection that takes each chunk as the reader yields it (a view into
the chunk cache, no copy) and hands it whole to the socket: ``sendall`` on a TLS socket encrypts
and writes the whole chunk in C with the interpreter's lock released, so the interpreter's work
is per chunk (4 MiB), not per message or per TLS record.

Everything else is the gRPC fetch's: the same range checks and segment opening
(``RemoteStorageServicer.fetch_range``), the same reader, the same slots
(``fetch.max_concurrent``: a request beyond them is answered ``RESOURCE_EXHAUSTED`` at once), the
same idle timeout (``fetch.idle_timeout_seconds``: a client that reads nothing that long is
disconnected), the same metrics (``op="fetch"``) and the same status codes. Failures after bytes
went out end the exchange with an ``E`` frame carrying the status, so the client fails the read;
a client that closes the connection mid-range makes the next write fail, which stops the read
(and with it further storage reads) at once.

A sidecar that stops (SIGTERM) drains the channel as gRPC drains its calls (``drain``): exchanges
in flight end whole, within ``server.shutdown_grace_seconds``; connections between exchanges are
closed at once (the shim asks a request that found its kept connection closed again on a new one,
which reaches the restarted sidecar); past the grace the rest are cut, which the shim reads as a
broken stream and resumes where it stopped. None ends in an error status: a stopping sidecar
never fails a read, it only makes it wait.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.errors import Cancelled, InvalidArgument
from rsm_sidecar.service import hooks
from rsm_sidecar.service.servicer import measured, report_failure

if TYPE_CHECKING:
    from rsm_sidecar.service.servicer import RemoteStorageServicer

log = logging.getLogger(__name__)

#: what a client sends first on a fetch channel connection
PREFACE = b"RSMFv1\r\n"
#: the ALPN protocol a TLS client of the fetch channel asks for
ALPN_PROTOCOL = "rsm-fetch/1"
#: a frame's header: type byte, payload length
FRAME_HEADER = struct.Struct(">cI")
REQUEST, INDEX_REQUEST, DATA, END = b"Q", b"I", b"D", b"E"
#: the largest 'D' payload (rsm.proto)
MAX_DATA_FRAME_BYTES = 4 * 1024 * 1024
#: the largest request accepted (a FetchSegmentRequest is a few hundred bytes)
MAX_REQUEST_BYTES = 64 * 1024
#: the kernel's send buffer of a fetch channel connection (Linux doubles it): fixed, so what the
#: sidecar has read ahead of a client that goes away is bounded (the bytes waiting in it were read
#: from storage), and small next to a chunk; a node-local connection needs no more to keep up
SEND_BUFFER_BYTES = 1024 * 1024
#: a connection with no request for this long is closed (the shim closes its idle ones sooner)
IDLE_CONNECTION_SECONDS = 300.0


class ConnectionLost(Exception):
    """The client closed or broke the connection, or read nothing for too long."""


def read_exactly(conn: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from ``conn``; None at a clean end of the stream before the first of them.
    Raises ``ConnectionLost`` when the stream ends inside them."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = conn.recv_into(view[got:])
        if k == 0:
            if got == 0:
                return None
            raise ConnectionLost(f"the connection ended after {got} of {n} bytes")
        got += k
    return bytes(buf)


def _shut(conn: socket.socket) -> None:
    """Shuts ``conn`` down both ways: its thread's blocked read or write returns at once."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or broken


def end_frame(code: int, message: str, length: int, next_segment: pb.SegmentMetadata | None = None) -> bytes:
    end = pb.FetchEnd(code=code, message=message, length=length)
    if next_segment is not None:
        end.next_segment.CopyFrom(next_segment)
    payload: bytes = end.SerializeToString()
    return FRAME_HEADER.pack(END, len(payload)) + payload


class FetchChannel:
    """Serves fetch channel connections for the servicer's sidecar."""

    def __init__(self, servicer: RemoteStorageServicer):
        self.servicer = servicer
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        #: connection -> whether it is in an exchange (False: waiting for a request)
        self._connections: dict[socket.socket, bool] = {}
        self._draining = False

    def serve(self, conn: socket.socket, peer: str) -> None:
        """Exchanges on ``conn`` (its preface already read) until the client closes it, breaks
        it, idles or sends something that is not a request, or the sidecar drains; then closes it."""
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            while True:
                if not self._set_state(conn, busy=False):
                    return  # draining: no new request on this connection
                conn.settimeout(IDLE_CONNECTION_SECONDS)
                request = self._read_request(conn, peer)
                if request is None or not self._set_state(conn, busy=True):
                    return  # a request read as the drain began stays unanswered: asked again elsewhere
                if isinstance(request, pb.FetchIndexRequest):
                    if not self._index_exchange(conn, request):
                        return
                elif not self._exchange(conn, request):
                    return
        except (OSError, ConnectionLost) as e:  # a client that went away between exchanges
            log.debug("fetch channel from %s closed: %s", peer, e)
        finally:
            with self._lock:
                self._connections.pop(conn, None)
                self._changed.notify_all()
            conn.close()

    def _set_state(self, conn: socket.socket, busy: bool) -> bool:
        """Records that ``conn`` is in an exchange (``busy``) or waits for a request; False when
        the channel is draining (the connection is to be closed instead)."""
        with self._lock:
            if self._draining:
                return False
            self._connections[conn] = busy
            return True

    def drain(self, grace: float) -> None:
        """Closes the connections waiting for a request, waits up to ``grace`` seconds for the
        exchanges in flight to end, then cuts the rest (module docstring)."""
        deadline = time.monotonic() + grace
        with self._lock:
            self._draining = True
            for conn, busy in self._connections.items():
                if not busy:
                    _shut(conn)  # wakes its thread, blocked reading the next request
            while self._connections and self._changed.wait(max(0.0, deadline - time.monotonic())):
                pass
            left = [conn for conn, busy in self._connections.items() if busy]  # idle ones: shut above
        if left:
            log.warning(
                "fetch channel: %d exchanges still in flight after %.0f s (server.shutdown_grace_seconds); "
                "cutting them (their readers resume on the restarted sidecar)",
                len(left),
                grace,
            )
            for conn in left:
                _shut(conn)

    def _read_request(
        self, conn: socket.socket, peer: str
    ) -> pb.FetchSegmentRequest | pb.FetchIndexRequest | None:
        header = read_exactly(conn, FRAME_HEADER.size)
        if header is None:
            return None
        kind, length = FRAME_HEADER.unpack(header)
        if kind not in (REQUEST, INDEX_REQUEST) or length > MAX_REQUEST_BYTES:
            log.warning(
                "fetch channel from %s: expected a request frame of at most %d bytes, got type %r of "
                "%d bytes; closing the connection",
                peer,
                MAX_REQUEST_BYTES,
                kind,
                length,
                extra={"fields": {"op": "fetch", "peer": peer}},
            )
            return None
        payload = read_exactly(conn, length) if length else b""
        if payload is None:
            raise ConnectionLost("the connection ended inside a request")
        message = pb.FetchSegmentRequest if kind == REQUEST else pb.FetchIndexRequest
        try:
            request: pb.FetchSegmentRequest | pb.FetchIndexRequest = message.FromString(payload)
            return request
        except Exception as e:
            err = InvalidArgument(f"malformed {message.__name__} message: {str(e)[:200]}")
            op = "fetch" if kind == REQUEST else "fetch_index"
            code, msg = report_failure(op, self.servicer.sidecar.metrics, err)
            conn.sendall(end_frame(code.value[0], msg, 0))
            return None

    @staticmethod
    def _send_data(conn: socket.socket, piece: bytes | memoryview) -> int:
        """``piece`` in 'D' frames; its length. Each frame's payload goes to the socket as one
        write, encrypted and sent in C (the interpreter's lock released)."""
        with memoryview(piece) as view:
            for i in range(0, len(view), MAX_DATA_FRAME_BYTES):
                with view[i : i + MAX_DATA_FRAME_BYTES] as part:
                    conn.sendall(FRAME_HEADER.pack(DATA, len(part)))
                    conn.sendall(part)
            return len(view)

    def _index_exchange(self, conn: socket.socket, request: pb.FetchIndexRequest) -> bool:
        """Serves one index request; whether the connection can serve the next one."""
        metrics = self.servicer.sidecar.metrics
        with measured(metrics, "fetch_index"):
            try:
                with self.servicer.fetch_slots.take():
                    hooks.before_fetch()
                    data = self.servicer.index_bytes(request)
                    idle = self.servicer.fetch_idle
                    conn.settimeout(idle if idle > 0 else None)
                    if data:
                        self._send_data(conn, data)
                    metrics.operations.labels("fetch_index", "OK").inc()
                    conn.sendall(end_frame(0, "", len(data)))
            except OSError:  # the client went away or stopped reading
                metrics.operations.labels("fetch_index", "CANCELLED").inc()
                return False
            except Exception as e:
                code, msg = report_failure("fetch_index", metrics, e)
                try:
                    conn.sendall(end_frame(code.value[0], msg, 0))
                except OSError:
                    return False
            return True

    def _exchange(self, conn: socket.socket, request: pb.FetchSegmentRequest) -> bool:
        """Serves one request; whether the connection can serve the next one."""
        sidecar = self.servicer.sidecar
        metrics = sidecar.metrics
        served = metrics.bytes.labels("fetch_served")
        over_channel = metrics.bytes.labels("fetch_channel")
        sent = 0
        with measured(metrics, "fetch") as t0:
            try:
                with self.servicer.fetch_slots.take():
                    idle = self.servicer.fetch_idle
                    conn.settimeout(idle if idle > 0 else None)
                    hooks.before_fetch()
                    rng = self.servicer.fetch_range(request)
                    for piece in sidecar.reader.read(rng.seg, rng.start, rng.end, views=True):
                        n = self._send_data(conn, piece)
                        del piece  # not held while the reader fetches the next chunk
                        if sent == 0:
                            metrics.first_byte.observe(time.monotonic() - t0)
                        sent += n
                        served.inc(n)
                        over_channel.inc(n)
                    following = self.servicer.next_segment_hint(rng)
                    hint = None
                    if following is not None:
                        hint = pb.SegmentMetadata()
                        following.fill_proto(hint)
                    metrics.operations.labels("fetch", "OK").inc()  # counted before the client can see it
                    conn.sendall(end_frame(0, "", sent, hint))
            except TimeoutError:
                idle = self.servicer.fetch_idle
                report_failure(
                    "fetch",
                    metrics,
                    Cancelled(
                        f"fetch channel: the client read nothing for {idle:g} s (fetch.idle_timeout_seconds) "
                        f"after {sent} bytes; disconnected"
                    ),
                )
                return False
            except OSError:  # the client closed or broke the connection: it stopped reading
                metrics.operations.labels("fetch", "CANCELLED").inc()
                return False
            except Exception as e:
                code, msg = report_failure("fetch", metrics, e)
                try:
                    conn.sendall(end_frame(code.value[0], msg, sent))
                except OSError:
                    return False
                return True
            return True
