"""The ``[storage.gcs]`` keys: declared once, as the fields of ``GcsSettings``.

Light on purpose: every ``Config()`` loads this module, so it imports no google-cloud-storage
(the GCS backend, :mod:`rsm_sidecar.storage.gcs`, is imported only when
``storage.backend = "gcs"``).
"""

from __future__ import annotations

import dataclasses

from rsm_sidecar.config import setting
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage import bucket_settings as remote
from rsm_sidecar.storage.bucket_settings import BucketSettings

KiB = 1024
MiB = 1024 * KiB
CHUNK_GRANULARITY = 256 * KiB  # resumable chunks must be multiples of this (but the last)


@dataclasses.dataclass(frozen=True)
class GcsSettings(BucketSettings):
    """How the GCS backend reaches its bucket and writes objects (validated on creation)."""

    KEY_PREFIX = "storage.gcs"

    project: str | None = setting(
        "str", None, "Project id sent with requests (not needed for object access)."
    )
    endpoint_url: str | None = setting(
        "str",
        None,
        "API endpoint, e.g. `http://127.0.0.1:4443` for fake-gcs-server or a Private Service Connect "
        "endpoint. Unset: `https://storage.googleapis.com` (or `STORAGE_EMULATOR_HOST`).",
    )
    credentials: str = setting(
        "str",
        "default",
        "`default`: application default credentials (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's ADC file, "
        "the GCE/GKE metadata server incl. Workload Identity); `file`: the JSON file in "
        "`storage.gcs.credentials_file`; `anonymous`: no credentials (emulators, public buckets).",
        choices=("default", "file", "anonymous"),
    )
    credentials_file: str | None = setting(
        "path",
        None,
        "Service-account key (or external-account/Workload Identity Federation) JSON file.",
        required_when=("storage.gcs.credentials", "file"),
    )
    chunk_size: int = setting(
        "size",
        8 * MiB,
        "Resumable-upload chunk size, a multiple of 256 KiB; objects up to this size are one request. "
        "Memory per upload is at most 2 x chunk_size.",
        min=CHUNK_GRANULARITY,
        max=1024 * MiB,
    )
    checksum: bool = setting(
        "bool",
        True,
        "Send the CRC32C of every upload (GCS rejects a mismatch) and verify it on whole-object GETs.",
    )
    connect_timeout: float = remote.connect_timeout()
    read_timeout: float = remote.read_timeout()
    max_attempts: int = remote.max_attempts(
        "429, 5xx, connection errors and timeouts are retried with exponential backoff and jitter"
        "; resumable chunk uploads are not retried: the writer fails"
    )
    delete_concurrency: int = remote.delete_concurrency("DELETE")
    max_pool_connections: int = remote.max_pool_connections("")
    startup_write_check: bool = setting(
        "bool",
        True,
        "At start-up, after listing the bucket, write and delete a 0-byte probe object under "
        "`storage.key_prefix`.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk_size <= 0 or self.chunk_size % CHUNK_GRANULARITY:
            raise ConfigError(
                f"storage.gcs.chunk_size: {self.chunk_size} is not a positive multiple of 256 KiB "
                f"({CHUNK_GRANULARITY} bytes)"
            )


CONFIG_KEYS = GcsSettings.keys()
