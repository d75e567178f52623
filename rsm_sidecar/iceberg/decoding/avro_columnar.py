"""A columnar Avro decoder: a whole batch of Avro datums read from their bytes with numpy.

``AvroSide.decode_keeping`` reads every value with fastavro, which builds a Python dict per
record, then :class:`~rsm_sidecar.iceberg.decoding.avro_mapping.AvroMapper` normalises the
dicts and Arrow converts them back; almost all of that time is spent creating and freeing
Python objects. This module reads the same columns straight from the bytes of all values at
once. An Avro datum has no tags: a record is its fields one after the other, so the decoder walks
the *schema*, not the bytes, and reads each field of every datum of the batch in one vectorised
step (a position per datum, advanced by what was read): zig-zag varints, 4/8-byte floats,
length-prefixed strings and bytes (copied once out of the batch's buffer, in C++),
enums by lookup, unions by branch index (each branch read on the datums that chose it), and
arrays and maps one item per datum per step. It gives exactly the Arrow arrays of the fastavro
path (with the writer's schema resolved against the table's, as fastavro resolves it), or it
refuses, and the caller then decodes the batch with fastavro:

* at build time (:func:`plan_for` returns None) for a schema, or a pair of writer and table
  schemas, that it does not reproduce: a named type used inside itself, record or field
  aliases, an ``error`` type, an empty record, a union whose branches a row cannot tell apart
  (two of one Python kind, a map beside a record), a logical type that the writer and the
  table's schema give differently, an array of items that may take no bytes, a reader field
  without a default that the writer lacks, or anything fastavro itself cannot resolve;
* per batch (:func:`decode` returns None) for bytes that fastavro rejects or turns into values
  the table's types reject, or reads in a way this decoder does not reproduce: a datum that runs
  past its value, a negative length, union index or enum index, a varint above 64 bits, an
  ``int`` outside 32 bits, a string that is not UTF-8, a ``uuid`` not in its canonical form, a
  date, time or timestamp outside what Python's ``datetime`` holds, a decimal beyond its
  precision, an enum symbol the table's enum lacks (without a default), a map with a key given
  twice, an array or map of more than ``_MAX_STEPS`` items in one datum (it would take more
  vectorised steps than fastavro takes), and, in a writer field the table's schema drops (which
  fastavro skips without reading), a block of negative count.

Bytes after the end of a datum are ignored, as fastavro ignores them. Memory: the batch's
values once (``column_buffer``), a few arrays the length of the batch per column, and the item
positions of one array or map.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# fastavro's own resolution rules (not in its type stubs): a writer schema is resolved exactly as
# fastavro resolves it; the differential test against fastavro notices when they change
from fastavro._read import match_schemas, match_types  # type: ignore[attr-defined]
from fastavro.const import AVRO_TYPES
from fastavro.read import LOGICAL_READERS, SchemaResolutionError
from fastavro.schema import extract_record_type, is_single_record_union, parse_schema

from rsm_sidecar.iceberg.columnar_bytes import Malformed, column_buffer, fixed, gather, preamble_ids, varint
from rsm_sidecar.iceberg.decoding.avro_mapping import AvroMapper

#: Array or map items read one per datum per step; a batch with a longer one goes to fastavro.
_MAX_STEPS = 256
_U8 = np.uint8
#: The datetime range of Python (and of fastavro's values), in µs since the epoch.
_MIN_US, _MAX_US = -62_135_596_800_000_000, 253_402_300_799_999_999
_DAY_US = 86_400_000_000
#: (base type, logicalType) pairs that fastavro converts and the mapping maps the same way.
_LOGICAL = {
    ("int", "date"),
    ("int", "time-millis"),
    ("long", "time-micros"),
    ("long", "timestamp-millis"),
    ("long", "timestamp-micros"),
    ("long", "local-timestamp-millis"),
    ("long", "local-timestamp-micros"),
    ("bytes", "decimal"),
    ("fixed", "decimal"),
    ("string", "uuid"),
}
#: logicalTypes the mapping maps on any base type (``date``/``decimal`` only on their own).
_MAPPED_ANYWHERE = {lt for _, lt in _LOGICAL} - {"date", "decimal"}


#: The Python kind of the values fastavro gives for an Avro type (or logical type): the mapping
#: puts a union's value in the first member that takes its kind, so a union of two branches of one
#: kind (but records told apart by name) is left to fastavro.
KINDS = {
    "boolean": "bool",
    "int": "int",
    "long": "int",
    "float": "float",
    "double": "float",
    "string": "str",
    "enum": "str",
    "bytes": "bytes",
    "fixed": "bytes",
    "record": "dict",
    "map": "dict",
    "array": "list",
    "date": "date",
    "time-millis": "time",
    "time-micros": "time",
    "timestamp-millis": "datetime",
    "timestamp-micros": "datetime",
    "local-timestamp-millis": "datetime",
    "local-timestamp-micros": "datetime",
    "decimal": "Decimal",
    "uuid": "UUID",
}


class _Unsupported(Exception):
    """The plan builder met something this decoder leaves to fastavro."""


# ============================================================================ values


@dataclass
class _Slices:
    """Byte ranges of the buffer not copied into Arrow yet (strings, bytes, fixed)."""

    starts: np.ndarray
    lengths: np.ndarray  # -1: null
    typ: pa.DataType
    utf8: bool  # validated as UTF-8 (strings, also strings read into a bytes column)


#: What a node reads: an Arrow array, or byte ranges (cheap to reorder before the copy).
_Part: TypeAlias = pa.Array | _Slices


def _arrow(part: _Part, buf: np.ndarray) -> pa.Array:
    if isinstance(part, _Slices):
        arr = gather(buf, part.starts, part.lengths, pa.string() if part.utf8 else pa.binary())
        return arr if arr.type == part.typ else arr.cast(part.typ)
    return part


def _concat(parts: list[_Part], buf: np.ndarray) -> _Part:
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, _Slices) and all(
        isinstance(p, _Slices) and p.typ == first.typ and p.utf8 == first.utf8 for p in parts
    ):
        starts = np.concatenate([p.starts for p in parts])
        lengths = np.concatenate([p.lengths for p in parts])
        return _Slices(starts, lengths, first.typ, first.utf8)
    return pa.concat_arrays([_arrow(p, buf) for p in parts])


def _take(part: _Part, idx: np.ndarray) -> _Part:
    """``part[idx]``; an index of -1 gives a null."""
    null = idx < 0
    if isinstance(part, _Slices):
        if len(part.starts) == 0:
            return _Slices(np.zeros(len(idx), np.int64), np.full(len(idx), -1, np.int64), part.typ, part.utf8)
        i = np.where(null, 0, idx)
        lengths = part.lengths[i]
        lengths[null] = -1
        return _Slices(part.starts[i], lengths, part.typ, part.utf8)
    return part.take(pa.array(idx, mask=null if null.any() else None))


def _scatter(parts: list[tuple[_Part, np.ndarray]], n: int, typ: pa.DataType, buf: np.ndarray) -> _Part:
    """``n`` rows holding each part's values at its (ascending) rows, null elsewhere."""
    if not parts:
        return pa.nulls(n, typ)
    if len(parts) == 1 and len(parts[0][1]) == n:
        return parts[0][0]
    where = np.full(n, -1, np.int64)
    offset = 0
    for _, rows in parts:
        where[rows] = np.arange(offset, offset + len(rows))
        offset += len(rows)
    return _take(_concat([p for p, _ in parts], buf), where)


