"""The copy journal's sweep beside copies (the sidecar's first sweep runs beside serving, not
before it: a journal of thousands of entries must not delay start-up).

The interleaving is forced rather than waited for: a sweep that listed an entry just before a
copy began it (``CopyJournal.pending`` snapshots the in-flight entries, then lists the files) and
reaches it after the copy finished and acknowledged the segment. Before the fix the sweep found
the copy's own manifest and deleted the segment as "completed but never acknowledged"."""

from __future__ import annotations

import concurrent.futures

from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.journal import CopyJournal
from rsm_sidecar.segment.settings import CopySettings
from rsm_sidecar.segment.sources import BytesSource
from rsm_sidecar.storage.local import LocalObjectStore

INDEXES = {"offset": b"\x00" * 8, "timestamp": b"\x01" * 12, "producerSnapshot": b"snap", "transaction": None}
MD = SegmentMetadata("MWJ6FHTfRYy67jzwZdeqSQ", "t", 0, "JournalJournalJournal0", 0, 99, segment_size=1000)


def test_a_sweep_that_listed_an_entry_before_its_copy_ended_leaves_the_copied_segment(tmp_path):
    store = LocalObjectStore(tmp_path / "remote", fsync=False)
    journal = CopyJournal(tmp_path / "journal", store)
    began = []
    begin = journal.begin

    def recording_begin(base, attempt):
        entry = begin(base, attempt)
        began.append((entry, base, attempt))
        return entry

    journal.begin = recording_begin  # type: ignore[method-assign]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        copier = SegmentCopier(store, KeyLayout("tiered/"), None, CopySettings(), pool, journal)
        copier.copy(MD, BytesSource(b"x" * 1000, dict(INDEXES)), b"0\n1\n0 0\n")
    (listed,) = began
    base = listed[1]
    assert store.exists(f"{base}.rsm-manifest")
    journal.pending = lambda: [listed]  # type: ignore[method-assign]  # what the racing listing saw
    assert journal.sweep() == 0
    assert all(store.exists(f"{base}.{s}") for s in ("log", "indexes", "rsm-manifest"))
    journal.close()


def test_the_leftover_count_counts_entries_not_in_flight(tmp_path):
    store = LocalObjectStore(tmp_path / "remote", fsync=False)
    journal = CopyJournal(tmp_path / "journal", store)
    entries = [journal.begin(f"tiered/t-x/0/{i:020d}-y", "a") for i in range(3)]
    assert journal.leftovers() == 0
    journal.release(entries[0])
    journal.end(entries[1])
    assert journal.leftovers() == 1
    journal.close()
