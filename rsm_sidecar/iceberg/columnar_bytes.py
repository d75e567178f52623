"""Vectorised reads of many values at once from one byte buffer (numpy), for the columnar
parsers of the convert job: Kafka records (:mod:`~rsm_sidecar.iceberg.reading.raw_records`),
Protobuf messages (:mod:`~rsm_sidecar.iceberg.decoding.proto_columnar`) and Avro datums
(:mod:`~rsm_sidecar.iceberg.decoding.avro_columnar`). Kafka's and Avro's zig-zag varint longs,
Protobuf's plain varints and the length-prefixed bytes of all three are the same primitives.

A buffer is a ``uint8`` numpy array whose last :data:`PAD` bytes are zeros, so that a read of a
varint or fixed-size value that runs past a corrupt value stays inside it; callers check the
positions they get back against their own bounds. Anything these readers cannot decode raises
:class:`Malformed`, and the caller re-parses with its library parser (which raises the precise
error, or decodes what the fast path refused).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

#: Zero bytes at the end of every buffer (longest varint: 10 bytes).
PAD = 16
_ARANGE12 = np.arange(12, dtype=np.int64)
_U7F = np.uint64(0x7F)


class Malformed(Exception):
    """The fast path cannot decode these bytes; re-parse them with the library parser."""


def column_buffer(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The value bytes of a binary (or string, large_binary) column as one buffer (its data and
    :data:`PAD` zeros; one copy) and the int64 offsets of its values in it (``len(col) + 1``;
    a null value is empty)."""
    if col.type != pa.binary():
        col = col.cast(pa.binary())  # int32 offsets below (a large_binary or string column)
    n = len(col)
    offsets = np.frombuffer(col.buffers()[1], np.int32)[col.offset : col.offset + n + 1].astype(np.int64)
    data = col.buffers()[2]
    buf = np.zeros((0 if data is None else data.size) + PAD, np.uint8)
    if data is not None:
        buf[: data.size] = np.frombuffer(data, np.uint8)
    return buf, offsets


def preamble_ids(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, min_len: int) -> np.ndarray | None:
    """The schema ids (int32) in the Confluent preambles of the values ``buf[starts:ends]``; None
    when a value is shorter than ``min_len`` bytes or does not start with the magic byte."""
    if ((ends - starts) < min_len).any() or buf[starts].any():
        return None
    b = [buf[starts + i].astype(np.uint32) for i in range(1, 5)]
    return ((b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3]).view(np.int32)


