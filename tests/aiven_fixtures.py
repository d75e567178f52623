"""Aiven-written segments for the tests: Aiven's key ids on the session's RSA key files, and
a bucket holding one segment per compression x encryption x chunk size (tests/aiven_format.py
writes them; the contents are the broker's fixture segments)."""

from __future__ import annotations

import itertools

import pytest

from rsm_sidecar.transform.keyring import Keyring
from tests import aiven_format as aiven
from tests.keys_fixture import encryption_config

COMPRESSION = (False, True)
KEY_IDS = (None, "aiven-key-1", "aiven-key-2")
CHUNK_SIZES = (1000, 4096, 4 * 1024 * 1024)
PREFIX = "aiven/"


@pytest.fixture(scope="module")
def aiven_keys(rsa_keys) -> dict[str, tuple[str, str]]:
    """Aiven's key pair ids, on the session's PEM files."""
    return {"aiven-key-1": rsa_keys["A"], "aiven-key-2": rsa_keys["B"]}


@pytest.fixture(scope="module")
def aiven_ring(aiven_keys) -> aiven.KeyRing:
    return aiven.KeyRing(aiven_keys)


@pytest.fixture(scope="module")
def our_ring(aiven_keys) -> Keyring:
    """The sidecar's keyring with Aiven's key ids and PEM files."""
    from rsm_sidecar.config import Config

    cfg = Config(
        {
            "storage": {"local": {"root": "/unused"}},
            "encryption": encryption_config(aiven_keys, "aiven-key-1", tuple(aiven_keys)),
        },
        environ={},
    )
    ring = Keyring.from_config(cfg)
    assert ring is not None
    return ring


def write_aiven_bucket(store, ring: aiven.KeyRing, topic: str = "aiven-topic") -> list[tuple]:
    """One Aiven-written segment per compression x encryption x chunk size, over the broker's
    fixture segments in turn; returns (segment, settings) pairs."""
    contents = aiven.fixture_segments(topic, aiven.kafka_uuid(topic))
    out = []
    for i, (compression, key_id, chunk) in enumerate(itertools.product(COMPRESSION, KEY_IDS, CHUNK_SIZES)):
        seg = contents[i % len(contents)]
        seg = aiven.SegmentInfo(
            **{
                **seg.__dict__,
                "partition": i,
                "segment_id": aiven.kafka_uuid(f"{topic}/{i}"),
            }
        )
        settings = aiven.WriterSettings(chunk, compression, False, key_id, PREFIX)
        aiven.write_segment(store.put, seg, settings, ring)
        out.append((seg, settings))
    return out


def sidecar_toml(path, root, aiven_keys: dict[str, tuple[str, str]] | None, accept: bool = True) -> str:
    """A sidecar configuration file (path returned as a string) for the Aiven bucket in ``root``:
    Aiven's prefix and key ids (encryption off when ``aiven_keys`` is None) and
    ``fetch.accept_unauthenticated_segments = accept``."""
    lines = [
        "[storage]",
        f'key_prefix = "{PREFIX}"',
        "[storage.local]",
        f'root = "{root}"',
        "fsync = false",
        "[fetch]",
        f"accept_unauthenticated_segments = {'true' if accept else 'false'}",
        "[encryption]",
    ]
    if aiven_keys is None:
        lines.append("enabled = false")
    else:
        lines += ["enabled = true", 'active_key_id = "aiven-key-1"']
        for key_id, (public, private) in aiven_keys.items():
            lines += [
                f"[encryption.keys.{key_id}]",
                f'public_key_file = "{public}"',
                f'private_key_file = "{private}"',
            ]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)
