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
import concurrent.futures
import dataclasses
import datetime
import functools
import io
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar, NoReturn, TypeVar

import grpc

from rsm_sidecar.config import Settings
from rsm_sidecar.errors import (
    ConfigError,
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
    #: the keys a ``delete_many`` could not delete
    failed_keys: Sequence[str] = ()


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

    #: the keys a ``delete_many`` could not delete
    failed_keys: Sequence[str] = ()


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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()


class ObjectStore(abc.ABC):
    """A flat key space of immutable objects (see the module docstring)."""

    #: short backend name for logs and metrics: "local", "s3", "gcs"
    name: str = "abstract"

    def __init__(self) -> None:
        self._requests: collections.Counter[str] = collections.Counter()
        self._bytes_read = 0
        self._requests_lock = threading.Lock()

    # -- request accounting -------------------------------------------------
    def _count(self, op: str, n: int = 1) -> None:
        with self._requests_lock:
            self._requests[op] += n

    def _received(self, body: bytes) -> bytes:
        """Count the bytes of a GET's answer (whole object or range) and return them."""
        with self._requests_lock:
            self._bytes_read += len(body)
        return body

    @property
    def bytes_read(self) -> int:
        """Bytes received from storage by ``get`` and ``get_range`` so far."""
        with self._requests_lock:
            return self._bytes_read

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
        last: RsmError | None = None
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
    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        """The objects whose keys start with ``prefix``, in key order (by code point, which is
        UTF-8 byte order); with ``start_after``, only those whose key is greater than it. S3
        (``StartAfter``) and GCS (``startOffset``) skip the earlier keys on the server, so a
        listing from ``start_after`` costs what it returns; Azure and the local directory
        filter what they read."""

    @abc.abstractmethod
    def check(self) -> None:
        """Verify at start-up that the store is usable (bucket exists, credentials
        work, directory writable). Raises ``ConfigError``/``StorageUnavailable`` with a
        message naming the bucket/path and the credential source."""

    def remove_leftovers(self) -> int:
        """Delete what writers that died left behind (temp files); returns how many. Run
        at start-up and periodically by the sidecar."""
        return 0

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections and thread pools."""

    def describe(self) -> str:
        """Where the objects go, for logs (never credentials)."""
        return self.name


class RemoteObjectStore(ObjectStore):
    """A store behind a network service (S3, GCS): uploads stream through
    :class:`StreamingUpload`, whose parts go out on one store-wide thread pool, and the bytes
    held by queued or uploading parts are counted (``buffered_bytes``, its peak in
    ``peak_buffered_bytes``) for metrics and the memory-bound tests."""

    #: URL scheme of object addresses in messages: "s3", "gs"
    scheme: str = "abstract"
    #: the backend's settings (``S3Settings``, ...): what the store is opened with
    settings_type: ClassVar[type[Settings]]

    def __init__(self, bucket: str, pool_threads: int, probe_prefix: str = "") -> None:
        super().__init__()
        self.bucket = bucket
        self.probe_prefix = probe_prefix
        self._pool_threads = pool_threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._buffered = 0
        self.peak_buffered_bytes = 0
        self._buffered_lock = threading.Lock()

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    @property
    @abc.abstractmethod
    def endpoint(self) -> str:
        """The service's base URL, for messages."""

    # -- thread pool and buffer accounting ------------------------------------------------
    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self._pool_threads, thread_name_prefix=f"{self.name}-upload"
                )
            return self._pool

    def _shutdown_pool(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _buffer_delta(self, n: int) -> None:
        with self._buffered_lock:
            self._buffered += n
            self.peak_buffered_bytes = max(self.peak_buffered_bytes, self._buffered)

    @property
    def buffered_bytes(self) -> int:
        """Bytes held by parts queued or uploading right now (all writers)."""
        with self._buffered_lock:
            return self._buffered

    # -- helpers of the operations ---------------------------------------------------------
    def _ranged_body(self, key: str, start: int, end: int, status: int, body: bytes) -> bytes:
        """The bytes of a ranged GET answered with ``status``: a 200 means the service ignored
        the Range header and sent the whole object."""
        if status == 200:
            if start >= len(body):
                raise InvalidRange(key, start, len(body))
            return body[start : end + 1]
        if len(body) > end - start + 1:
            raise StorageError(
                f"GET {self.url(key)}: asked for {end - start + 1} bytes (bytes={start}-{end}), got "
                f"{len(body)}"
            )
        return body

    def _delete_each(self, keys: Iterable[str], concurrency: int) -> None:
        """``delete_many`` for services without a batch delete: one ``delete`` per key, at most
        ``concurrency`` at once on the store's pool; every key is tried, then the failures are
        raised together (in the order of ``keys``) by :meth:`_raise_delete_failures`."""
        unique = list(dict.fromkeys(keys))
        failures: list[tuple[str, str, bool]] = []
        lock = threading.Lock()
        sem = threading.Semaphore(concurrency)

        def one(key: str) -> None:
            try:
                self.delete(key)
            except RsmError as e:
                with lock:
                    failures.append((key, str(e), e.retriable))
            finally:
                sem.release()

        futures = []
        pool = self._executor()
        for key in unique:
            sem.acquire()
            futures.append(pool.submit(one, key))
        concurrent.futures.wait(futures)
        order = {k: i for i, k in enumerate(unique)}
        failures.sort(key=lambda f: order[f[0]])
        self._raise_delete_failures(failures, len(unique))

    def _raise_delete_failures(self, failures: list[tuple[str, str, bool]], total: int) -> None:
        """Raise for the keys ``delete_many`` could not delete, given as (key, reason, transient):
        ``StorageUnavailable`` if every failure is transient, else ``StorageError``; the keys
        are in ``failed_keys``."""
        if not failures:
            return
        shown = "; ".join(f"{k} ({reason})" for k, reason, _ in failures[:20])
        more = f"; and {len(failures) - 20} more" if len(failures) > 20 else ""
        msg = (
            f"could not delete {len(failures)} of {total} objects from bucket {self.bucket} "
            f"at {self.endpoint}: {shown}{more}"
        )
        exc = StorageUnavailable(msg) if all(t for _, _, t in failures) else StorageError(msg)
        exc.failed_keys = [k for k, _, _ in failures]
        raise exc

    def _write_probe(self, hint: str) -> None:
        """Write and delete a 0-byte object under the key prefix (the start-up write check);
        a permanent failure is a ``ConfigError`` that ends with ``hint``."""
        probe = f"{self.probe_prefix}.rsm-probe/{uuid.uuid4().hex}"
        try:
            self.put(probe, b"")
            self.delete(probe)
        except RsmError as e:
            if e.retriable:
                raise
            raise ConfigError(
                f"storage.{self.name}: bucket {self.bucket!r} at {self.endpoint} is readable but writing or "
                f"deleting the probe object {probe!r} failed ({e}); {hint}"
            ) from e

    def open_writer(self, key: str) -> ObjectWriter:
        return UploadHandle(self._new_upload(key))

    @abc.abstractmethod
    def _new_upload(self, key: str) -> StreamingUpload: ...


_Ack = TypeVar("_Ack")  # what a backend keeps of a part's acknowledgement


class StreamingUpload(abc.ABC):
    """One streaming upload, the logic every remote backend shares; the backend provides the
    requests (``_put_whole``, ``_start``, ``_send_part``, ``_finish``, ``_cancel``).

    Bytes collect in one part buffer of ``part_size``. An object that fits in one part is
    sent whole at commit (``_put_whole``); a larger one starts an upload session
    (``_start``, e.g. a multipart upload) and each full part is sent by the store's thread
    pool (``_send_part``). At most ``window`` parts of one upload are queued or uploading;
    ``write()`` blocks while the window is full, so one upload holds at most
    ``part_size x (window + 1)`` bytes (a window of 1 sends the parts one after the other).
    ``commit()`` waits for every part, then hands the last, possibly short, part to
    ``_finish``, which publishes the object. Any failure, ``abort()``, an exception in the
    ``with`` block and a garbage-collected uncommitted writer (:class:`UploadHandle`) cancel
    the session (``_cancel``).
    """

    def __init__(
        self,
        store: RemoteObjectStore,
        key: str,
        *,
        part_size: int,
        window: int,
        max_parts: int | None = None,
        part_size_key: str = "",
        digest: Callable[[memoryview], None] | None = None,
    ) -> None:
        self._store = store
        self._key = key
        self.url = store.url(key)
        self._part_size = part_size
        self._max_parts = max_parts
        self._part_size_key = part_size_key
        self._digest = digest  # sees every byte written, in order
        self._buf = bytearray()
        self._size = 0  # bytes written
        self._sent = 0  # bytes handed to part uploads
        self._started = False
        self._futures: list[concurrent.futures.Future[None]] = []
        self._slots = threading.Semaphore(window)
        self._error: BaseException | None = None
        self._state = "open"  # open -> committed | aborted
        self._lock = threading.Lock()

    # -- what a backend provides -----------------------------------------------------------
    @abc.abstractmethod
    def _put_whole(self, body: bytearray) -> None:
        """Publish an object that fits in one part, in one request."""

    @abc.abstractmethod
    def _start(self) -> None:
        """Open the upload session (before the first part)."""

    @abc.abstractmethod
    def _send_part(self, number: int, offset: int, part: bytearray) -> None:
        """Send full part ``number`` (from 1) that starts at byte ``offset`` (pool thread)."""

    @abc.abstractmethod
    def _finish(self, number: int, offset: int, last: bytearray) -> None:
        """Every earlier part is acknowledged: send ``last`` (part ``number`` at ``offset``,
        ``self._size`` bytes in all) and publish the object."""

    @abc.abstractmethod
    def _cancel(self) -> None:
        """Cancel the started session (its parts are no longer in flight)."""

    @abc.abstractmethod
    def _translate(self, e: Exception) -> RsmError:
        """The contract's error for a failure of a request."""

    def _send_last(
        self, number: int, offset: int, last: bytearray, acked: Mapping[int, _Ack], what: str
    ) -> list[_Ack]:
        """For the ``_finish`` of a backend that publishes the parts it sent as one list (S3's
        parts, Azure's blocks): send ``last``, if it holds bytes, as part ``number``; return what
        each part's acknowledgement left in ``acked`` (by part number), in part order, which must
        be every part sent (``what``: the backend's word for its parts, for the error)."""
        if last:
            self._send_part(number, offset, last)
        else:
            number -= 1
        parts = [acked[n] for n in sorted(acked)]
        if len(parts) != number:
            raise StorageError(f"{self.url}: {number} {what} sent but only {len(parts)} acknowledged")
        return parts

    # -- the shared logic ------------------------------------------------------------------
    def _ensure_open(self, what: str) -> None:
        if self._state != "open":
            raise StorageError(
                f"{what} after {'commit' if self._state == 'committed' else 'abort'}: {self.url}"
            )

    def _fail(self, e: BaseException) -> BaseException:
        """Abort everything; the error to raise for ``e``."""
        err: BaseException = e
        if isinstance(e, Exception) and not isinstance(e, RsmError):
            err = self._translate(e)
        self.abort()
        return err

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _submit(self, part: bytearray) -> None:
        """Hand a full part to the pool; blocks while ``window`` parts are pending."""
        number = len(self._futures) + 1
        if self._max_parts is not None and number > self._max_parts:
            raise StorageError(
                f"{self.url}: more than {self._max_parts} parts of {self._part_size} bytes; "
                f"raise {self._part_size_key}"
            )
        if not self._started:
            self._start()
            self._started = True
        self._slots.acquire()
        if self._error is not None:
            self._slots.release()
            self._raise_if_failed()
        offset = self._sent
        self._sent += len(part)
        self._store._buffer_delta(len(part))

        # The pool thread holds the part only while it sends it. Its slot is released in the done
        # callback, which runs before the pool drops its work item (and with it ``run``): were the
        # part reachable from ``run``, a pool thread waiting for the GIL after the release would
        # keep it beside the window's parts and the one being filled.
        held = [part]
        nbytes = len(part)
        del part

        def run() -> None:
            body = held.pop()
            try:
                if self._state == "open":  # not aborted while queued
                    self._send_part(number, offset, body)
            finally:
                del body  # not kept by a traceback either

        future = self._store._executor().submit(run)
        future.add_done_callback(functools.partial(self._part_done, nbytes=nbytes))
        self._futures.append(future)

    def _submit_buffer(self) -> None:
        part, self._buf = self._buf, bytearray()
        self._submit(part)

    def _part_done(self, future: concurrent.futures.Future[None], nbytes: int) -> None:
        self._store._buffer_delta(-nbytes)
        if not future.cancelled() and future.exception() is not None and self._error is None:
            self._error = future.exception()
        self._slots.release()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._ensure_open("write")
        mv = memoryview(data).cast("B")
        nbytes = mv.nbytes
        try:
            self._raise_if_failed()
            while mv:
                if len(self._buf) >= self._part_size:
                    self._submit_buffer()  # no local keeps the part while the next one fills
                n = min(len(mv), self._part_size - len(self._buf))
                piece = mv[:n]
                self._buf += piece
                if self._digest is not None:
                    self._digest(piece)
                mv = mv[n:]
        except BaseException as e:
            self._fail_and_raise(e)
        self._size += nbytes

    def commit(self) -> int:
        self._ensure_open("commit")
        try:
            self._raise_if_failed()
            body, self._buf = self._buf, bytearray()
            if not self._started:
                self._put_whole(body)
            else:
                concurrent.futures.wait(self._futures)
                self._raise_if_failed()
                self._finish(len(self._futures) + 1, self._sent, body)
        except BaseException as e:
            self._fail_and_raise(e)
        self._state = "committed"
        return self._size

    def _fail_and_raise(self, e: BaseException) -> NoReturn:
        if self._state != "open":
            raise e
        err = self._fail(e)
        if err is e:
            raise e
        raise err from e

    def abort(self) -> None:
        with self._lock:
            if self._state != "open":
                return
            self._state = "aborted"
        self._buf = bytearray()
        for f in self._futures:
            f.cancel()
        # Parts already on the wire finish (or fail) first: a cancel racing a part upload
        # could leave that part's storage behind.
        concurrent.futures.wait(self._futures)
        if self._started:
            self._cancel()

    def has_unfinished_upload(self) -> bool:
        return self._state == "open"


class UploadHandle(ObjectWriter):
    """The writer callers hold, in front of a :class:`StreamingUpload` (which upload threads
    reference). Dropping an uncommitted handle finalizes it at once and aborts the upload,
    so an abandoned writer never leaves a multipart upload or session open."""

    def __init__(self, upload: StreamingUpload) -> None:
        self._upload = upload

    def write(self, data: bytes | bytearray | memoryview) -> None:
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


class BufferBody(io.RawIOBase):
    """A seekable, read-only file over a part buffer, for SDKs that stream a file body without
    copying it but copy other bytes-likes (or refuse them).

    botocore streams file bodies (checksum, payload hash, send, retry rewind) without
    copying them, whereas a ``bytearray`` body is copied into a ``BytesIO`` by the CRT
    signer botocore switches to when ``awscrt`` is installed: one more part per part in
    flight.
    """

    def __init__(self, buf: bytearray | bytes):
        super().__init__()
        self._mv = memoryview(buf).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), len(self._mv) - self._pos))
        b[:n] = self._mv[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = len(self._mv) - self._pos
        data = self._mv[self._pos : self._pos + size].tobytes()
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        origin = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._mv)}[whence]
        self._pos = max(0, origin + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._mv)
