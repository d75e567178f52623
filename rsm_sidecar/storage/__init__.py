"""Object storage: the ``ObjectStore`` contract and its backends (local, s3, gcs)."""

from rsm_sidecar.storage.base import (  # noqa: F401
    InvalidRange,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectWriter,
    StorageError,
    StorageTimeout,
    StorageUnavailable,
)
