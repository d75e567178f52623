"""Local-directory object store: the embedded default.

Objects are files under ``root``; a key's ``/`` separators become directories.
Writes go to a temp file under ``root/.tmp`` and are published with ``rename`` (atomic
on one filesystem); with ``fsync`` on (the default) the file and its directory are
flushed first, so a committed object survives a power cut. Deleting the last object of
a directory prunes the empty directories up to the root.
"""

from __future__ import annotations

import datetime
import errno
import os
import time
import uuid
from typing import Iterator

from rsm_sidecar.errors import ConfigError, InvalidArgument
from rsm_sidecar.storage.base import (
    InvalidRange,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectWriter,
    StorageError,
    StorageUnavailable,
)

TMP_DIR = ".tmp"
STALE_TMP_SECONDS = 3600


def _translate(e: OSError, key: str) -> Exception:
    if isinstance(e, FileNotFoundError):
        return ObjectNotFound(key)
    if isinstance(e, PermissionError):
        return StorageError(f"permission denied for {key}: {e}")
    if e.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EAGAIN, errno.EMFILE, errno.ENFILE):
        return StorageUnavailable(f"local storage error for {key}: {e}")
    return StorageError(f"local storage error for {key}: {e}")


class LocalObjectStore(ObjectStore):
    name = "local"

    def __init__(self, root: str | os.PathLike, fsync: bool = True):
        super().__init__()
        self.root = os.path.abspath(os.fspath(root))
        self.fsync = fsync

    # -- paths ----------------------------------------------------------------
    def _path(self, key: str) -> str:
        if not key or key.startswith("/") or "\\" in key or "\x00" in key:
            raise InvalidArgument(f"invalid object key {key!r}")
        parts = key.split("/")
        if any(p in ("", ".", "..") for p in parts) or parts[0] == TMP_DIR:
            raise InvalidArgument(f"invalid object key {key!r}")
        return os.path.join(self.root, *parts)

    def describe(self) -> str:
        return f"local directory {self.root}"

    def check(self) -> None:
        try:
            os.makedirs(os.path.join(self.root, TMP_DIR), exist_ok=True)
            probe = os.path.join(self.root, TMP_DIR, f"probe-{uuid.uuid4().hex}")
            with open(probe, "wb") as f:
                f.write(b"ok")
            os.unlink(probe)
        except OSError as e:
            raise ConfigError(f"storage.local.root: directory {self.root} is not writable: {e}") from e
        self._remove_stale_temp_files()

    def _remove_stale_temp_files(self) -> None:
        tmp = os.path.join(self.root, TMP_DIR)
        now = time.time()
        for name in os.listdir(tmp):
            path = os.path.join(tmp, name)
            try:
                if now - os.stat(path).st_mtime > STALE_TMP_SECONDS:
                    os.unlink(path)
            except FileNotFoundError:
                pass

    # -- writes ---------------------------------------------------------------
    def open_writer(self, key: str) -> ObjectWriter:
        return _LocalWriter(self, key, self._path(key))

    def _fsync_dir(self, path: str) -> None:
        if not self.fsync:
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- reads ----------------------------------------------------------------
    def get(self, key: str) -> bytes:
        path = self._path(key)
        self._count("GET")
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise _translate(e, key) from e

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise InvalidArgument(f"invalid range [{start}, {end}] for {key}")
        path = self._path(key)
        self._count("GET")
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if start >= size:
                    raise InvalidRange(key, start, size)
                f.seek(start)
                return f.read(min(end, size - 1) - start + 1)
        except OSError as e:
            raise _translate(e, key) from e

    def size(self, key: str) -> int:
        self._count("HEAD")
        try:
            return os.stat(self._path(key)).st_size
        except OSError as e:
            raise _translate(e, key) from e

    # -- deletes --------------------------------------------------------------
    def delete(self, key: str) -> None:
        path = self._path(key)
        self._count("DELETE")
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise _translate(e, key) from e
        self._prune(os.path.dirname(path))

    def _prune(self, directory: str) -> None:
        while directory != self.root and directory.startswith(self.root + os.sep):
            try:
                os.rmdir(directory)
            except OSError:  # not empty (or raced with a writer): stop
                return
            directory = os.path.dirname(directory)

    # -- listing --------------------------------------------------------------
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._count("LIST")
        base_dir = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = os.path.join(self.root, *base_dir.split("/")) if base_dir else self.root
        if not os.path.isdir(start):
            return
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(start):
            rel_dir = os.path.relpath(dirpath, self.root)
            if rel_dir == ".":
                dirnames[:] = [d for d in dirnames if d != TMP_DIR]
                rel_dir = ""
            for name in filenames:
                key = f"{rel_dir}/{name}".lstrip("/").replace(os.sep, "/")
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                found.append(ObjectInfo(key, st.st_size,
                                        datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)))
        found.sort(key=lambda o: o.key)
        yield from found


class _LocalWriter(ObjectWriter):
    def __init__(self, store: LocalObjectStore, key: str, path: str):
        self.store = store
        self.key = key
        self.path = path
        tmp_dir = os.path.join(store.root, TMP_DIR)
        os.makedirs(tmp_dir, exist_ok=True)
        self.tmp_path = os.path.join(tmp_dir, f"{uuid.uuid4().hex}.part")
        try:
            self._file = open(self.tmp_path, "wb")
        except OSError as e:
            raise _translate(e, key) from e
        self._size = 0
        self._done = False

    def write(self, data) -> None:
        if self._done:
            raise StorageError(f"write after commit/abort: {self.key}")
        try:
            self._file.write(data)
        except OSError as e:
            self.abort()
            raise _translate(e, self.key) from e
        self._size += len(data)

    def commit(self) -> int:
        if self._done:
            raise StorageError(f"commit after commit/abort: {self.key}")
        try:
            self._file.flush()
            if self.store.fsync:
                os.fsync(self._file.fileno())
            self._file.close()
            parent = os.path.dirname(self.path)
            self.store._count("PUT")
            for attempt in range(3):
                os.makedirs(parent, exist_ok=True)
                try:
                    os.replace(self.tmp_path, self.path)
                    break
                except FileNotFoundError:  # a concurrent delete pruned the directory
                    if attempt == 2:
                        raise
            self.store._fsync_dir(parent)
        except OSError as e:
            self.abort()
            raise _translate(e, self.key) from e
        self._done = True
        return self._size

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._file.close()
        except OSError:
            pass
        try:
            os.unlink(self.tmp_path)
        except FileNotFoundError:
            pass
