"""A columnar Protobuf decoder: a whole batch of messages parsed from the wire format with numpy.

:class:`~rsm_sidecar.iceberg.decoding.proto_mapping.ProtoDecoder` parses each payload with upb
and pulls every column out of the parsed messages; about 55 % of that time is upb creating and
freeing Python objects (docs/iceberg.md "Performance"). This module reads the same columns
straight from the bytes of all payloads at once: a loop over the schema's fields in number order,
reading each field where every message has it (:func:`_tokenize_in_order`: the order every
Protobuf library writes), or, for a batch with a message whose fields are in another order, a loop
over the *n*-th field of every message (:func:`_tokenize`); never a loop over messages. Then one
vectorised pass per column. It gives exactly the Arrow arrays and loss flags the upb path gives,
or refuses, and the caller then runs the upb path on the batch:

* at build time (:func:`plan_for` returns None), for a schema with a map, a group, a wrapper or
  ``Struct``/``Value`` well-known type, a recursion point, or a ``required`` field;
* per batch (:func:`decode` returns None), for bytes that the upb path would treat in a way this
  decoder does not reproduce: an unknown field number (upb keeps it for ``__unrecognized__``),
  a wire type that does not match the field, a message-typed field given twice (upb merges the
  two), two members of one ``oneof``, an enum number the enum does not name, a repeated scalar
  both packed and unpacked, a string that is not UTF-8, or anything malformed (upb then raises
  its own error, which the caller turns into ``__err__``).

What it reproduces: last value wins for a scalar given twice; proto3 fields without presence
read as their default when absent, fields with presence as null; ``int32``/``uint32`` keep the
low 32 bits of the varint and ``uint32``/``uint64``/``fixed*`` wrap into the signed column (or
``uint32`` into ``long`` with ``uint32_as_long``); ``sint*`` zig-zag; a ``bool`` is any non-zero
varint; packed repeated scalars; ``Timestamp``/``Duration`` to micro-seconds with the sub-µs
loss flag. Memory: the batch's payload bytes once (``column_buffer``); 48 bytes per field
occurrence (room for 16 per message at first, doubled when more come, never more than one per
2 payload bytes); per column, a few arrays the length of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor

from rsm_sidecar.iceberg.columnar_bytes import Malformed, column_buffer, fixed, gather, uvarint, zigzag
from rsm_sidecar.iceberg.decoding import proto_mapping as pm

_T = FieldDescriptor
_WIRE = {
    **dict.fromkeys(
        (_T.TYPE_INT32, _T.TYPE_INT64, _T.TYPE_UINT32, _T.TYPE_UINT64, _T.TYPE_SINT32, _T.TYPE_SINT64),
        0,
    ),
    _T.TYPE_BOOL: 0,
    _T.TYPE_ENUM: 0,
    _T.TYPE_FIXED64: 1,
    _T.TYPE_SFIXED64: 1,
    _T.TYPE_DOUBLE: 1,
    _T.TYPE_FIXED32: 5,
    _T.TYPE_SFIXED32: 5,
    _T.TYPE_FLOAT: 5,
    _T.TYPE_STRING: 2,
    _T.TYPE_BYTES: 2,
    _T.TYPE_MESSAGE: 2,
}
_SIZE = {1: 8, 5: 4}
_U32 = np.uint64(0xFFFFFFFF)


@dataclass
class _Field:
    number: int
    kind: str  # "scalar" | "enum" | "message" | "time"
    type: int  # FieldDescriptor.TYPE_*
    wire: int
    repeated: bool
    presence: bool
    arrow: pa.DataType  # the column's type (a list type when repeated)
    elem_arrow: pa.DataType  # the element's type
    wide_uint32: bool = False  # uint32/fixed32 -> long
    message: _Plan | None = None
    enum_numbers: np.ndarray | None = None
    enum_names: pa.Array | None = None


@dataclass
class _Plan:
    """How to read one message type's columns (its fields in column order)."""

    fields: list[_Field]
    arrow_fields: list[pa.Field]
    oneofs: list[list[int]] = field(default_factory=list)  # field numbers of each real oneof

    def __post_init__(self) -> None:
        self.numbers = np.array(sorted(f.number for f in self.fields), np.int64)
        self.walk = _walk([(f.number, f.wire, f.repeated) for f in self.fields])


