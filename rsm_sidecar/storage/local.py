"""Local-directory object store: the embedded default.

Objects are files under ``root``; a key's ``/`` separators become directories.
Writes go to a temp file under ``root/.tmp`` and are published with ``rename`` (atomic
on one filesystem); with ``fsync`` on (the default) the file and its directory are
flushed first, so a committed object survives a power cut. Deleting the last object of
a directory prunes the empty directories up to the root.

Objects are created with ``file_mode`` (0600 by default, whatever the umask) and
directories with the matching execute bits, so unencrypted segments are not readable by
other users. A writer creates its temp file as ``<id>.new``, takes an exclusive ``flock`` on
it and renames it ``<id>.part``, so a ``.part`` file is locked from its first moment while its
writer lives: one nobody holds belongs to a writer that died (kill -9), and
``remove_leftovers`` (at start-up and with every journal sweep, of every sidecar sharing the
directory) deletes it. Other files there (a ``.new`` not yet locked, a start-up probe of another
sidecar) are deleted only when unlocked and older than ``UNLOCKED_GRACE_SECONDS``.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import logging
import os
import time
import uuid
from collections.abc import Iterator

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
#: a writer's temp file once it holds the lock on it (see the module's docstring)
PART_SUFFIX = ".part"
#: a writer's temp file before it holds the lock
NEW_SUFFIX = ".new"
#: how old an unlocked file under ``TMP_DIR`` other than a ``.part`` must be to be deleted: far
#: more than the moment between a writer's create and its lock, or a probe's create and unlink
UNLOCKED_GRACE_SECONDS = 60.0
log = logging.getLogger(__name__)


def directory_mode(file_mode: int) -> int:
    """Directories get an execute bit wherever files get a read bit."""
    return file_mode | ((file_mode & 0o444) >> 2)


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

    def __init__(self, root: str | os.PathLike[str], fsync: bool = True, file_mode: int = 0o600):
        super().__init__()
        self.root = os.path.abspath(os.fspath(root))
        self.fsync = fsync
        self.file_mode = file_mode
        self.dir_mode = directory_mode(file_mode)

    def _makedirs(self, path: str) -> None:
        os.makedirs(path, mode=self.dir_mode, exist_ok=True)

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
            self._makedirs(os.path.join(self.root, TMP_DIR))
            probe = os.path.join(self.root, TMP_DIR, f"probe-{uuid.uuid4().hex}")
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, self.file_mode)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise ConfigError(f"storage.local.root: directory {self.root} is not writable: {e}") from e
        self.remove_leftovers()

    def close(self) -> None:
        """Nothing to release: every file is closed when its call returns."""
        return None

    def remove_leftovers(self) -> int:
        """Delete temp files of writers that died; returns how many."""
        tmp = os.path.join(self.root, TMP_DIR)
        removed = 0
        try:
            names = os.listdir(tmp)
        except FileNotFoundError:
            return 0
        now = time.time()
        for name in names:
            path = os.path.join(tmp, name)
            if not name.endswith(PART_SUFFIX):
                try:
                    if now - os.stat(path).st_mtime < UNLOCKED_GRACE_SECONDS:
                        continue  # being created, or another sidecar's probe
                except OSError:
                    continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a live writer holds it
                continue
            else:
                try:
                    os.unlink(path)
                    removed += 1
                except OSError:
                    pass
            finally:
                os.close(fd)
        if removed:
            log.info("removed %d temp files of interrupted writes under %s", removed, tmp)
        return removed

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
                return self._received(f.read())
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
                return self._received(f.read(min(end, size - 1) - start + 1))
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
    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Streamed in key order, one directory at a time (memory: the entries of the largest
        directory, not the whole tree); a subdirectory whose keys cannot match ``prefix`` or
        all come before ``start_after`` is not read."""
        self._count("LIST")
        base_dir = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = os.path.join(self.root, *base_dir.split("/")) if base_dir else self.root
        if not os.path.isdir(start):
            return
        yield from self._list_dir(start, f"{base_dir}/" if base_dir else "", prefix, start_after)

    def _list_dir(self, path: str, rel: str, prefix: str, start_after: str | None) -> Iterator[ObjectInfo]:
        entries: list[tuple[str, os.DirEntry[str]]] = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    if not rel and e.name == TMP_DIR:
                        continue
                    # a directory sorts as its keys do: "<name>/..." ("a-b/x" before "a/x")
                    key = rel + (e.name + "/" if e.is_dir(follow_symlinks=False) else e.name)
                    if key.endswith("/"):
                        if not (key.startswith(prefix) or prefix.startswith(key)):
                            continue
                        if start_after is not None and key < start_after and not start_after.startswith(key):
                            continue  # every key below it sorts before start_after
                    elif not key.startswith(prefix) or (start_after is not None and key <= start_after):
                        continue
                    entries.append((key, e))
        except FileNotFoundError:  # removed while listing (an emptied directory is pruned)
            return
        entries.sort(key=lambda t: t[0])
        for key, e in entries:
            if key.endswith("/"):
                yield from self._list_dir(e.path, key, prefix, start_after)
                continue
            try:
                st = e.stat()
            except FileNotFoundError:
                continue
            yield ObjectInfo(key, st.st_size, datetime.datetime.fromtimestamp(st.st_mtime, datetime.UTC))


class _LocalWriter(ObjectWriter):
    def __init__(self, store: LocalObjectStore, key: str, path: str):
        self.store = store
        self.key = key
        self.path = path
        tmp_dir = os.path.join(store.root, TMP_DIR)
        base = os.path.join(tmp_dir, uuid.uuid4().hex)
        self.tmp_path = base + PART_SUFFIX
        try:
            store._makedirs(tmp_dir)
            fd = os.open(
                base + NEW_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, store.file_mode
            )
        except OSError as e:
            raise _translate(e, key) from e
        try:
            os.fchmod(fd, store.file_mode)  # the umask may have removed bits the configuration asks for
            fcntl.flock(fd, fcntl.LOCK_EX)  # held until the file is renamed or removed: see remove_leftovers
            os.rename(base + NEW_SUFFIX, self.tmp_path)  # a .part is locked from its first moment
        except OSError as e:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(base + NEW_SUFFIX)
            raise _translate(e, key) from e
        self._file = os.fdopen(fd, "wb")
        self._size = 0
        self._done = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
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
            parent = os.path.dirname(self.path)
            self.store._count("PUT")
            for attempt in range(3):
                self.store._makedirs(parent)
                try:
                    os.replace(self.tmp_path, self.path)  # still holding the flock: see remove_leftovers
                    break
                except FileNotFoundError:  # a concurrent delete pruned the directory
                    if attempt == 2:
                        raise
            self._file.close()
            self.store._fsync_dir(parent)
        except OSError as e:
            self.abort()
            raise _translate(e, self.key) from e
        self._done = True
        return self._size

    def abort(self) -> None:
        """Never raises: a temp file that cannot be removed now is left to ``remove_leftovers``."""
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
        except OSError as e:
            log.warning(
                "could not remove the temp file %s of an aborted write of %s: %s", self.tmp_path, self.key, e
            )
