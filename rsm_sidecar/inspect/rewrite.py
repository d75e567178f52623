"""Replacing a stored segment's manifest in place (``inspect rekey``, ``inspect seal``) while
sidecars serve and delete the segment.

A manifest is replaced with one ``store.put``, which publishes atomically (rename on a local
directory, a single PUT on S3/GCS/Azure): readers see the old manifest or the new one.

Object stores give no compare-and-swap here, so a delete can race the rewrite. The sidecar
deletes a segment manifest first, then ``.indexes`` and ``.log`` (segment/objects.py), so:

1. just before the write, the manifest must still be the exact bytes the rewrite started from
   (otherwise it was deleted, or rewritten by someone else: left alone), and ``.log`` and
   ``.indexes`` must exist;
2. just after it, ``.log`` must still exist; if it is gone, a delete was under way and the
   manifest just written is removed again;
3. ``Rewriter.settle()`` checks every rewritten segment's ``.log`` once more, at least
   ``SETTLE_SECONDS`` after its write: a delete whose manifest removal fell between 1 and the
   write, and whose data removal came after 2, has finished by then, and the manifest is removed
   again.

What remains is a delete that removes the manifest in that window and then stalls for longer
than ``SETTLE_SECONDS`` (or a rewrite killed before ``settle``): a manifest without ``.log``,
which no broker refers to, reads as nothing, and ``inspect orphans`` lists as
``manifest-without-data``; a rerun of ``inspect seal`` removes those it wrote.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time

from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.storage.base import ObjectNotFound, ObjectStore

#: how long after a rewrite its segment's ``.log`` is checked once more (``Rewriter.settle``)
SETTLE_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class Skipped:
    """Why a manifest was not (or no longer is) replaced."""

    reason: str


class Rewriter:
    """Manifest replacements of one command run; thread-safe."""

    def __init__(self, store: ObjectStore, clock=time.monotonic, sleep=time.sleep):
        self.store = store
        self._clock = clock
        self._sleep = sleep
        #: (when, base, SHA-256 of the manifest written) of every replacement
        self._written: list[tuple[float, str, bytes]] = []
        self._lock = threading.Lock()

    def replace(self, base: str, old: bytes, new: bytes) -> Skipped | None:
        """Replace the manifest of ``base`` (whose bytes were ``old``) by ``new``; None when
        written."""
        manifest, log, indexes = (f"{base}.{s}" for s in (fkeys.MANIFEST, fkeys.LOG, fkeys.INDEXES))
        try:
            current = self.store.get(manifest)
        except ObjectNotFound:
            return Skipped(f"{manifest} is gone (the segment was deleted)")
        if current != old:
            return Skipped(f"{manifest} changed since it was read (rewritten by another process); left as is")
        if not self.store.exists(log) or not self.store.exists(indexes):
            return Skipped(f"{log} or {indexes} is gone (the segment is being deleted)")
        self.store.put(manifest, new)
        if not self.store.exists(log):
            self.store.delete(manifest)
            return Skipped(f"{log} was deleted during the rewrite; the manifest was removed again")
        with self._lock:
            self._written.append((self._clock(), base, hashlib.sha256(new).digest()))
        return None

    def settle(self) -> list[str]:
        """The last check of every rewritten segment (see the module's docstring); returns the
        bases whose manifest was removed again because their ``.log`` had been deleted."""
        with self._lock:
            written, self._written = self._written, []
        removed = []
        for at, base, digest in written:
            wait = at + SETTLE_SECONDS - self._clock()
            if wait > 0:
                self._sleep(wait)
            if self.store.exists(f"{base}.{fkeys.LOG}"):
                continue
            manifest = f"{base}.{fkeys.MANIFEST}"
            try:  # only the manifest this run wrote (not one of a new copy of the segment)
                if hashlib.sha256(self.store.get(manifest)).digest() != digest:
                    continue
            except ObjectNotFound:
                continue
            self.store.delete(manifest)
            removed.append(base)
        return removed
