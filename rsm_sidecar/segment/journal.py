"""The copy journal: what an interrupted copy left in object storage.

A copy records its segment's key and its attempt token in
``<journal_dir>/<entry>.json`` before its first byte goes to storage, and removes the
entry once the segment is complete or its objects are cleaned up. An entry that survives
belongs to a copy that was killed (sidecar crash, SIGKILL, power loss) or whose cleanup
failed (storage down): the broker will not delete those objects (Kafka 4.3+ does not clean
up after a retriable failure, and a crash leaves no failure to react to). The sidecar
removes them right after start-up (beside serving, so that a large journal does not delay it)
and then every ``copy.journal_sweep_seconds``.

A sweep deletes only what the entry's own attempt wrote: it skips segments with an
operation in flight (``SegmentLocks``), deletes everything when the manifest is the
entry's own (a copy killed after its manifest, before it answered), only the data objects
when there is no manifest, and nothing when the manifest belongs to another attempt (a
later copy of the same segment id completed: it is acknowledged and stays).

One sidecar per journal: the directory is locked (``flock`` on ``.lock``) while the
sidecar runs, and a second one refuses to start. Leftover ``.tmp`` files of interrupted
journal writes are removed when the lock is taken. Entries are created mode 0600.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import threading
import uuid
from pathlib import Path

from rsm_sidecar.errors import ConfigError, DataLoss, InvalidArgument
from rsm_sidecar.segment.locks import SegmentLocks
from rsm_sidecar.segment.objects import (
    NO_MANIFEST,
    delete_data_objects,
    delete_segment_objects,
    manifest_attempt,
)
from rsm_sidecar.storage.base import ObjectStore

log = logging.getLogger(__name__)
LOCK_FILE = ".lock"


def lock_exclusively(path: Path, what: str) -> int:
    """Take an exclusive ``flock`` on ``path`` (created 0600) for the life of the process;
    returns the open descriptor. A lock held elsewhere is a ``ConfigError`` naming the
    holder's pid."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise ConfigError(f"{what}: cannot create the lock file {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ConfigError(
                f"{what}: {path} is locked by another rsm-sidecar process (pid {holder}); "
                f"each sidecar needs its own"
            ) from None
        raise ConfigError(f"{what}: cannot lock {path}: {e.strerror}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class CopyJournal:
    def __init__(
        self, directory: str | os.PathLike[str], store: ObjectStore, locks: SegmentLocks | None = None
    ):
        self.dir = Path(directory)
        self.store = store
        self.locks = locks or SegmentLocks()
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not self.dir.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a directory")
        except OSError as e:
            raise ConfigError(
                f"copy.journal_dir: cannot use {directory} as the copy journal: {e.strerror or e}"
            ) from None
        self._lock_fd: int | None = lock_exclusively(self.dir / LOCK_FILE, "copy.journal_dir")
        for tmp in self.dir.glob(".*.tmp"):  # interrupted writes of this directory's (dead) owner
            tmp.unlink(missing_ok=True)

    def close(self) -> None:
        """Release the directory lock (the process exiting does too)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _path(self, entry: str) -> Path:
        return self.dir / f"{entry}.json"

    def begin(self, base: str, attempt: str) -> str:
        """Record copy attempt ``attempt`` about to write the segment whose keys start
        with ``base``; returns the entry to pass to ``end``. Durable before returning."""
        entry = uuid.uuid4().hex
        tmp = self.dir / f".{entry}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"base": base, "attempt": attempt}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(entry))
        with self._lock:
            self._in_flight.add(entry)
        return entry

    def end(self, entry: str) -> None:
        """The copy is complete, or its objects are gone."""
        self._path(entry).unlink(missing_ok=True)
        with self._lock:
            self._in_flight.discard(entry)

    def release(self, entry: str) -> None:
        """The copy failed and could not clean up: leave the entry for the sweep."""
        with self._lock:
            self._in_flight.discard(entry)

    def settle_completed(self, base: str) -> None:
        """A copy found ``base`` complete and acknowledged it: entries of earlier attempts
        of that segment have nothing left to remove (their caller holds ``base``)."""
        for entry, entry_base, _ in self.pending():
            if entry_base == base:
                self.end(entry)

    def pending(self) -> list[tuple[str, str, str | None]]:
        """(entry, base, attempt) of copies that are not in flight and left objects behind;
        attempt is None in entries written before attempts were recorded."""
        with self._lock:
            busy = set(self._in_flight)
        out = []
        for path in sorted(self.dir.glob("*.json")):
            entry = path.stem
            if entry in busy:
                continue
            try:
                doc = json.loads(path.read_text())
                base, attempt = doc["base"], doc.get("attempt")
                if not isinstance(base, str) or not (attempt is None or isinstance(attempt, str)):
                    raise ValueError("base/attempt are not strings")
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("unreadable copy journal entry %s (%s); removing it", path, e)
                path.unlink(missing_ok=True)
                continue
            out.append((entry, base, attempt))
        return out

    def leftovers(self) -> int:
        """How many entries are not in flight (for the metric: names are counted, not read)."""
        with self._lock:
            busy = len(self._in_flight)
        try:
            with os.scandir(self.dir) as it:
                entries = sum(1 for e in it if e.name.endswith(".json") and not e.name.startswith("."))
        except OSError:
            return 0
        return max(0, entries - busy)

    def sweep(self) -> int:
        """Delete what interrupted copies left; returns how many entries were settled.

        Safe while copies run: an entry is settled only while its segment is held
        (``SegmentLocks``), and only if it is still there and not in flight once held: a copy
        that began after :meth:`pending` took its snapshot ends its entry before it releases
        the segment, so a sweep that listed the entry then finds it gone and leaves the
        segment (the copy acknowledged it)."""
        settled = 0
        for entry, base, attempt in self.pending():
            with self.locks.try_hold(base) as held:
                if not held:  # a copy or delete of this segment is running: it decides
                    continue
                with self._lock:
                    in_flight = entry in self._in_flight
                if in_flight or not self._path(entry).exists():
                    continue
                try:
                    action = self._settle(base, attempt)
                except InvalidArgument as e:  # the key cannot exist in this store, so nothing was written
                    log.warning("dropping copy journal entry for %s: %s", base, e)
                    action = "none"
                except DataLoss as e:
                    log.warning(
                        "not removing what an interrupted copy left at %s: its manifest is unreadable (%s); "
                        "check it with `rsm-sidecar inspect verify`",
                        base,
                        e,
                    )
                    action = "none"
                except Exception as e:  # storage down: try again at the next sweep
                    log.warning("could not yet remove what an interrupted copy left at %s: %s", base, e)
                    continue
            self.end(entry)
            settled += 1
            log.info(
                "copy journal: %s (%s)",
                base,
                action,
                extra={"fields": {"op": "journal-sweep", "key": base, "action": action}},
            )
        return settled

    def _settle(self, base: str, attempt: str | None) -> str:
        found = manifest_attempt(self.store, base)
        if found == NO_MANIFEST:
            delete_data_objects(self.store, base)
            return "removed the data objects of an incomplete copy"
        if attempt is not None and found == attempt:
            delete_segment_objects(self.store, base)
            return "removed a copy that completed in storage but was never acknowledged"
        return "kept: the segment was completed by another copy attempt"
