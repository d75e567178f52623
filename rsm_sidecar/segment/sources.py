"""Where a copied segment's bytes come from.

A source gives the copier the ``.log`` size, the ``.log`` bytes in pieces, and then the
index files by manifest name (``transaction`` may be None):

* ``PathSource``: the broker's own files, read by path (a shared filesystem). Only
  regular files under ``copy.allowed_dirs`` are opened, checked after opening through the
  descriptor (no symlink, ``..`` or FIFO trick gets around it), and the ``.log`` must not
  change while it is read.
* ``StreamSource``: the bytes arrive in messages, in the contract's file order, each
  file exactly its declared size.
* ``BytesSource``: bytes in memory (tests, tools, benchmarks).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from typing import Protocol

from rsm_sidecar.errors import ConfigError, FailedPrecondition, InvalidArgument
from rsm_sidecar.format import keys as fkeys

#: file names of the contract (proto FileKind), in the order stream mode sends them
LOG = "log"
INDEX_FILES = ("offset", "timestamp", "producerSnapshot", "transaction")
FILE_ORDER = (LOG,) + INDEX_FILES


#: a piece of a file: bytes, or a view into bytes the source holds
Piece = bytes | memoryview


class SegmentSource(Protocol):
    log_size: int

    def log_pieces(self, size: int) -> Iterator[Piece]:
        """The ``.log`` file in pieces of about ``size`` bytes; raises if the source breaks."""

    def index_files(self) -> dict[str, bytes | None]:
        """Called once the ``.log`` is consumed: the index files by manifest name."""


class BytesSource:
    def __init__(self, log: bytes, indexes: dict[str, bytes | None]):
        self.log = log
        self.log_size = len(log)
        self.indexes = indexes

    def log_pieces(self, size: int) -> Iterator[Piece]:
        view = memoryview(self.log)
        for i in range(0, len(view), size):
            yield view[i : i + size]

    def index_files(self) -> dict[str, bytes | None]:
        return dict(self.indexes)


# -- path mode -------------------------------------------------------------------------
def allowed_dirs(dirs: list[str]) -> list[str]:
    """Validate ``copy.allowed_dirs`` (absolute, existing directories other than ``/``);
    returns their real paths."""
    out = []
    for d in dirs:
        if not d or not os.path.isabs(d):
            raise ConfigError(
                f"copy.allowed_dirs: {d!r} is not an absolute directory path (list the broker's log.dirs)"
            )
        real = os.path.realpath(d)
        if not os.path.isdir(real):
            raise ConfigError(f"copy.allowed_dirs: {d} does not exist or is not a directory")
        if real == "/":
            raise ConfigError(
                f"copy.allowed_dirs: {d} is the root directory; list the broker's log.dirs instead"
            )
        out.append(real)
    return out


def _under(real: str, allowed: list[str]) -> bool:
    return any(real == d or real.startswith(d.rstrip("/") + "/") for d in allowed)


def open_allowed(path: str, allowed: list[str], what: str, describe: str) -> tuple[int, os.stat_result]:
    """Open ``path`` read-only if it is a regular file under one of ``allowed`` (real
    paths). The check runs on the opened descriptor too, so a symlink swapped in between
    is caught; FIFOs and devices are refused without blocking."""
    if not allowed:
        raise FailedPrecondition(
            "path transfer mode is disabled on this sidecar: copy.allowed_dirs is empty; set it "
            "to the broker's log.dirs (or use the shim's stream transfer mode)"
        )
    if not path:
        raise InvalidArgument(f"copy of {describe}: the {what} path is empty")
    if "\x00" in path or not os.path.isabs(path):
        raise InvalidArgument(
            f"copy of {describe}: the {what} path {fkeys.echo(path)} is not an absolute path"
        )
    if not _under(os.path.realpath(path), allowed):
        raise InvalidArgument(
            f"copy of {describe}: the {what} path {fkeys.echo(path)} is outside copy.allowed_dirs"
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise FailedPrecondition(
            f"copy of {describe}: cannot open the {what} file {fkeys.echo(path)}: {e.strerror}"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(
                f"copy of {describe}: the {what} path {fkeys.echo(path)} is not a regular file"
            )
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            real = os.path.realpath(path)
        if not _under(real, allowed):
            raise InvalidArgument(
                f"copy of {describe}: the {what} path {fkeys.echo(path)} is outside copy.allowed_dirs"
            )
        return fd, st
    except BaseException:
        os.close(fd)
        raise


class PathSource:
    """Path mode: the sidecar reads the broker's files and checks they did not change."""

    def __init__(self, paths: dict[str, str | None], describe: str, allowed: list[str], max_index_bytes: int):
        """``paths``: file name (``FILE_ORDER``) -> path; ``transaction`` may be None."""
        self.paths = paths
        self.describe = describe
        self.allowed = allowed
        self.max_index_bytes = max_index_bytes
        self.log_path = paths[LOG] or ""
        fd, self._stat = open_allowed(self.log_path, allowed, ".log", describe)
        self._fd: int | None = fd
        self.log_size = self._stat.st_size

    def log_pieces(self, size: int) -> Iterator[Piece]:
        fd = self._fd
        if fd is None:
            raise FailedPrecondition(f"copy of {self.describe}: {self.log_path} was already read")
        try:
            total = 0
            while True:
                try:
                    piece = os.read(fd, size)
                except OSError as e:
                    raise FailedPrecondition(
                        f"copy of {self.describe}: cannot read {self.paths[LOG]}: {e.strerror}"
                    ) from None
                if not piece:
                    break
                total += len(piece)
                if total > self.log_size:
                    raise FailedPrecondition(
                        f"copy of {self.describe}: {self.paths[LOG]} grew during the copy "
                        f"({self.log_size} bytes at start)"
                    )
                yield piece
            self._verify_unchanged(total)
        finally:
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _verify_unchanged(self, total: int) -> None:
        path = self.log_path
        try:
            now = os.stat(path)
        except FileNotFoundError:
            raise FailedPrecondition(f"copy of {self.describe}: {path} disappeared during the copy") from None
        before = self._stat
        if (now.st_ino, now.st_dev) != (before.st_ino, before.st_dev):
            raise FailedPrecondition(f"copy of {self.describe}: {path} was replaced during the copy")
        if now.st_size != before.st_size or now.st_mtime_ns != before.st_mtime_ns or total != before.st_size:
            raise FailedPrecondition(
                f"copy of {self.describe}: {path} changed during the copy "
                f"({before.st_size} bytes at start, {now.st_size} now, {total} read)"
            )

    def index_files(self) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for name in INDEX_FILES:
            path = self.paths.get(name)
            if path is None and name == "transaction":
                out[name] = None
                continue
            out[name] = self._read(path or "", name)
        return out

    def _read(self, path: str, name: str) -> bytes:
        fd, st = open_allowed(path, self.allowed, f"{name} index", self.describe)
        try:
            if st.st_size > self.max_index_bytes:
                raise FailedPrecondition(
                    f"copy of {self.describe}: the {name} index {fkeys.echo(path)} has "
                    f"{st.st_size} bytes, more than copy.max_index_file_bytes "
                    f"({self.max_index_bytes})"
                )
            data = bytearray()
            while len(data) <= st.st_size:
                piece = os.read(fd, st.st_size + 1 - len(data))
                if not piece:
                    break
                data += piece
            if len(data) != st.st_size:
                raise FailedPrecondition(
                    f"copy of {self.describe}: the {name} index {fkeys.echo(path)} changed "
                    f"while it was read ({st.st_size} bytes expected, {len(data)} read)"
                )
            return bytes(data)
        except OSError as e:
            raise FailedPrecondition(
                f"copy of {self.describe}: cannot read the {name} index {fkeys.echo(path)}: {e.strerror}"
            ) from None
        finally:
            os.close(fd)


