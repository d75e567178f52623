"""What every bucket backend's settings share: the bucket, required when ``storage.backend``
chooses the backend. Light, as every settings module (no SDK imports)."""

from __future__ import annotations

import dataclasses

from rsm_sidecar.config import Key, Settings, setting
from rsm_sidecar.errors import ConfigError


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
