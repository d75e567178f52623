"""Tiered segments written exactly as the sidecar writes them, without a broker: for the tests
and benchmarks of every reader of tiered segments (the Iceberg job, ``inspect``).

:class:`TieredWriter` takes v2 record batches (built with :mod:`rsm_sidecar.kafka.builder`),
derives the indexes a broker would hand over - offset index, time index, producer snapshot (the
producer state at the segment's end, open transactions included), transaction index (the
aborts whose marker is in the segment), leader-epoch checkpoint - and copies the segment with
the sidecar's own :class:`~rsm_sidecar.segment.copy.SegmentCopier` (chunking, zstd, AES-GCM,
manifest written last). Transactions are followed across the segments of a partition.
"""

from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import os
from collections.abc import Iterable

from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata
from rsm_sidecar.kafka import AbortedTxn, ControlType, read_batches
from rsm_sidecar.kafka.indexes import OffsetPosition, TimestampOffset, encode_offset_index, encode_time_index
from rsm_sidecar.kafka.snapshot import ProducerSnapshotEntry, encode_producer_snapshot
from rsm_sidecar.kafka.txnindex import encode_txn_index
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.settings import CopySettings
from rsm_sidecar.segment.sources import BytesSource
from rsm_sidecar.storage.base import ObjectStore
from rsm_sidecar.transform.keyring import Keyring

INDEX_INTERVAL = 4096


def new_uuid() -> str:
    """A Kafka Uuid string (22 URL-safe base64 characters)."""
    return base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


@dataclasses.dataclass
class _PartitionState:
    open_txns: dict[int, int] = dataclasses.field(default_factory=dict)  # pid -> first offset
    producers: dict[int, tuple[int, int, int]] = dataclasses.field(
        default_factory=dict
    )  # pid -> (epoch, last offset, ts)
    next_offset: int = 0


class TieredWriter:
    """Writes segments of one topic into ``store`` under ``layout`` (optionally encrypted)."""

    def __init__(
        self,
        store: ObjectStore,
        layout: KeyLayout,
        keyring: Keyring | None,
        topic: str,
        topic_id: str | None = None,
        settings: CopySettings | None = None,
    ):
        self.store, self.layout, self.keyring = store, layout, keyring
        self.topic = topic
        self.topic_id = topic_id or new_uuid()
        self.settings = settings or CopySettings(chunk_size=1024 * 1024)
        self._pool = concurrent.futures.ThreadPoolExecutor(2)
        self._parts: dict[int, _PartitionState] = {}

    def close(self) -> None:
        self._pool.shutdown()

    def write_segment(
        self,
        partition: int,
        batches: Iterable[bytes],
        *,
        segment_id: str | None = None,
        track: bool = True,
        event_timestamp_ms: int = -1,
        time_index: bool | int = True,
    ) -> SegmentMetadata:
        """Copy one segment made of ``batches`` (consecutive offsets). ``track=False`` writes a
        re-upload of already written offsets (the transaction state is not advanced).
        ``event_timestamp_ms``: the broker's copy time recorded in the manifest (-1: none).

        Each batch is one append of ``LogSegment.append``: an offset-index entry (last offset,
        first byte) every ``INDEX_INTERVAL`` bytes and with it ``TimeIndex.maybeAppend(max
        timestamp so far, last offset of the batch holding it)`` - only when the timestamp is
        above the last entry's - plus that entry once more at the end, as when the segment
        rolls. ``time_index``: False stores an empty time index (the sidecar needs one), an int
        keeps only that many entries (a short index, for tests)."""
        data = b"".join(batches)
        st = self._parts.setdefault(partition, _PartitionState())
        work = _PartitionState(dict(st.open_txns), dict(st.producers))
        offset_entries: list[OffsetPosition] = []
        time_entries: list[TimestampOffset] = []
        aborted: list[AbortedTxn] = []
        start = end = None
        max_ts = -1
        max_ts_offset = -1
        last_indexed = -INDEX_INTERVAL

        def maybe_append_time() -> None:
            if max_ts > (time_entries[-1].timestamp if time_entries else -1):
                time_entries.append(TimestampOffset(max_ts, max_ts_offset))

        for b in read_batches(data):
            h = b.header
            start = h.base_offset if start is None else start
            end = h.last_offset
            if h.max_timestamp > max_ts:
                max_ts, max_ts_offset = h.max_timestamp, h.last_offset
            if h.position - last_indexed >= INDEX_INTERVAL:
                offset_entries.append(OffsetPosition(h.last_offset, h.position))
                maybe_append_time()
                last_indexed = h.position
            if h.has_producer_id:
                work.producers[h.producer_id] = (h.producer_epoch, h.last_offset, h.max_timestamp)
                if h.is_control:
                    marker = b.control_records()[0]
                    first = work.open_txns.pop(h.producer_id, None)
                    if marker.type_id == ControlType.ABORT and first is not None:
                        lso = min(work.open_txns.values(), default=h.last_offset + 1)
                        aborted.append(AbortedTxn(h.producer_id, first, h.last_offset, lso))
                elif h.is_transactional:
                    work.open_txns.setdefault(h.producer_id, h.base_offset)
        if start is None or end is None:
            raise ValueError("a segment needs at least one batch")
        maybe_append_time()  # LogSegment.onBecomeInactiveSegment: the roll
        if time_index is not True:
            time_entries = time_entries[: int(time_index)] if time_index is not False else []
        if track:
            st.open_txns, st.producers, st.next_offset = work.open_txns, work.producers, end + 1
        snapshot = encode_producer_snapshot(
            [
                ProducerSnapshotEntry(pid, epoch, 0, last, 0, ts, 0, work.open_txns.get(pid, -1))
                for pid, (epoch, last, ts) in sorted(work.producers.items())
            ]
        )
        indexes: dict[str, bytes | None] = {
            "offset": encode_offset_index(offset_entries, start),
            "timestamp": encode_time_index(time_entries, start),
            "producerSnapshot": snapshot,
            "leaderEpoch": f"0\n1\n0 {start}\n".encode(),
            "transaction": encode_txn_index(aborted) if aborted else None,
        }
        md = SegmentMetadata(
            self.topic_id,
            self.topic,
            partition,
            segment_id or new_uuid(),
            start,
            end,
            max_timestamp_ms=max_ts,
            broker_id=1,
            event_timestamp_ms=event_timestamp_ms,
            segment_size=len(data),
        ).validate()
        copier = SegmentCopier(self.store, self.layout, self.keyring, self.settings, self._pool)
        leader_epoch = indexes.pop("leaderEpoch")
        assert leader_epoch is not None
        copier.copy(md, BytesSource(data, indexes), leader_epoch)
        return md

    def base_key(self, md: SegmentMetadata) -> str:
        return self.layout.base(md)
