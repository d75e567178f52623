"""RSA key files for tests (generated once per session: 2048-bit generation takes a while)."""

from __future__ import annotations

import pytest

from rsm_sidecar.transform.keyring import write_key_pair


@pytest.fixture(scope="session")
def rsa_keys(tmp_path_factory) -> dict[str, tuple[str, str]]:
    d = tmp_path_factory.mktemp("rsa-keys")
    out = {}
    for kid in ("A", "B"):
        write_key_pair(d / f"{kid}.public.pem", d / f"{kid}.private.pem", 2048)
        out[kid] = (str(d / f"{kid}.public.pem"), str(d / f"{kid}.private.pem"))
    return out


def encryption_config(rsa_keys, active: str = "A", ids=("A", "B")) -> dict:
    return {
        "enabled": True,
        "active_key_id": active,
        "keys": {k: {"public_key_file": rsa_keys[k][0], "private_key_file": rsa_keys[k][1]} for k in ids},
    }
