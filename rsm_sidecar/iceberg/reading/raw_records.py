"""Kafka record batches of a tiered segment -> raw record batches (``RAW_RECORD_SCHEMA``).

This is the executor-side hot path of ``rsm-sidecar iceberg convert``. Batches come from
:func:`rsm_sidecar.kafka.read_batches` (CRC-checked, one at a time) and go through
:class:`~rsm_sidecar.kafka.ReadCommittedFilter`; the records sections of the accepted batches
are decompressed and parsed *columnar*: all records of up to ``max_records`` records (or
``max_bytes`` decompressed bytes) are decoded together with numpy (one vectorised pass per
record field), instead of one Python ``Record`` object per record, which costs ~17 us per
record. Only the walk over the record length prefixes is a Python loop. Anything the fast path
does not like (a length that runs past the section, a record whose fields do not add up, an
offset delta out of range, a header key that is not UTF-8) re-parses that window with the
library's record parser, which either succeeds (the values are then taken from it) or raises
its precise :class:`~rsm_sidecar.kafka.CorruptRecordError` naming the batch.

What a row gets (docs/iceberg.md "ingest_timestamp"):

* ``timestamp`` (-> ``kafka.event_timestamp``): the producer's timestamp, ``baseTimestamp +
  timestampDelta``. For CreateTime batches that is what consumers see; for LogAppendTime
  batches the broker only overwrites ``maxTimestamp`` (consumers then see the append time) and
  the producer's time is still there.
* ``ingest_timestamp``: the partition's running maximum, in offset order, of the time the
  broker took the record as: CreateTime -> the record timestamp; LogAppendTime -> the batch's
  append time (``maxTimestamp``). Control batches and aborted transactional batches emit no
  rows but still advance the maximum with their ``maxTimestamp``. Every time is first capped at
  the segment's *ingest bound* (when the broker began copying the segment to remote storage), so
  one far-future producer timestamp cannot pin the maximum; the value at a segment's end is
  ``max(state before, min(segment maxTimestampMs, bound))`` whatever the run boundaries are.

Memory: one Kafka batch (bounded by ``max_batch_size``) plus one window of at most
``max_records`` records / ``max_bytes`` bytes and its Arrow arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from rsm_sidecar.iceberg.columnar_bytes import PAD, Malformed, gather, varint
from rsm_sidecar.kafka import AbortedTxn, ReadCommittedFilter, RecordBatch, TimestampType
from rsm_sidecar.kafka.records import parse_records

# ============================================================================ raw record batches

HEADER_TYPE = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))

#: One row per Kafka record; timestamps are epoch milliseconds (null or negative: none).
RAW_RECORD_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("batch_start", pa.int64()),
        ("timestamp", pa.int64()),
        ("ingest_timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADER_TYPE),
    ]
)


class KafkaRecord(NamedTuple):
    partition: int
    offset: int
    batch_start: int
    timestamp: int | None
    ingest_timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()


def raw_batch(records: Iterable[KafkaRecord | tuple]) -> pa.RecordBatch:
    """A :data:`RAW_RECORD_SCHEMA` batch from Python records (tests, small producers)."""
    cols: list[list] = [[] for _ in range(8)]
    for r in records:
        for i, v in enumerate(r):
            cols[i].append(v)
        if len(r) == 7:
            cols[7].append(())
    hdrs = [
        [(k if isinstance(k, str) else bytes(k).decode("utf-8", "replace"), v) for k, v in h] for h in cols[7]
    ]
    arrays = [pa.array(c, f.type) for c, f in zip(cols[:7], RAW_RECORD_SCHEMA)]
    arrays.append(pa.array(hdrs, HEADER_TYPE))
    return pa.RecordBatch.from_arrays(arrays, schema=RAW_RECORD_SCHEMA)


# ============================================================================ segment -> raw record batches

DEFAULT_MAX_RECORDS = 10_000
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
_HEADER_STRUCT = HEADER_TYPE.value_type


@dataclasses.dataclass
class WindowStats:
    records: int = 0  # rows emitted
    batches: int = 0  # data batches emitted (at least one row)
    skipped_batches: int = 0  # control + aborted batches in range
    aborted_records: int = 0


class _Window:
    """Records sections of accepted batches waiting to be decoded together."""

    def __init__(self) -> None:
        self.sections: list[bytes] = []
        self.headers: list = []  # BatchHeader per section
        self.bytes = 0
        self.records = 0
        #: (row index of the next row, max timestamp) of skipped batches: advances ingest
        self.bumps: list[tuple[int, int]] = []

    def add(self, header, section: bytes) -> None:
        self.sections.append(section)
        self.headers.append(header)
        self.bytes += len(section)
        self.records += header.record_count

    def bump(self, ts: int) -> None:
        self.bumps.append((self.records, ts))

    def __bool__(self) -> bool:
        return bool(self.sections or self.bumps)


class SegmentRowReader:
    """Turns the batches of one offset range of one partition into raw record batches.

    ``lo``/``hi``: the inclusive offset range to emit (records outside it are dropped and do not
    move the ingest maximum). ``aborted``: the aborted transactions overlapping the range (what
    :func:`~rsm_sidecar.kafka.collect_aborted_txns` returns for it: every transaction whose ABORT
    marker is at or after ``lo``). ``ingest_state``: the running maximum (ms) before ``lo``.
    ``ingest_bound``: no record of the segment was ingested after this time (ms); record and
    batch times above it count as it (-1: no bound).
    """

    def __init__(
        self,
        partition: int,
        lo: int,
        hi: int,
        aborted: Iterable[AbortedTxn] = (),
        ingest_state: int = -1,
        *,
        ingest_bound: int = -1,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        source: str | None = None,
    ):
        self.partition = partition
        self.lo, self.hi = lo, hi
        self.filter = ReadCommittedFilter(aborted)
        self.state = ingest_state
        self.bound = ingest_bound if ingest_bound >= 0 else 2**63 - 1
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.source = source
        self.stats = WindowStats()
        self.last_offset = lo - 1  # highest offset seen in range (emitted or skipped)

    # ------------------------------------------------------------------ driving
    def batches(self, batches: Iterable[RecordBatch]) -> Iterator[pa.RecordBatch]:
        window = _Window()
        for batch in batches:
            h = batch.header
            if h.last_offset < self.lo:
                continue
            if h.base_offset > self.hi:
                break
            self.last_offset = max(self.last_offset, min(h.last_offset, self.hi))
            if not self.filter.accept(batch):
                self.stats.skipped_batches += 1
                if not h.is_control:
                    self.stats.aborted_records += h.record_count
                window.bump(min(h.max_timestamp, self.bound))
                continue
            if h.record_count == 0:
                continue
            window.add(h, batch.records_section())
            if window.records >= self.max_records or window.bytes >= self.max_bytes:
                out = self._flush(window)
                window = _Window()
                if out is not None:
                    yield out
        if window:
            out = self._flush(window)
            if out is not None:
                yield out

    # ------------------------------------------------------------------ decoding
    def _flush(self, w: _Window) -> pa.RecordBatch | None:
        if not w.sections:
            for _, ts in w.bumps:
                self.state = max(self.state, ts)
            return None
        try:
            cols = self._fast(w)
        except (Malformed, pa.ArrowInvalid, IndexError):
            cols = self._slow(w)
        return self._finish(w, *cols)

    def _fast(self, w: _Window):
        buf_bytes = b"".join(w.sections) + b"\x00" * PAD
        buf = np.frombuffer(buf_bytes, np.uint8)
        counts = np.array([h.record_count for h in w.headers], np.int64)
        sec_lengths = np.array([len(section) for section in w.sections], np.int64)
        sec_ends = np.cumsum(sec_lengths)
        S, E = _record_spans(buf, buf_bytes, sec_ends - sec_lengths, sec_ends, counts)
        p = S + 1  # attributes (int8), unused
        ts_delta, n = varint(buf, p, 10)
        p += n
        off_delta, n = varint(buf, p, 5)
        p += n
        klen, n = varint(buf, p, 5)
        p += n
        kstart = p.copy()
        p += np.maximum(klen, 0)
        vlen, n = varint(buf, p, 5)
        p += n
        vstart = p.copy()
        p += np.maximum(vlen, 0)
        if (p > E).any():
            raise Malformed("key/value past the record")
        hcount, n = varint(buf, p, 5)
        p += n
        if (hcount < 0).any():
            raise Malformed("negative header count")
        headers = self._headers(buf, p, E, hcount)
        if not np.array_equal(p, E):
            raise Malformed("record fields do not add up")
        last_delta = np.array([h.last_offset_delta for h in w.headers], np.int64)
        if ((off_delta < 0) | (off_delta > np.repeat(last_delta, counts))).any():
            raise Malformed("offset delta outside the batch")
        base_off = np.repeat(np.array([h.base_offset for h in w.headers], np.int64), counts)
        base_ts = np.repeat(np.array([h.base_timestamp for h in w.headers], np.int64), counts)
        keys = gather(buf, kstart, klen, pa.binary())
        values = gather(buf, vstart, vlen, pa.binary())
        return base_off + off_delta, base_off, base_ts + ts_delta, counts, keys, values, headers

    def _headers(self, buf, p, E, hcount) -> pa.Array:
        n = len(hcount)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(hcount, out=offsets[1:])
        total = int(offsets[-1])
        if total == 0:
            return pa.ListArray.from_arrays(
                pa.array(offsets.astype(np.int32)), pa.array([], _HEADER_STRUCT), type=HEADER_TYPE
            )
        ks = np.zeros(total, np.int64)
        kl = np.zeros(total, np.int64)
        vs = np.zeros(total, np.int64)
        vl = np.zeros(total, np.int64)
        for j in range(int(hcount.max())):
            rows = np.nonzero(hcount > j)[0]
            q = p[rows]
            flat = offsets[rows] + j
            length, nb = varint(buf, q, 5)
            q = q + nb
            if (length < 0).any():
                raise Malformed("negative header key length")
            ks[flat], kl[flat] = q, length
            q = q + length
            length, nb = varint(buf, q, 5)
            q = q + nb
            vs[flat], vl[flat] = q, length
            q = q + np.maximum(length, 0)
            if (q > E[rows]).any():
                raise Malformed("header past the record")
            p[rows] = q
        hkeys = gather(buf, ks, kl, pa.string())
        hvals = gather(buf, vs, vl, pa.binary())
        struct = pa.StructArray.from_arrays([hkeys, hvals], fields=list(_HEADER_STRUCT))
        # the offsets are those of the headers just read: nothing for from_arrays to check
        return pa.Array.from_buffers(
            HEADER_TYPE, n, [None, pa.py_buffer(offsets.astype(np.int32))], children=[struct]
        )

    def _slow(self, w: _Window):
        """The library parser (precise errors; Java-like UTF-8 replacement in header keys)."""
        offsets, batch_start, ts, keys, values, headers, counts = [], [], [], [], [], [], []
        for section, h in zip(w.sections, w.headers):
            n = 0
            for r in parse_records(section, h, source=self.source):
                offsets.append(r.offset)
                batch_start.append(h.base_offset)
                ts.append(h.base_timestamp + r.timestamp_delta)
                keys.append(r.key)
                values.append(r.value)
                headers.append([(x.key, x.value) for x in r.headers])
                n += 1
            counts.append(n)
        return (
            np.array(offsets, np.int64),
            np.array(batch_start, np.int64),
            np.array(ts, np.int64),
            np.array(counts, np.int64),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(headers, HEADER_TYPE),
        )

    def _finish(self, w: _Window, offsets, batch_start, ts, counts, keys, values, headers):
        log_append = np.array([h.timestamp_type is TimestampType.LOG_APPEND_TIME for h in w.headers])
        if log_append.any():
            max_ts = np.repeat(np.array([h.max_timestamp for h in w.headers], np.int64), counts)
            cand = np.where(np.repeat(log_append, counts), max_ts, ts)
        else:
            cand = ts
        cand = np.minimum(cand, self.bound)
        n_all = len(cand)
        keep = (offsets >= self.lo) & (offsets <= self.hi)
        bump = np.full(n_all, -1, np.int64)
        tail = -1
        for row, bts in w.bumps:  # a skipped batch just before row `row` advances the maximum
            if row < n_all:
                bump[row] = max(bump[row], bts)
            else:
                tail = max(tail, bts)
        # rows outside [lo, hi] do not move the maximum, the skipped batches before them do
        cand = np.where(keep, np.maximum(cand, bump), bump)
        run = np.maximum.accumulate(np.concatenate([np.array([self.state], np.int64), cand]))[1:]
        self.state = max(int(run[-1]), tail)
        if keep.all():
            ingest = run
        else:
            sel = np.nonzero(keep)[0]
            if len(sel) == 0:
                return None
            offsets, batch_start, ts, ingest = offsets[sel], batch_start[sel], ts[sel], run[sel]
            take = pa.array(sel)
            keys, values, headers = keys.take(take), values.take(take), headers.take(take)
        n = len(offsets)
        self.stats.records += n
        self.stats.batches += int((counts > 0).sum())
        return pa.RecordBatch.from_arrays(
            [
                pa.array(np.full(n, self.partition, np.int32)),
                pa.array(offsets),
                pa.array(batch_start),
                pa.array(ts),
                pa.array(ingest),
                keys,
                values,
                headers,
            ],
            schema=RAW_RECORD_SCHEMA,
        )


#: Sections walked together per step of :func:`_record_spans` below which the rest is walked one
#: section at a time (a window holding one large batch would otherwise take one numpy step per
#: record).
_MIN_WIDTH = 8


def _record_spans(
    buf: np.ndarray, buf_bytes: bytes, sec_starts: np.ndarray, sec_ends: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Body start and end of every length-prefixed record of the sections, in order.

    Step *k* reads the length of the *k*-th record of every section that has one, vectorised
    (the sections sorted by record count, most first, so that those still walking are the first
    ones: a slice, not a selection); once fewer than :data:`_MIN_WIDTH` sections are left, each
    goes on in :func:`_record_bounds`. A length of one or two bytes (records below 8 KiB) is read
    in a few numpy operations; a step with a longer one reads all its lengths as varints. A step
    does not check what it read: the records are checked together at the end. Raises
    :class:`Malformed` when a length is not positive, runs past its section, or the records do
    not end exactly at their section's end (a length that sends a step outside the buffer raises
    ``IndexError``, which the caller treats alike)."""
    first_out = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    S = np.empty(int(counts.sum()), np.int64)
    E = np.empty_like(S)
    order = np.argsort(-counts, kind="stable")
    left = counts[order].tolist()
    pos = sec_starts[order].astype(np.int64)
    out0 = first_out[order]
    m = int(np.count_nonzero(counts))
    k = 0
    while m >= _MIN_WIDTH:
        p = pos[:m]
        b0 = buf[p]
        raw = np.where(b0 >= 0x80, (b0 & 0x7F) | (buf[p + 1].astype(np.int64) << 7), b0)
        if raw.max() < 1 << 14:  # one or two bytes
            length = (raw >> 1) ^ -(raw & 1)
            body = p + 1 + (b0 >= 0x80)
        else:
            length, nb = varint(buf, p, 5)
            body = p + nb
        out = out0[:m] + k
        S[out] = body
        E[out] = pos[:m] = body + length
        k += 1
        while m and left[m - 1] <= k:
            m -= 1
    for i in range(m):
        sec = int(order[i])
        starts: list[int] = []
        ends: list[int] = []
        rest = left[i] - k
        pos[i] = _record_bounds(buf_bytes, int(pos[i]), int(sec_ends[sec]), rest, starts, ends)
        if len(starts) != rest:
            raise Malformed("record lengths do not add up")
        at = slice(first_out[sec] + k, first_out[sec] + k + rest)
        S[at], E[at] = starts, ends
    # every record at least one byte long and the last one ending at its section's end: the
    # records of each section follow each other inside it
    if (E - S < 1).any() or not np.array_equal(pos, sec_ends[order]):
        raise Malformed("record lengths do not add up")
    return S, E


def _record_bounds(buf: bytes, pos: int, end: int, count: int, starts: list, ends: list) -> int:
    """Walk ``count`` length-prefixed records from ``pos``; append body starts/ends; return the
    position after the last one (stops early, returning a position != ``end``, on nonsense)."""
    append_s, append_e = starts.append, ends.append
    for _ in range(count):
        if pos >= end:
            return -1
        b = buf[pos]
        pos += 1
        if b < 0x80:
            raw = b
        else:
            raw = b & 0x7F
            shift = 7
            while True:
                b = buf[pos]
                pos += 1
                raw |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
                if shift > 28:
                    return -1
        length = (raw >> 1) ^ -(raw & 1)
        if length < 1 or pos + length > end:
            return -1
        append_s(pos)
        pos += length
        append_e(pos)
    return pos


def raw_batches(
    batches: Iterable[RecordBatch],
    partition: int,
    lo: int,
    hi: int,
    aborted: Sequence[AbortedTxn] = (),
    ingest_state: int = -1,
    **kwargs,
) -> Iterator[pa.RecordBatch]:
    """Convenience wrapper around :class:`SegmentRowReader`."""
    return SegmentRowReader(partition, lo, hi, aborted, ingest_state, **kwargs).batches(batches)