@dataclass(frozen=True)
class _Step:
    """One field of :func:`_tokenize_in_order`'s walk: the bytes of its tag and its wire type."""

    number: int
    wire: int
    repeated: bool
    tag: tuple[int, ...]  # the tag's varint bytes (one or two)


def _walk(fields: list[tuple[int, int, bool]]) -> list[_Step] | None:
    """The steps of :func:`_tokenize_in_order` for fields ``(number, wire, repeated)``: by field
    number, a repeated scalar as its packed form then its unpacked one. None when a tag takes
    more than two bytes (field numbers from 2048 on)."""
    steps = []
    for number, wire, repeated in sorted(fields):
        wires = (2, wire) if repeated and wire != 2 else (wire,)
        for w in wires:
            tag = number << 3 | w
            if tag >= 1 << 14:
                return None
            raw = (tag,) if tag < 0x80 else (tag & 0x7F | 0x80, tag >> 7)
            steps.append(_Step(number, w, repeated, raw))
    return steps


# ----------------------------------------------------------------------------- plans


def plan_for(decoder: pm.ProtoDecoder) -> _Plan | None:
    """How to read ``decoder``'s message from its bytes, or None when its schema has something
    this decoder leaves to upb (see the module docstring)."""
    options = decoder.options

    def elem(fd, conv) -> _Field | None:
        common = dict(number=fd.number, type=fd.type, repeated=fd.is_repeated, arrow=None)
        if isinstance(conv, pm._Scalar):
            if fd.type not in _WIRE:
                return None
            wide = fd.type in (_T.TYPE_UINT32, _T.TYPE_FIXED32) and options.uint32_as_long
            return _Field(kind="scalar", wire=_WIRE[fd.type], presence=False, elem_arrow=conv.arrow,
                          wide_uint32=wide, **common)  # fmt: skip
        if isinstance(conv, pm._Enum):
            items = sorted(conv.names.items())
            return _Field(kind="enum", wire=0, presence=False, elem_arrow=pa.string(),
                          enum_numbers=np.array([k for k, _ in items], np.int64),
                          enum_names=pa.array([v for _, v in items], pa.string()), **common)  # fmt: skip
        if isinstance(conv, (pm._Timestamp, pm._Duration)):
            return _Field(kind="time", wire=2, presence=False, elem_arrow=conv.arrow, **common)  # fmt: skip
        if isinstance(conv, pm._Message) and fd.type == _T.TYPE_MESSAGE:
            sub = build(conv)
            if sub is None:
                return None
            return _Field(kind="message", wire=2, presence=False, elem_arrow=conv.arrow, message=sub,
                          **common)  # fmt: skip
        return None  # maps, groups, wrappers, JSON well-known types, recursion points

    def build(conv) -> _Plan | None:
        fields = []
        for fd, f in zip(conv.desc.fields, conv.fields, strict=True):
            if fd.is_required:
                return None
            inner = f.conv.elem if isinstance(f.conv, pm._List) else f.conv
            if isinstance(f.conv, pm._Map) or (fd.is_repeated and not isinstance(f.conv, pm._List)):
                return None
            out = elem(fd, inner)
            if out is None:
                return None
            out.arrow, out.presence = f.conv.arrow, f.has_presence
            fields.append(out)
        oneofs = [[fd.number for fd in o.fields] for o in conv.desc.oneofs if len(o.fields) > 1]
        return _Plan(fields, conv.arrow_fields, oneofs)

    return build(decoder.message_converter)


# ----------------------------------------------------------------------------- decoding


