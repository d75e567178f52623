#!/usr/bin/env python3
"""issue-certs: a test CA and the mutual-TLS certificates of the remote topology
(docker-compose.remote.yml), laid out as cert-manager's Secrets appear in a pod.

    issue-certs.py --ca DIR --server DIR --server-dns NAME[,NAME...] --server-owner UID:GID
                   --client DIR --client-cn NAME --client-owner UID:GID [--renew] [--days N]

The CA (ECDSA P-256, ``ca.key``/``ca.crt`` in ``--ca``) is made once and kept. The sidecar's
certificate (``--server``: server and client auth, the probe presents it too) and the brokers'
client certificate (``--client``: client auth) are issued when missing, or again with new keys
with ``--renew`` (what cert-manager does when it renews). Each directory gets ``tls.crt``,
``tls.key`` (unencrypted PKCS#8, as the shim reads it) and ``ca.crt`` the way the kubelet writes
a Secret volume: the files are symlinks into ``..data``, itself a symlink to a timestamped
directory, and a renewal swaps ``..data`` in one rename, so a reader sees the old set or the
new one, never a mix. Keys are readable by the directory's owner only.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

FILES = ("tls.crt", "tls.key", "ca.crt")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def ensure_ca(directory: Path, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key_file, cert_file = directory / "ca.key", directory / "ca.crt"
    if key_file.exists() and cert_file.exists():
        key = serialization.load_pem_private_key(key_file.read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return key, x509.load_pem_x509_certificate(cert_file.read_bytes())
    directory.mkdir(parents=True, exist_ok=True)
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rsm-sidecar test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days * 10))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_file.write_bytes(_pem_key(key))
    key_file.chmod(0o600)
    cert_file.write_bytes(_pem_cert(cert))
    return key, cert


def issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    dns_names: list[str],
    usages: list[x509.ObjectIdentifier],
    days: int,
) -> tuple[bytes, bytes]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return _pem_cert(cert), _pem_key(key)


def write_secret_volume(directory: Path, files: dict[str, bytes], owner: tuple[int, int]) -> None:
    """The files as a kubelet Secret volume: <dir>/<name> -> ..data/<name>, ..data -> ..<stamp>."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
    stamp.mkdir(mode=0o750)
    for name, data in files.items():
        path = stamp / name
        path.write_bytes(data)
        path.chmod(0o400 if name.endswith(".key") else 0o444)
        os.chown(path, *owner)
    os.chown(stamp, *owner)
    link = directory / "..data_tmp"
    link.unlink(missing_ok=True)
    link.symlink_to(stamp.name)
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    link.rename(directory / "..data")  # the one atomic switch
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")
    if old:
        shutil.rmtree(directory / old, ignore_errors=True)
    os.chown(directory, *owner)


def _owner(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    return int(uid), int(gid or uid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="issue-certs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ca", type=Path, required=True)
    ap.add_argument("--server", type=Path, required=True)
    ap.add_argument("--server-dns", required=True, help="comma-separated DNS names")
    ap.add_argument("--server-owner", type=_owner, required=True)
    ap.add_argument("--client", type=Path, required=True)
    ap.add_argument("--client-cn", required=True)
    ap.add_argument("--client-owner", type=_owner, required=True)
    ap.add_argument("--days", type=int, default=90)
    ap.add_argument("--renew", action="store_true", help="issue new leaf certificates and keys")
    args = ap.parse_args(argv)
    ca_key, ca_cert = ensure_ca(args.ca, args.days)
    ca_pem = _pem_cert(ca_cert)
    dns = [n.strip() for n in args.server_dns.split(",") if n.strip()]
    wanted = [
        (
            args.server,
            dns[0],
            dns,
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
            args.server_owner,
        ),
        (args.client, args.client_cn, [], [ExtendedKeyUsageOID.CLIENT_AUTH], args.client_owner),
    ]
    for directory, cn, names, usages, owner in wanted:
        if not args.renew and all((directory / f).exists() for f in FILES):
            print(f"{directory}: kept")
            continue
        cert, key = issue(ca_key, ca_cert, cn, names, usages, args.days)
        write_secret_volume(directory, {"tls.crt": cert, "tls.key": key, "ca.crt": ca_pem}, owner)
        print(f"{directory}: {'renewed' if args.renew else 'issued'} {cn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
