"""Build the configured ObjectStore.

A backend's module, and with it its cloud SDK, is imported only when ``storage.backend``
chooses it; the SDKs are the pip extras ``s3``, ``gcs`` and ``azure`` of rsm-sidecar, and a missing
one is a ``ConfigError`` that names the extra to install.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

from rsm_sidecar.config import Config, Settings, setting
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage.base import ObjectStore
from rsm_sidecar.storage.local_settings import LocalSettings

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


@dataclasses.dataclass(frozen=True)
class StorageSettings(Settings):
    """Which backend stores the segments, and under which keys (the backend's own keys are its
    ``<backend>_settings.py``'s)."""

    KEY_PREFIX = "storage"

    backend: str = setting(
        "str",
        "local",
        "Where segments are stored.",
        choices=tuple(BACKENDS),
    )
    key_prefix: str = setting(
        "str",
        "",
        "Prefix of every object key, concatenated verbatim (include a trailing `/` for a folder).",
    )
    hashed_prefix_chars: int = setting(
        "int",
        0,
        "When > 0, insert this many hex characters of a hash of (topic id, partition) after the "
        "prefix, spreading partitions over storage key ranges (S3 request-rate partitions). Keys stay"
        " derivable from the segment metadata. 0 keeps the Aiven-compatible layout.",
        min=0,
        max=16,
    )


CONFIG_KEYS = StorageSettings.keys()


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
    backend = StorageSettings.from_config(cfg).backend
    module = backend_module(backend)
    if backend == "local":
        local = LocalSettings.from_config(cfg)
        store: ObjectStore = module.LocalObjectStore(
            local.root, fsync=local.fsync, file_mode=int(local.file_mode, 8)
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
