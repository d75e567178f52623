"""The object-storage contract every backend implements.

Semantics shared by all backends (and checked by ``tests/storage/contract.py``):

* ``open_writer(key)`` returns a writer; bytes become visible under ``key`` only when
  ``commit()`` returns, atomically and completely. ``abort()`` (or an exception inside
  the ``with`` block) leaves nothing behind: no partial object, no temp file, no open
  multipart upload. Committing over an existing key replaces it.
* ``get_range(key, start, end)`` returns bytes ``[start, end]`` (end inclusive), fewer
  only when the object ends before ``end``; ``start`` at or past the end is
  ``InvalidRange``. Callers that know the expected length must check it.
* ``delete``/``delete_many`` are idempotent: a missing key is not an error.
* ``list(prefix)`` yields every object whose key starts with ``prefix``, sorted by key.
* Errors: ``ObjectNotFound`` (missing key), ``InvalidRange``, ``StorageUnavailable``
  (transient: network, throttling, 5xx; retry later), ``StorageTimeout``,
  ``StorageError`` (permanent: permissions, bad bucket, bad request).

Every backend counts the requests it sends to the storage service in ``requests``
(operation name -> count), which metrics and benchmarks read; cost depends on them.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import datetime
import logging
import threading
from collections.abc import Iterable, Iterator

import grpc

from rsm_sidecar.errors import (
    DeadlineExceeded,
    NotFound,
    OutOfRange,
    RsmError,
    Unavailable,
)


class StorageError(RsmError):
    """A permanent storage failure (permissions, missing bucket, a path that cannot be
    created, a bad request): the call cannot succeed until an operator fixes storage."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class ObjectNotFound(NotFound):
    def __init__(self, key: str, detail: str = ""):
        super().__init__(f"object not found: {key}" + (f" ({detail})" if detail else ""))
        self.key = key


class InvalidRange(OutOfRange):
    def __init__(self, key: str, start: int, size: int | None = None):
        what = f" of a {size}-byte object" if size is not None else ""
        super().__init__(f"range start {start} is beyond the end{what}: {key}")
        self.key = key


class StorageUnavailable(Unavailable):
    """Transient: the storage service is unreachable, throttling or failing; retry later."""


class StorageTimeout(DeadlineExceeded):
    """A storage request did not finish within its timeout."""


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified: datetime.datetime  # timezone-aware, UTC


class ObjectWriter(abc.ABC):
    """A streaming upload. Use as a context manager: an exception aborts it."""

    @abc.abstractmethod
    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes. May block while earlier parts upload (bounded memory)."""

    @abc.abstractmethod
    def commit(self) -> int:
        """Publish the object atomically; returns its size in bytes."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Discard everything written; idempotent; never raises for 'nothing to abort'."""

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


class UploadHandle(ObjectWriter):
    """The writer callers hold, in front of a backend's upload object (which upload
    threads reference). Dropping an uncommitted handle finalizes it at once and aborts
    the upload, so an abandoned writer never leaves a multipart upload or session open.
    The upload object provides write/commit/abort/has_unfinished_upload and ``url``."""

    def __init__(self, upload):
        self._upload = upload

    def write(self, data) -> None:
        self._upload.write(data)

    def commit(self) -> int:
        return self._upload.commit()

    def abort(self) -> None:
        self._upload.abort()

    def __del__(self) -> None:
        upload = getattr(self, "_upload", None)
        try:
            if upload is not None and upload.has_unfinished_upload():
                logging.getLogger(__name__).warning(
                    "uncommitted writer for %s garbage-collected; aborting it", upload.url
                )
                upload.abort()
        except Exception:
            pass


class ObjectStore(abc.ABC):
    """A flat key space of immutable objects (see the module docstring)."""

    #: short backend name for logs and metrics: "local", "s3", "gcs"
    name: str = "abstract"

    def __init__(self) -> None:
        self._requests: collections.Counter[str] = collections.Counter()
        self._requests_lock = threading.Lock()

    # -- request accounting -------------------------------------------------
    def _count(self, op: str, n: int = 1) -> None:
        with self._requests_lock:
            self._requests[op] += n

    @property
    def requests(self) -> dict[str, int]:
        """A snapshot of how many storage requests of each kind were sent."""
        with self._requests_lock:
            return dict(self._requests)

    # -- the contract -------------------------------------------------------
    @abc.abstractmethod
    def open_writer(self, key: str) -> ObjectWriter: ...

    def put(self, key: str, data: bytes) -> None:
        """Write a small object in one go (manifests)."""
        with self.open_writer(key) as writer:
            writer.write(data)
            writer.commit()

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object. Only for small objects (manifests, indexes)."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end] inclusive (see the module docstring)."""

    @abc.abstractmethod
    def size(self, key: str) -> int: ...

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
            return True
        except ObjectNotFound:
            return False

    @abc.abstractmethod
    def delete(self, key: str) -> None: ...

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete every key; missing keys are fine. Raises ``StorageError`` naming the
        keys that could not be deleted (after trying all of them)."""
        failures: list[str] = []
        last: Exception | None = None
        for key in keys:
            try:
                self.delete(key)
            except RsmError as e:
                failures.append(f"{key}: {e}")
                last = e
        if failures:
            if last is not None and last.retriable:
                raise StorageUnavailable("could not delete " + "; ".join(failures))
            raise StorageError("could not delete " + "; ".join(failures))

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]: ...

    def check(self) -> None:
        """Verify at start-up that the store is usable (bucket exists, credentials
        work, directory writable). Raises ``ConfigError``/``StorageUnavailable`` with a
        message naming the bucket/path and the credential source."""

    def remove_leftovers(self) -> int:
        """Delete what writers that died left behind (temp files); returns how many. Run
        at start-up and periodically by the sidecar."""
        return 0

    def close(self) -> None:
        """Release connections and thread pools."""

    def describe(self) -> str:
        """Where the objects go, for logs (never credentials)."""
        return self.name
