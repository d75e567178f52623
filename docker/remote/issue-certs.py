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

The certificates are made by the project's one builder of test certificates, ``devstack/tls.py``:
in the compose topology that file is mounted read-only under ``$RSM_DEVSTACK_PARENT/devstack/``
(the sidecar's image holds no ``devstack``); elsewhere it is taken from this checkout.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.environ.get("RSM_DEVSTACK_PARENT") or str(Path(__file__).resolve().parents[2]))

from devstack.tls import CLIENT, SERVER_AND_CLIENT, SecretVolume, TestCA

FILES = ("tls.crt", "tls.key", "ca.crt")


def ensure_ca(directory: Path, days: int) -> TestCA:
    key_file, cert_file = directory / "ca.key", directory / "ca.crt"
    if key_file.exists() and cert_file.exists():
        return TestCA.load(key_file.read_bytes(), cert_file.read_bytes())
    directory.mkdir(parents=True, exist_ok=True)
    ca = TestCA("rsm-sidecar test CA", days=days * 10)
    key_file.write_bytes(ca.key_pem)
    key_file.chmod(0o600)
    cert_file.write_bytes(ca.cert_pem)
    return ca


def _owner(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    return int(uid), int(gid or uid)


def _mode(name: str) -> int:
    return 0o400 if name.endswith(".key") else 0o444


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
    ca = ensure_ca(args.ca, args.days)
    dns = [n.strip() for n in args.server_dns.split(",") if n.strip()]
    wanted = [
        (args.server, dns[0], dns, SERVER_AND_CLIENT, args.server_owner),
        (args.client, args.client_cn, [], CLIENT, args.client_owner),
    ]
    for directory, cn, names, usage, owner in wanted:
        if not args.renew and all((directory / f).exists() for f in FILES):
            print(f"{directory}: kept")
            continue
        leaf = ca.issue(cn, dns=names, usage=usage, days=args.days)
        files = {"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem, "ca.crt": ca.cert_pem}
        SecretVolume(directory, files, mode=_mode, owner=owner)
        print(f"{directory}: {'renewed' if args.renew else 'issued'} {cn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
