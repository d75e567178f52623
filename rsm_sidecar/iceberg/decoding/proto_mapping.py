"""Protobuf -> Iceberg types, and a columnar Protobuf -> Arrow decoder that agrees with them.

Mapping (the Bufstream table, docs/iceberg.md has the full list and the options):

==========================================  ==================================================
Protobuf                                    Iceberg (every field optional)
==========================================  ==================================================
int32, sint32, sfixed32                     int
uint32, fixed32                             int (wraps above 2^31-1, as the seed) or long with
                                            ``ProtoOptions(uint32_as_long=True)`` (lossless)
int64, sint64, sfixed64                     long
uint64, fixed64                             long (wraps above 2^63-1, as the seed)
bool / float / double / string / bytes      boolean / float / double / string / binary
enum                                        string (the value's name; an unknown number is
                                            written as its decimal string)
message, group                              struct + ``__unrecognized__`` binary
repeated T / map<K, V>                      list<T> / map<K, V>
field that closes a recursion               struct<__unrecognized__ binary> holding the
                                            field's encoded message bytes
unknown fields and extension values         the message's ``__unrecognized__`` (re-encoded)
google.protobuf.Timestamp (WKT option)      timestamptz (micro-seconds, nanos truncated; a
                                            record with sub-µs nanos keeps ``__raw__``)
google.protobuf.Duration (WKT option)       long micro-seconds (same rule)
wrappers (Int32Value ...) (WKT option)      the wrapped primitive, null when unset
Struct / Value / ListValue (WKT option)     string holding JSON
==========================================  ==================================================

Decoding is columnar: all payloads of a batch are parsed with the upb-backed message class,
then each column is pulled out with one ``map(attrgetter)`` pass and turned into an Arrow array
by a C loop in ``pa.array``. Fields without presence (proto3 implicit) carry their default
value; fields with presence (messages, ``optional``, oneof members, proto2) are null when unset.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter, methodcaller
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory, unknown_fields
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestamptzType,
)

from rsm_sidecar.iceberg.types import (
    SIDE_COLUMNS,
    IdCounter,
    check_reserved,
    list_of,
    map_of,
    opt,
    to_arrow,
)
from rsm_sidecar.iceberg.types import (
    ReservedFieldName as ReservedFieldName,  # re-exported (the Protobuf rule had it first)
)

UNRECOGNIZED = "__unrecognized__"

_chain = itertools.chain.from_iterable


@dataclass(frozen=True)
class ProtoOptions:
    """Explicit deviations from the seed mapping (see docs/iceberg.md)."""

    #: uint32/fixed32 -> long (lossless). Default False = int, as the seed (values >= 2^31 wrap).
    uint32_as_long: bool = False
    #: Special-case well-known types (Timestamp, Duration, wrappers, Struct/Value/ListValue).
    #: False = the seed's plain rule: every message is a struct.
    well_known_types: bool = True


# ----------------------------------------------------------------------------- converters


#: Per input value, whether its row loses something (see :meth:`_Conv.convert_lossy`); None
#: when no value does (the usual case, and the only one without Timestamp/Duration).
Lossy: TypeAlias = pa.BooleanArray | None


def _or(a: Lossy, b: Lossy) -> Lossy:
    return b if a is None else a if b is None else pc.or_(a, b)


class _Conv:
    """Converts a list of Python values (as read from a message attribute) to an Arrow array."""

    ice: IcebergType
    arrow: pa.DataType
    #: Whether a value can hold something the column cuts (a Timestamp/Duration below it).
    loses: bool = False

    def convert(self, vals: list, present: list[bool] | None) -> pa.Array:  # pragma: no cover
        raise NotImplementedError

    def convert_lossy(self, vals: list, present: list[bool] | None) -> tuple[pa.Array, Lossy]:
        """:meth:`convert`, plus which of ``vals`` lose data in the column (None: none)."""
        return self.convert(vals, present), None


_SECONDS, _NANOS, _VALUE = attrgetter("seconds"), attrgetter("nanos"), attrgetter("value")


def _masked(arr: pa.Array, present: list[bool] | None) -> pa.Array:
    if present is None:
        return arr
    return pc.if_else(pa.array(present, pa.bool_()), arr, pa.scalar(None, arr.type))


def _apply_presence(vals: list, present: list[bool] | None) -> list:
    if present is None:
        return vals
    return [v if p else None for v, p in zip(vals, present)]


class _Scalar(_Conv):
    def __init__(self, ice: IcebergType, arrow: pa.DataType, source: pa.DataType | None = None):
        self.ice, self.arrow = ice, arrow
        self.source = source  # e.g. uint32 read, then reinterpreted as int32

    def convert(self, vals, present):
        vals = _apply_presence(vals, present)
        if self.source is None:
            return pa.array(vals, self.arrow)
        return pa.array(vals, self.source).cast(self.arrow, safe=False)


class _Enum(_Conv):
    def __init__(self, enum_desc):
        self.ice, self.arrow = StringType(), pa.string()
        self.names = {v.number: v.name for v in enum_desc.values}

    def convert(self, vals, present):
        names = self.names
        out = list(map(names.get, vals))
        if None in out:  # numbers outside the enum (open proto3 enums) or nulls
            out = [names[v] if v in names else (None if v is None else str(v)) for v in vals]
        return pa.array(_apply_presence(out, present), pa.string())


def _micros(vals: list) -> tuple[pa.Array, Lossy]:
    """µs of Timestamps/Durations, and which of them have nanos the µs cut (``nanos % 1000``).

    seconds and nanos share their sign in a valid Duration (Timestamp nanos are >= 0), and
    ``divide`` truncates toward zero, so ``q * 1000 != nanos`` exactly when digits are cut."""
    secs = pa.array(list(map(_SECONDS, vals)), pa.int64())
    nanos = pa.array(list(map(_NANOS, vals)), pa.int64())
    q = pc.divide(nanos, 1000)
    cut = pc.not_equal(pc.multiply(q, 1000), nanos)
    return pc.add(pc.multiply(secs, 1_000_000), q), (cut if pc.any(cut).as_py() else None)


class _Timestamp(_Conv):
    loses = True

    def __init__(self) -> None:
        self.ice, self.arrow = TimestamptzType(), pa.timestamp("us", tz="UTC")

    def convert_lossy(self, vals, present):
        # an unset field reads as the default (0 s, 0 nanos): it never counts as lossy
        us, lossy = _micros(vals)
        return _masked(us, present).cast(self.arrow), lossy

    def convert(self, vals, present):
        return self.convert_lossy(vals, present)[0]


class _Duration(_Conv):
    loses = True

    def __init__(self) -> None:
        self.ice, self.arrow = LongType(), pa.int64()

    def convert_lossy(self, vals, present):
        us, lossy = _micros(vals)
        return _masked(us, present), lossy

    def convert(self, vals, present):
        return self.convert_lossy(vals, present)[0]


class _Wrapper(_Conv):
    def __init__(self, inner: _Scalar):
        self.inner = inner
        self.ice, self.arrow = inner.ice, inner.arrow

    def convert(self, vals, present):
        return self.inner.convert(list(map(_VALUE, vals)), present)


class _Json(_Conv):
    def __init__(self) -> None:
        self.ice, self.arrow = StringType(), pa.string()

    def convert(self, vals, present):
        out = (
            [json.dumps(json_format.MessageToDict(m), separators=(",", ":"), sort_keys=True) for m in vals]
            if vals
            else []
        )
        return pa.array(_apply_presence(out, present), pa.string())


class _Recursive(_Conv):
    """The point of recursion: struct<__unrecognized__> with the field's encoded bytes."""

    def __init__(self, ids: IdCounter):
        self.ice = StructType(opt(ids, UNRECOGNIZED, BinaryType()))
        self.arrow = to_arrow(self.ice)

    def convert(self, vals, present):
        raw = [m.SerializeToString() for m in vals]
        mask = None if present is None else pa.array([not p for p in present], pa.bool_())
        return pa.StructArray.from_arrays([pa.array(raw, pa.binary())], fields=list(self.arrow), mask=mask)


