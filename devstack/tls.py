"""Test certificates for the TCP + mTLS topology (the broker's shim and a sidecar that is not
co-located): a CA that issues EC P-256 leaf certificates, and a directory laid out like a
Kubernetes Secret volume, whose files change at once when it is updated (the kubelet writes a new
timestamped directory and swaps the ``..data`` symlink with a rename), as cert-manager's
renewals reach a pod.

Keys are written as unencrypted PKCS#8 PEM (``-----BEGIN PRIVATE KEY-----``), the form both the
shim and the sidecar read."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Issued:
    """A certificate (PEM) and its private key (PKCS#8 PEM)."""

    cert_pem: bytes
    key_pem: bytes


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class TestCA:
    """A self-signed CA; :meth:`issue` signs leaf certificates valid for a day."""

    __test__ = False  # not a pytest test class

    def __init__(self, name: str):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.cert_pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        dns: Iterable[str] = (),
        ips: Iterable[str] = (),
        valid_from: datetime.datetime | None = None,
        valid_until: datetime.datetime | None = None,
    ) -> Issued:
        """A leaf certificate for ``common_name`` with these DNS names and IP addresses, usable
        by a TLS server and a TLS client; valid from 5 minutes ago for a day, unless
        ``valid_from`` / ``valid_until`` say otherwise (an expired certificate, one not valid yet)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid_from or now - datetime.timedelta(minutes=5))
            .not_valid_after(valid_until or now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


class SecretVolume:
    """A directory laid out as the kubelet lays out a Secret volume: ``<name>`` is a symlink to
    ``..data/<name>``, ``..data`` a symlink to a timestamped directory holding the files.
    :meth:`update` writes a new timestamped directory and swaps ``..data`` with one rename, so a
    reader sees either all old or all new files."""

    def __init__(self, path: Path, files: Mapping[str, bytes]):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._generation = 0
        self.update(files)

    def file(self, name: str) -> Path:
        return self.path / name

    def update(self, files: Mapping[str, bytes]) -> None:
        self._generation += 1
        stamp = f"..{datetime.datetime.now(datetime.UTC):%Y_%m_%d_%H_%M_%S.%f}_{self._generation}"
        target = self.path / stamp
        target.mkdir(mode=0o755)
        for name, data in files.items():
            (target / name).write_bytes(data)
            (target / name).chmod(0o644)
        tmp = self.path / "..data_tmp"
        tmp.unlink(missing_ok=True)
        os.symlink(stamp, tmp)
        old = os.readlink(self.path / "..data") if (self.path / "..data").is_symlink() else None
        os.replace(tmp, self.path / "..data")  # the atomic swap
        for name in files:
            link = self.path / name
            if not link.is_symlink():
                os.symlink(f"..data/{name}", link)
        if old is not None:
            for p in (self.path / old).iterdir():
                p.unlink()
            (self.path / old).rmdir()