@dataclass
class _Tokens:
    """Every field occurrence of a set of messages, in field-position order (all first fields,
    then all second fields...): so for one message, a later occurrence comes later."""

    msg: np.ndarray  # index of the message (into the starts/ends decoded)
    field: np.ndarray
    wire: np.ndarray
    value: np.ndarray  # uint64: varint or fixed value
    start: np.ndarray  # length-delimited: where the bytes start
    length: np.ndarray


def _new_tokens(cap: int) -> _Tokens:
    i64 = np.int64
    return _Tokens(np.empty(cap, i64), np.empty(cap, i64), np.empty(cap, i64), np.empty(cap, np.uint64),
                   np.zeros(cap, i64), np.zeros(cap, i64))  # fmt: skip


def _grown(tok: _Tokens, used: int, cap: int) -> _Tokens:
    """``tok`` with room for ``cap`` tokens, its first ``used`` kept."""
    out = _new_tokens(cap)
    for name in ("msg", "field", "wire", "value", "start", "length"):
        getattr(out, name)[:used] = getattr(tok, name)[:used]
    return out


def _tokenize(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> _Tokens:
    # 16 fields per message to start with; every field takes at least 2 bytes (tag, value)
    limit = int((ends - starts).sum()) // 2 + 1
    out = _new_tokens(min(limit, 16 * len(starts) + 16))
    used = 0
    pos = starts.copy()
    idx = np.nonzero(starts < ends)[0]
    while len(idx):
        k = len(idx)
        if used + k > len(out.msg):
            out = _grown(out, used, min(limit, 2 * (used + k)))
        at = slice(used, used + k)
        used += k
        p = pos[idx]
        end = ends[idx]
        tag, n = uvarint(buf, p, 5)
        p += n
        if (tag >= np.uint64(1 << 32)).any() or (tag < np.uint64(8)).any():
            raise Malformed("field number out of range")
        wire = (tag & np.uint64(7)).astype(np.int64)
        out.msg[at], out.field[at], out.wire[at] = idx, tag >> np.uint64(3), wire
        value, start, length = out.value[at], out.start[at], out.length[at]
        after = np.empty(k, np.int64)
        kinds = np.flatnonzero(np.bincount(wire, minlength=8)).tolist()
        for wt in kinds:
            m = wire == wt if len(kinds) > 1 else slice(None)
            q = p[m]
            if wt == 0:
                v, n = uvarint(buf, q, 10)
                value[m], after[m] = v, q + n
            elif wt in (1, 5):
                value[m], after[m] = fixed(buf, q, _SIZE[wt]), q + _SIZE[wt]
            elif wt == 2:
                v, n = uvarint(buf, q, 5)
                if (v >= np.uint64(1 << 31)).any():
                    raise Malformed("length out of range")
                s = q + n
                start[m], length[m] = s, v
                after[m] = s + v.astype(np.int64)
            else:  # groups (3, 4) and invalid wire types: left to upb
                raise Malformed(f"wire type {wt}")
        if (after > end).any():
            raise Malformed("field runs past its message")
        pos[idx] = after
        idx = idx[after < end]
    return _Tokens(out.msg[:used], out.field[:used], out.wire[:used], out.value[:used],
                   out.start[:used], out.length[:used])  # fmt: skip


def _tokenize_in_order(
    walk: list[_Step], buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> dict[int, _Tokens] | None:
    """The field occurrences of the messages at the spans, per field number, when every message
    has its fields in field-number order (what upb and the other Protobuf libraries write); None
    when one does not (a field out of order, a field the walk does not know, a scalar given twice),
    and the caller then runs :func:`_tokenize`.

    One step per field (``walk``): the tag at every message's position is compared with the
    field's, and the messages where it is read that field's value; a repeated field takes steps
    until no message has one more. The occurrences are the ones :func:`_tokenize` reads, in the
    same order for each message, so the same bytes raise :class:`Malformed` in both. Cheaper than
    :func:`_tokenize`: each step reads one wire type, and nothing is sorted by field afterwards.
    """
    pos = starts.copy()
    out: dict[int, list] = {}
    for step in walk:
        tag = step.tag
        cand = None  # the messages that may have one more occurrence (None: all)
        while True:
            p = pos if cand is None else pos[cand]
            e = ends if cand is None else ends[cand]
            hit = (buf[p] == tag[0]) & (p < e)
            if len(tag) == 2:
                hit &= buf[p + 1] == tag[1]
            idx = np.flatnonzero(hit)
            if len(idx) == 0:
                break
            msg = idx if cand is None else cand[idx]
            q = p[idx] + len(tag)
            wire = step.wire
            if wire == 0:
                value, nb = uvarint(buf, q, 10)
                after = q + nb
                start = length = None
            elif wire == 2:
                v, nb = uvarint(buf, q, 5)
                if (v >= np.uint64(1 << 31)).any():
                    raise Malformed("length out of range")
                start, length = q + nb, v.astype(np.int64)
                after = start + length
                value = None
            else:
                value, after = fixed(buf, q, _SIZE[wire]).astype(np.uint64), q + _SIZE[wire]
                start = length = None
            if (after > e[idx]).any():
                raise Malformed("field runs past its message")
            pos[msg] = after
            out.setdefault(step.number, []).append((msg, wire, value, start, length))
            if not step.repeated:
                break
            cand = msg
    if not np.array_equal(pos, ends):
        return None
    return {number: _joined(pieces) for number, pieces in out.items()}


_NO_TOKENS = _new_tokens(0)


def _joined(pieces: list) -> _Tokens:
    """The :class:`_Tokens` of one field's steps (the fields a wire type has no use for read as
    zeros)."""
    k = sum(len(msg) for msg, *_ in pieces)
    if len(pieces) == 1:
        msg, wire, value, start, length = pieces[0]
        zeros = np.broadcast_to(np.int64(0), (k,))
        return _Tokens(
            msg,
            np.broadcast_to(np.int64(0), (k,)),  # the field: known to the caller
            np.broadcast_to(np.int64(wire), (k,)),
            np.broadcast_to(np.uint64(0), (k,)) if value is None else value,
            zeros if start is None else start,
            zeros if length is None else length,
        )
    tok = _new_tokens(k)
    at = 0
    for msg, wire, value, start, length in pieces:
        sl = slice(at, at + len(msg))
        tok.msg[sl], tok.field[sl], tok.wire[sl] = msg, 0, wire
        tok.value[sl] = 0 if value is None else value
        tok.start[sl] = 0 if start is None else start
        tok.length[sl] = 0 if length is None else length
        at += len(msg)
    return tok


def _typed(f: _Field, v: np.ndarray) -> np.ndarray:
    """Wire values (uint64) -> the column's numpy values."""
    t = f.type
    if t in (_T.TYPE_INT64, _T.TYPE_UINT64, _T.TYPE_FIXED64, _T.TYPE_SFIXED64):
        return v.view(np.int64)
    if t in (_T.TYPE_INT32, _T.TYPE_SFIXED32, _T.TYPE_ENUM):
        return (v & _U32).astype(np.uint32).view(np.int32)
    if t in (_T.TYPE_UINT32, _T.TYPE_FIXED32):
        u = (v & _U32).astype(np.uint32)
        return u.astype(np.int64) if f.wide_uint32 else u.view(np.int32)
    if t == _T.TYPE_SINT64:
        return zigzag(v)
    if t == _T.TYPE_SINT32:
        return zigzag(v & _U32).astype(np.int32)
    if t == _T.TYPE_BOOL:
        return v != 0
    if t == _T.TYPE_DOUBLE:
        return v.view(np.float64)
    if t == _T.TYPE_FLOAT:
        return (v & _U32).astype(np.uint32).view(np.float32)
    raise Malformed(f"type {t}")  # pragma: no cover - plans hold no other scalar


def _enum_index(f: _Field, numbers: np.ndarray) -> np.ndarray:
    known = f.enum_numbers
    assert known is not None
    if len(known) == 0:
        raise Malformed("empty enum")
    i = np.minimum(np.searchsorted(known, numbers), len(known) - 1)
    if (known[i] != numbers).any():
        raise Malformed("enum number the enum does not name")  # upb: name or unknown field
    return i


def _values(f: _Field, buf: np.ndarray, tok: _Tokens, t: np.ndarray) -> pa.Array:
    """The Arrow values of the field occurrences ``t`` (one per occurrence)."""
    if f.type in (_T.TYPE_STRING, _T.TYPE_BYTES):
        return gather(buf, tok.start[t], tok.length[t], f.elem_arrow)
    typed = _typed(f, tok.value[t])
    if f.kind == "enum":
        assert f.enum_names is not None
        return f.enum_names.take(pa.array(_enum_index(f, typed.astype(np.int64))))
    return pa.array(typed, f.elem_arrow)


def _unpack(f: _Field, buf: np.ndarray, tok: _Tokens, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Packed occurrences ``t`` of a repeated scalar -> (owning token per element, uint64 values)."""
    starts, lengths = tok.start[t], tok.length[t]
    if f.wire in _SIZE:
        size = _SIZE[f.wire]
        if (lengths % size).any():
            raise Malformed("packed fixed values of a broken length")
        counts = lengths // size
        owner = np.repeat(np.arange(len(t)), counts)
        k = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return owner, fixed(buf, starts[owner] + k * size, size)
    owner_of_byte = np.repeat(np.arange(len(t)), lengths)
    first_byte = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    total = int(lengths.sum())
    pos = np.repeat(starts - first_byte, lengths) + np.arange(total)
    last = buf[pos] < 0x80  # the last byte of each varint
    nonempty = lengths > 0
    if not last[(first_byte + lengths - 1)[nonempty]].all():
        raise Malformed("packed varints cut short")
    elem_end = pos[last]
    owner = owner_of_byte[last]
    elem_start = np.empty_like(elem_end)
    if len(elem_end):
        elem_start[0] = starts[owner[0]]
        elem_start[1:] = elem_end[:-1] + 1
        first = np.ones(len(owner), bool)
        first[1:] = owner[1:] != owner[:-1]
        elem_start[first] = starts[owner[first]]
    values, n = uvarint(buf, elem_start, 10)
    if not np.array_equal(elem_start + n - 1, elem_end):
        raise Malformed("packed varint")
    return owner, values


#: :func:`_tokenize_in_order`'s walk of a ``Timestamp``/``Duration``: ``seconds``, ``nanos``
_TIME_WALK: list[_Step] = _walk([(1, 0, False), (2, 0, False)]) or []


def _times(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps/Durations at the given spans -> (µs, whether µs cut their nanos)."""
    n = len(starts)
    secs = np.zeros(n, np.int64)
    nanos = np.zeros(n, np.int64)
    by_field = _tokenize_in_order(_TIME_WALK, buf, starts, ends)
    if by_field is not None:  # seconds then nanos, each at most once
        if (tok := by_field.get(1)) is not None:
            secs[tok.msg] = tok.value.view(np.int64)
        if (tok := by_field.get(2)) is not None:
            nanos[tok.msg] = (tok.value & _U32).astype(np.uint32).view(np.int32)
    else:
        tok = _tokenize(buf, starts, ends)
        if len(tok.field) and (((tok.field != 1) & (tok.field != 2)).any() or (tok.wire != 0).any()):
            raise Malformed("unknown field in a Timestamp/Duration")
        one, two = tok.field == 1, tok.field == 2  # later occurrences assign later: last one wins
        secs[tok.msg[one]] = tok.value[one].view(np.int64)
        nanos[tok.msg[two]] = (tok.value[two] & _U32).astype(np.uint32).view(np.int32)
    q = np.where(nanos < 0, -(-nanos // 1000), nanos // 1000)
    return secs * 1_000_000 + q, q * 1000 != nanos


def _column(
    f: _Field, buf: np.ndarray, tok: _Tokens, t: np.ndarray, n: int, lossy: np.ndarray
) -> tuple[pa.Array, np.ndarray]:
    """One field's column for ``n`` messages from its occurrences ``t``; ORs the rows that lose
    data into ``lossy``; returns the column and which messages have the field."""
    msgs = tok.msg[t]
    counts = np.bincount(msgs, minlength=n)
    present = counts > 0
    if f.repeated:
        return _repeated(f, buf, tok, t, msgs, counts, lossy), present
    if (tok.wire[t] != f.wire).any():
        raise Malformed("wire type does not match the field")
    if len(t) and counts.max() > 1:
        if f.kind in ("message", "time"):
            raise Malformed("message field given twice (upb merges them)")
        rev = t[::-1]
        _, first = np.unique(msgs[::-1], return_index=True)
        t = rev[first]  # the last occurrence of each message
        msgs = tok.msg[t]
    absent = None if present.all() else pa.array(~present)
    if f.kind in ("message", "time"):
        order = _stable_order(msgs)
        t, msgs = t[order], msgs[order]
        starts, ends = tok.start[t], tok.start[t] + tok.length[t]
        if f.kind == "time":
            us, cut = _times(buf, starts, ends)
            lossy[msgs] |= cut
            col = np.zeros(n, np.int64)
            col[msgs] = us
            arr = pa.array(col, pa.int64(), mask=None if absent is None else ~present)
            return arr.cast(f.elem_arrow), present
        assert f.message is not None
        sub_lossy = np.zeros(len(t), bool)
        children = _message(f.message, buf, starts, ends, sub_lossy)
        lossy[msgs] |= sub_lossy
        if absent is not None:
            where = np.full(n, -1, np.int64)
            where[msgs] = np.arange(len(t))
            take = pa.array(where, mask=where < 0)
            children = [c.take(take) for c in children]
        return pa.StructArray.from_arrays(children, fields=f.message.arrow_fields, mask=absent), present
    if f.type in (_T.TYPE_STRING, _T.TYPE_BYTES):
        starts = np.zeros(n, np.int64)
        lengths = np.full(n, -1 if f.presence else 0, np.int64)
        starts[msgs], lengths[msgs] = tok.start[t], tok.length[t]
        return gather(buf, starts, lengths, f.elem_arrow), present
    typed = _typed(f, tok.value[t])
    mask = ~present if (f.presence and absent is not None) else None
    if f.kind == "enum":
        assert f.enum_names is not None and f.enum_numbers is not None
        idx = np.zeros(n, np.int64)
        if absent is not None and not f.presence:
            idx[:] = _enum_index(f, np.zeros(1, np.int64))[0]  # the default: number 0
        idx[msgs] = _enum_index(f, typed.astype(np.int64))
        return f.enum_names.take(pa.array(idx, mask=mask)), present
    col = np.zeros(n, typed.dtype)
    col[msgs] = typed
    return pa.array(col, f.elem_arrow, mask=mask), present


def _repeated(f, buf, tok, t, msgs, counts, lossy) -> pa.Array:
    order = _stable_order(msgs)  # by message, each message's occurrences in order
    t, msgs = t[order], msgs[order]
    offsets = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    wires = tok.wire[t]
    if f.kind in ("scalar", "enum") and f.wire != 2 and (wires == 2).any():
        if not (wires == 2).all():
            raise Malformed("repeated field both packed and not")
        owner, raw = _unpack(f, buf, tok, t)
        per_msg = np.bincount(msgs[owner], minlength=len(counts))
        np.cumsum(per_msg, out=offsets[1:])
        typed = _typed(f, raw)
        if f.kind == "enum":
            assert f.enum_names is not None
            values = f.enum_names.take(pa.array(_enum_index(f, typed.astype(np.int64))))
        else:
            values = pa.array(typed, f.elem_arrow)
        return pa.ListArray.from_arrays(pa.array(offsets), values, type=f.arrow)
    if (wires != f.wire).any():
        raise Malformed("wire type does not match the field")
    if f.kind == "time":
        us, cut = _times(buf, tok.start[t], tok.start[t] + tok.length[t])
        np.logical_or.at(lossy, msgs, cut)
        values = pa.array(us, pa.int64()).cast(f.elem_arrow)
    elif f.kind == "message":
        assert f.message is not None
        sub_lossy = np.zeros(len(t), bool)
        children = _message(f.message, buf, tok.start[t], tok.start[t] + tok.length[t], sub_lossy)
        np.logical_or.at(lossy, msgs, sub_lossy)
        values = pa.StructArray.from_arrays(children, fields=f.message.arrow_fields)
    else:
        values = _values(f, buf, tok, t)
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=f.arrow)


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """``argsort(keys, kind="stable")``; keys that fit 16 bits (field numbers, message indexes of
    a batch) are sorted as uint16, for which numpy's stable sort is a radix sort."""
    if len(keys) and 0 <= keys.min() and keys.max() < 1 << 16:
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")


def _occurrences(plan: _Plan, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list:
    """For each field of ``plan`` (in column order), its occurrences in the messages at the spans:
    ``(tokens, indexes into them)``, in message order and, within a message, in byte order."""
    walk = plan.walk
    by_field = None if walk is None else _tokenize_in_order(walk, buf, starts, ends)
    if by_field is not None:
        out = []
        for f in plan.fields:
            tok = by_field.get(f.number, _NO_TOKENS)
            out.append((tok, np.arange(len(tok.msg))))
        return out
    tok = _tokenize(buf, starts, ends)
    order = _stable_order(tok.field)  # by field; each field's occurrences in order
    fields = tok.field[order]
    first = np.flatnonzero(np.diff(fields, prepend=-1))  # where each field number begins
    numbers = fields[first]
    if len(numbers) and not np.isin(numbers, plan.numbers).all():
        raise Malformed("unknown field (upb keeps it for __unrecognized__)")
    bounds = dict(zip(numbers.tolist(), zip(first.tolist(), [*first[1:].tolist(), len(fields)])))
    empty = np.zeros(0, np.int64)
    out = []
    for f in plan.fields:
        lo, hi = bounds.get(f.number, (0, 0))
        out.append((tok, order[lo:hi] if hi > lo else empty))
    return out


def _message(plan: _Plan, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, lossy: np.ndarray) -> list:
    """The columns (fields, then ``__unrecognized__``: null) of the messages at the spans."""
    n = len(starts)
    columns = []
    presence = {}
    for f, (tok, t) in zip(plan.fields, _occurrences(plan, buf, starts, ends), strict=True):
        col, present = _column(f, buf, tok, t, n, lossy)
        columns.append(col)
        presence[f.number] = present
    for members in plan.oneofs:
        if (np.sum([presence[m] for m in members], axis=0) > 1).any():
            raise Malformed("two members of one oneof (upb keeps the last)")
    columns.append(pa.nulls(n, pa.binary()))
    return columns


def decode(plan: _Plan, col: pa.Array, skip: int) -> tuple[list[pa.Array], pa.BooleanArray | None] | None:
    """The message columns and loss flags (as ``ProtoDecoder.children_lossy``) of the binary
    column ``col``'s values, each after its first ``skip`` bytes (a null value reads as the empty
    message), or None when the upb path must decode this batch (or a value is shorter than
    ``skip``)."""
    n = len(col)
    buf, offsets = column_buffer(col)
    starts, ends = offsets[:-1] + skip, offsets[1:]
    short = starts > ends
    if short.any():
        if col.null_count == 0 or not col.is_null().to_numpy(zero_copy_only=False)[short].all():
            return None  # a value shorter than its skipped preamble: not a message to read
        starts = np.minimum(starts, ends)  # nulls: the empty message
    lossy = np.zeros(n, bool)
    try:
        children = _message(plan, buf, starts, ends, lossy)
    except (Malformed, pa.ArrowInvalid, IndexError):
        return None
    return children, (pa.array(lossy) if lossy.any() else None)
