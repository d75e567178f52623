"""`inspect verify`: read every byte of stored segments and check them against each
other and against the manifest.

Per segment, in order (a failed step is a problem; later steps that depend on it are
skipped, the others still run):

1. the manifest parses and its SHA-256 verifies (``SegmentManifest.from_bytes``);
2. the ``.log`` and ``.indexes`` objects exist with the sizes the manifest implies;
3. the data key unwraps under its key id (the key id is in the keyring);
4. each index decrypts/verifies (GCM tag or CRC32C) and parses: offset index, time
   index, producer snapshot (version, CRC, entries at or below the end offset),
   leader-epoch checkpoint, transaction index;
5. every chunk of the ``.log`` is downloaded and verified (GCM tag or CRC32C, zstd
   frame, decoded size), every batch parses and its CRC32C matches; control batches'
   records are parsed (``--deep``: every record of every batch);
6. offsets: the first batch starts at the manifest's ``startOffset``, batches increase,
   the last batch ends at ``endOffset``; the largest batch timestamp is the manifest's
   ``maxTimestampMs``;
7. offset index: every entry points at a batch start whose base offset is at or below
   the entry's offset; time index: every entry's offset lies in a batch whose max
   timestamp is the entry's timestamp and no earlier batch has a later one;
8. each batch's partition leader epoch is the checkpoint's epoch at its base offset;
9. the transaction index lists exactly the ABORT markers of the segment (producer id and
   marker offset).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from rsm_sidecar.errors import RsmError
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.manifest import SegmentManifest
from rsm_sidecar.inspect import manifests, runner
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.output import human_bytes
from rsm_sidecar.inspect.runner import Tally
from rsm_sidecar.kafka import (
    BatchHeader,
    OffsetPosition,
    TimestampOffset,
    parse_leader_epoch_checkpoint,
    read_batches,
    read_offset_index,
    read_producer_snapshot,
    read_time_index,
    read_txn_index,
)
from rsm_sidecar.kafka.checkpoint import EpochEntry, epoch_for_offset
from rsm_sidecar.kafka.reader import RecordBatch
from rsm_sidecar.segment.listing import StoredSegment
from rsm_sidecar.segment.log_file import StoredLogFile
from rsm_sidecar.segment.reader import OpenSegment, SegmentReader

MAX_PROBLEMS_PER_CHECK = 10  # per kind, then "... and N more"
E = TypeVar("E", OffsetPosition, TimestampOffset)
#: index entries that lie before a batch and point at no batch: (test, problem) by check
PASSED_ENTRIES: dict[str, tuple[Callable[[Any, BatchHeader], bool], Callable[[Any], str]]] = {
    "offset index": (
        lambda e, h: e.position < h.position,
        lambda e: f"offset index entry {e.offset} @ {e.position} does not point at a batch start",
    ),
    "time index": (
        lambda e, h: e.offset < h.base_offset,
        lambda e: f"time index entry {e.timestamp} -> {e.offset}: no batch holds offset {e.offset}",
    ),
}


@dataclasses.dataclass
class SegmentReport:
    base: str
    segment: str  # topic-partition@start (uuid)
    start_offset: int | None = None
    end_offset: int | None = None
    key_id: str | None = None
    chunks: int = 0
    original_bytes: int = 0
    batches: int = 0
    control_records: int = 0  # transaction markers and other control records
    records: int | None = None  # data records, counted with --deep only
    aborted_txns: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    _counts: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def action(self) -> str:
        return "ok" if self.ok else "failed"

    def problem(self, kind: str, message: str) -> None:
        n = self._counts[kind] = self._counts.get(kind, 0) + 1
        if n <= MAX_PROBLEMS_PER_CHECK:
            self.problems.append(message)

    def finish(self) -> None:
        for kind, n in self._counts.items():
            if n > MAX_PROBLEMS_PER_CHECK:
                self.problems.append(f"... and {n - MAX_PROBLEMS_PER_CHECK} more {kind} problems")
        self._counts.clear()

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in dataclasses.asdict(self).items() if not k.startswith("_")}
        d["status"] = self.action
        return d

    def print_text(self) -> None:
        if self.ok:
            print(
                f"OK      {self.segment}  offsets {self.start_offset}..{self.end_offset}, "
                f"{self.chunks} chunks, {self.batches} batches, {human_bytes(self.original_bytes)}"
                + (f", {self.aborted_txns} aborted transactions" if self.aborted_txns else ""),
                flush=True,
            )
        else:
            print(f"FAILED  {self.segment}  {self.base}", flush=True)
            for p in self.problems:
                print(f"  - {p}", flush=True)
        for n in self.notes:
            print(f"  note: {n}", flush=True)


@dataclasses.dataclass
class _Indexes:
    offset: list[OffsetPosition] | None = None
    time: list[TimestampOffset] | None = None
    epochs: list[EpochEntry] | None = None
    txns: list | None = None
    failed: set[str] = dataclasses.field(default_factory=set)  # indexes that did not verify or parse


class SegmentVerifier:
    def __init__(
        self,
        ctx: InspectContext,
        seg: StoredSegment,
        deep: bool = False,
        on_bytes: Callable[[int], None] = lambda n: None,
        reader: SegmentReader | None = None,
    ):
        """``reader``: the segment reader to read with (default: the context's)."""
        self.ctx = ctx
        self.reader = reader if reader is not None else ctx.reader
        self.seg = seg
        self.deep = deep
        self.on_bytes = on_bytes
        self.report = SegmentReport(seg.base, seg.describe)

    def run(self) -> SegmentReport:
        try:
            self._run()
        except Exception as e:  # corrupt bytes reaching a code path without a precise error
            self.report.problem("unexpected", f"unexpected {type(e).__name__} while verifying: {e}")
        finally:
            self.report.finish()
        return self.report

    def _run(self) -> None:
        r = self.report
        try:
            _, manifest = manifests.read_manifest(self.ctx.store, self.seg.base)
        except RsmError as e:
            r.problem("manifest", str(e))
            return
        r.key_id = manifest.key_id
        r.chunks = manifest.chunk_index.chunk_count
        r.original_bytes = manifest.original_size
        md = manifest.segment or {}
        r.start_offset = md.get("startOffset") if isinstance(md.get("startOffset"), int) else None
        r.end_offset = md.get("endOffset") if isinstance(md.get("endOffset"), int) else None
        if r.start_offset is None or r.end_offset is None:
            r.notes.append(
                "the manifest has no start/end offsets (no remoteLogSegmentMetadata): offsets not checked"
            )
        elif r.start_offset != self.seg.start_offset:
            r.problem(
                "manifest",
                f"manifest startOffset {r.start_offset} differs from the key's {self.seg.start_offset}",
            )
        if not self._check_objects(manifest):
            return
        try:
            opened = self.reader.open_base(self.seg.base, self.seg.describe)
        except RsmError as e:
            r.problem("key", str(e))
            return
        indexes = self._read_indexes(opened)
        self._walk(opened, manifest, indexes)

    # -- 2. objects ----------------------------------------------------------------
    def _check_objects(self, manifest: SegmentManifest) -> bool:
        r = self.report
        log_size = self.seg.object_size(fkeys.LOG)
        expected_log = manifest.chunk_index.transformed_file_size
        usable = True
        if log_size is None:
            r.problem("objects", f"data object {self.seg.object_key(fkeys.LOG)} is missing")
            usable = False
        elif log_size != expected_log:
            r.problem(
                "objects",
                f"{self.seg.object_key(fkeys.LOG)} is {log_size} bytes, the chunk index says {expected_log}",
            )
        expected_idx = max(
            (x.position + x.size for x in manifest.indexes.values() if x is not None), default=0
        )
        idx_size = self.seg.object_size(fkeys.INDEXES)
        if idx_size is None:
            r.problem("objects", f"indexes object {self.seg.object_key(fkeys.INDEXES)} is missing")
        elif idx_size != expected_idx:
            r.problem(
                "objects",
                f"{self.seg.object_key(fkeys.INDEXES)} is {idx_size} bytes, the manifest's index "
                f"ranges end at {expected_idx}",
            )
        return usable

    # -- 4. indexes ------------------------------------------------------------------
    def _read_indexes(self, opened: OpenSegment) -> _Indexes:
        r = self.report
        base = self.seg.start_offset
        out = _Indexes()
        where = self.seg.object_key(fkeys.INDEXES)

        def load(name: str, parse):
            if opened.manifest.indexes.get(name) is None:
                return None
            try:
                data = self.reader.read_index(opened, name)
                self.on_bytes(len(data))
                return parse(data, f"{where} ({name} index)")
            except RsmError as e:
                r.problem("index", f"{name} index: {e}")
                out.failed.add(name)
                return None

        out.offset = load("offset", lambda d, n: read_offset_index(d, base, name=n))
        out.time = load("timestamp", lambda d, n: read_time_index(d, base, name=n))
        out.epochs = load("leaderEpoch", lambda d, n: parse_leader_epoch_checkpoint(d, name=n))
        out.txns = load("transaction", lambda d, n: read_txn_index(d, name=n))
        snapshot = load("producerSnapshot", lambda d, n: read_producer_snapshot(d, name=n) if d else None)
        if snapshot is not None and r.end_offset is not None:
            for e in snapshot.entries:
                if e.last_offset > r.end_offset:
                    r.problem(
                        "index",
                        f"producer snapshot: producer {e.producer_id} has last offset "
                        f"{e.last_offset} beyond the segment's end offset {r.end_offset}",
                    )
        return out

    # -- 5-9. data -------------------------------------------------------------------
    def _walk(self, opened: OpenSegment, manifest: SegmentManifest, ix: _Indexes) -> None:
        r = self.report
        offsets = ix.offset or []
        times = ix.time or []
        oi = ti = 0
        previous = None
        running_max = -1
        aborts: set[tuple[int, int]] = set()
        complete = False
        try:
            with StoredLogFile(self.reader, opened, self.on_bytes) as f:
                for batch in read_batches(f, name=f.name):
                    h = batch.header
                    r.batches += 1
                    if previous is None:
                        if r.start_offset is not None and h.base_offset != r.start_offset:
                            r.problem(
                                "offsets",
                                f"the first batch starts at offset {h.base_offset}, the manifest's "
                                f"startOffset is {r.start_offset}",
                            )
                    elif h.base_offset <= previous.last_offset:
                        r.problem(
                            "offsets",
                            f"{h.describe()} does not follow the previous batch, which ends at "
                            f"offset {previous.last_offset}",
                        )
                    running_max = max(running_max, h.max_timestamp)
                    oi = self._offset_index_at(batch, offsets, oi)
                    ti = self._time_index_at(batch, times, ti, running_max)
                    self._epoch_of(batch, ix.epochs)
                    self._records_of(batch, aborts)
                    previous = h
            complete = True
        except RsmError as e:
            r.problem("data", str(e))
        if not complete:
            return
        if previous is None:
            if manifest.original_size:
                r.problem("data", "the .log holds no batch")
            else:
                r.notes.append("empty segment")
            return
        if r.end_offset is not None and previous.last_offset != r.end_offset:
            r.problem(
                "offsets",
                f"the last batch ends at offset {previous.last_offset}, the manifest's endOffset is "
                f"{r.end_offset}",
            )
        max_ts = (manifest.segment or {}).get("maxTimestampMs")
        if isinstance(max_ts, int) and max_ts != running_max:
            r.problem(
                "offsets",
                f"the largest batch timestamp is {running_max}, the manifest's maxTimestampMs is {max_ts}",
            )
        for o in offsets[oi:]:
            if o.position < previous.position + previous.size_in_bytes:
                r.problem(
                    "offset index",
                    f"offset index entry {o.offset} @ {o.position} does not point at a batch start",
                )
            else:
                r.problem(
                    "offset index",
                    f"offset index entry {o.offset} @ {o.position} points beyond the data "
                    f"({previous.position + previous.size_in_bytes} bytes)",
                )
        for t in times[ti:]:
            r.problem(
                "time index",
                f"time index entry {t.timestamp} -> {t.offset} points beyond the last offset "
                f"{previous.last_offset}",
            )
        if (ix.txns is not None or aborts) and "transaction" not in ix.failed:
            self._txn_index(ix.txns or [], aborts)

    def _passed_entries(self, check: str, entries: list[E], i: int, h: BatchHeader) -> int:
        """Report the ``check`` index entries from ``i`` on that lie before batch ``h`` and
        point at no batch; returns the index of the first one that does not."""
        passed, problem = PASSED_ENTRIES[check]
        while i < len(entries) and passed(entries[i], h):
            self.report.problem(check, problem(entries[i]))
            i += 1
        return i

    def _offset_index_at(self, batch: RecordBatch, entries: list[OffsetPosition], i: int) -> int:
        h = batch.header
        i = self._passed_entries("offset index", entries, i, h)
        if i < len(entries) and entries[i].position == h.position:
            e = entries[i]
            if e.offset < h.base_offset:
                self.report.problem(
                    "offset index",
                    f"offset index entry {e.offset} @ {e.position} points at "
                    f"{h.describe()}, which starts after that offset",
                )
            i += 1
        return i

    def _time_index_at(
        self, batch: RecordBatch, entries: list[TimestampOffset], i: int, running_max: int
    ) -> int:
        h = batch.header
        i = self._passed_entries("time index", entries, i, h)
        while i < len(entries) and entries[i].offset <= h.last_offset:
            e = entries[i]
            if h.max_timestamp != e.timestamp or running_max != e.timestamp:
                self.report.problem(
                    "time index",
                    f"time index entry {e.timestamp} -> {e.offset} disagrees with "
                    f"{h.describe()}: its max timestamp is {h.max_timestamp}, the "
                    f"largest so far {running_max}",
                )
            i += 1
        return i

    def _epoch_of(self, batch: RecordBatch, epochs: list[EpochEntry] | None) -> None:
        h = batch.header
        if not epochs or h.partition_leader_epoch < 0:
            return
        expected = epoch_for_offset(epochs, h.base_offset)
        if expected is not None and expected != h.partition_leader_epoch:
            self.report.problem(
                "leader epoch",
                f"{h.describe()} has leader epoch {h.partition_leader_epoch}, the "
                f"leader-epoch checkpoint says {expected} from offset "
                f"{max(e.start_offset for e in epochs if e.epoch == expected)}",
            )

    def _records_of(self, batch: RecordBatch, aborts: set[tuple[int, int]]) -> None:
        h = batch.header
        if h.is_control:
            for c in batch.control_records():
                self.report.control_records += 1
                if c.is_abort:
                    aborts.add((h.producer_id, c.offset))
        elif self.deep:
            self.report.records = (self.report.records or 0) + sum(1 for _ in batch.records())

    def _txn_index(self, txns: list, aborts: set[tuple[int, int]]) -> None:
        listed = {(t.producer_id, t.last_offset) for t in txns}
        self.report.aborted_txns = len(aborts)
        for pid, offset in sorted(aborts - listed, key=lambda x: x[1]):
            self.report.problem(
                "transaction index",
                f"ABORT marker of producer {pid} at offset {offset} is not in the transaction index",
            )
        for pid, offset in sorted(listed - aborts, key=lambda x: x[1]):
            self.report.problem(
                "transaction index",
                f"transaction index entry of producer {pid} ending at offset "
                f"{offset} has no ABORT marker in the segment",
            )


class VerifySummary(Tally):
    ACTIONS = {"ok": "ok", "failed": "failed"}
    PROBLEMS = ("failed",)

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0  # of original data read

    def count(self, outcome: SegmentReport) -> None:  # type: ignore[override]
        super().count(outcome)
        self.bytes += outcome.original_bytes

    def text(self) -> str:
        return (
            f"{self.segments} segments verified: {self['ok']} ok, {self['failed']} with problems "
            f"({human_bytes(self.bytes)} of original data read)"
        )

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "bytes": self.bytes}


