"""The sidecar's TLS files renewed in place (cert-manager, a Kubernetes Secret volume): new
connections use the new files, connections and calls already open go on, a set caught
half-written is not used, and a CA change works through an overlap where both CAs are trusted."""

from __future__ import annotations

import logging
import ssl
import threading

import grpc
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from devstack.tls import Issued, SecretVolume, TestCA
from rsm_sidecar.service.server import SidecarServer
from tests.service.mtls import secret

HOST = "sidecar.test"


def channel(server: SidecarServer, trust: bytes, client: Issued) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(trust, client.key_pem, client.cert_pem)
    return grpc.secure_channel(server.address, creds, options=[("grpc.ssl_target_name_override", HOST)])


def healthy(ch: grpc.Channel) -> bool:
    try:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    except grpc.RpcError:
        return False
    return resp.status == health_pb2.HealthCheckResponse.SERVING


def test_renewed_certificates_and_a_new_ca_reach_new_connections_without_disturbing_open_ones(
    tmp_path, mtls_sidecar, caplog
):
    old_ca, new_ca = TestCA("rsm test CA old"), TestCA("rsm test CA new")
    volume = SecretVolume(tmp_path / "secret", secret(old_ca.issue(HOST, dns=[HOST]), old_ca.cert_pem))
    server = mtls_sidecar(volume)
    old_client = old_ca.issue("broker-1")

    # a connection and a call in flight from before the renewal: a health Watch stream stays open
    first = channel(server, old_ca.cert_pem, old_client)
    assert healthy(first)
    watch = health_pb2_grpc.HealthStub(first).Watch(health_pb2.HealthCheckRequest(service=""))
    seen: list[object] = []

    def read_watch() -> None:
        try:
            seen.extend(watch)
        except grpc.RpcError as e:
            seen.append(e.code())

    reader = threading.Thread(target=read_watch, daemon=True)
    reader.start()

    # 1. the overlap: the client CA bundle trusts both CAs; clients with new certificates get in
    volume.update(secret(old_ca.issue(HOST, dns=[HOST]), old_ca.cert_pem + new_ca.cert_pem))
    new_client = new_ca.issue("broker-1")
    assert healthy(channel(server, old_ca.cert_pem, new_client))
    # 2. the sidecar's own certificate from the new CA: a client trusting both (as the shim's
    #    bundle does during the overlap) and one trusting only the new CA both get in
    volume.update(secret(new_ca.issue(HOST, dns=[HOST]), old_ca.cert_pem + new_ca.cert_pem))
    assert healthy(channel(server, old_ca.cert_pem + new_ca.cert_pem, new_client))
    assert healthy(channel(server, new_ca.cert_pem, new_client))
    assert not healthy(channel(server, old_ca.cert_pem, new_client)), "the old certificate is still served"
    # 3. the old CA dropped: a client certificate of the old CA is refused on a new connection
    volume.update(secret(new_ca.issue(HOST, dns=[HOST]), new_ca.cert_pem))
    assert healthy(channel(server, new_ca.cert_pem, new_client))
    assert not healthy(channel(server, new_ca.cert_pem, old_client))

    # the connection opened before the renewals still serves calls, and the stream is still open
    assert healthy(first)
    assert watch.running() and len(seen) == 1, seen
    watch.cancel()
    reader.join(5)
    assert seen[1:] == [grpc.StatusCode.CANCELLED], seen  # ended by us, not by the renewals
    assert server.tls is not None and server.tls.reloads == 3


def test_a_key_that_is_not_the_certificates_is_not_used(tmp_path, mtls_sidecar, caplog):
    ca = TestCA("rsm test CA")
    volume = SecretVolume(tmp_path / "secret", secret(ca.issue(HOST, dns=[HOST]), ca.cert_pem))
    server = mtls_sidecar(volume)
    client = ca.issue("broker-1")
    # a renewal caught half-written: the new certificate beside the old key
    renewed = ca.issue(HOST, dns=[HOST])
    old_key = volume.file("tls.key").read_bytes()
    with caplog.at_level(logging.WARNING, logger="rsm_sidecar.service.tls"):
        volume.update({"tls.crt": renewed.cert_pem, "tls.key": old_key, "ca.crt": ca.cert_pem})
        assert healthy(channel(server, ca.cert_pem, client)), "the files in use must stay in use"
        assert healthy(channel(server, ca.cert_pem, client))
    warnings = [r.getMessage() for r in caplog.records if "not usable yet" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "is not the key of the certificate" in warnings[0]
    # the rest of the renewal arrives: used from the next connection on
    volume.update(secret(renewed, ca.cert_pem))
    assert healthy(channel(server, ca.cert_pem, client))
    assert server.tls is not None and server.tls.reloads == 1


def test_a_renewal_landing_while_the_files_are_read_is_loaded_once(tmp_path, monkeypatch):
    """The files change between the check that saw them change and their read (a renewal under a
    loaded machine: CI saw 4 reloads for 3 renewals): the newest set is used, and the next
    handshake does not read the same files again. The renewal is made to land inside the read
    through ``tls.load``: a timing no real server can be made to hit on demand."""
    from rsm_sidecar.service import tls

    ca = TestCA("rsm test CA")
    volume = SecretVolume(tmp_path / "secret", secret(ca.issue(HOST, dns=[HOST]), ca.cert_pem))
    server_tls = tls.ServerTls(
        str(volume.file("tls.crt")), str(volume.file("tls.key")), str(volume.file("ca.crt")), ["h2"]
    )
    first, second = ca.issue(HOST, dns=[HOST]), ca.issue(HOST, dns=[HOST])
    real_load = tls.load
    landed = []

    def load_while_renewed(*args):
        if not landed:  # the second renewal lands after the check saw the first
            landed.append(True)
            volume.update(secret(second, ca.cert_pem))
        return real_load(*args)

    monkeypatch.setattr(tls, "load", load_while_renewed)
    volume.update(secret(first, ca.cert_pem))
    server_tls.context()
    assert server_tls.reloads == 1
    for _ in range(3):
        server_tls.context()
    assert server_tls.reloads == 1, "the same files were read again"
    # and what is in use is the newest renewal: a handshake with the context presents its certificate
    assert _presented(server_tls.context(), ca, tmp_path).serial_number == (
        x509.load_pem_x509_certificate(second.cert_pem).serial_number
    )


def _presented(server_ctx: ssl.SSLContext, ca: TestCA, tmp_path) -> x509.Certificate:
    """The certificate a server with ``server_ctx`` presents: one handshake in memory."""
    client = ca.issue("broker-1")
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    cert.write_bytes(client.cert_pem)
    key.write_bytes(client.key_pem)
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    client_ctx.load_cert_chain(cert, key)
    client_ctx.set_alpn_protocols(["h2"])
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    c = client_ctx.wrap_bio(pipes[0], pipes[1], server_hostname=HOST)
    s = server_ctx.wrap_bio(pipes[2], pipes[3], server_side=True)
    for _ in range(10):
        for side in (c, s):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        pipes[2].write(pipes[1].read())  # client -> server
        pipes[0].write(pipes[3].read())  # server -> client
    der = c.getpeercert(binary_form=True)
    assert der is not None, "no handshake"
    return x509.load_der_x509_certificate(der)
