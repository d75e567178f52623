"""The ``[encryption]`` keys, declared once, as the fields of ``EncryptionSettings``.

Light on purpose: every ``Config()`` loads this module, so it imports no cryptography (the
keyring, :mod:`.keyring`, loads the keys).
"""

from __future__ import annotations

import dataclasses

from rsm_sidecar.config import REQUIRED, Settings, family, setting


@dataclasses.dataclass(frozen=True)
class KeyFiles(Settings):
    """The two files of one key id (``encryption.keys.<id>.*``)."""

    public_key_file: str = setting(
        "path", REQUIRED, "PEM RSA public key (X.509 SubjectPublicKeyInfo) of key id `<id>`."
    )
    private_key_file: str = setting(
        "path",
        REQUIRED,
        "PEM RSA private key (PKCS#8 or PKCS#1) of key id `<id>`; needed to read segments written "
        "under it. Must not be readable or writable by other users (mode 0600 or 0640).",
    )


@dataclasses.dataclass(frozen=True)
class EncryptionSettings(Settings):
    """Whether new segments are encrypted, under which key, and the key pairs that wrap data keys
    (read by :meth:`rsm_sidecar.transform.keyring.Keyring.from_config`)."""

    KEY_PREFIX = "encryption"

    enabled: bool = setting(
        "bool", False, "Encrypt chunks and indexes with AES-256-GCM under a fresh data key per segment."
    )
    active_key_id: str | None = setting(
        "str",
        None,
        "Key id whose RSA public key wraps the data keys of new segments; must be one of `encryption.keys`.",
        required_when=("encryption.enabled", True),
    )
    key_files: dict[str, KeyFiles] = family(KeyFiles, name="id", key="keys")
    allow_exposed_private_keys: bool = setting(
        "bool",
        False,
        "Accept private key files that other users can read or write (start-up fails otherwise).",
    )


CONFIG_KEYS = EncryptionSettings.keys()