def _lossy_parents(offsets: list[int], elem_lossy: Lossy) -> Lossy:
    """Flags of a list's (or map's) elements -> flags of the rows holding them (``offsets``:
    the list offsets, one more than rows)."""
    if elem_lossy is None:
        return None
    elems = pc.indices_nonzero(elem_lossy).to_pylist()
    hit = {bisect.bisect_right(offsets, e) - 1 for e in elems}
    return pa.array([i in hit for i in range(len(offsets) - 1)], pa.bool_())


class _List(_Conv):
    def __init__(self, ids: IdCounter, elem: _Conv):
        self.elem = elem
        self.loses = elem.loses
        self.ice = list_of(ids, elem.ice)
        self.arrow = to_arrow(self.ice)

    def convert_lossy(self, vals, present):
        offsets = [0, *itertools.accumulate(map(len, vals))]
        flat = list(_chain(vals))
        values, lossy = self.elem.convert_lossy(flat, None)
        # Repeated fields have no presence: ``present`` is always None here.
        arr = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, type=self.arrow)
        return arr, _lossy_parents(offsets, lossy)

    def convert(self, vals, present):
        return self.convert_lossy(vals, present)[0]


class _Map(_Conv):
    def __init__(self, ids: IdCounter, key: _Conv, value: _Conv):
        self.key, self.value = key, value
        self.loses = value.loses  # keys are scalars
        self.ice = map_of(ids, key.ice, value.ice)
        self.arrow = to_arrow(self.ice)

    def convert_lossy(self, vals, present):
        offsets = [0, *itertools.accumulate(map(len, vals))]
        items = list(_chain(m.items() for m in vals))
        keys = self.key.convert([k for k, _ in items], None)
        values, lossy = self.value.convert_lossy([v for _, v in items], None)
        # Repeated fields have no presence: ``present`` is always None here.
        arr = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, values, type=self.arrow)
        return arr, _lossy_parents(offsets, lossy)

    def convert(self, vals, present):
        return self.convert_lossy(vals, present)[0]


