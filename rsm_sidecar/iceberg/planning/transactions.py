"""Driver, step 3 of planning: aborted transactions, and segments that must wait for theirs.

A segment's transaction index lists only the aborts whose marker is in that segment, so the
driver reads the transaction indexes of every segment of the chain and hands each task the
aborted transactions overlapping its range. A segment is converted only once every transaction
with data in it is known to be finished *within the tiered segments*: the producer snapshot
stored with a later chain segment (the producer state at that segment's end) must show no
transaction that started at or before the segment's end still open. Otherwise the segment waits
for the next run (its markers are not tiered yet).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Mapping

from rsm_sidecar.errors import NotFound
from rsm_sidecar.iceberg.planning.listing import LIST_THREADS
from rsm_sidecar.kafka import AbortedTxn
from rsm_sidecar.kafka.snapshot import parse_producer_snapshot
from rsm_sidecar.kafka.txnindex import read_txn_index
from rsm_sidecar.segment.listing import StoredSegment
from rsm_sidecar.segment.reader import OpenSegment, SegmentReader

#: what :func:`read_aborted_and_open` returns for one segment
TxnInfo = tuple[list[AbortedTxn], list[int] | None]


def read_aborted_and_open(reader: SegmentReader, seg: StoredSegment) -> TxnInfo:
    """(aborted transactions listed in the segment's transaction index, first offsets of the
    transactions open at its end per its producer snapshot - None when it has no snapshot)."""
    return read_txn_info(reader, reader.open_base(seg.base, seg.describe), seg)


def read_txn_info(reader: SegmentReader, opened: OpenSegment, seg: StoredSegment) -> TxnInfo:
    """:func:`read_aborted_and_open` of a segment already opened."""
    try:
        aborted = read_txn_index(
            reader.read_index(opened, "transaction"), name=f"{seg.base} (transaction index)"
        )
    except NotFound:
        aborted = []
    try:
        snap = parse_producer_snapshot(
            reader.read_index(opened, "producerSnapshot"), name=f"{seg.base} (producer snapshot)"
        )
        open_first = [e.current_txn_first_offset for e in snap.entries if e.has_open_transaction]
    except NotFound:
        open_first = None
    return aborted, open_first


@dataclasses.dataclass(frozen=True)
class Settlement:
    """What the transactions of a chain allow: the aborted transactions of every chain segment
    (deduplicated, by last offset), how many leading segments of the chain may be converted, and
    why the rest waits (None: nothing waits)."""

    aborted: list[AbortedTxn]
    complete: int
    waiting: str | None = None


def settle_transactions(
    reader: SegmentReader, chain: list[StoredSegment], known: Mapping[str, TxnInfo] | None = None
) -> Settlement:
    """Read the chain's transaction indexes and producer snapshots (those not in ``known``, by
    base key: read while the manifests were loaded); the leading segments whose transactions
    are all finished within the chain may be converted, the tail waits for the next run."""
    if not chain:
        return Settlement([], 0)
    known = known or {}
    todo = [s for s in chain if s.base not in known]
    if len(todo) == 1:
        read = {todo[0].base: read_aborted_and_open(reader, todo[0])}
    elif todo:
        with concurrent.futures.ThreadPoolExecutor(min(LIST_THREADS, len(todo))) as pool:
            read = dict(
                zip((s.base for s in todo), pool.map(lambda s: read_aborted_and_open(reader, s), todo))
            )
    else:
        read = {}
    infos = [known[s.base] if s.base in known else read[s.base] for s in chain]
    seen = set()
    aborted = []
    for txns, _ in infos:
        for t in txns:
            key = (t.producer_id, t.first_offset, t.last_offset)
            if key not in seen:
                seen.add(key)
                aborted.append(t)
    aborted.sort(key=lambda t: (t.last_offset, t.first_offset))
    # threshold[j]: every transaction open at chain[j]'s end started after this offset
    thresholds = []
    for _, open_first in infos:
        if open_first is None:
            thresholds.append(-1)  # unknown: proves nothing
        else:
            thresholds.append(min(open_first) - 1 if open_first else 2**63 - 1)
    # chain[i] is complete iff max(thresholds[i:]) >= its end offset; that is a prefix
    suffix = -1
    keep = 0
    for j in range(len(chain) - 1, -1, -1):
        suffix = max(suffix, thresholds[j])
        if suffix >= chain[j].end_offset:
            keep = j + 1
            break
    if keep == len(chain):
        return Settlement(aborted, keep)
    return Settlement(
        aborted,
        keep,
        f"transactions with data in {chain[keep].describe} or before are still open at "
        f"the end of the tiered segments; converting it once their markers are tiered",
    )
