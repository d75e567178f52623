"""read_committed filtering with interleaved transactions, across segments.

The expected results come from a simple model (a record is visible iff it is not
transactional or its transaction committed), independent of the filter's algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from rsm_sidecar.kafka import (
    AbortedTxn,
    ReadCommittedFilter,
    collect_aborted_txns,
    committed_batches,
    committed_records,
    read_batches,
)
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch, build_control_batch
from rsm_sidecar.kafka.control import ControlType


@dataclass
class Log:
    """A partition log built batch by batch, with the broker's bookkeeping of aborted txns."""

    batches: list[bytes] = field(default_factory=list)
    next_offset: int = 0
    open_txns: dict[int, int] = field(default_factory=dict)  # pid -> first offset
    txn_offsets: dict[int, list[int]] = field(default_factory=dict)
    aborted: list[AbortedTxn] = field(default_factory=list)
    visible: list[int] = field(default_factory=list)
    epochs: dict[int, int] = field(default_factory=dict)

    def _append(self, records: int, **kw) -> list[int]:
        base = self.next_offset
        recs = [SimpleRecord(b"k%d" % (base + i), b"v", 1000 + base + i) for i in range(records)]
        self.batches.append(build_batch(recs, base_offset=base, **kw))
        self.next_offset += records
        return list(range(base, base + records))

    def plain(self, records: int = 1, pid: int | None = None) -> None:
        # non-transactional: plain or idempotent (a producer id but no transactional flag)
        kw = {} if pid is None else dict(producer_id=pid, producer_epoch=0, base_sequence=0)
        self.visible += self._append(records, **kw)

    def data(self, pid: int, records: int = 1) -> None:
        self.open_txns.setdefault(pid, self.next_offset)
        self.txn_offsets.setdefault(pid, []).extend(
            self._append(
                records,
                transactional=True,
                producer_id=pid,
                producer_epoch=self.epochs.get(pid, 0),
                base_sequence=0,
            )
        )

    def end(self, pid: int, commit: bool) -> None:
        if pid not in self.open_txns:
            return
        first = self.open_txns.pop(pid)
        marker = self.next_offset
        self.batches.append(
            build_control_batch(
                ControlType.COMMIT if commit else ControlType.ABORT,
                base_offset=marker,
                producer_id=pid,
                producer_epoch=self.epochs.get(pid, 0),
            )
        )
        self.next_offset += 1
        offsets = self.txn_offsets.pop(pid)
        if commit:
            self.visible += offsets
        else:
            # ProducerStateManager.lastStableOffset: the first offset of the earliest other
            # ongoing transaction, else just after this marker.
            lso = min(self.open_txns.values(), default=marker + 1)
            self.aborted.append(AbortedTxn(pid, first, marker, lso))

    def data_bytes(self) -> bytes:
        return b"".join(self.batches)


def visible_offsets(batches, aborted) -> list[int]:
    return [r.offset for r in committed_records(batches, aborted)]


def test_interleaved_transactions_of_two_producers():
    log = Log()
    log.plain(2)  # 0, 1
    log.data(10, 2)  # 2, 3   txn A (pid 10)
    log.data(20, 1)  # 4      txn B (pid 20)
    log.plain(1)  # 5
    log.data(10, 1)  # 6
    log.end(20, commit=False)  # 7  ABORT B
    log.data(20, 2)  # 8, 9   txn B2 (pid 20 again)
    log.end(10, commit=True)  # 10 COMMIT A
    log.plain(1, pid=30)  # 11 idempotent, not transactional
    log.data(10, 1)  # 12     txn A2
    log.end(20, commit=True)  # 13 COMMIT B2
    log.end(10, commit=False)  # 14 ABORT A2
    assert log.aborted == [AbortedTxn(20, 4, 7, 2), AbortedTxn(10, 12, 14, 15)]
    batches = list(read_batches(log.data_bytes()))
    assert visible_offsets(batches, log.aborted) == [0, 1, 2, 3, 5, 6, 8, 9, 11]
    assert visible_offsets(batches, log.aborted) == sorted(log.visible)
    # The order of the aborted list does not matter (the filter sorts by first offset).
    assert visible_offsets(batches, reversed(log.aborted)) == sorted(log.visible)
    # Control batches are never returned.
    assert all(not b.header.is_control for b in committed_batches(batches, log.aborted))


