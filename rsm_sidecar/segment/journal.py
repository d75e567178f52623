"""The copy journal: what an interrupted copy left in object storage.

A copy writes the keys it is about to create into ``<journal_dir>/<segment id>.json``
before its first byte goes to storage, and removes the entry once the segment is
complete or its objects are cleaned up. An entry that survives belongs to a copy that
was killed (sidecar crash, SIGKILL, power loss) or whose cleanup failed (storage down):
the broker will not delete those objects (Kafka 4.3+ does not clean up after a
retriable failure, and a crash leaves no failure to react to). The sidecar deletes them
at start-up and then every ``copy.journal_sweep_seconds``, skipping copies in flight.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from pathlib import Path

from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.storage.base import ObjectStore

log = logging.getLogger(__name__)


def delete_segment_objects(store: ObjectStore, base: str) -> None:
    """Delete one segment's objects, the manifest first so that a half-deleted segment
    is never readable. Idempotent."""
    store.delete(f"{base}.{fkeys.MANIFEST}")
    store.delete_many([f"{base}.{fkeys.INDEXES}", f"{base}.{fkeys.LOG}"])


class CopyJournal:
    def __init__(self, directory: str | os.PathLike, store: ObjectStore):
        self.dir = Path(directory)
        self.store = store
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, entry: str) -> Path:
        return self.dir / f"{entry}.json"

    def begin(self, base: str) -> str:
        """Record a copy about to write the segment whose keys start with ``base``;
        returns the entry to pass to ``end``. Durable before returning."""
        entry = uuid.uuid4().hex
        tmp = self.dir / f".{entry}.tmp"
        with open(tmp, "w") as f:
            json.dump({"base": base}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(entry))
        with self._lock:
            self._in_flight.add(entry)
        return entry

    def end(self, entry: str) -> None:
        """The copy is complete, or its objects are gone."""
        try:
            self._path(entry).unlink()
        except FileNotFoundError:
            pass
        with self._lock:
            self._in_flight.discard(entry)

    def release(self, entry: str) -> None:
        """The copy failed and could not clean up: leave the entry for the sweep."""
        with self._lock:
            self._in_flight.discard(entry)

    def pending(self) -> list[tuple[str, str]]:
        """(entry, base) of copies that are not in flight and left objects behind."""
        with self._lock:
            busy = set(self._in_flight)
        out = []
        for path in sorted(self.dir.glob("*.json")):
            entry = path.stem
            if entry in busy:
                continue
            try:
                out.append((entry, json.loads(path.read_text())["base"]))
            except (OSError, ValueError, KeyError) as e:
                log.warning("unreadable copy journal entry %s (%s); removing it", path, e)
                path.unlink(missing_ok=True)
        return out

    def sweep(self) -> int:
        """Delete what interrupted copies left; returns how many were cleaned."""
        cleaned = 0
        for entry, base in self.pending():
            try:
                delete_segment_objects(self.store, base)
            except Exception as e:  # noqa: BLE001 - storage down: try again at the next sweep
                log.warning("could not yet remove what an interrupted copy left at %s: %s", base, e)
                continue
            self.end(entry)
            cleaned += 1
            log.info("removed the objects an interrupted copy left at %s", base,
                     extra={"fields": {"op": "journal-sweep", "key": base}})
        return cleaned