def sample_segments(
    segs: Iterable[StoredSegment], n: int, rng: random.Random | None = None
) -> list[StoredSegment]:
    """``n`` segments chosen uniformly at random from ``segs`` (all of them if fewer), in
    listing order. Reservoir sampling over the streamed listing: memory is ``n`` segments,
    whatever the bucket holds."""
    rng = rng or random.Random()
    chosen: list[StoredSegment] = []
    for i, seg in enumerate(segs):
        if i < n:
            chosen.append(seg)
        else:
            j = rng.randrange(i + 1)
            if j < n:
                chosen[j] = seg
    chosen.sort(key=lambda s: s.sort_key)
    return chosen


def run(
    ctx: InspectContext,
    segs: list[StoredSegment],
    on_report: Callable[[SegmentReport], None],
    deep: bool = False,
    progress=None,
) -> VerifySummary:
    """Verify each segment in turn (one at a time: memory is one ranged GET); call
    ``on_report`` as each finishes."""
    _ = ctx.reader  # loads the keyring: a configuration error stops here, not once per segment
    on_bytes = progress.add_bytes if progress else lambda n: None

    def one(seg: StoredSegment) -> SegmentReport:
        return SegmentVerifier(ctx, seg, deep, on_bytes).run()

    return runner.run(segs, one, VerifySummary(), on_report, progress=progress)