# -- stream mode -----------------------------------------------------------------------
class StreamEnded(FailedPrecondition):
    """The client's stream ended before every declared byte arrived: a client that went away
    (the service tells which) or one that sent less than it declared."""


class StreamSource:
    """Stream mode: ``messages`` yields ``(file name, bytes)`` in ``FILE_ORDER``; each
    file is exactly its declared size (``sizes``: name -> size, ``transaction`` None when
    the segment has no transaction index)."""

    def __init__(
        self,
        sizes: dict[str, int | None],
        messages: Iterable[tuple[str, bytes]],
        describe: str,
        max_message_bytes: int,
        max_index_bytes: int,
    ):
        self.messages = iter(messages)
        self.describe = describe
        self.max_message_bytes = max_message_bytes
        self.sizes = sizes
        for name, size in sizes.items():
            if size is None and name != "transaction":
                raise InvalidArgument(f"copy of {describe}: no size declared for the {name} file")
            if size is not None and size < 0:
                raise InvalidArgument(f"copy of {describe}: negative size declared for the {name} file")
            if size is not None and name != LOG and size > max_index_bytes:
                raise FailedPrecondition(
                    f"copy of {describe}: the {name} index has {size} bytes, more than "
                    f"copy.max_index_file_bytes ({max_index_bytes})"
                )
        log_size = sizes.get(LOG)
        if log_size is None:
            raise InvalidArgument(f"copy of {describe}: no size declared for the {LOG} file")
        self.log_size = log_size
        self.received = {k: 0 for k in sizes}
        self._position = 0  # index into FILE_ORDER

    def _next(self) -> tuple[str, bytes] | None:
        item = next(self.messages, None)
        if item is None:
            return None
        name, data = item
        if len(data) > self.max_message_bytes:
            raise InvalidArgument(
                f"copy of {self.describe}: a message of {len(data)} bytes exceeds "
                f"{self.max_message_bytes} bytes"
            )
        if name not in self.sizes:
            raise InvalidArgument(f"copy of {self.describe}: unknown file kind {fkeys.echo(name)}")
        order = FILE_ORDER.index(name)
        if order < self._position:
            raise InvalidArgument(
                f"copy of {self.describe}: {name} data after {FILE_ORDER[self._position]} data "
                f"(files must be sent in the contract's order)"
            )
        declared = self.sizes[name]
        if declared is None:
            raise InvalidArgument(
                f"copy of {self.describe}: transaction index data but no transaction index was declared"
            )
        self._position = order
        self.received[name] += len(data)
        if self.received[name] > declared:
            raise InvalidArgument(f"copy of {self.describe}: more {name} bytes than the declared {declared}")
        return name, data

    def log_pieces(self, size: int) -> Iterator[Piece]:
        while self.received[LOG] < self.log_size:
            item = self._next()
            if item is None:
                raise StreamEnded(
                    f"copy of {self.describe}: the stream ended after {self.received[LOG]} of "
                    f"{self.log_size} bytes of the .log file"
                )
            name, data = item
            if name != LOG:
                raise FailedPrecondition(
                    f"copy of {self.describe}: {name} data before the .log file was complete "
                    f"({self.received[LOG]} of {self.log_size} bytes)"
                )
            yield data

    def index_files(self) -> dict[str, bytes | None]:
        bufs = {name: bytearray() for name in INDEX_FILES}
        while True:
            item = self._next()
            if item is None:
                break
            name, data = item
            if name == LOG:
                raise InvalidArgument(f"copy of {self.describe}: more .log bytes than declared")
            bufs[name] += data
        out: dict[str, bytes | None] = {}
        for name in INDEX_FILES:
            declared = self.sizes[name]
            if declared is None:
                out[name] = None
                continue
            if len(bufs[name]) != declared:
                raise StreamEnded(
                    f"copy of {self.describe}: the stream ended with {len(bufs[name])} of "
                    f"{declared} bytes of the {name} index"
                )
            out[name] = bytes(bufs[name])
        return out
