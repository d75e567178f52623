"""Fetch hand-off: the bytes of a fetch window written to a file beside the Unix socket, for a
client on the same host to read, instead of sent over gRPC.

Python's gRPC moves about 250-400 MB/s through one stream on a 2-core machine, a few ms per MiB
on both ends, and that was most of what a remote read cost the broker (benchmarks/remote_read.py,
docs/operations.md "Remote reads"). A client that connected over the Unix socket sets
``accept_handoff``; the sidecar then writes the requested range (at most
``fetch.handoff_max_bytes``) into ``<socket path>.handoff/<random name>`` and answers with one
``HandoffFile{name, length}`` message. The client opens the file, deletes it and reads it.

Who can see the files: the directory is created 0700 and the files 0600, by the sidecar's user;
the socket itself is 0600, so whoever can read a hand-off file could fetch the same bytes over
the socket. A directory that is a symlink, owned by another user, or writable by group or others
(where someone else could swap a file between the write and the client's open) turns hand-off off
with one warning. A file lives from the write until the client opens it (milliseconds); files a
client never opened (it was cancelled, or died) are removed after ``STALE_SECONDS``, and every
file is removed at start-up. The files waiting in the directory are bounded: at most
``max_pending_files`` files and ``max_pending_bytes`` (``fetch.max_concurrent`` times
``fetch.handoff_max_bytes``, 256 MiB by default); beyond that a fetch streams over gRPC, so a
client that never deletes its files cannot fill the host's memory or disk.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path

from rsm_sidecar.private_dir import private_dir_problem

log = logging.getLogger(__name__)

#: A file no client opened for this long is deleted.
STALE_SECONDS = 60.0


class HandoffError(Exception):
    """Writing a hand-off file failed; the fetch streams its bytes over gRPC instead."""


def handoff_dir_for(listen: str) -> Path | None:
    """The hand-off directory of a ``unix://`` listen address; None for TCP."""
    if not listen.startswith("unix:"):
        return None
    path = listen[len("unix://") :] if listen.startswith("unix://") else listen[len("unix:") :]
    return Path(path + ".handoff")


class HandoffDir:
    """The sidecar's hand-off directory (one sidecar per socket: the socket's lock file)."""

    def __init__(self, path: Path, max_bytes: int, max_concurrent: int = 32):
        self.path = path
        self.max_bytes = max_bytes
        self.max_pending_bytes = max_concurrent * max_bytes
        self.max_pending_files = 2 * max_concurrent
        self._warned = False

    @classmethod
    def open(cls, listen: str, max_bytes: int, max_concurrent: int = 32) -> HandoffDir | None:
        """The prepared directory, or None when hand-off is off (TCP, ``max_bytes`` 0, or an
        unsafe or unusable directory: one warning says why)."""
        path = handoff_dir_for(listen)
        if path is None or max_bytes <= 0:
            return None
        try:
            problem = _prepare(path)
        except OSError as e:
            problem = f"cannot prepare it: {e.strerror or e}"
        if problem:
            log.warning("fetch hand-off is off: %s %s; fetches stream over gRPC", path, problem)
            return None
        return cls(path, max_bytes, max_concurrent)

    def accepts(self, length: int) -> bool:
        """Whether a fetch of ``length`` bytes may be handed off now: not empty, at most
        ``max_bytes``, and room among the files waiting for their clients (one directory scan,
        which also deletes files older than ``STALE_SECONDS``; normally a handful of entries)."""
        if not 0 < length <= self.max_bytes:
            return False
        files, pending = 0, 0
        stale_before = time.time() - STALE_SECONDS
        try:
            entries = list(os.scandir(self.path))
        except OSError:
            return True  # the write reports what is wrong and the fetch streams
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
                if st.st_mtime < stale_before:
                    os.unlink(e.path)
                    log.info(
                        "removed hand-off file %s that no client opened within %.0f s", e.name, STALE_SECONDS
                    )
                    continue
            except OSError:  # the client opened and deleted it meanwhile
                continue
            files += 1
            pending += st.st_size
        if files >= self.max_pending_files or pending + length > self.max_pending_bytes:
            self.warn_once(
                f"{files} files of {pending} bytes wait in {self.path} for their clients "
                f"(at most {self.max_pending_files} files, {self.max_pending_bytes} bytes)"
            )
            return False
        return True

    def write(self, pieces: Iterable[bytes | memoryview], length: int) -> str:
        """Writes ``pieces`` (``length`` bytes in all) to a new file; returns its name.

        :raises HandoffError: the write failed (a full tmpfs, ...) or the pieces were not
            ``length`` bytes; no file is left behind.
        """
        name = secrets.token_hex(16)
        target = self.path / name
        written = 0
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise HandoffError(f"cannot create {target}: {e.strerror or e}") from e
        try:
            try:
                for piece in pieces:
                    view = memoryview(piece)
                    while view:
                        n = os.write(fd, view)
                        written += n
                        view = view[n:]
            finally:
                os.close(fd)
            if written != length:
                raise HandoffError(f"{target}: the range gave {written} bytes, {length} expected")
        except OSError as e:
            _unlink(target)
            raise HandoffError(f"cannot write {target}: {e.strerror or e}") from e
        except BaseException:
            _unlink(target)
            raise
        return name

    def discard(self, name: str) -> None:
        """Deletes a file whose client will not open it (its call was cancelled)."""
        _unlink(self.path / name)

    def warn_once(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("fetch hand-off failed, streaming over gRPC instead (said once): %s", why)


def _prepare(path: Path) -> str | None:
    """Creates the directory 0700 (or checks the existing one) and empties it; a problem or None."""
    problem = private_dir_problem(path)
    if problem is None:
        _remove_files(path)
    return problem


def _remove_files(path: Path) -> None:
    """Deletes the regular files in ``path`` (what a killed sidecar left; start-up only)."""
    for e in os.scandir(path):
        if e.is_file(follow_symlinks=False):
            _unlink(Path(e.path))


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