def _encode_varint(v: int, out: bytearray) -> None:
    v &= (1 << 64) - 1
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def encode_unknown(ufs: unknown_fields.UnknownFieldSet, out: bytearray | None = None) -> bytes:
    """Re-encode an UnknownFieldSet to wire-format bytes (tags in their original order)."""
    out = bytearray() if out is None else out
    for f in ufs:
        num, wt, data = f.field_number, f.wire_type, f.data
        _encode_varint((num << 3) | wt, out)
        if wt == 0:
            _encode_varint(data, out)
        elif wt == 1:
            out += (data & ((1 << 64) - 1)).to_bytes(8, "little")
        elif wt == 2:
            _encode_varint(len(data), out)
            out += data
        elif wt == 3:
            encode_unknown(data, out)
            _encode_varint((num << 3) | 4, out)
        elif wt == 5:
            out += (data & 0xFFFFFFFF).to_bytes(4, "little")
        else:  # pragma: no cover - upb never yields other wire types
            raise ValueError(f"unknown wire type {wt}")
    return bytes(out)


def unrecognized_bytes(m: Any) -> bytes | None:
    ufs = unknown_fields.UnknownFieldSet(m)
    return encode_unknown(ufs) if len(ufs) else None


class _Field:
    __slots__ = ("name", "getter", "has", "has_presence", "conv")

    def __init__(self, name: str, conv: _Conv, has_presence: bool):
        self.name, self.conv, self.has_presence = name, conv, has_presence
        self.getter = attrgetter(name)
        self.has = methodcaller("HasField", name)


class _Message(_Conv):
    ice: StructType

    def __init__(self, desc: Descriptor, ids: IdCounter, opts: ProtoOptions, stack: tuple[str, ...]):
        self.desc = desc
        top = not stack  # the side's message: rows.py adds SIDE_COLUMNS next to its fields
        stack = stack + (desc.full_name,)
        self.fields: list[_Field] = []
        nested = []
        reserved = (*SIDE_COLUMNS, UNRECOGNIZED) if top else (UNRECOGNIZED,)
        level = "the top-level message's struct" if top else "every message struct"
        for fd in desc.fields:
            check_reserved(
                fd.name,
                reserved,
                level,
                f"Protobuf field {fd.name!r} (number {fd.number}) of message {desc.full_name} "
                f"in {desc.file.name}",
            )
            conv = _field_conv(fd, ids, opts, stack)
            presence = (not fd.is_repeated) and fd.has_presence
            self.fields.append(_Field(fd.name, conv, presence))
            nested.append(opt(ids, fd.name, conv.ice))
        nested.append(opt(ids, UNRECOGNIZED, BinaryType()))
        self.loses = any(f.conv.loses for f in self.fields)
        self.ice = StructType(*nested)
        self.arrow = to_arrow(self.ice)
        self.arrow_fields = list(self.arrow)

    def children_lossy(self, msgs: list) -> tuple[list[pa.Array], Lossy]:
        cols = []
        lossy: Lossy = None
        for f in self.fields:
            vals = list(map(f.getter, msgs))
            present = None
            if f.has_presence:
                present = list(map(f.has, msgs))
                if all(present):
                    present = None
            if f.conv.loses:
                col, cut = f.conv.convert_lossy(vals, present)
                lossy = _or(lossy, cut)
                cols.append(col)
            else:
                cols.append(f.conv.convert(vals, present))
        ufs = list(map(unknown_fields.UnknownFieldSet, msgs))
        if any(map(len, ufs)):
            cols.append(pa.array([encode_unknown(u) if len(u) else None for u in ufs], pa.binary()))
        else:
            cols.append(pa.nulls(len(msgs), pa.binary()))
        return cols, lossy

    def children(self, msgs: list) -> list[pa.Array]:
        return self.children_lossy(msgs)[0]

    def convert_lossy(self, vals, present):
        # an unset message field reads as the empty message: it never counts as lossy
        mask = None if present is None else pa.array([not p for p in present], pa.bool_())
        children, lossy = self.children_lossy(vals)
        return pa.StructArray.from_arrays(children, fields=self.arrow_fields, mask=mask), lossy

    def convert(self, vals, present):
        return self.convert_lossy(vals, present)[0]


