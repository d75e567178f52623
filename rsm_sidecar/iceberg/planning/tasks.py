"""The unit of work the driver hands to an executor: :class:`SegmentTask`, one segment or one
piece of a split segment, with the offsets it emits, the aborted transactions it filters and
the ``ingest_timestamp`` state it starts from (JSON on the wire to the Spark workers).
"""

from __future__ import annotations

import dataclasses
import json

from rsm_sidecar.kafka import AbortedTxn


@dataclasses.dataclass(frozen=True)
class SegmentTask:
    """One executor task: emit offsets ``[lo, hi]`` of one segment (JSON on the wire)."""

    index: int
    partition: int
    base: str
    segment_id: str
    start_offset: int
    end_offset: int
    lo: int
    hi: int
    ingest_state: int
    aborted: tuple[tuple[int, int, int, int], ...] = ()  # (pid, first, last, lso)
    describe: str = ""
    ingest_bound: int = -1  # no record of the segment was ingested later (ms; -1: no bound)
    #: a task that ends where the next task of the same segment starts: the running maximum the
    #: driver gave that task, which this task must reach at ``hi`` (None: not split there)
    end_state: int | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SegmentTask:
        d = json.loads(text)
        d["aborted"] = tuple(tuple(a) for a in d["aborted"])
        return cls(**d)

    def aborted_txns(self) -> list[AbortedTxn]:
        return [AbortedTxn(*a) for a in self.aborted]
