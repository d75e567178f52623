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

#: backend -> (its module, its store class, the pip extra that installs its SDK, the SDK, the SDK's
#: top-level modules)
BACKENDS: dict[str, tuple[str, str, str | None, str, tuple[str, ...]]] = {
    "local": ("rsm_sidecar.storage.local", "LocalObjectStore", None, "", ()),
    "s3": ("rsm_sidecar.storage.s3", "S3ObjectStore", "s3", "boto3", ("boto3", "botocore", "awscrt")),
    "gcs": (
        "rsm_sidecar.storage.gcs",
        "GcsObjectStore",
        "gcs",
        "google-cloud-storage",
        ("google", "requests", "urllib3"),
    ),
    "azure": (
        "rsm_sidecar.storage.azure",
        "AzureObjectStore",
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
    module, _, extra, sdk, sdk_modules = BACKENDS[backend]
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
    """The configured backend's store: a remote one from its settings class (``settings_type``),
    its start-up probe under ``storage.key_prefix``."""
    storage = StorageSettings.from_config(cfg)
    store_type = getattr(backend_module(storage.backend), BACKENDS[storage.backend][1])
    if storage.backend == "local":
        local = LocalSettings.from_config(cfg)
        store: ObjectStore = store_type(local.root, fsync=local.fsync, file_mode=int(local.file_mode, 8))
    else:
        store = store_type(store_type.settings_type.from_config(cfg), probe_prefix=storage.key_prefix)
    return store