_T = FieldDescriptor
_SCALARS: dict[int, Callable[[ProtoOptions], _Scalar]] = {
    _T.TYPE_INT32: lambda o: _Scalar(IntegerType(), pa.int32()),
    _T.TYPE_SINT32: lambda o: _Scalar(IntegerType(), pa.int32()),
    _T.TYPE_SFIXED32: lambda o: _Scalar(IntegerType(), pa.int32()),
    _T.TYPE_UINT32: lambda o: (
        _Scalar(LongType(), pa.int64())
        if o.uint32_as_long
        else _Scalar(IntegerType(), pa.int32(), pa.uint32())
    ),
    _T.TYPE_FIXED32: lambda o: (
        _Scalar(LongType(), pa.int64())
        if o.uint32_as_long
        else _Scalar(IntegerType(), pa.int32(), pa.uint32())
    ),
    _T.TYPE_INT64: lambda o: _Scalar(LongType(), pa.int64()),
    _T.TYPE_SINT64: lambda o: _Scalar(LongType(), pa.int64()),
    _T.TYPE_SFIXED64: lambda o: _Scalar(LongType(), pa.int64()),
    _T.TYPE_UINT64: lambda o: _Scalar(LongType(), pa.int64(), pa.uint64()),
    _T.TYPE_FIXED64: lambda o: _Scalar(LongType(), pa.int64(), pa.uint64()),
    _T.TYPE_BOOL: lambda o: _Scalar(BooleanType(), pa.bool_()),
    _T.TYPE_FLOAT: lambda o: _Scalar(FloatType(), pa.float32()),
    _T.TYPE_DOUBLE: lambda o: _Scalar(DoubleType(), pa.float64()),
    _T.TYPE_STRING: lambda o: _Scalar(StringType(), pa.string()),
    _T.TYPE_BYTES: lambda o: _Scalar(BinaryType(), pa.binary()),
}

_WRAPPERS = {
    "google.protobuf.DoubleValue": _T.TYPE_DOUBLE,
    "google.protobuf.FloatValue": _T.TYPE_FLOAT,
    "google.protobuf.Int64Value": _T.TYPE_INT64,
    "google.protobuf.UInt64Value": _T.TYPE_UINT64,
    "google.protobuf.Int32Value": _T.TYPE_INT32,
    "google.protobuf.UInt32Value": _T.TYPE_UINT32,
    "google.protobuf.BoolValue": _T.TYPE_BOOL,
    "google.protobuf.StringValue": _T.TYPE_STRING,
    "google.protobuf.BytesValue": _T.TYPE_BYTES,
}
_JSON_WKT = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}


def _type_conv(fd: FieldDescriptor, ids: IdCounter, opts: ProtoOptions, stack: tuple[str, ...]) -> _Conv:
    """Converter for one (non-repeated view of a) field's type."""
    if fd.type == _T.TYPE_ENUM:
        return _Enum(fd.enum_type)
    if fd.type in (_T.TYPE_MESSAGE, _T.TYPE_GROUP):
        mt = fd.message_type
        name = mt.full_name
        if opts.well_known_types:
            if name == "google.protobuf.Timestamp":
                return _Timestamp()
            if name == "google.protobuf.Duration":
                return _Duration()
            if name in _WRAPPERS:
                return _Wrapper(_SCALARS[_WRAPPERS[name]](opts))
            if name in _JSON_WKT:
                return _Json()
        if name in stack:
            return _Recursive(ids)
        return _Message(mt, ids, opts, stack)
    return _SCALARS[fd.type](opts)