def uvarint(buf: np.ndarray, pos: np.ndarray, max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Unsigned base-128 varints at ``pos`` -> (values as uint64, encoded lengths).

    Raises :class:`Malformed` for a varint longer than ``max_bytes`` bytes, or a 10-byte one whose
    last byte carries more than the 64th bit."""
    b = buf[pos].astype(np.uint64)
    val = b & _U7F
    cont = b >= 0x80
    length = np.ones(len(pos), np.int64)
    k = 1
    while cont.any():
        if k >= max_bytes:
            raise Malformed("varint too long")
        b = buf[pos + k].astype(np.uint64)
        if k == 9 and (cont & (b > 1)).any():
            raise Malformed("varint above 64 bits")
        val |= np.where(cont, (b & _U7F) << np.uint64(7 * k), np.uint64(0))
        length += cont
        cont &= b >= 0x80
        k += 1
    return val, length


def zigzag(val: np.ndarray) -> np.ndarray:
    """Zig-zag decoded int64 of uint64 values."""
    return (val >> np.uint64(1)).view(np.int64) ^ -(val & np.uint64(1)).view(np.int64)


def varint(buf: np.ndarray, pos: np.ndarray, max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Zig-zag varints at ``pos`` (Kafka's encoding) -> (values int64, encoded lengths)."""
    val, length = uvarint(buf, pos, max_bytes)
    return zigzag(val), length


def fixed(buf: np.ndarray, pos: np.ndarray, size: int) -> np.ndarray:
    """Little-endian ``size``-byte (4 or 8) values at ``pos`` as uint32/uint64.

    Read through a view of ``buf`` as overlapping ``size``-byte values, one starting at every
    byte (stride 1, no copy): one gather, about 13x faster than gathering the bytes and
    reassembling them (10,000 values)."""
    dtype = np.dtype("<u4") if size == 4 else np.dtype("<u8")
    every = np.ndarray((max(len(buf) - size + 1, 0),), dtype, buffer=buf, strides=(1,))
    return every[pos].astype(dtype.newbyteorder("="), copy=False)


def gather(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A binary/string array of ``buf[start:start+len]`` slices (negative length: null).

    A ``string`` result is validated as UTF-8 (``pa.ArrowInvalid`` otherwise). Slices in buffer
    order that do not overlap (the keys of a window's records, a field's values in message
    order), the common case, are cut by :func:`_gather_in_order`; any others by
    :func:`_gather_views`.
    """
    arr = _gather_in_order(buf, starts, lengths)
    if arr is None:
        arr = _gather_views(buf, starts, lengths)
    if typ == pa.string():
        arr = arr.cast(pa.string())  # validates UTF-8; raises ArrowInvalid otherwise
    return arr


def _gather_in_order(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array | None:
    """:func:`gather` of slices that follow each other in ``buf`` (each ends at or before the
    next one starts; slices without bytes may be anywhere), else None.

    ``buf`` is read as a binary array of 2n values, each slice followed by the gap up to the
    next one (int32 offsets into ``buf``, no copy), and Arrow's ``take`` of the even values copies
    the slices out in C++: 4-6x faster than building views (10,000 values of 5 to 92 bytes).
    """
    n = len(starts)
    if n == 0 or len(buf) >= 2**31:
        return None
    lens = np.maximum(lengths, 0)
    ends = starts + lens
    if n > 1 and not (starts[1:] >= ends[:-1]).all():
        empty = lens == 0
        if not empty.any():
            return None
        # a slice without bytes (null, absent, empty) moves to where the slice before it ended
        reach = np.maximum.accumulate(np.where(empty, 0, ends))
        starts = np.where(empty, np.concatenate(([0], reach[:-1])), starts)
        ends = starts + lens
        if not (starts[1:] >= ends[:-1]).all():
            return None
    if starts[0] < 0 or ends[-1] > len(buf):
        return None
    offsets = np.empty(2 * n + 1, np.int32)
    offsets[0 : 2 * n : 2] = starts
    offsets[1 : 2 * n : 2] = ends
    offsets[2 * n] = ends[-1]  # the last gap is empty
    valid = lengths >= 0
    null_count = n - int(np.count_nonzero(valid))
    validity = None
    if null_count:
        both = np.ones(2 * n, bool)
        both[0::2] = valid
        validity = pa.py_buffer(np.packbits(both, bitorder="little"))
    pieces = pa.Array.from_buffers(
        pa.binary(), 2 * n, [validity, pa.py_buffer(offsets), pa.py_buffer(buf)], null_count
    )
    return pieces.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))


def _gather_views(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """:func:`gather` of slices in any order, as a ``binary`` array.

    Built as an Arrow ``binary_view`` array whose 16-byte views point into ``buf`` (values of at
    most 12 bytes are inlined in the view), then cast to
    ``binary``: Arrow copies the bytes in C++, about 7x faster than gathering them with numpy.
    """
    n = len(starts)
    valid = lengths >= 0
    lens = np.where(valid, lengths, 0).astype(np.int32)
    views = np.zeros((n, 16), np.uint8)
    words = views.view(np.int32)  # (n, 4): length, prefix / inline, buffer index, offset
    words[:, 0] = lens
    # every 12-byte window of buf, as rows (no copy): a value's first bytes are one row
    windows = np.lib.stride_tricks.sliding_window_view(buf if len(buf) >= 12 else np.resize(buf, 12), 12)
    inline = lens <= 12
    ri = np.nonzero(inline)[0]
    if len(ri):
        first = np.minimum(starts[ri], len(windows) - 1)
        views[ri, 4:16] = windows[first] * (_ARANGE12[None, :] < lens[ri, None])
    ro = np.nonzero(~inline)[0]
    if len(ro):
        views[ro, 4:8] = windows[starts[ro], :4]
        words[ro, 3] = starts[ro]
    null_count = n - int(valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if null_count else None
    arr = pa.Array.from_buffers(
        pa.binary_view(), n, [validity, pa.py_buffer(views), pa.py_buffer(buf)], null_count
    )
    return arr.cast(pa.binary())