# ============================================================================ nodes


class _Node:
    """How to read one Avro type at a position per datum (``pos``, advanced in place)."""

    #: encoded size when it is the same for every value (array items read a block at once)
    size: int | None = None
    min_size = 1

    def read(self, buf: np.ndarray, pos: np.ndarray) -> _Part:
        raise NotImplementedError

    def skip(self, buf: np.ndarray, pos: np.ndarray) -> None:
        """Move past the values (a writer field the table's schema drops)."""
        self.read(buf, pos)


class _Null(_Node):
    size = 0
    min_size = 0

    def read(self, buf, pos):  # pragma: no cover - nulls are read by their union
        raise Malformed("null outside a union")

    def skip(self, buf, pos):
        pass


class _Boolean(_Node):
    size = 1

    def read(self, buf, pos):
        v = buf[pos] != 0  # fastavro: any byte other than 0 is true
        pos += 1
        return pa.array(v, pa.bool_())

    def skip(self, buf, pos):
        pos += 1


#: int/long outputs: (numpy dtype, smallest, largest, multiplier to µs)
_LONGS: dict[str, tuple[Any, int | None, int | None, int]] = {
    "int": (np.int32, -(2**31), 2**31 - 1, 1),
    "long": (np.int64, None, None, 1),
    "float": (np.float32, None, None, 1),
    "double": (np.float64, None, None, 1),
    "date": (np.int32, -719_162, 2_932_896, 1),  # date.fromordinal's range
    "time-millis": (np.int64, 0, _DAY_US // 1000 - 1, 1000),
    "time-micros": (np.int64, 0, _DAY_US - 1, 1),
    "timestamp-millis": (np.int64, -(-_MIN_US // 1000), _MAX_US // 1000, 1000),
    "timestamp-micros": (np.int64, _MIN_US, _MAX_US, 1),
}


class _Long(_Node):
    """A zig-zag varint (int, long, enum index, and the logical types on them)."""

    def __init__(self, kind: str = "long", typ: pa.DataType | None = None):
        self.dtype, self.lo, self.hi, self.mul = _LONGS[kind]
        self.typ = typ

    def read(self, buf, pos):
        v, n = varint(buf, pos, 10)
        pos += n
        if self.lo is not None and ((v < self.lo) | (v > self.hi)).any():
            raise Malformed("value out of range")
        if self.mul != 1:
            v = v * self.mul
        if self.dtype == np.float32:  # as Python does: the int to a double, then to float32
            return pa.array(v.astype(np.float64).astype(np.float32), self.typ)
        return pa.array(v.astype(self.dtype, copy=False), self.typ)

    def skip(self, buf, pos):
        pos += varint(buf, pos, 10)[1]


class _Float(_Node):
    def __init__(self, size: int, typ: pa.DataType | None = None):
        self.size = size
        self.typ = typ

    def read(self, buf, pos):
        v = fixed(buf, pos, self.size).view(np.float32 if self.size == 4 else np.float64)
        pos += self.size
        if self.size == 4 and self.typ == pa.float64():  # float read as double: exact
            v = v.astype(np.float64)
        return pa.array(v, self.typ)

    def skip(self, buf, pos):
        pos += self.size


def _spans(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Length-prefixed byte ranges at ``pos`` -> (starts, lengths); ``pos`` moves past them."""
    ln, n = varint(buf, pos, 10)
    start = pos + n
    if (ln < 0).any() or (ln > len(buf) - start).any():
        raise Malformed("length out of range")
    pos[:] = start + ln
    return start, ln


class _Bytes(_Node):
    """bytes or string, into a binary or string column (``utf8``: validated as text)."""

    def __init__(self, typ: pa.DataType | None = None, utf8: bool = False):
        self.typ, self.utf8 = typ, utf8

    def read(self, buf, pos):
        start, ln = _spans(buf, pos)
        return _Slices(start, ln, self.typ, self.utf8)

    def skip(self, buf, pos):
        _spans(buf, pos)  # not validated as text: fastavro skips it unread


_AR36 = np.arange(36)
_HYPHENS = np.array([8, 13, 18, 23])
_HEX = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])


class _Uuid(_Bytes):
    """A uuid string; fastavro gives ``uuid.UUID(s)`` and the row ``str()`` of it: only the
    canonical form (36 lower-case characters) is read here."""

    def read(self, buf, pos):
        start, ln = _spans(buf, pos)
        if (ln != 36).any():
            raise Malformed("uuid not in canonical form")
        m = buf[start[:, None] + _AR36]
        h = m[:, _HEX]
        if (
            not (m[:, _HYPHENS] == ord("-")).all()
            or not (((h >= ord("0")) & (h <= ord("9"))) | ((h >= ord("a")) & (h <= ord("f")))).all()
        ):
            raise Malformed("uuid not in canonical form")
        return _Slices(start, ln, self.typ, True)


class _Fixed(_Node):
    def __init__(self, size: int, typ: pa.DataType | None = None):
        self.size = self.min_size = size
        self.typ = typ

    def read(self, buf, pos):
        start = pos.copy()
        self.skip(buf, pos)
        return _Slices(start, np.full(len(pos), self.size, np.int64), self.typ, False)

    def skip(self, buf, pos):
        pos += self.size
        if len(pos) and pos.max() > len(buf):
            raise Malformed("fixed runs past the values")


_AR16 = np.arange(16)


class _Decimal(_Node):
    """A decimal on bytes (``size`` None) or fixed: big-endian two's complement, unscaled."""

    def __init__(self, size: int | None, typ: pa.Decimal128Type):
        self.size = size
        self.min_size = 1 if size is None else size
        self.typ = typ

    def read(self, buf, pos):
        if self.size is None:
            start, ln = _spans(buf, pos)
        else:
            start, ln = pos.copy(), np.full(len(pos), self.size, np.int64)
            pos += self.size
        if (ln > 16).any() or (len(pos) and pos.max() > len(buf)):
            raise Malformed("decimal wider than 128 bits")
        k = len(pos)
        back = start[:, None] + ln[:, None] - 1 - _AR16[None, :]  # little-endian byte j
        inside = _AR16[None, :] < ln[:, None]
        negative = (ln > 0) & (buf[start] >= 0x80)
        le = np.where(inside, buf[np.where(inside, back, 0)], np.where(negative, 0xFF, 0)[:, None]).astype(
            _U8
        )
        raw = pa.Array.from_buffers(pa.decimal128(38, self.typ.scale), k, [None, pa.py_buffer(le.tobytes())])
        # a value beyond the precision: fastavro rounds it, then the column rejects it
        return raw.cast(pa.decimal256(76, self.typ.scale)).cast(self.typ)


class _Enum(_Node):
    def __init__(self, lookup: np.ndarray, names: pa.Array):
        self.lookup, self.names = lookup, names  # writer index -> index into names (-1: error)

    def read(self, buf, pos):
        i, n = varint(buf, pos, 10)
        pos += n
        if (i < 0).any() or (i >= len(self.lookup)).any():
            raise Malformed("enum index out of range")
        j = self.lookup[i]
        if (j < 0).any():
            raise Malformed("enum symbol the table's enum lacks")
        return self.names.take(pa.array(j))

    def skip(self, buf, pos):
        pos += varint(buf, pos, 10)[1]


class _Record(_Node):
    def __init__(
        self,
        fields: list[tuple[_Node, int | None]],
        defaults: list[tuple[int, pa.Array]],
        typ: pa.StructType | None,
    ):
        self.fields, self.defaults, self.typ = fields, defaults, typ
        self.min_size = sum(f.min_size for f, _ in fields)

    def read(self, buf, pos):
        assert self.typ is not None
        cols: list[Any] = [None] * self.typ.num_fields
        for node, j in self.fields:
            if j is None:
                node.skip(buf, pos)
            else:
                cols[j] = node.read(buf, pos)
        if self.defaults:
            zeros = pa.array(np.zeros(len(pos), np.int64))
            for j, value in self.defaults:
                cols[j] = value.take(zeros)
        return pa.StructArray.from_arrays([_arrow(c, buf) for c in cols], fields=list(self.typ))

    def skip(self, buf, pos):
        for node, _ in self.fields:
            node.skip(buf, pos)


def _counts(buf: np.ndarray, pos: np.ndarray, reading: bool) -> np.ndarray:
    """Block counts at ``pos`` (a negative count: its absolute value, then a byte size that
    fastavro reads past); ``pos`` moves past them."""
    c, n = varint(buf, pos, 10)
    pos += n
    neg = c < 0
    if neg.any():
        if not reading:  # fastavro skips such a block by its byte size, unread
            raise Malformed("negative block count in a skipped value")
        c = np.abs(c)
        q = pos[neg]
        q += varint(buf, q, 10)[1]
        pos[neg] = q
    if (c < 0).any() or (c > len(buf)).any():
        raise Malformed("block count out of range")
    return c


class _Repeated(_Node):
    """An array (``key`` None) or a map (string keys): blocks of items."""

    def __init__(self, item: _Node, typ: pa.DataType | None, key: _Bytes | None = None):
        self.item, self.typ, self.key = item, typ, key

    def _walk(self, buf, pos, reading: bool):
        """Read (or skip) the items of every datum: (items per datum, [(key part, item part,
        datum of each item, index of each item in its datum)]) in reading order."""
        k = len(pos)
        total = np.zeros(k, np.int64)
        remaining = _counts(buf, pos, reading)
        chunks = []
        size = self.item.size if self.key is None else None
        active = np.flatnonzero(remaining)
        steps = 0
        while len(active):
            steps += 1
            if steps > _MAX_STEPS:
                raise Malformed("too many items for the columnar decoder")
            p = pos[active]
            if size is not None:  # the whole block at once
                m = remaining[active]
                first = np.repeat(np.cumsum(m) - m, m)
                within = np.arange(len(first)) - first
                if len(within) * size > len(buf):
                    raise Malformed("block runs past the values")
                at = np.repeat(p, m) + within * size
                item = self.item.read(buf, at) if reading else None
                p += m * size
                rows = np.repeat(active, m)
                idx = np.repeat(total[active], m) + within
                total[active] += m
                remaining[active] = 0
                keys = None
            elif reading:  # the next item of every datum that has one
                keys = None if self.key is None else self.key.read(buf, p)
                item = self.item.read(buf, p)
            else:
                if self.key is not None:
                    self.key.skip(buf, p)
                self.item.skip(buf, p)
            if size is None:
                rows, idx = active, total[active]
                total[active] += 1
                remaining[active] -= 1
            pos[active] = p
            if reading:
                chunks.append((keys, item, rows, idx))
            done = active[remaining[active] == 0]
            if len(done):
                q = pos[done]
                remaining[done] = _counts(buf, q, reading)
                pos[done] = q
            active = np.flatnonzero(remaining)
        return total, chunks

    def skip(self, buf, pos):
        self._walk(buf, pos, False)

    def read(self, buf, pos):
        assert self.typ is not None
        total, chunks = self._walk(buf, pos, True)
        offsets = np.zeros(len(pos) + 1, np.int64)
        np.cumsum(total, out=offsets[1:])
        if len(chunks) == 1 and len(chunks[0][2]) == offsets[-1] and (np.diff(chunks[0][2]) >= 0).all():
            _, items, _, _ = chunks[0]  # one item per datum at most, or one block: in order
            keys = chunks[0][0]
        elif chunks:
            rows = np.concatenate([c[2] for c in chunks])
            idx = np.concatenate([c[3] for c in chunks])
            src = np.empty(len(rows), np.int64)
            src[offsets[rows] + idx] = np.arange(len(rows))
            items = _take(_concat([c[1] for c in chunks], buf), src)
            keys = None if self.key is None else _take(_concat([c[0] for c in chunks], buf), src)
        else:
            items = pa.array([], self._item_type())
            keys = _Slices(np.zeros(0, np.int64), np.zeros(0, np.int64), pa.string(), True)
        offs = pa.array(offsets.astype(np.int32))
        if self.key is None:
            return pa.ListArray.from_arrays(offs, _arrow(items, buf), type=self.typ)
        key_arr = _arrow(keys, buf)
        if len(total) and total.max() > 1:  # a datum with two entries: is a key given twice?
            ids = key_arr.dictionary_encode().indices.to_numpy().astype(np.int64)
            pair = np.repeat(np.arange(len(pos), dtype=np.int64), total) * (int(ids.max()) + 1) + ids
            if len(np.unique(pair)) != len(pair):
                raise Malformed("map key given twice (fastavro keeps the last)")
        return pa.MapArray.from_arrays(offs, key_arr, _arrow(items, buf), type=self.typ)

    def _item_type(self) -> pa.DataType:
        assert self.typ is not None
        return self.typ.value_type if self.key is None else self.typ.item_type


class _Union(_Node):
    """A writer union. ``branches[i]``: (node, member) for writer branch ``i``; node None reads
    a null; member -1 is a null, -2 a branch the table's schema cannot take (fastavro fails).
    ``fields``: the table's union members (None: one column, a nullable union or no union)."""

    def __init__(self, branches: list[tuple[_Node | None, int]], typ: pa.DataType | None, fields):
        self.branches, self.typ, self.fields = branches, typ, fields
        self.nulls = np.array([node is None for node, _ in branches])

    def _index(self, buf, pos) -> np.ndarray:
        b, n = varint(buf, pos, 10)
        pos += n
        if (b < 0).any() or (b >= len(self.branches)).any():
            raise Malformed("union index out of range")
        return b

    def _each(self, buf, pos, b, fn) -> None:
        used = np.flatnonzero(np.bincount(b, minlength=len(self.branches)))
        for i in used.tolist():
            node, member = self.branches[i]
            if member == -2:
                raise Malformed("a union branch the table's schema cannot take")
            if node is None:
                continue
            if len(used) == 1:
                fn(node, member, np.arange(len(pos)), pos)
            else:
                rows = np.flatnonzero(b == i)
                sub = pos[rows]
                fn(node, member, rows, sub)
                pos[rows] = sub

    def skip(self, buf, pos):
        self._each(buf, pos, self._index(buf, pos), lambda node, member, rows, sub: node.skip(buf, sub))

    def read(self, buf, pos):
        b = self._index(buf, pos)
        parts: dict[int, list] = {}
        self._each(
            buf,
            pos,
            b,
            lambda node, member, rows, sub: parts.setdefault(member, []).append((node.read(buf, sub), rows)),
        )
        k = len(pos)
        if self.fields is None:
            return _scatter(parts.get(0, []), k, self.typ, buf)
        children = [
            _arrow(_scatter(parts.get(m, []), k, f.type, buf), buf) for m, f in enumerate(self.fields)
        ]
        null = self.nulls[b]
        return pa.StructArray.from_arrays(
            children, fields=self.fields, mask=pa.array(null) if null.any() else None
        )


class _AsMember(_Node):
    """A writer type that is not a union read into a union of the table's schema."""

    def __init__(self, inner: _Node, member: int, fields):
        self.inner, self.member, self.fields = inner, member, fields
        self.size, self.min_size = inner.size, inner.min_size

    def read(self, buf, pos):
        part = self.inner.read(buf, pos)
        if self.fields is None:
            return part
        k = len(pos)
        children = [
            _arrow(part, buf) if m == self.member else pa.nulls(k, f.type) for m, f in enumerate(self.fields)
        ]
        return pa.StructArray.from_arrays(children, fields=self.fields)


# ============================================================================ plans


@dataclass
class Plan:
    """How to read the datums of one writer schema into the table's columns."""

    root: _Node
    arrow_type: pa.DataType  # the mapping's type of the table's schema


def plan_for(writer: Any, reader: Any | None, mapper: AvroMapper) -> Plan | None:
    """The plan for datums written with ``writer`` and read, as fastavro reads them, with the
    table's schema ``reader`` (None: the writer's schema is the table's) into ``mapper``'s
    columns; None when this decoder leaves such datums to fastavro (module docstring)."""
    try:
        root = _Builder(writer, reader, mapper).node(None, None, mapper.arrow_type, ())
    except (
        _Unsupported,
        SchemaResolutionError,
        KeyError,
        TypeError,
        ValueError,
        IndexError,
        pa.ArrowException,
    ):
        return None  # SchemaResolutionError: fastavro fails every datum of this writer
    return Plan(root, mapper.arrow_type)


def _logical(s: Any) -> tuple | None:
    """The logical conversion of schema ``s`` that fastavro and the mapping both apply (None:
    the base type's); raises :class:`_Unsupported` for one they treat differently."""
    if not isinstance(s, dict) or "logicalType" not in s:
        return None
    base, lt = s["type"], s["logicalType"]
    if (base, lt) in _LOGICAL:
        return (lt, s.get("precision"), s.get("scale", 0)) if lt == "decimal" else (lt,)
    if lt in _MAPPED_ANYWHERE or f"{base}-{lt}" in LOGICAL_READERS:
        raise _Unsupported(f"logical type {lt} on {base}")
    return None  # a logicalType neither knows: the base type


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise _Unsupported(what)


class _Builder:
    """Walks the writer's schema as fastavro's ``_read_data`` does (with the table's schema as
    the reader, resolved by fastavro's own ``match_schemas``/``match_types``) and the mapping's
    Arrow types beside it."""

    def __init__(self, writer: Any, reader: Any | None, mapper: AvroMapper):
        if reader is not None and writer == reader:
            reader = None  # fastavro's schemaless_reader: no resolution
        self.named: dict[str, dict[str, Any]] = {"writer": {}, "reader": {}}
        self.writer = parse_schema(writer, self.named["writer"])
        self.reader = None if reader is None else parse_schema(reader, self.named["reader"])
        self.resolving = reader is not None
        self.mapper = mapper

    # --- the table's side (what the mapping made of the reader's schema) -------------------

    def _deref_table(self, s: Any) -> Any:
        named = self.named["reader" if self.resolving else "writer"]
        while isinstance(s, str) and s in named:
            s = named[s]
        return s

    def _kind(self, s: Any) -> str:
        """The Python kind of the values of (table) schema ``s``, as ``_matches`` tells them."""
        s = self._deref_table(s)
        logical = _logical(s)
        t = logical[0] if logical is not None else extract_record_type(s)
        _check(isinstance(t, str) and t in KINDS, f"union branch {t}")
        return KINDS[t]

    def _members(self, union: list, t: pa.DataType) -> tuple[list, list | None, bool]:
        """The table's union: its non-null branches, its member fields (None: a nullable union,
        one column), whether records are told apart by name (several records)."""
        nn = [b for b in union if b != "null"]
        _check(bool(nn), "union of null only")
        if len(nn) == 1:
            return nn, None, False
        _check(pa.types.is_struct(t) and t.num_fields == len(nn), "union type")
        kinds = [self._kind(b) for b in nn]
        records = [extract_record_type(self._deref_table(b)) == "record" for b in nn]
        dicts = kinds.count("dict")
        _check(dicts == sum(records) or dicts <= 1, "union of a map and a record")
        others = [k for k in kinds if k != "dict"]
        _check(len(set(others)) == len(others), "union branches of one kind")
        return nn, list(t), sum(records) > 1

    def _member(self, nn: list, rb_index: int, writer_type: Any, multi: bool) -> int:
        """Which member of the table's union a plain (not name-tagged) value read with the
        table's branch ``nn[rb_index]`` lands in: the first member ``_matches`` accepts it."""
        rb = self._deref_table(nn[rb_index])
        kind = self._kind(rb)
        if kind == "float" and extract_record_type(rb) == "float":
            wt = extract_record_type(self._deref_writer(writer_type))
            _check(wt == "float", "int or long promoted to a float member (float32 or not)")
        if kind == "dict" and multi:  # the first record whose fields hold the value's keys
            keys = {f["name"] for f in rb["fields"]}
            for i, b in enumerate(nn):
                m = self._deref_table(b)
                if extract_record_type(m) == "record" and keys <= {f["name"] for f in m["fields"]}:
                    _check(i == rb_index, "record read into an earlier record member")
                    break
        return rb_index

    # --- the writer's side -----------------------------------------------------------------

    def _deref_writer(self, s: Any) -> Any:
        while isinstance(s, str) and s in self.named["writer"]:
            s = self.named["writer"][s]
        return s

    def node(self, w: Any, r: Any, t: pa.DataType, stack: tuple[str, ...]) -> _Node:
        """``_read_data(w, r)``: the node reading writer type ``w`` (resolved against ``r``
        when resolving) into a column of type ``t``. ``None, None`` is the top level."""
        if w is None:
            w, r = self.writer, self.reader
        if self.resolving:
            if isinstance(r, list) and not isinstance(w, list):
                rb = match_schemas(w, r, self.named)  # the first branch the writer matches
                _check(rb != "null", "null read into a union")
                nn, fields, multi = self._members(r, t)
                i = next(i for i, b in enumerate(nn) if b is rb)
                mt = t if fields is None else fields[i].type
                member = 0 if fields is None else self._member(nn, i, w, multi)
                return _AsMember(self._matched(w, rb, mt, stack), member, fields)
            r = match_schemas(w, r, self.named)
        return self._matched(w, r, t, stack)

    def _matched(self, w: Any, r: Any, t: pa.DataType, stack: tuple[str, ...]) -> _Node:
        """The rest of ``_read_data`` once ``r`` is the reader schema matched to ``w``."""
        rt = extract_record_type(w)
        _check(isinstance(rt, str), "nested type declaration")
        if rt not in AVRO_TYPES:  # a named type by its name
            _check(rt not in stack, f"{rt} used inside itself")
            inner = self.named["writer"][rt]
            if not self.resolving:
                return self.node(inner, None, t, stack)
            _check(isinstance(r, str) and r in self.named["reader"], "named type read into an inline one")
            return self.node(inner, self.named["reader"][r], t, stack)
        logical = _logical(w)
        if self.resolving:
            _check(_logical(self._deref_table(r)) == logical, "logical types differ")
        if logical is not None:
            return self._logical_node(w, logical, t)
        target = extract_record_type(r) if self.resolving else rt  # fastavro's maybe_promote
        if rt in ("int", "long"):
            kind = {
                "int": "int" if rt == "int" else None,
                "long": "long",
                "float": "float",
                "double": "double",
            }
            k = kind.get(target)
            _check(k is not None and t == _ARROW[k], "int/long column")
            return _Long(k, t)  # type: ignore[arg-type]
        if rt in ("float", "double"):
            _check(t == _ARROW[target] and (rt == target or rt == "float"), "float column")
            return _Float(4 if rt == "float" else 8, t)
        if rt == "boolean":
            _check(t == pa.bool_(), "boolean column")
            return _Boolean()
        if rt in ("string", "bytes"):
            out = target if target in ("string", "bytes") else rt
            _check(t == (pa.string() if out == "string" else pa.binary()), "string/bytes column")
            return _Bytes(t, utf8=rt == "string" or out == "string")
        if rt == "fixed":
            _check(t == pa.binary() and w["size"] >= 1, "fixed column")
            return _Fixed(w["size"], t)
        if rt == "enum":
            return self._enum(w, r, t)
        if rt == "array":
            _check(pa.types.is_list(t), "array column")
            item = self.node(w["items"], r["items"] if self.resolving else None, t.value_type, stack)
            _check(item.min_size >= 1, "array items that may take no bytes")
            return _Repeated(item, t)
        if rt == "map":
            _check(pa.types.is_map(t) and t.key_type == pa.string(), "map column")
            value = self.node(w["values"], r["values"] if self.resolving else None, t.item_type, stack)
            return _Repeated(value, t, key=_Bytes(pa.string(), utf8=True))
        if rt == "union":
            return self._union(w, r, t, stack)
        if rt == "record":
            return self._record(w, r, t, stack)
        raise _Unsupported(f"Avro type {rt}")

    def _logical_node(self, w: dict, logical: tuple, t: pa.DataType) -> _Node:
        lt = logical[0]
        if lt == "decimal":
            p, s = int(w["precision"]), int(w.get("scale", 0))
            _check(t == pa.decimal128(p, s) and p <= 38, "decimal column")
            size = w["size"] if w["type"] == "fixed" else None
            _check(size is None or 1 <= size <= 16, "decimal wider than 128 bits")
            return _Decimal(size, t)
        if lt == "uuid":
            _check(t == pa.string(), "uuid column")
            return _Uuid(t, utf8=True)
        expected = {
            "date": pa.date32(),
            "time-millis": pa.time64("us"),
            "time-micros": pa.time64("us"),
            "timestamp-millis": pa.timestamp("us", tz="UTC"),
            "timestamp-micros": pa.timestamp("us", tz="UTC"),
            "local-timestamp-millis": pa.timestamp("us"),
            "local-timestamp-micros": pa.timestamp("us"),
        }[lt]
        _check(t == expected, f"{lt} column")
        return _Long(lt.replace("local-", ""), t)

    def _enum(self, w: dict, r: Any, t: pa.DataType) -> _Node:
        _check(t == pa.string(), "enum column")
        symbols = list(w["symbols"])
        if not self.resolving:
            return _Enum(np.arange(len(symbols)), pa.array(symbols, pa.string()))
        _check(isinstance(r, dict) and r.get("type") == "enum", "enum read into a named reference")
        default = r.get("default")
        out = [s if s in r["symbols"] else (default if default else None) for s in symbols]
        names = sorted({s for s in out if s is not None})
        lookup = np.array([-1 if s is None else names.index(s) for s in out], np.int64)
        return _Enum(lookup, pa.array(names, pa.string()))

    def _record(self, w: dict, r: Any, t: pa.DataType, stack: tuple[str, ...]) -> _Node:
        _check(pa.types.is_struct(t) and bool(w["fields"]), "record column")
        table = r if self.resolving else w
        _check(
            isinstance(table, dict) and table.get("type") == "record", "record read into a named reference"
        )
        _check(not w.get("aliases") and not table.get("aliases"), "record aliases")
        _check(not any(f.get("aliases") for f in table["fields"]), "field aliases")
        _check([f.name for f in t] == [f["name"] for f in table["fields"]], "record fields")
        inner = stack + (table["name"],)
        by_name = {f["name"]: j for j, f in enumerate(table["fields"])}
        fields: list[tuple[_Node, int | None]] = []
        for f in w["fields"]:
            j = by_name.pop(f["name"], None)
            if j is None:
                fields.append((self._skipper(f["type"], ()), None))
            else:
                rt = table["fields"][j]["type"] if self.resolving else None
                fields.append((self.node(f["type"], rt, t.field(j).type, inner), j))
        defaults = []
        for j in by_name.values():  # fastavro fills them with the field's default
            field = table["fields"][j]
            _check("default" in field, "a table field the writer lacks, without a default")
            value = self.mapper.value_array(field["type"], field["default"])
            _check(value.type == t.field(j).type, "default's type")
            defaults.append((j, value))
        return _Record(fields, defaults, t)

    def _union(self, w: list, r: Any, t: pa.DataType, stack: tuple[str, ...]) -> _Node:
        table = r if self.resolving else w
        tagged = not is_single_record_union(w)  # fastavro names the records of such unions
        if isinstance(table, list):
            nn, fields, multi = self._members(table, t)
        else:
            nn, fields, multi = [table], None, False  # a union read into a single type
        branches: list[tuple[_Node | None, int]] = []
        for b in w:
            rb_index = self._branch(b, table, nn)
            if rb_index is None:
                branches.append((None, -1 if b == "null" and table != nn else -2))
                continue
            rb = nn[rb_index]
            mt = t if fields is None else fields[rb_index].type
            node = self.node(b, rb if self.resolving else None, mt, stack)
            bt = extract_record_type(b)
            if tagged and (bt == "record" or bt not in AVRO_TYPES):
                member = self._tagged(b, rb, nn, fields, isinstance(table, list))
                _check(member in (rb_index, -2), "record read into another record's member")
            elif fields is None:
                member = 0
            else:
                member = self._member(nn, rb_index, b, multi)
            branches.append((node, member))
        if not isinstance(table, list):
            branches = [(n, -2 if m == -1 else m) for n, m in branches]  # null into a non-union
        return _Union(branches, t, fields)

    def _branch(self, b: Any, table: Any, nn: list) -> int | None:
        """Index in ``nn`` of the table's branch that writer branch ``b`` is read with (None:
        a null, or no branch matches)."""
        if not self.resolving:
            return None if b == "null" else next(i for i, x in enumerate(nn) if x is b)
        if isinstance(table, list):
            for x in table:  # read_union: the first reader branch the writer's matches
                if match_types(b, x, self.named):
                    return None if x == "null" else next(i for i, y in enumerate(nn) if y is x)
            return None
        return 0 if b != "null" and match_types(b, table, self.named) else None

    def _tagged(self, b: Any, rb: Any, nn: list, fields, reader_union: bool) -> int:
        """fastavro gives ``(name, value)`` for a record (or a named type by its name) of a union
        of several: the member of that name (-2: none, the fastavro path fails)."""
        _check(fields is not None, "name-tagged value outside a union of several members")
        if isinstance(b, dict):
            src = rb if (self.resolving and reader_union) else b
            _check(isinstance(src, dict), "record name")
            name = src["name"]
        else:
            if self.resolving and reader_union:
                _check(isinstance(rb, str), "named type read into an inline one")
                name = self.named["reader"][rb]["name"]
            else:
                name = self.named["writer"][b]["name"]
        for i, x in enumerate(nn):
            m = self._deref_table(x)
            if isinstance(m, dict) and m.get("name") == name:
                return i
        return -2

    def _skipper(self, w: Any, seen: tuple[str, ...]) -> _Node:
        """A node that moves past writer type ``w`` as fastavro's ``_skip_data`` does."""
        rt = extract_record_type(w)
        _check(isinstance(rt, str), "nested type declaration")
        if rt not in AVRO_TYPES:
            _check(rt not in seen, f"{rt} used inside itself")
            return self._skipper(self.named["writer"][rt], seen + (rt,))
        simple: dict[str, Callable[[], _Node]] = {
            "null": _Null,
            "boolean": _Boolean,
            "int": _Long,
            "long": _Long,
            "enum": _Long,
            "float": lambda: _Float(4),
            "double": lambda: _Float(8),
            "string": _Bytes,
            "bytes": _Bytes,
            "fixed": lambda: _Fixed(w["size"]),
        }
        if rt in simple:
            return simple[rt]()
        if rt == "array":
            return _Repeated(self._skipper(w["items"], seen), None)
        if rt == "map":
            return _Repeated(self._skipper(w["values"], seen), None, key=_Bytes())
        if rt == "union":
            return _Union([(None if b == "null" else self._skipper(b, seen), 0) for b in w], None, None)
        if rt == "record":
            return _Record(
                [(self._skipper(f["type"], seen + (w["name"],)), None) for f in w["fields"]], [], None
            )
        raise _Unsupported(f"Avro type {rt}")


_ARROW = {"int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64()}


def _unsupported(what: str) -> str:
    raise _Unsupported(what)


# ============================================================================ decoding


def decode(plan: Plan, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.Array | None:
    """The table's column (``plan.arrow_type``) of the datums at ``buf[starts:ends]``, or None
    when fastavro must decode them."""
    pos = starts.copy()
    try:
        part = plan.root.read(buf, pos)
        if (pos > ends).any():
            return None
        arr = _arrow(part, buf)
    except (Malformed, pa.ArrowInvalid, IndexError):
        return None
    return arr if arr.type == plan.arrow_type else None


#: Per schema id: its plan (None: fastavro) and whether its rows keep their bytes.
PlanOf = Callable[[int], tuple[Plan | None, bool]]


def decode_framed(
    col: pa.Array, arrow_type: pa.DataType, wrap: bool, plan_of: PlanOf
) -> tuple[list[pa.Array], pa.Array, pa.Array, pa.BooleanArray | None] | None:
    """``Side.decode_arrow`` of Confluent-framed Avro values: the decoded children (one column
    ``value`` when ``wrap``), prefixes, errors (none) and the rows whose writer schema loses
    data; None when a value is not framed, names a schema id without a plan, or does not decode
    (the caller then decodes the batch value by value with fastavro)."""
    n = len(col)
    if col.type != pa.binary():
        col = col.cast(pa.binary())
    buf, offsets = column_buffer(col)
    rows = np.flatnonzero(np.asarray(col.is_valid())) if col.null_count else np.arange(n)
    if len(rows) == 0:
        return None
    starts, ends = offsets[:-1][rows], offsets[1:][rows]
    sid = preamble_ids(buf, starts, ends, 5)
    if sid is None:
        return None  # too short for a preamble, or no magic byte
    ids = np.unique(sid)
    parts = []
    lossy = None
    for i in ids.tolist():
        plan, loses = plan_of(i)
        if plan is None:
            return None
        sel = slice(None) if len(ids) == 1 else sid == i
        arr = decode(plan, buf, starts[sel] + 5, ends[sel])
        if arr is None:
            return None
        parts.append((arr, rows[sel]))
        if loses:
            lossy = np.zeros(n, bool) if lossy is None else lossy
            lossy[rows[sel]] = True
    out = _arrow(_scatter(parts, n, arrow_type, buf), buf)
    children = [out] if wrap else out.flatten()
    return (
        children,
        pc.binary_slice(col, 0, 5),
        pa.nulls(n, pa.string()),
        None if lossy is None else pa.array(lossy),
    )