def test_same_producer_commit_then_abort_then_commit():
    log = Log()
    for commit in (True, False, True, False, True):
        log.data(5, 2)
        log.end(5, commit)
    batches = list(read_batches(log.data_bytes()))
    assert visible_offsets(batches, log.aborted) == [0, 1, 6, 7, 12, 13]


def test_abort_marker_in_the_next_segment():
    """Data in segment 1, ABORT marker (and txnindex entry) in segment 2: segment 1 alone is
    filtered correctly only with segment 2's index, which collect_aborted_txns provides."""
    log = Log()
    log.plain(1)  # 0
    log.data(7, 2)  # 1, 2
    log.plain(1)  # 3
    split = len(log.batches)
    log.end(7, commit=False)  # 4 (segment 2)
    log.plain(1)  # 5
    seg1, seg2 = log.batches[:split], log.batches[split:]
    idx1 = [t for t in log.aborted if t.last_offset < 4]
    idx2 = [t for t in log.aborted if t.last_offset >= 4]
    assert idx1 == [] and len(idx2) == 1
    seg1_batches = list(read_batches(b"".join(seg1)))
    # Wrong on purpose: with only its own (empty) index, segment 1 looks all committed, and the
    # filter says a transaction is still open.
    f = ReadCommittedFilter(idx1)
    assert [b.header.base_offset for b in seg1_batches if f.accept(b)] == [0, 1, 3]
    assert f.open_transactions == {7: 1}
    # Right: collect over this and the following segments' indexes, like the broker.
    aborted, complete = collect_aborted_txns([idx1, idx2], 0, 4)
    assert complete and aborted == idx2
    assert visible_offsets(seg1_batches, aborted) == [0, 3]
    f = ReadCommittedFilter(aborted)
    for b in seg1_batches + list(read_batches(b"".join(seg2))):
        f.accept(b)
    assert f.open_transactions == {}


OPS = st.lists(
    st.tuples(
        st.sampled_from(["plain", "idem", "data", "commit", "abort"]), st.integers(1, 4), st.integers(1, 3)
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, cuts=st.lists(st.integers(0, 200), max_size=5), final_commit=st.booleans())
def test_random_interleavings_match_the_model(ops, cuts, final_commit):
    log = Log()
    for kind, pid, n in ops:
        if kind == "plain":
            log.plain(n)
        elif kind == "idem":
            log.plain(n, pid=100 + pid)
        elif kind == "data":
            log.data(pid, n)
        else:
            log.end(pid, commit=kind == "commit")
    for pid in sorted(log.open_txns):
        log.end(pid, final_commit)
    assert not log.open_txns
    expected = sorted(log.visible)

    # The whole log at once.
    batches = list(read_batches(log.data_bytes()))
    assert visible_offsets(batches, log.aborted) == expected

    # Cut into segments at batch boundaries; each segment's .txnindex holds the transactions
    # whose ABORT marker it contains; each segment is filtered on its own.
    bounds = sorted({c % (len(batches) + 1) for c in cuts} | {0, len(batches)})
    segments = [batches[a:b] for a, b in zip(bounds, bounds[1:]) if a < b]
    indexes = [
        [t for t in log.aborted if seg[0].header.base_offset <= t.last_offset <= seg[-1].header.last_offset]
        for seg in segments
    ]
    assert sum(map(len, indexes)) == len(log.aborted)
    got = []
    for i, seg in enumerate(segments):
        start, end = seg[0].header.base_offset, seg[-1].header.next_offset
        aborted, _complete = collect_aborted_txns(indexes[i:], start, end)
        got += visible_offsets(seg, aborted)
    assert got == expected
