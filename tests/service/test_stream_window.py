"""The HTTP/2 flow-control window the sidecar gives each call it receives
(``server.stream_window_bytes``), seen on the wire: a raw HTTP/2 client makes one gRPC health
check and reads the frames the real server sends back."""

from __future__ import annotations

import os
import socket
import time

import pytest

from rsm_sidecar.errors import ConfigError
from tests.service.rsm_client import SegmentFilesOnDisk, metadata, seg_id

SETTINGS, PING, HEADERS, DATA = 4, 6, 1, 0
INITIAL_WINDOW_SIZE = 0x4
MiB = 1 << 20


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _literal(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman coding."""
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


def frames_after_one_call(address: str, listen_for: float = 1.5) -> list[tuple[int, int, bytes]]:
    """(type, flags, payload) of every frame the server sends within ``listen_for`` seconds of
    a connection that makes one unary call (grpc.health.v1.Health/Check)."""
    host, port = address.rsplit(":", 1)
    headers = b"".join(
        _literal(k, v)
        for k, v in (
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/grpc.health.v1.Health/Check"),
            (":authority", "sidecar"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        )
    )
    empty_request = b"\x00" + (0).to_bytes(4, "big")  # not compressed, 0 bytes
    received = b""
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + _frame(SETTINGS, 0, 0, b"")
            + _frame(HEADERS, 0x4, 1, headers)  # END_HEADERS
            + _frame(DATA, 0x1, 1, empty_request)  # END_STREAM
        )
        sock.settimeout(0.1)
        deadline = time.monotonic() + listen_for
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                break
            received += chunk
    frames = []
    while len(received) >= 9:
        length = int.from_bytes(received[:3], "big")
        frames.append((received[3], received[4], received[9 : 9 + length]))
        received = received[9 + length :]
    return frames


def announced_settings(frames: list[tuple[int, int, bytes]]) -> dict[int, int]:
    """The server's first SETTINGS frame (not an acknowledgement), as {identifier: value}."""
    payload = next(p for kind, flags, p in frames if kind == SETTINGS and not flags & 0x1)
    return {
        int.from_bytes(payload[i : i + 2], "big"): int.from_bytes(payload[i + 2 : i + 6], "big")
        for i in range(0, len(payload), 6)
    }


def pings(frames: list[tuple[int, int, bytes]]) -> list[bytes]:
    """The server's own PINGs (not acknowledgements of ours): gRPC core's bandwidth-delay probes."""
    return [p for kind, flags, p in frames if kind == PING and not flags & 0x1]


@pytest.mark.parametrize("window", [None, 1 * MiB, 16 * MiB])
def test_the_window_is_the_configured_one_and_never_probed_larger(start_sidecar, window):
    """The default (4 MiB) or the configured window is what the server announces, and it sends
    no bandwidth-delay probe, which would let gRPC grow the window past it."""
    overrides = {} if window is None else {"server__stream_window_bytes": window}
    sc = start_sidecar(**overrides)
    frames = frames_after_one_call(sc.server.address)
    assert any(kind == HEADERS for kind, _, _ in frames), f"no response to the call: {frames}"
    assert announced_settings(frames)[INITIAL_WINDOW_SIZE] == (window or 4 * MiB)
    assert pings(frames) == []


def test_zero_leaves_the_window_to_grpc_which_probes(start_sidecar):
    """``0``: gRPC core's own sizing, told apart on the wire by its probes (what the fixed
    window turns off, and what the test above would see if it were not off)."""
    sc = start_sidecar(server__stream_window_bytes=0)
    frames = frames_after_one_call(sc.server.address)
    assert len(pings(frames)) >= 1, frames


@pytest.mark.parametrize("window", [1, 65534])
def test_a_window_below_http2s_default_is_refused(start_sidecar, window):
    with pytest.raises(ConfigError, match=r"server\.stream_window_bytes: .* below HTTP/2's default window"):
        start_sidecar(server__stream_window_bytes=window)


def test_messages_larger_than_the_smallest_window_still_flow(start_sidecar, tmp_path):
    """The smallest window allowed (65535 bytes) is smaller than a copy's 1 MiB messages (and a
    fetch's): a stream-mode copy of 3.5 MiB and its fetch still round-trip, byte for byte."""
    sc = start_sidecar(server__stream_window_bytes=65535)
    log = os.urandom(3 * MiB + MiB // 2)
    files = SegmentFilesOnDisk(str(tmp_path / "segment"), log)
    md = metadata(seg_id(1), size=len(log))
    sc.client.copy(files.stream_requests(md), timeout=60)
    assert sc.client.fetch(md) == log
