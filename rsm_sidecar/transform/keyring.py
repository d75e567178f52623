"""Key-encryption keys: RSA key pairs by id, one of them active.

A segment's data key (AES-256) is wrapped with RSA-OAEP using SHA3-512 for both the
OAEP hash and MGF1, as Aiven's plugin does with BouncyCastle's
``RSA/NONE/OAEPWithSHA3-512AndMGF1Padding``. ``cryptography`` refuses SHA3 in OAEP,
so pycryptodome does the RSA part. New segments use the active id; every id in the
ring stays readable. Key material never appears in messages or logs.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from Crypto.Cipher import PKCS1_OAEP
from Crypto.Hash import SHA3_512
from Crypto.PublicKey import RSA
from Crypto.Signature import pss

from rsm_sidecar.errors import ConfigError, DataLoss, FailedPrecondition
from rsm_sidecar.transform.keyring_settings import EncryptionSettings

if TYPE_CHECKING:
    from rsm_sidecar.config import Config

DATA_KEY_BYTES = 32
AAD_BYTES = 32


def _oaep(key: RSA.RsaKey) -> PKCS1_OAEP.PKCS1OAEP_Cipher:
    return PKCS1_OAEP.new(key, hashAlgo=SHA3_512, mgfunc=lambda x, y: pss.MGF1(x, y, SHA3_512))


@dataclasses.dataclass
class KeyPair:
    key_id: str
    public: RSA.RsaKey
    private: RSA.RsaKey | None

    def __repr__(self) -> str:
        private = "yes" if self.private else "no"
        return f"KeyPair({self.key_id!r}, {self.public.size_in_bits()} bits, private={private})"


def _load_pem(path: str, what: str, private: bool = False, allow_exposed: bool = False) -> RSA.RsaKey:
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if private and mode & 0o007 and not allow_exposed:
                raise ConfigError(
                    f"{what}: {path} is accessible to other users (mode {mode & 0o777:04o}); restrict "
                    f"it (chmod 600) or set encryption.allow_exposed_private_keys = true"
                )
            data = f.read()
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {path}: {e.strerror}") from None
    try:
        return RSA.import_key(data)
    except (ValueError, IndexError, TypeError):
        raise ConfigError(f"{what}: {path} is not a PEM RSA key") from None


class Keyring:
    def __init__(self, pairs: dict[str, KeyPair], active_id: str):
        if active_id not in pairs:
            raise ConfigError(
                f"encryption.active_key_id: {active_id!r} is not one of the configured keys "
                f"({', '.join(sorted(pairs)) or 'none'})"
            )
        self.pairs = pairs
        self.active_id = active_id

    @classmethod
    def from_config(cls, cfg: Config) -> Keyring | None:
        settings = EncryptionSettings.from_config(cfg)
        if not settings.enabled:
            return None
        if not settings.key_files:
            raise ConfigError(
                "encryption.keys: encryption is enabled but no key is configured "
                "(add [encryption.keys.<id>] with public_key_file and private_key_file)"
            )
        pairs = {}
        for key_id, files in sorted(settings.key_files.items()):
            public = _load_pem(files.public_key_file, f"encryption.keys.{key_id}.public_key_file")
            private = _load_pem(
                files.private_key_file,
                f"encryption.keys.{key_id}.private_key_file",
                private=True,
                allow_exposed=settings.allow_exposed_private_keys,
            )
            if not private.has_private():
                raise ConfigError(
                    f"encryption.keys.{key_id}.private_key_file: {files.private_key_file} "
                    f"holds a public key, not a private key"
                )
            if private.public_key().n != public.n:
                raise ConfigError(
                    f"encryption.keys.{key_id}: the public and private key files are not a pair"
                )
            if public.size_in_bits() < 2048:
                raise ConfigError(
                    f"encryption.keys.{key_id}.public_key_file: RSA keys must have at least "
                    f"2048 bits, got {public.size_in_bits()}"
                )
            pairs[key_id] = KeyPair(key_id, public, private)
        return cls(pairs, str(settings.active_key_id))

    def new_data_key(self) -> tuple[bytes, bytes]:
        """A fresh (data key, AAD) for one segment."""
        return os.urandom(DATA_KEY_BYTES), os.urandom(AAD_BYTES)

    def wrap(self, data_key: bytes, key_id: str | None = None) -> tuple[str, bytes]:
        key_id = key_id or self.active_id
        return key_id, _oaep(self.pairs[key_id].public).encrypt(data_key)

    def unwrap(self, key_id: str, wrapped: bytes, where: str = "segment") -> bytes:
        pair = self.pairs.get(key_id)
        if pair is None:
            raise FailedPrecondition(
                f"{where}: data key is wrapped under key id {key_id!r}, which is not in the "
                f"keyring (known: {', '.join(sorted(self.pairs))})"
            )
        if pair.private is None:
            raise FailedPrecondition(f"{where}: no private key for key id {key_id!r}")
        try:
            key = bytes(_oaep(pair.private).decrypt(wrapped))
        except (ValueError, TypeError):
            raise DataLoss(
                f"{where}: the wrapped data key does not decrypt under key id {key_id!r} "
                f"(corrupt manifest or a different key with the same id)"
            ) from None
        if len(key) != DATA_KEY_BYTES:
            raise DataLoss(f"{where}: unwrapped data key has {len(key)} bytes, expected {DATA_KEY_BYTES}")
        return key


def generate_key_pair(bits: int = 3072) -> tuple[bytes, bytes]:
    """(public PEM, private PKCS#8 PEM) for a new key-encryption key."""
    key = RSA.generate(bits)
    return key.public_key().export_key("PEM"), key.export_key("PEM", pkcs=8)


def write_key_pair(
    public_path: str | os.PathLike[str],
    private_path: str | os.PathLike[str],
    bits: int = 3072,
    overwrite: bool = False,
) -> None:
    """Generate a key-encryption key and write it as two PEM files; the private one is
    created with mode 0600 (only the owner can read it), as ``Keyring`` requires."""
    public, private = generate_key_pair(bits)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    fd = os.open(private_path, flags, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(private)
    with open(public_path, "wb") as f:
        f.write(public)
