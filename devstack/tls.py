"""Test certificates: the one builder of them for the tests, the benchmarks, the local stack and
the remote topology's stand-in for cert-manager (``docker/remote/issue-certs.py``).

* :class:`TestCA`, a CA (made here, or loaded from its files) that issues EC P-256 leaf
  certificates: for a server (``dns``/``ips`` names), for a client, or both; and the broken ones a
  TLS refusal test needs: expired or not yet valid (``valid=EXPIRED``, ``valid=NOT_YET_VALID``),
  for another name (issue it for that name), from another CA (another :class:`TestCA`);
* :func:`self_signed`, a server certificate that is its own trust anchor;
* :class:`SecretVolume`, a directory laid out like a Kubernetes Secret volume, whose files change
  at once when it is updated (the kubelet writes a new timestamped directory and swaps the
  ``..data`` symlink with a rename), as cert-manager's renewals reach a pod.

Keys are unencrypted PKCS#8 PEM (``-----BEGIN PRIVATE KEY-----``), the form both the shim and the
sidecar read. This module needs nothing but ``cryptography`` and the standard library:
``issue-certs.py`` imports it inside the sidecar's image."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: what a leaf certificate may be used for (``usage`` of :meth:`TestCA.issue`)
SERVER_AND_CLIENT = "server+client"
SERVER = "server"
CLIENT = "client"
_USAGES = {
    SERVER_AND_CLIENT: [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    SERVER: [ExtendedKeyUsageOID.SERVER_AUTH],
    CLIENT: [ExtendedKeyUsageOID.CLIENT_AUTH],
}
#: ``valid`` of :meth:`TestCA.issue`: from 5 minutes ago for ``days`` days
CURRENT = "current"
#: ``valid``: it ended yesterday (valid from 3 days ago to 1 day ago)
EXPIRED = "expired"
#: ``valid``: it starts tomorrow (valid from 1 day ahead to 3 days ahead)
NOT_YET_VALID = "not-yet-valid"


@dataclass(frozen=True)
class Issued:
    """A certificate (PEM) and its private key (PKCS#8 PEM)."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """``<name>.pem`` (the certificate) and ``<name>.key`` in ``directory``; their paths."""
        cert, key = Path(directory) / f"{name}.pem", Path(directory) / f"{name}.key"
        cert.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        return cert, key


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _validity(valid: str, days: float) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)
    if valid == CURRENT:
        return now - datetime.timedelta(minutes=5), now + days * day
    if valid == EXPIRED:
        return now - 3 * day, now - day
    if valid == NOT_YET_VALID:
        return now + day, now + 3 * day
    raise ValueError(f"valid={valid!r}: expected {CURRENT!r}, {EXPIRED!r} or {NOT_YET_VALID!r}")


def _key_usage(*, sign_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not sign_certificates,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign_certificates,
        crl_sign=sign_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _names(dns: Iterable[str], ips: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    return names + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]


class TestCA:
    """A self-signed CA valid for ``days`` days; :meth:`issue` signs leaf certificates.
    :meth:`load` takes one kept in files instead."""

    __test__ = False  # not a pytest test class

    def __init__(self, name: str, days: float = 1, *, valid: str = CURRENT):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        not_before, not_after = _validity(valid, days)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(sign_certificates=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )

    @classmethod
    def load(cls, key_pem: bytes, cert_pem: bytes) -> TestCA:
        """The CA whose key and certificate are these PEM bytes (``ca.key``, ``ca.crt`` kept by
        ``issue-certs.py``)."""
        key = serialization.load_pem_private_key(key_pem, None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the CA key is not an EC key")
        ca = cls.__new__(cls)
        ca.key = key
        ca.cert = x509.load_pem_x509_certificate(cert_pem)
        ca.name = ca.cert.subject
        return ca

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)

    def issue(
        self,
        common_name: str,
        dns: Iterable[str] = (),
        ips: Iterable[str] = (),
        *,
        usage: str = SERVER_AND_CLIENT,
        valid: str = CURRENT,
        days: float = 1,
    ) -> Issued:
        """A leaf certificate for ``common_name`` with these DNS names and IP addresses (subject
        alternative names: what a TLS client checks the server's name against), usable by a TLS
        server, a TLS client or both (``usage``), valid from now for ``days`` days, or expired or
        not yet valid (``valid``)."""
        key = ec.generate_private_key(ec.SECP256R1())
        not_before, not_after = _validity(valid, days)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(sign_certificates=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(_USAGES[usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        names = _names(dns, ips)
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def server(self, name: str, ips: Iterable[str] = (), *, valid: str = CURRENT) -> Issued:
        """A server's certificate for the DNS name ``name`` (and ``ips``)."""
        return self.issue(name, dns=[name], ips=ips, usage=SERVER_AND_CLIENT, valid=valid)

    def client(self, name: str, *, valid: str = CURRENT) -> Issued:
        """A client's certificate for ``name``, with no subject alternative names."""
        return self.issue(name, usage=CLIENT, valid=valid)


def self_signed(common_name: str, dns: Iterable[str] = (), ips: Iterable[str] = ()) -> Issued:
    """A server certificate valid for a day that is its own CA: clients trust its own file."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    not_before, not_after = _validity(CURRENT, 1)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    )
    names = _names(dns, ips)
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


class SecretVolume:
    """A directory laid out as the kubelet lays out a Secret volume: ``<name>`` is a symlink to
    ``..data/<name>``, ``..data`` a symlink to a timestamped directory holding the files.
    :meth:`update` writes a new timestamped directory and swaps ``..data`` with one rename, so a
    reader sees either all old or all new files. ``mode`` gives each file's permissions (a
    function of its name), ``owner`` a (uid, gid) for the files and directories (root only)."""

    def __init__(
        self,
        path: Path,
        files: Mapping[str, bytes],
        *,
        mode: Callable[[str], int] = lambda name: 0o644,
        owner: tuple[int, int] | None = None,
    ):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._mode = mode
        self._owner = owner
        self._generation = 0
        self.update(files)

    def file(self, name: str) -> Path:
        return self.path / name

    def read(self) -> dict[str, bytes]:
        """The files as they are now, by name."""
        return {p.name: p.read_bytes() for p in self.path.iterdir() if not p.name.startswith("..")}

    def update(self, files: Mapping[str, bytes]) -> None:
        self._generation += 1
        stamp = f"..{datetime.datetime.now(datetime.UTC):%Y_%m_%d_%H_%M_%S.%f}_{self._generation}"
        target = self.path / stamp
        target.mkdir(mode=0o755 if self._owner is None else 0o750)
        for name, data in files.items():
            (target / name).write_bytes(data)
            (target / name).chmod(self._mode(name))
            self._chown(target / name)
        self._chown(target)
        tmp = self.path / "..data_tmp"
        tmp.unlink(missing_ok=True)
        os.symlink(stamp, tmp)
        old = os.readlink(self.path / "..data") if (self.path / "..data").is_symlink() else None
        os.replace(tmp, self.path / "..data")  # the atomic swap
        for name in files:
            link = self.path / name
            if not link.is_symlink():
                os.symlink(f"..data/{name}", link)
        if old is not None and (self.path / old).is_dir():
            for p in (self.path / old).iterdir():
                p.unlink()
            (self.path / old).rmdir()
        self._chown(self.path)

    def _chown(self, path: Path) -> None:
        if self._owner is not None:
            os.chown(path, *self._owner)
