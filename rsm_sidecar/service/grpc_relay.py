"""Relays a client's gRPC connection (HTTP/2, after the listener's TLS) to the sidecar's gRPC
server on its private Unix socket.

The listener owns the sidecar's address so that the fetch channel and gRPC share it (one port,
one set of certificates, one place that sees every handshake: listener.py); gRPC's server listens
only on a socket in a directory of the sidecar's own. A gRPC connection carries copies, index
fetches, deletes and health checks (a fetch's bytes go over the fetch channel), so what crosses
here is small but for stream-mode copies: one thread per connection moves the bytes both ways
with non-blocking sockets (a TLS socket must not be read and written by two threads at once), in
reads of up to ``BUFFER_BYTES`` and as many TLS records as are pending, so the interpreter works
per read, not per record.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl

log = logging.getLogger(__name__)

#: most bytes read from one side before they are written to the other (and held per direction)
BUFFER_BYTES = 256 * 1024


class _Side:
    """One end of the relay: its socket and the bytes waiting to be written to it."""

    def __init__(self, sock: socket.socket, name: str):
        self.sock = sock
        self.name = name
        self.out = bytearray()
        self.eof = False  # nothing more will be read from it
        #: a TLS read that needs the socket writable (or a write that needs it readable)
        self.read_wants_write = False
        self.write_wants_read = False
        self._buf = memoryview(bytearray(BUFFER_BYTES))

    def buffered(self, other: _Side) -> bool:
        """Whether TLS has decrypted bytes of this side waiting that a read would take now (the
        socket itself may have nothing more to read)."""
        pending = getattr(self.sock, "pending", None)
        return pending is not None and not self.eof and len(other.out) < BUFFER_BYTES and pending() > 0

    def wants(self, other: _Side) -> int:
        events = 0
        if not self.eof and len(other.out) < BUFFER_BYTES and not self.read_wants_write:
            events |= selectors.EVENT_READ
        if self.write_wants_read:
            events |= selectors.EVENT_READ
        if self.out or self.read_wants_write:
            events |= selectors.EVENT_WRITE
        return events

    def read_into(self, other: _Side) -> None:
        """Reads what is there (every pending TLS record) into ``other.out``."""
        self.read_wants_write = False
        buf = self._buf
        while len(other.out) < BUFFER_BYTES:
            try:
                n = self.sock.recv_into(buf, BUFFER_BYTES - len(other.out))
            except (ssl.SSLWantReadError, BlockingIOError):
                return
            except ssl.SSLWantWriteError:
                self.read_wants_write = True
                return
            if n == 0:
                self.eof = True
                return
            other.out += buf[:n]

    def write(self) -> None:
        self.write_wants_read = False
        while self.out:
            try:
                n = self.sock.send(memoryview(self.out)[:BUFFER_BYTES])
            except (ssl.SSLWantWriteError, BlockingIOError):
                return
            except ssl.SSLWantReadError:
                self.write_wants_read = True
                return
            del self.out[:n]


def relay(client: socket.socket, first_bytes: bytes, grpc_socket_path: str, peer: str) -> None:
    """Moves bytes between ``client`` (whose first bytes, already read, were ``first_bytes``) and a
    new connection to the gRPC server until either side closes; then closes both."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(grpc_socket_path)
    except OSError as e:
        log.warning("cannot reach the gRPC server at %s for %s: %s", grpc_socket_path, peer, e)
        upstream.close()
        client.close()
        return
    a, b = _Side(client, "client"), _Side(upstream, "grpc")
    b.out += first_bytes
    client.setblocking(False)
    upstream.setblocking(False)
    sel = selectors.DefaultSelector()
    try:
        registered = {a: 0, b: 0}
        while True:
            for side, other in ((a, b), (b, a)):
                if side.buffered(other):  # decrypted already: the socket may never become readable for it
                    side.read_into(other)
                    other.write()
            for side, other in ((a, b), (b, a)):
                events = side.wants(other)
                if events != registered[side]:
                    if registered[side] == 0:
                        sel.register(side.sock, events, side)
                    elif events == 0:
                        sel.unregister(side.sock)
                    else:
                        sel.modify(side.sock, events, side)
                    registered[side] = events
            if (a.eof and not b.out) or (b.eof and not a.out) or not (registered[a] or registered[b]):
                return  # one side closed and what it sent is delivered: HTTP/2 needs no half-close
            for key, mask in sel.select():
                side = key.data
                other = b if side is a else a
                if mask & selectors.EVENT_READ:
                    if side.write_wants_read:
                        side.write()
                    side.read_into(other)
                    other.write()
                if mask & selectors.EVENT_WRITE:
                    if side.read_wants_write:
                        side.read_into(other)
                    side.write()
    except OSError as e:
        log.debug("gRPC connection of %s ended: %s", peer, e)
    finally:
        sel.close()
        upstream.close()
        client.close()
