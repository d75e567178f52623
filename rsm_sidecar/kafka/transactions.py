"""``read_committed`` filtering: which records a transactional consumer would see.

This is the consumer's algorithm (``CompletedFetch`` in the Java client) applied to batches read
from segments: the aborted transactions (producer id, first offset) are kept sorted by first
offset; before each batch with a producer id, every aborted transaction whose first offset is
<= the batch's last offset marks its producer as "aborting"; transactional data batches of an
aborting producer are dropped; that producer's ABORT marker (a control batch) ends it. Control
batches are never returned. Non-transactional batches are always returned. Because the state is
per producer id, interleaved transactions of different producers are handled exactly.

The aborted-transaction list must cover every transaction that has data in the batches: the
``.txnindex`` of a segment lists only transactions whose ABORT marker is in that segment, so a
transaction whose data is in segment N but whose marker is in N+1 is listed in N+1's index. Use
:func:`~rsm_sidecar.kafka.txnindex.collect_aborted_txns` over this and the following segments'
indexes (as the broker does for a fetch) until it reports ``complete``. Transactions still open
at the end of the batches (no marker seen) are listed in
:attr:`ReadCommittedFilter.open_transactions`; on tiered segments, which all lie below the last
stable offset, such a transaction is committed unless the aborted list says otherwise.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from .compression import DEFAULT_MAX_DECOMPRESSED_SIZE
from .control import ControlType
from .reader import RecordBatch
from .records import Record
from .txnindex import AbortedTxn


class ReadCommittedFilter:
    """Feed batches in offset order to :meth:`accept`; it says whether to return their records."""

    def __init__(self, aborted_txns: Iterable[AbortedTxn] = ()) -> None:
        self._pending: list[tuple[int, int, int]] = []  # (first_offset, seq, producer_id)
        self._seq = 0
        self._aborting: set[int] = set()
        #: producer id -> first offset of a transaction with data seen but no marker yet.
        self.open_transactions: dict[int, int] = {}
        self.add_aborted_txns(aborted_txns)

    def add_aborted_txns(self, txns: Iterable[AbortedTxn]) -> None:
        """Add aborted transactions (e.g. from the next segment's index) before feeding the
        batches they concern."""
        for txn in txns:
            heapq.heappush(self._pending, (txn.first_offset, self._seq, txn.producer_id))
            self._seq += 1

    def _consume_aborted_up_to(self, offset: int) -> None:
        while self._pending and self._pending[0][0] <= offset:
            _, _, pid = heapq.heappop(self._pending)
            self._aborting.add(pid)

    def accept(self, batch: RecordBatch) -> bool:
        """True if the batch's records are visible to a read_committed consumer."""
        h = batch.header
        if h.has_producer_id:
            self._consume_aborted_up_to(h.last_offset)
            pid = h.producer_id
            if h.is_control:
                markers = batch.control_records()
                if markers and markers[0].is_transaction_marker:
                    self.open_transactions.pop(pid, None)
                    if markers[0].type_id == ControlType.ABORT:
                        self._aborting.discard(pid)
            elif h.is_transactional:
                self.open_transactions.setdefault(pid, h.base_offset)
                if pid in self._aborting:
                    return False
        return not h.is_control

    def is_aborting(self, producer_id: int) -> bool:
        return producer_id in self._aborting


def committed_batches(
    batches: Iterable[RecordBatch], aborted_txns: Iterable[AbortedTxn]
) -> Iterator[RecordBatch]:
    """The data batches a read_committed consumer would see (see the module doc for what
    ``aborted_txns`` must contain)."""
    f = ReadCommittedFilter(aborted_txns)
    for batch in batches:
        if f.accept(batch):
            yield batch


def committed_records(
    batches: Iterable[RecordBatch],
    aborted_txns: Iterable[AbortedTxn],
    *,
    max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE,
) -> Iterator[Record]:
    """The records a read_committed consumer would see, in offset order."""
    for batch in committed_batches(batches, aborted_txns):
        yield from batch.records(max_decompressed_size)
