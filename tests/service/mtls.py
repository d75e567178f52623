"""The sidecar behind mTLS with its files in a Secret volume (:class:`~devstack.tls.SecretVolume`),
for the tests of its TLS listener."""

from __future__ import annotations

from devstack.tls import Issued, SecretVolume


def secret(server: Issued, client_cas: bytes) -> dict[str, bytes]:
    """The sidecar's Secret: its certificate and key, and the CA bundle clients are checked against."""
    return {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": client_cas}


def tls_settings(volume: SecretVolume) -> dict[str, str]:
    """``[server.tls]`` reading the files of :func:`secret` from ``volume``."""
    return {
        "cert_file": str(volume.file("tls.crt")),
        "key_file": str(volume.file("tls.key")),
        "client_ca_file": str(volume.file("ca.crt")),
    }
