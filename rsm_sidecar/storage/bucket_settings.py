"""What the remote backends' settings share: the bucket, required when ``storage.backend``
chooses the backend (S3, GCS: ``BucketSettings``), and the keys every remote backend has, written
once here (``connect_timeout()``, ...: each call is the field of one backend's class). Light, as
every settings module (no SDK imports)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rsm_sidecar.config import Key, Settings, setting
from rsm_sidecar.errors import ConfigError


def connect_timeout() -> Any:
    return setting("seconds", 5.0, "TCP/TLS connect timeout of one attempt.", min=0.1)


def read_timeout() -> Any:
    return setting(
        "seconds", 30.0, "Longest wait for the service to answer or send more bytes, per attempt.", min=0.1
    )


def max_attempts(retried: str) -> Any:
    """``retried``: which failures are tried again, and how."""
    return setting("int", 3, f"Attempts per request including the first ({retried}).", min=1, max=20)


def max_pool_connections(what: str = " (upload threads plus concurrent reads should fit)") -> Any:
    return setting("int", 64, f"HTTP connections kept to the service{what}.", min=1, max=1024)


def delete_concurrency(request: str) -> Any:
    return setting("int", 16, f"Parallel {request} requests of one `delete_many`.", min=1, max=128)


@dataclasses.dataclass(frozen=True)
class BucketSettings(Settings):
    """Base of ``S3Settings`` and ``GcsSettings``; ``KEY_PREFIX`` is ``storage.<backend>``."""

    bucket: str = setting("str", None, "Bucket that holds the objects.")

    @classmethod
    def keys(cls, prefix: str | None = None, **doc_vars: str) -> list[Key]:
        backend = cls.KEY_PREFIX.rsplit(".", 1)[1]
        return [
            dataclasses.replace(k, required_when=("storage.backend", backend))
            if k.path == f"{cls.KEY_PREFIX}.bucket"
            else k
            for k in super().keys(prefix, **doc_vars)
        ]

    def __post_init__(self) -> None:
        if not self.bucket:
            raise ConfigError(f"{self.KEY_PREFIX}.bucket: missing; the bucket that holds the objects")
