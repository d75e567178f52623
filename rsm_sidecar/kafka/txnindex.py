"""Transaction index (``.txnindex``): the aborted transactions whose ABORT marker is in the
segment (Kafka's ``TransactionIndex`` / ``AbortedTxn``).

Each entry is 34 bytes, big-endian::

    version int16 (0) | producerId int64 | firstOffset int64 | lastOffset int64 | lastStableOffset int64

``firstOffset`` is the transaction's first data offset (possibly in an earlier segment),
``lastOffset`` the offset of its ABORT marker, ``lastStableOffset`` the partition's LSO when it
completed. The file is not preallocated. Entries are appended with strictly increasing
``lastOffset``. Unlike Kafka, which silently ignores a trailing fragment shorter than an entry,
a fragment is reported as :class:`TruncatedError` unless ``allow_partial_tail``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .errors import CorruptIndexError, TruncatedError, UnsupportedFormatError, Where
from .reader import Source, _open

ABORTED_TXN_SIZE = 34
CURRENT_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
assert _ENTRY.size == ABORTED_TXN_SIZE


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int
    version: int = CURRENT_VERSION

    def encode(self) -> bytes:
        return _ENTRY.pack(
            self.version, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset
        )


def iter_txn_index(
    source: Source, *, name: str | None = None, allow_partial_tail: bool = False
) -> Iterator[AbortedTxn]:
    """Stream the entries; validate version, ``firstOffset <= lastOffset`` and increasing
    ``lastOffset``."""
    with _open(source, name) as (f, label):
        slot = 0
        previous: AbortedTxn | None = None
        while True:
            raw = f.read(ABORTED_TXN_SIZE)
            while raw and len(raw) < ABORTED_TXN_SIZE:
                more = f.read(ABORTED_TXN_SIZE - len(raw))
                if not more:
                    break
                raw += more
            if not raw:
                return
            where = Where(source=label, position=slot * ABORTED_TXN_SIZE)
            if len(raw) < ABORTED_TXN_SIZE:
                if allow_partial_tail:
                    return
                raise TruncatedError(
                    f"transaction index ends with a {len(raw)}-byte fragment of a "
                    f"{ABORTED_TXN_SIZE}-byte entry",
                    **where,
                )
            version, pid, first, last, lso = _ENTRY.unpack(raw)
            if version > CURRENT_VERSION:
                raise UnsupportedFormatError(
                    f"aborted transaction entry version {version} (this library knows {CURRENT_VERSION})",
                    **where,
                )
            if version < 0 or first > last or first < 0:
                raise CorruptIndexError(
                    f"invalid aborted transaction entry: version {version}, producer {pid}, "
                    f"offsets {first}..{last}",
                    **where,
                )
            txn = AbortedTxn(pid, first, last, lso, version)
            if previous is not None and txn.last_offset <= previous.last_offset:
                raise CorruptIndexError(
                    f"aborted transaction last offsets must increase: {txn.last_offset} after "
                    f"{previous.last_offset}",
                    **where,
                )
            previous = txn
            slot += 1
            yield txn


def read_txn_index(
    source: Source, *, name: str | None = None, allow_partial_tail: bool = False
) -> list[AbortedTxn]:
    return list(iter_txn_index(source, name=name, allow_partial_tail=allow_partial_tail))


def encode_txn_index(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(e.encode() for e in entries)


def collect_aborted_txns(
    indexes: Iterable[Iterable[AbortedTxn]], fetch_offset: int, upper_bound_offset: int
) -> tuple[list[AbortedTxn], bool]:
    """The aborted transactions overlapping ``[fetch_offset, upper_bound_offset)``, as the broker
    collects them for a fetch (``TransactionIndex.collectAbortedTxns``).

    ``indexes`` are the transaction indexes of the segment holding ``fetch_offset`` and of the
    following segments, in order. Returns ``(txns, complete)``: ``complete`` is True once an
    entry's ``lastStableOffset >= upper_bound_offset`` proves no later segment can abort a
    transaction with data in the range; with ``False`` the caller should pass more segments
    (or has reached the end of the log).
    """
    found: list[AbortedTxn] = []
    for index in indexes:
        for txn in index:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                found.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return found, True
    return found, False
