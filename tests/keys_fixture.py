"""RSA key files for tests (generated once per session: 2048-bit generation takes a while)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from rsm_sidecar.transform.keyring import write_key_pair


def key_pairs(folder: Path, key_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """A fresh 2048-bit key pair per key id, written into ``folder``: (public, private) file
    names by key id."""
    out = {}
    for kid in key_ids:
        write_key_pair(folder / f"{kid}.public.pem", folder / f"{kid}.private.pem", 2048)
        out[kid] = (str(folder / f"{kid}.public.pem"), str(folder / f"{kid}.private.pem"))
    return out


@pytest.fixture(scope="session")
def rsa_keys(tmp_path_factory) -> dict[str, tuple[str, str]]:
    return key_pairs(tmp_path_factory.mktemp("rsa-keys"), ("A", "B"))


def encryption_config(rsa_keys, active: str = "A", ids=("A", "B")) -> dict:
    return {
        "enabled": True,
        "active_key_id": active,
        "keys": {k: {"public_key_file": rsa_keys[k][0], "private_key_file": rsa_keys[k][1]} for k in ids},
    }
