"""Keyring: wrapping data keys, rotation, and interop with BouncyCastle (Aiven's provider)."""

from __future__ import annotations

import os
import subprocess

import pytest

from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError, DataLoss, FailedPrecondition
from rsm_sidecar.transform.chunks import ChunkCodec
from rsm_sidecar.transform.keyring import Keyring
from tests.helpers import REPO, cache_dir, require_file
from tests.keys_fixture import encryption_config


def ring_of(keys: dict[str, tuple[str, str]], active: str) -> Keyring:
    """A keyring of ``keys``: key id -> (public PEM path, private PEM path)."""
    return Keyring.from_config(
        Config(
            {
                "storage": {"local": {"root": "/tmp/unused"}},
                "encryption": encryption_config(keys, active, tuple(keys)),
            }
        )
    )


def ring(rsa_keys, active, ids=("A", "B")) -> Keyring:
    return ring_of({k: rsa_keys[k] for k in ids}, active)


def test_wrap_unwrap_roundtrip_and_rotation(rsa_keys):
    a = ring(rsa_keys, "A")
    dek, _ = a.new_data_key()
    kid, wrapped = a.wrap(dek)
    assert kid == "A" and dek not in wrapped
    b = ring(rsa_keys, "B")  # rotated: B active, A still in the ring
    assert b.wrap(dek)[0] == "B"
    assert b.unwrap("A", wrapped) == dek


def test_unknown_key_id_is_failed_precondition_naming_it(rsa_keys):
    only_b = ring(rsa_keys, "B", ids=("B",))
    _, wrapped = ring(rsa_keys, "A").wrap(os.urandom(32))
    with pytest.raises(FailedPrecondition, match="'A'.*not in the keyring"):
        only_b.unwrap("A", wrapped, "seg.rsm-manifest")


def test_wrong_key_under_same_id_is_data_loss(rsa_keys):
    _, wrapped = ring(rsa_keys, "A").wrap(os.urandom(32))
    swapped = ring_of({"A": rsa_keys["B"]}, "A")
    with pytest.raises(DataLoss, match="does not decrypt"):
        swapped.unwrap("A", wrapped)


def test_config_errors_name_the_key(rsa_keys, tmp_path):
    with pytest.raises(ConfigError, match="encryption.active_key_id"):
        ring(rsa_keys, "C")
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    with pytest.raises(ConfigError, match="encryption.keys.A.public_key_file"):
        ring_of({"A": (str(bad), rsa_keys["A"][1])}, "A")
    with pytest.raises(ConfigError, match="not a pair"):
        ring_of({"A": (rsa_keys["A"][0], rsa_keys["B"][1])}, "A")
    with pytest.raises(ConfigError, match="encryption.active_key_id: missing"):
        Config({"storage": {"local": {"root": "/tmp/unused"}}, "encryption": {"enabled": True}})
    half = {"enabled": True, "active_key_id": "A", "keys": {"A": {"public_key_file": rsa_keys["A"][0]}}}
    with pytest.raises(
        ConfigError, match=r"^encryption.keys.A.private_key_file: missing; PEM RSA private key"
    ):
        Keyring.from_config(Config({"storage": {"local": {"root": "/tmp/unused"}}, "encryption": half}))


def test_keyring_repr_has_no_key_material(rsa_keys):
    text = repr(ring(rsa_keys, "A").pairs)
    assert "PRIVATE" not in text and "BEGIN" not in text


# -- interop with BouncyCastle -----------------------------------------------------------
def _bc(*args: str) -> str:
    jar = require_file(cache_dir() / "interop" / "bcprov-jdk18on-1.83.jar", "make interop-jars")
    out = subprocess.run(
        ["java", "-cp", str(jar), str(REPO / "tests" / "interop" / "BcEnvelope.java"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.integration  # Java and the BouncyCastle jar (make interop-jars)
def test_bouncycastle_wraps_python_unwraps_and_back(rsa_keys):
    """RSA/NONE/OAEPWithSHA3-512AndMGF1Padding in BC applies SHA3-512 to MGF1 too; a
    mismatch in either digest would make one direction fail."""
    import base64

    keys = ring(rsa_keys, "A")
    dek = os.urandom(32)
    wrapped_by_bc = base64.b64decode(_bc("wrap", rsa_keys["A"][0], dek.hex()))
    assert keys.unwrap("A", wrapped_by_bc) == dek
    _, wrapped_by_py = keys.wrap(dek)
    assert _bc("unwrap", rsa_keys["A"][1], base64.b64encode(wrapped_by_py).decode()) == dek.hex()


@pytest.mark.integration  # Java and the BouncyCastle jar (make interop-jars)
def test_java_aes_gcm_chunks_match_ours():
    dek, aad, plain = os.urandom(32), os.urandom(32), os.urandom(1000)
    codec = ChunkCodec(False, dek, aad)
    sealed_by_java = bytes.fromhex(_bc("seal", dek.hex(), aad.hex(), plain.hex()))
    assert codec.decode(sealed_by_java, len(plain), "java chunk") == plain
    assert bytes.fromhex(_bc("open", dek.hex(), aad.hex(), codec.encode(plain).hex())) == plain
