"""The disk chunk cache: stored chunks (exactly the bytes downloaded: still compressed and
encrypted) kept in files under ``fetch.disk_cache.path``, bounded by
``fetch.disk_cache.bytes``, surviving restarts.

Nothing decrypted ever lands on disk. The reader verifies a chunk read from here exactly
like a downloaded one (GCM tag and position, or CRC32C); a file of the wrong size or that
fails verification is deleted and the chunk downloaded again. A chunk the reader cannot
verify (a plaintext segment without CRCs, written by Aiven's plugin) is never cached.

Layout: ``<path>/<segment dir>/<entry>.chunk``, where the segment directory is a hash of
the segment's base key (so deleting a segment removes one directory) and the entry name a
hash of everything that identifies the stored chunk (the reader's key: copy attempt or
manifest digest, position, sizes, GCM tag or CRC), so that a re-copy of a segment id never
finds the bytes of an earlier copy. Files are 0600, directories 0700, whatever the umask.

A write goes to ``<path>/.tmp`` and is renamed into place (atomic), without fsync: a file
torn by a crash has the wrong size or fails verification, and is then deleted. Two
sidecars may share a directory: each renames whole files and verifies what it reads, so
neither can serve the other's torn or stale bytes; each bounds the bytes it knows of (the
directory may then hold up to the sum of their capacities).

Eviction is least-recently-used by total bytes: a hit sets the file's mtime, and start-up
rebuilds the order from the files' mtimes (one directory entry and one ``stat`` per file;
at most ``capacity / chunk size`` files). An I/O error other than a missing file (disk
full, read-only, permissions) turns the cache off with one WARNING; fetches go on from
object storage.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable

from rsm_sidecar.segment.cache import ByteBounded
from rsm_sidecar.transform.chunks import Buffer

log = logging.getLogger(__name__)

TMP_DIR = ".tmp"
FILE_MODE = 0o600
DIR_MODE = 0o700
SUFFIX = ".chunk"
#: temp files older than this at start-up belong to a writer that died
STALE_TMP_SECONDS = 600.0
_SEGMENT_DIR = re.compile(r"^[0-9a-f]{32}$")
_ENTRY = re.compile(r"^[0-9a-f]{40}\.chunk$")


def _write_all(fd: int, data: Buffer) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def segment_dir(base: str) -> str:
    """The directory name of a segment (by its base object key)."""
    return hashlib.sha256(base.encode()).hexdigest()[:32]


class DiskChunkCache(ByteBounded):
    """Thread-safe. ``on_event(name)`` receives ``hit``, ``miss``, ``eviction`` and
    ``verification_failure`` for metrics. Entries are named by ``entry(base, identity)``."""

    def __init__(self, path: str, capacity: int, on_event: Callable[[str], None] = lambda e: None):
        self.root = os.path.abspath(path)
        self.capacity = capacity
        self._on_event = on_event
        self._lock = threading.Lock()
        self._last_ns = 0
        #: relative path -> size, least recently used first
        self._items: collections.OrderedDict[str, int] = collections.OrderedDict()
        #: segment directory -> its entries in ``_items`` (a segment is discarded without a scan)
        self._by_segment: dict[str, set[str]] = {}
        self._size = 0
        self.enabled = True
        try:
            self._prepare()
            self._scan()
        except OSError as e:
            self._disable("cannot use the directory", e)

    # -- start-up ---------------------------------------------------------------
    def _makedir(self, path: str) -> None:
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            return
        os.chmod(path, DIR_MODE)  # the umask may have removed bits; never wider than 0700

    def _prepare(self) -> None:
        parent = os.path.dirname(self.root)
        if not os.path.isdir(parent):
            os.makedirs(parent, exist_ok=True)
        self._makedir(self.root)
        self._makedir(os.path.join(self.root, TMP_DIR))
        probe = os.path.join(self.root, TMP_DIR, f"probe-{uuid.uuid4().hex}")
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        os.close(fd)
        os.unlink(probe)

    def _scan(self) -> None:
        """Rebuild the index from the files (oldest mtime first), remove temp files of
        writers that died and empty segment directories, and evict down to the capacity."""
        t0 = time.monotonic()
        now = time.time()
        with os.scandir(os.path.join(self.root, TMP_DIR)) as tmp:
            for e in tmp:
                try:
                    if now - e.stat().st_mtime > STALE_TMP_SECONDS:
                        os.unlink(e.path)
                except FileNotFoundError:
                    pass
        found: list[tuple[float, str, int]] = []
        with os.scandir(self.root) as top:
            dirs = [d for d in top if _SEGMENT_DIR.match(d.name) and d.is_dir(follow_symlinks=False)]
        for d in dirs:
            empty = True
            with os.scandir(d.path) as entries:
                for e in entries:
                    empty = False
                    if not _ENTRY.match(e.name):
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    found.append((st.st_mtime_ns, f"{d.name}/{e.name}", st.st_size))
            if empty:
                self._rmdir(d.path)
        found.sort()
        with self._lock:
            for _, rel, size in found:
                self._add_locked(rel, size)
            evicted = self._evict_locked()
        self._unlink(evicted)
        log.info(
            "disk chunk cache %s: %d entries, %d bytes (capacity %d) found in %.3f s",
            self.root,
            len(self._items),
            self._size,
            self.capacity,
            time.monotonic() - t0,
        )

    # -- entries ----------------------------------------------------------------
    @staticmethod
    def entry(base: str, identity: str) -> str:
        """The entry of a stored chunk: ``identity`` must change whenever its bytes may."""
        name = hashlib.sha256(f"{base}\0{identity}".encode()).hexdigest()[:40]
        return f"{segment_dir(base)}/{name}{SUFFIX}"

    def _path(self, entry: str) -> str:
        return os.path.join(self.root, *entry.split("/"))

    def contains(self, entry: str) -> bool:
        """Whether the entry is probably there (known to this process, or a file another
        process wrote); ``get`` decides."""
        if not self.enabled:
            return False
        with self._lock:
            if entry in self._items:
                return True
        return os.path.exists(self._path(entry))

    def get(self, entry: str, size: int) -> bytes | None:
        """The stored bytes of ``entry`` if its file holds exactly ``size`` bytes; a file
        of another size (torn, truncated) is deleted and counted as a verification
        failure. None on a miss. The caller verifies the bytes and reports ``verified()``
        (a hit) or ``invalid()``."""
        if not self.enabled:
            return None
        path = self._path(entry)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._forget(entry)
            self._on_event("miss")
            return None
        except OSError as e:
            self._disable("cannot read", e)
            return None
        try:
            found = os.fstat(fd).st_size
            data = os.read(fd, size + 1) if found == size else b""
            while found == size and len(data) < size:  # os.read may return less
                more = os.read(fd, size + 1 - len(data))
                if not more:
                    break
                data += more
            if found == size and len(data) == size:
                os.utime(fd, ns=self._stamp())  # most recently used, also for the next start-up
        except OSError as e:
            self._disable("cannot read", e)
            return None
        finally:
            os.close(fd)
        if len(data) != size:
            self.invalid(entry, f"{len(data) if found == size else found} bytes instead of {size}")
            return None
        with self._lock:
            if entry in self._items:
                self._items.move_to_end(entry)
                evicted: list[str] = []
            else:  # written by another process sharing the directory
                self._add_locked(entry, size)
                evicted = self._evict_locked()
        self._unlink(evicted)
        return data

    def verified(self) -> None:
        """The bytes ``get`` returned passed verification: a hit."""
        self._on_event("hit")

    def missed(self) -> None:
        """A chunk the caller did not look up (known to be absent) is read from storage."""
        if self.enabled:
            self._on_event("miss")

    def _stamp(self) -> tuple[int, int]:
        """(atime, mtime) in ns for a file just used: strictly increasing within this process,
        so the start-up scan sees the use order even when uses fall in one clock tick."""
        with self._lock:
            self._last_ns = max(time.time_ns(), self._last_ns + 1)
            return self._last_ns, self._last_ns

    def put(self, entry: str, data: Buffer) -> None:
        """Store ``data`` as ``entry`` (atomically: temp file, then rename)."""
        size = len(data)
        if not self.enabled or size > self.capacity:
            return
        tmp = os.path.join(self.root, TMP_DIR, f"{uuid.uuid4().hex}.part")
        path = self._path(entry)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
            try:
                os.fchmod(fd, FILE_MODE)
                _write_all(fd, data)
                os.utime(fd, ns=self._stamp())
            finally:
                os.close(fd)
            for attempt in (1, 2):
                self._makedir(os.path.dirname(path))
                try:
                    os.rename(tmp, path)
                    break
                except FileNotFoundError:  # the segment directory was pruned meanwhile
                    if attempt == 2:
                        raise
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self._disable("cannot write", e)
            return
        with self._lock:
            self._remove_locked(entry)
            self._add_locked(entry, size)
            evicted = self._evict_locked()
        self._unlink(evicted)

    def invalid(self, entry: str, why: str) -> None:
        """``entry`` failed verification: delete it (it is downloaded again)."""
        log.warning(
            "disk chunk cache: entry %s is damaged (%s); deleted, reading the chunk from storage", entry, why
        )
        self._on_event("verification_failure")
        self._forget(entry)
        try:
            os.unlink(self._path(entry))
        except FileNotFoundError:
            pass
        except OSError as e:
            self._disable("cannot delete a damaged entry", e)

    def discard_segment(self, base: str) -> None:
        """Remove every entry of the segment ``base`` (deleted or rewritten)."""
        if not self.enabled:
            return
        with self._lock:
            for k in list(self._by_segment.get(segment_dir(base), ())):
                self._remove_locked(k)
        try:
            shutil.rmtree(os.path.join(self.root, segment_dir(base)))
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTEMPTY):  # gone, or a chunk written meanwhile
                self._disable("cannot delete the entries of a segment", e)

    # -- bookkeeping ------------------------------------------------------------
    def _add_locked(self, entry: str, size: int) -> None:
        self._items[entry] = size
        self._size += size
        self._by_segment.setdefault(entry.partition("/")[0], set()).add(entry)

    def _remove_locked(self, entry: str) -> None:
        size = self._items.pop(entry, None)
        if size is None:
            return
        self._size -= size
        seg = entry.partition("/")[0]
        members = self._by_segment.get(seg)
        if members is not None:
            members.discard(entry)
            if not members:
                del self._by_segment[seg]

    def _forget(self, entry: str) -> None:
        with self._lock:
            self._remove_locked(entry)

    def _evict_locked(self) -> list[str]:
        evicted = []
        while self._size > self.capacity and self._items:
            rel = next(iter(self._items))
            self._remove_locked(rel)
            evicted.append(rel)
        return evicted

    def _unlink(self, evicted: list[str]) -> None:
        for rel in evicted:
            path = self._path(rel)
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                self._disable("cannot evict", e)
                return
            self._on_event("eviction")
            self._rmdir(os.path.dirname(path))

    @staticmethod
    def _rmdir(path: str) -> None:
        try:
            os.rmdir(path)
        except OSError:  # not empty, or gone
            pass

    def _disable(self, what: str, e: OSError) -> None:
        with self._lock:
            if not self.enabled:
                return
            self.enabled = False
        hint = " (disk full)" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        log.warning(
            "disk chunk cache %s turned off: %s: %s%s; fetches read from object storage",
            self.root,
            what,
            e,
            hint,
        )