def _field_conv(fd: FieldDescriptor, ids: IdCounter, opts: ProtoOptions, stack: tuple[str, ...]) -> _Conv:
    if fd.is_repeated:
        mt = fd.message_type
        if mt is not None and mt.GetOptions().map_entry:
            kfd, vfd = mt.fields_by_name["key"], mt.fields_by_name["value"]
            return _Map(ids, _type_conv(kfd, ids, opts, stack), _type_conv(vfd, ids, opts, stack))
        return _List(ids, _type_conv(fd, ids, opts, stack))
    return _type_conv(fd, ids, opts, stack)


# ----------------------------------------------------------------------------- public API


def _has_extension_ranges(desc: Descriptor) -> bool:
    """Whether ``desc`` or a message reachable through its fields declares ``extensions``
    (the only messages an ``extend`` can target)."""
    seen: set[str] = set()
    todo = [desc]
    while todo:
        d = todo.pop()
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        if d.extension_ranges:
            return True
        todo.extend(fd.message_type for fd in d.fields if fd.message_type is not None)
    return False


def _strip_extensions(msg: descriptor_pb2.DescriptorProto) -> None:
    del msg.extension[:]
    for nested in msg.nested_type:
        _strip_extensions(nested)


def without_extensions(desc: Descriptor) -> Descriptor:
    """``desc`` rebuilt in a private pool holding its file and the files it imports with every
    ``extend`` removed: extension values then parse as unknown fields (and land in
    ``__unrecognized__``, as the seed says) instead of as extensions, which are no column.

    Done once per decoder; the message and its fields are otherwise identical."""
    files: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    order: list[str] = []

    def visit(f: FileDescriptor) -> None:
        if f.name in files:
            return
        fdp = descriptor_pb2.FileDescriptorProto()
        f.CopyToProto(fdp)
        files[f.name] = fdp
        for dep in f.dependencies:
            visit(dep)
        order.append(f.name)  # dependencies first

    visit(desc.file)
    pool = descriptor_pool.DescriptorPool()
    for name in order:
        fdp = files[name]
        del fdp.extension[:]
        for msg in fdp.message_type:
            _strip_extensions(msg)
        pool.Add(fdp)
    return pool.FindMessageTypeByName(desc.full_name)


class ProtoDecoder:
    """Decoder for one message type: Iceberg struct type + columnar bytes -> Arrow children.

    ``iceberg_type`` lists the message's fields then ``__unrecognized__`` (placeholder ids).
    When the message, or one it contains, can be extended, it is first rebuilt without the
    ``extend`` declarations (:func:`without_extensions`) so that extension values are unknown
    fields: the per-record decoding is the same either way.
    """

    def __init__(self, desc: Descriptor, options: ProtoOptions | None = None):
        if _has_extension_ranges(desc):
            desc = without_extensions(desc)
        self.desc = desc
        self.options = options or ProtoOptions()
        self._root = _Message(desc, IdCounter(), self.options, ())
        self.iceberg_type: StructType = self._root.ice
        self.arrow_type: pa.StructType = self._root.arrow
        self.cls = message_factory.GetMessageClass(desc)
        self._default = self.cls()

    @property
    def full_name(self) -> str:
        return self.desc.full_name

    def parse(self, payload: bytes) -> Any:
        """Parse one payload (raises ``google.protobuf.message.DecodeError``)."""
        return self.cls.FromString(payload)

    @property
    def default_message(self) -> Any:
        """An empty message, used as the stand-in for rows that are null or failed."""
        return self._default

    def children(self, msgs: Sequence[Any]) -> list[pa.Array]:
        """Arrow arrays for the message fields + ``__unrecognized__``, one row per message."""
        return self._root.children(list(msgs))

    @property
    def may_lose(self) -> bool:
        """Whether the message has a field the columns can cut (a ``Timestamp``/``Duration``
        with the well-known-type mapping, at any depth)."""
        return self._root.loses

    def children_lossy(self, msgs: Sequence[Any]) -> tuple[list[pa.Array], pa.BooleanArray | None]:
        """:meth:`children`, plus per message whether its row loses data: a ``Timestamp`` or
        ``Duration`` anywhere in it whose ``nanos`` are not whole microseconds (None when no
        message does)."""
        return self._root.children_lossy(list(msgs))

    @property
    def message_converter(self) -> _Message:
        """The converter of the side's message (its fields' converters, in column order), which
        :func:`~rsm_sidecar.iceberg.decoding.proto_columnar.plan_for` reads."""
        return self._root


def message_iceberg_type(desc: Descriptor, options: ProtoOptions | None = None) -> StructType:
    """The Iceberg struct for a message (fields + ``__unrecognized__``), placeholder ids."""
    return _Message(desc, IdCounter(), options or ProtoOptions(), ()).ice
