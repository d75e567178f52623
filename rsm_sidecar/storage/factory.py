"""Build the configured ObjectStore.

A backend's module, and with it its cloud SDK, is imported only when ``storage.backend``
chooses it; the SDKs are the pip extras ``s3``, ``gcs`` and ``azure`` of rsm-sidecar, and a missing
one is a ``ConfigError`` that names the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from rsm_sidecar.config import Config, Key
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage.base import ObjectStore

#: backend -> (its module, the pip extra that installs its SDK, the SDK, the SDK's top-level modules)
BACKENDS: dict[str, tuple[str, str | None, str, tuple[str, ...]]] = {
    "local": ("rsm_sidecar.storage.local", None, "", ()),
    "s3": ("rsm_sidecar.storage.s3", "s3", "boto3", ("boto3", "botocore", "awscrt")),
    "gcs": ("rsm_sidecar.storage.gcs", "gcs", "google-cloud-storage", ("google", "requests", "urllib3")),
    "azure": (
        "rsm_sidecar.storage.azure",
        "azure",
        "azure-storage-blob",
        ("azure", "requests", "urllib3", "msal", "isodate"),
    ),
}

CONFIG_KEYS = [
    Key("storage.backend", "str", "local", "Where segments are stored.", choices=tuple(BACKENDS)),
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


def backend_module(backend: str) -> ModuleType:
    """The module of ``backend``, imported now; a missing SDK is a ``ConfigError`` naming the
    pip extra that installs it."""
    if backend not in BACKENDS:
        raise ConfigError(f"storage.backend: unknown backend {backend!r}")
    module, extra, sdk, sdk_modules = BACKENDS[backend]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if extra is None or (e.name or "").split(".")[0] not in sdk_modules:
            raise
        raise ConfigError(
            f"storage.backend = {backend!r} needs {sdk}, which is not installed (no module {e.name!r}): "
            f"pip install 'rsm-sidecar[{extra}]'"
        ) from e


def open_store(cfg: Config) -> ObjectStore:
    backend = cfg["storage.backend"]
    module = backend_module(backend)
    if backend == "local":
        store: ObjectStore = module.LocalObjectStore(
            cfg["storage.local.root"],
            fsync=cfg["storage.local.fsync"],
            file_mode=int(cfg["storage.local.file_mode"], 8),
        )
        return store
    if backend == "s3":
        store = module.S3ObjectStore.from_config(cfg)
        return store
    if backend == "gcs":
        store = module.GcsObjectStore.from_config(cfg)
        return store
    store = module.AzureObjectStore.from_config(cfg)
    return store
