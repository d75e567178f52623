"""Build the configured ObjectStore."""

from __future__ import annotations

from rsm_sidecar.config import Config, Key
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage.base import ObjectStore

CONFIG_KEYS = [
    Key("storage.backend", "str", "local", "Where segments are stored.", choices=("local", "s3", "gcs")),
    Key(
        "storage.key_prefix",
        "str",
        "",
        "Prefix of every object key, concatenated verbatim (include a trailing `/` for a folder).",
    ),
    Key(
        "storage.hashed_prefix_chars",
        "int",
        0,
        "When > 0, insert this many hex characters of a hash of (topic id, partition) after the prefix, "
        "spreading partitions over storage key ranges (S3 request-rate partitions). Keys stay derivable "
        "from the segment metadata. 0 keeps the Aiven-compatible layout.",
        min=0,
        max=16,
    ),
    Key(
        "storage.local.root",
        "path",
        None,
        "Directory that holds the objects.",
        required_when=("storage.backend", "local"),
    ),
    Key("storage.local.fsync", "bool", True, "fsync files and directories before a write is acknowledged."),
    Key(
        "storage.local.file_mode",
        "str",
        "0600",
        "Permissions of stored objects (octal); directories get the matching execute bits. The default keeps "
        "segments readable by the sidecar's user only, whatever the umask.",
        choices=("0600", "0640", "0644"),
    ),
]


def open_store(cfg: Config) -> ObjectStore:
    backend = cfg["storage.backend"]
    if backend == "local":
        from rsm_sidecar.storage.local import LocalObjectStore

        return LocalObjectStore(
            cfg["storage.local.root"],
            fsync=cfg["storage.local.fsync"],
            file_mode=int(cfg["storage.local.file_mode"], 8),
        )
    if backend == "s3":
        from rsm_sidecar.storage.s3 import S3ObjectStore

        return S3ObjectStore.from_config(cfg)
    if backend == "gcs":
        from rsm_sidecar.storage.gcs import GcsObjectStore

        return GcsObjectStore.from_config(cfg)
    raise ConfigError(f"storage.backend: unknown backend {backend!r}")
