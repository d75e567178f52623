"""The sidecar's listener over TCP + mTLS: the fetch channel and gRPC on one port under the same
certificates, reads going on while the certificates are renewed, and every refused handshake
counted and logged once with the peer and the reason."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.tls import EXPIRED, Issued, SecretVolume, TestCA
from rsm_sidecar.service import fetch_channel
from rsm_sidecar.service.server import SidecarServer
from tests.service.mtls import secret
from tests.service.rsm_client import Client, FetchChannelClient, SegmentFilesOnDisk, metadata, seg_id

HOST = "sidecar.test"
KiB = 1024


def _client_context(
    trust: bytes, client: Issued | None, tmp_path, alpn: str | None = fetch_channel.ALPN_PROTOCOL
):
    ctx = ssl.create_default_context(cadata=trust.decode())
    if client is not None:
        cert, key = tmp_path / f"c{id(client)}.pem", tmp_path / f"k{id(client)}.pem"
        cert.write_bytes(client.cert_pem)
        key.write_bytes(client.key_pem)
        ctx.load_cert_chain(cert, key)
    if alpn:
        ctx.set_alpn_protocols([alpn])
    return ctx


def _grpc_channel(server: SidecarServer, trust: bytes, client: Issued) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(trust, client.key_pem, client.cert_pem)
    return grpc.secure_channel(server.address, creds, options=[("grpc.ssl_target_name_override", HOST)])


def _refusals(server: SidecarServer, reason: str) -> float:
    return (
        server.sidecar.metrics.registry.get_sample_value(
            "rsm_tls_handshake_failures_total", {"reason": reason}
        )
        or 0.0
    )


def test_fetch_channel_and_grpc_share_the_port_and_reads_go_on_through_a_renewal(mtls_sidecar, tmp_path):
    ca = TestCA("rsm test CA")
    volume = SecretVolume(tmp_path / "secret", secret(ca.issue(HOST, dns=[HOST]), ca.cert_pem))
    server = mtls_sidecar(volume)
    broker = ca.issue("broker-1")
    grpc_client = Client.__new__(Client)
    grpc_client.channel = _grpc_channel(server, ca.cert_pem, broker)
    from rsm_sidecar._proto.rsm.v1 import rsm_pb2_grpc

    grpc_client.stub = rsm_pb2_grpc.RemoteStorageStub(grpc_client.channel)
    log = os.urandom(600 * KiB)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), log)
    md = metadata(seg_id(1), size=len(log))
    md.custom_metadata = grpc_client.copy(
        files.stream_requests(md)
    ).custom_metadata  # gRPC through the listener
    ctx = _client_context(ca.cert_pem, broker, tmp_path)
    open_before = FetchChannelClient(server.address, ctx, HOST)
    assert open_before.sock.selected_alpn_protocol() == fetch_channel.ALPN_PROTOCOL
    assert open_before.fetch(md, 1000)[0] == log[1000:]

    errors: list[BaseException] = []
    served = [0]
    stop = threading.Event()

    def reads() -> None:  # new connections while the certificate is renewed
        while not stop.is_set():
            try:
                c = FetchChannelClient(server.address, ctx, HOST)
                assert c.fetch(md, 5000, 300 * KiB)[0] == log[5000 : 300 * KiB + 1]
                c.close()
                served[0] += 1
            except BaseException as e:
                errors.append(e)
                return

    readers = [threading.Thread(target=reads) for _ in range(3)]
    for t in readers:
        t.start()
    for _ in range(3):  # each renewal reached by connections made after it, under the readers' load
        volume.update(secret(ca.issue(HOST, dns=[HOST]), ca.cert_pem))
        target = served[0] + 10
        while served[0] < target and not errors:
            threading.Event().wait(0.02)
    stop.set()
    for t in readers:
        t.join()
    assert not errors, errors
    assert server.tls is not None and server.tls.reloads == 3
    # a new connection presents the last renewal's certificate; the one opened before still serves
    c = FetchChannelClient(server.address, ctx, HOST)
    presented = c.sock.getpeercert(binary_form=True)
    c.close()
    assert presented is not None
    from cryptography import x509

    with open(volume.file("tls.crt"), "rb") as f:
        current = x509.load_pem_x509_certificate(f.read())
    assert x509.load_der_x509_certificate(presented).serial_number == current.serial_number
    assert open_before.fetch(md)[0] == log
    open_before.close()
    health = health_pb2_grpc.HealthStub(grpc_client.channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    grpc_client.close()


def _attempt(server: SidecarServer, ctx: ssl.SSLContext | None) -> None:
    """One connection attempt that the sidecar is expected to refuse."""
    host, _, port = server.address.rpartition(":")
    raw = socket.create_connection((host, int(port)), timeout=10)
    try:
        if ctx is None:
            raw.sendall(fetch_channel.PREFACE)  # plaintext to the TLS port
            raw.recv(100)
            return
        conn = ctx.wrap_socket(raw, server_hostname=HOST)
        conn.sendall(fetch_channel.PREFACE)
        conn.recv(8)  # TLS 1.3: a refused client certificate shows only here
    except (ssl.SSLError, OSError):
        pass
    finally:
        raw.close()


def test_refused_handshakes_are_counted_and_logged_once_per_peer_with_the_reason(
    mtls_sidecar, tmp_path, caplog
):
    ca, other_ca = TestCA("rsm test CA"), TestCA("someone else's CA")
    volume = SecretVolume(tmp_path / "secret", secret(ca.issue(HOST, dns=[HOST]), ca.cert_pem))
    server = mtls_sidecar(volume)
    expired = ca.issue("broker-1", valid=EXPIRED)
    cases = {
        "no_client_certificate": _client_context(ca.cert_pem, None, tmp_path),
        "client_certificate_untrusted": _client_context(ca.cert_pem, other_ca.issue("broker-1"), tmp_path),
        "client_certificate_expired": _client_context(ca.cert_pem, expired, tmp_path),
        "server_certificate_refused": _client_context(other_ca.cert_pem, ca.issue("broker-1"), tmp_path),
        "not_tls": None,
    }
    with caplog.at_level(logging.DEBUG, logger="rsm_sidecar.service.listener"):
        for reason, ctx in cases.items():
            for _ in range(3):  # a client retrying: one log line, every attempt counted
                _attempt(server, ctx)
            deadline = threading.Event()
            for _ in range(100):
                if _refusals(server, reason) >= 3:
                    break
                deadline.wait(0.05)
            assert _refusals(server, reason) == 3, reason
    for reason in cases:
        lines = [r for r in caplog.records if getattr(r, "fields", {}).get("tls_refusal") == reason]
        assert len(lines) == 1, (reason, [r.getMessage() for r in lines])
        line = lines[0]
        assert line.levelno == logging.WARNING and line.fields["peer"].startswith("127.0.0.1:")
        assert "TLS handshake with 127.0.0.1:" in line.getMessage()
    expired_line = next(
        r
        for r in caplog.records
        if getattr(r, "fields", {}).get("tls_refusal") == "client_certificate_expired"
    )
    assert "expired" in expired_line.getMessage()
    # and a good client still gets in
    md = metadata(seg_id(1), size=10)
    good = FetchChannelClient(
        server.address, _client_context(ca.cert_pem, ca.issue("broker-1"), tmp_path), HOST
    )
    with pytest.raises(Exception, match="not found"):
        good.fetch(md)
    good.close()
