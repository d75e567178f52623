"""Avro -> Iceberg types, and Avro datums (decoded by fastavro) -> Arrow.

=====================================  ===================================================
Avro                                   Iceberg (every field optional)
=====================================  ===================================================
boolean/int/long/float/double          boolean/int/long/float/double
string / bytes / fixed                 string / binary / binary
enum                                   string (the symbol)
record                                 struct
array / map                            list / map<string, V>
union [null, T] (any order)            optional T
other unions                           struct of optional members, one per branch, named by
                                       the branch: its simple name for named types, else the
                                       type name (``int``, ``string``, ``array``, ``map``)
date                                   date
time-millis / time-micros              time
timestamp-millis / timestamp-micros    timestamptz
local-timestamp-millis / -micros       timestamp (without zone)
(local-)timestamp-nanos                long (nanoseconds as written; fastavro returns ints)
duration (fixed 12)                    binary (the 12 bytes)
decimal (bytes or fixed)               decimal(precision, scale)
uuid                                   string
a named type used inside itself        string holding the JSON of that value (Iceberg has no
                                       recursive types)
=====================================  ===================================================

Records are decoded with the writer's schema (the record's schema id) resolved against the
table's (latest) schema by fastavro, so promotions and added fields with defaults follow the
Avro resolution rules; a datum that cannot be resolved becomes a record-level ``__err__``.
:func:`resolution_loss` says, once per writer schema, whether a row cannot give back what was
written (fields the table's schema lacks, narrowing promotions, ...): such records also keep
their bytes in ``__raw__``.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import struct
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
)

from rsm_sidecar.iceberg.types import SIDE_COLUMNS, IdCounter, check_reserved, list_of, map_of, opt, to_arrow

_Norm = Callable[[Any], Any] | None  # None: the fastavro value is already what Arrow takes

_PRIMS: dict[str, IcebergType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "string": StringType(),
    "bytes": BinaryType(),
}


def _json_default(o: Any) -> Any:
    if isinstance(o, (bytes, bytearray)):
        return o.hex()
    if isinstance(o, (datetime.datetime, datetime.date, datetime.time)):
        return o.isoformat()
    if isinstance(o, (decimal.Decimal, uuid.UUID)):
        return str(o)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(type(o).__name__)


class AvroMapper:
    """Maps one parsed (fastavro) Avro schema to an Iceberg type and a value normalizer."""

    def __init__(self, schema: Any, named: dict[str, Any] | None = None):
        self.schema = schema
        self.named: dict[str, Any] = dict(named or {})
        if isinstance(schema, dict):
            self.named.update(schema.get("__named_schemas", {}))
        self._check_top_names(schema)
        ids = IdCounter()
        self.iceberg_type, self._norm = self._map(schema, ids, ())
        self.arrow_type = to_arrow(self.iceberg_type)

    def _check_top_names(self, s: Any) -> None:
        """The fields of the top-level struct sit next to rows.py's ``SIDE_COLUMNS``: one with
        such a name raises :class:`~rsm_sidecar.iceberg.types.ReservedFieldName` (the same rule
        as for Protobuf's top-level message)."""
        level = "the top-level record's struct"
        s = self._resolve(s)
        if isinstance(s, list):
            non_null = [b for b in s if b != "null"]
            if len(non_null) == 1:
                self._check_top_names(non_null[0])
                return
            for b in non_null:  # several branches: one member per branch, named by it
                name = self._branch_name(b)
                check_reserved(name, SIDE_COLUMNS, level, f"Avro union branch {name!r}")
            return
        if not isinstance(s, dict) or s.get("logicalType"):
            return
        t = s["type"]
        if t in ("record", "error"):
            rec = s["name"]
            for f in s["fields"]:
                check_reserved(f["name"], SIDE_COLUMNS, level, f"Avro field {f['name']!r} of record {rec}")
        elif isinstance(t, (dict, list)) or (isinstance(t, str) and t in self.named):
            self._check_top_names(t)

    # ------------------------------------------------------------------ mapping
    def _resolve(self, s: Any) -> Any:
        if isinstance(s, str) and s not in _PRIMS and s != "null":
            try:
                return self.named[s]
            except KeyError:
                raise ValueError(f"unknown Avro named type {s!r}") from None
        return s

    def _map(self, s: Any, ids: IdCounter, stack: tuple[str, ...]) -> tuple[IcebergType, _Norm]:
        if isinstance(s, str) and s in self.named and s in stack:
            return StringType(), lambda v: json.dumps(v, default=_json_default, sort_keys=True)
        s = self._resolve(s)
        if isinstance(s, str):
            if s == "null":
                raise ValueError("an Avro field of type null alone has no Iceberg type")
            return _PRIMS[s], None
        if isinstance(s, list):
            return self._union(s, ids, stack)
        t = s["type"]
        logical = s.get("logicalType")
        if logical == "decimal" and t in ("bytes", "fixed"):
            return DecimalType(int(s["precision"]), int(s.get("scale", 0))), None
        if logical == "date" and t == "int":
            return DateType(), None
        if logical in ("time-millis", "time-micros"):
            return TimeType(), None
        if logical in ("timestamp-millis", "timestamp-micros"):
            return TimestamptzType(), None
        if logical in ("local-timestamp-millis", "local-timestamp-micros"):
            return TimestampType(), None
        if logical == "uuid":
            return StringType(), lambda v: None if v is None else str(v)
        if t == "record" or t == "error":
            name = s["name"]
            inner = stack + (name,)
            fields, norms = [], []
            for f in s["fields"]:
                ft, fn = self._map(f["type"], ids, inner)
                fields.append(opt(ids, f["name"], ft))
                norms.append((f["name"], fn))
            active = [(n, fn) for n, fn in norms if fn is not None]
            if not active:
                return StructType(*fields), None

            def norm_record(v: dict, _a=active) -> dict:
                if v is None:
                    return None
                out = dict(v)
                for n, fn in _a:
                    out[n] = fn(v.get(n))
                return out

            return StructType(*fields), norm_record
        if t == "enum":
            return StringType(), None
        if t == "fixed":
            return BinaryType(), None
        if t == "array":
            et, en = self._map(s["items"], ids, stack)
            if en is None:
                return list_of(ids, et), None
            return list_of(ids, et), lambda v, _e=en: None if v is None else [_e(x) for x in v]
        if t == "map":
            vt, vn = self._map(s["values"], ids, stack)
            if vn is None:
                return map_of(ids, StringType(), vt), lambda v: None if v is None else list(v.items())
            return (
                map_of(ids, StringType(), vt),
                lambda v, _e=vn: None if v is None else [(k, _e(x)) for k, x in v.items()],
            )
        if isinstance(t, (dict, list)) or t in _PRIMS or t in self.named:
            return self._map(t, ids, stack)
        raise ValueError(f"unsupported Avro type {t!r}")

    def _branch_name(self, b: Any) -> str:
        r = self._resolve(b)
        if isinstance(r, dict):
            if r.get("type") in ("record", "error", "enum", "fixed"):
                return r["name"].rsplit(".", 1)[-1]
            if r.get("logicalType"):
                return str(r["logicalType"]).replace("-", "_")
            return str(r["type"])
        return str(r)

    def _union(self, branches: list, ids: IdCounter, stack: tuple[str, ...]) -> tuple[IcebergType, _Norm]:
        non_null = [b for b in branches if b != "null"]
        if len(non_null) == 1:
            return self._map(non_null[0], ids, stack)
        if not non_null:
            raise ValueError("an Avro union of only null has no Iceberg type")
        members = []
        matchers = []
        for b in non_null:
            name = self._branch_name(b)
            mt, mn = self._map(b, ids, stack)
            members.append(opt(ids, name, mt))
            matchers.append((name, self._resolve(b), mn))

        def norm_union(v: Any, _m=matchers) -> dict | None:
            if v is None:
                return None
            # fastavro names the value (name, value) in a union of several records, counting a
            # named type given by its name as one; no other value is a tuple
            if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
                tname, val = v
                for name, r, fn in _m:
                    if isinstance(r, dict) and r.get("name") == tname:
                        return {name: fn(val) if fn else val}
            for name, r, fn in _m:
                if _matches(r, v):
                    return {name: fn(v) if fn else v}
            raise ValueError(f"value of type {type(v).__name__} matches no union branch")

        return StructType(*members), norm_union

    # ------------------------------------------------------------------ conversion
    def normalize(self, datum: Any) -> Any:
        """A fastavro datum -> the Python value Arrow takes for :attr:`arrow_type` (raises
        ValueError for a union value that matches no branch)."""
        if datum is None or self._norm is None:
            return datum
        return self._norm(datum)

    def value_array(self, schema: Any, value: Any) -> pa.Array:
        """A one-row Arrow array of ``value``, a fastavro value of ``schema`` (one of this
        mapper's types, not inside itself): the column of a reader field's default."""
        ice, norm = self._map(schema, IdCounter(), ())
        return pa.array([value if norm is None else norm(value)], to_arrow(ice))

    def to_arrow(self, datums: list, *, normalized: bool = False) -> pa.Array:
        """Arrow array (of :attr:`arrow_type`) for decoded datums; None entries are null."""
        if not normalized and self._norm is not None:
            n = self._norm
            datums = [None if d is None else n(d) for d in datums]
        return pa.array(datums, self.arrow_type)


def _matches(r: Any, v: Any) -> bool:
    """Does decoded value ``v`` belong to (resolved) Avro branch ``r``? (Python-type test.)"""
    if isinstance(r, str):
        return {
            "boolean": lambda: isinstance(v, bool),
            # a value the narrower member cannot hold goes to a later (long/double) member
            "int": lambda: isinstance(v, int) and not isinstance(v, bool) and -(2**31) <= v < 2**31,
            "long": lambda: isinstance(v, int) and not isinstance(v, bool),
            "float": lambda: isinstance(v, float) and _fits_float32(v),
            "double": lambda: isinstance(v, float),
            "string": lambda: isinstance(v, str),
            "bytes": lambda: isinstance(v, (bytes, bytearray)),
        }[r]()
    t, logical = r.get("type"), r.get("logicalType")
    if logical in (
        "timestamp-millis",
        "timestamp-micros",
        "local-timestamp-millis",
        "local-timestamp-micros",
    ):
        return isinstance(v, datetime.datetime)
    if logical == "date":
        return isinstance(v, datetime.date) and not isinstance(v, datetime.datetime)
    if logical in ("time-millis", "time-micros"):
        return isinstance(v, datetime.time)
    if logical == "decimal":
        return isinstance(v, decimal.Decimal)
    if logical == "uuid":
        return isinstance(v, uuid.UUID)
    if t in ("record", "error"):
        return isinstance(v, dict) and set(v) <= {f["name"] for f in r["fields"]}
    if t == "map":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    if t == "enum":
        return isinstance(v, str) and v in r["symbols"]
    if t == "fixed":
        return isinstance(v, (bytes, bytearray)) and len(v) == r["size"]
    if isinstance(t, str):
        return _matches(t, v)
    return False


def _fits_float32(v: float) -> bool:
    try:
        return v != v or struct.unpack("<f", struct.pack("<f", v))[0] == v  # NaN fits
    except OverflowError:
        return False


def read_datum(payload: bytes, writer: Any, reader: Any | None) -> Any:
    """fastavro ``schemaless_reader`` with record names for multi-record unions."""
    import fastavro

    return fastavro.schemaless_reader(
        io.BytesIO(payload), writer, reader, return_record_name=True, return_record_name_override=True
    )


# ============================================================================ loss

#: Promotions that can change the value (a long above 2**53 as double, an int as float).
_NARROWING = {("int", "float"), ("long", "float"), ("long", "double")}
_NAMED = ("record", "error", "enum", "fixed")


def resolution_loss(writer: Any, reader: Any) -> str | None:
    """Why a datum written with ``writer`` cannot be rebuilt from its row when decoded as
    ``reader`` (both fastavro-parsed schemas, possibly the same), or None when it can.

    Depends on the two schemas only, so callers compute it once per writer schema id. Loss:

    * a writer record field the reader's record lacks (by name or reader alias): dropped;
    * an enum symbol the reader lacks when the reader has a default (it becomes the default);
    * a narrowing promotion: int -> float, long -> float, long -> double;
    * a different logical type (or decimal precision/scale) on both sides: the number is
      reinterpreted (e.g. timestamp-micros read as timestamp-millis);
    * a writer union with two branches a row cannot tell apart (both int-like, both
      float-like, string/enum/uuid, bytes/fixed, two of one date/time kind): which branch was
      written is not in the row.

    Writer branches or symbols the reader cannot take at all are not loss: decoding them fails
    and the record becomes a record-level ``__err__`` with ``__raw__``.
    """
    wn = writer.get("__named_schemas", {}) if isinstance(writer, dict) else {}
    rn = reader.get("__named_schemas", {}) if isinstance(reader, dict) else {}
    return _Resolution(wn, rn).loss(writer, reader, "", set())


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _kind(s: Any) -> str:
    """The Avro type name of a resolved (non-union) schema."""
    if isinstance(s, dict):
        t = s["type"]
        return t if isinstance(t, str) else _kind(t)
    return str(s)


def _row_class(s: Any) -> str:
    """What a row can tell about a value of resolved branch ``s`` (see the union rule)."""
    kind = _kind(s)
    logical = s.get("logicalType") if isinstance(s, dict) else None
    if logical in ("date",):
        return "date"
    if logical in ("time-millis", "time-micros"):
        return "time"
    if logical in (
        "timestamp-millis",
        "timestamp-micros",
        "local-timestamp-millis",
        "local-timestamp-micros",
    ):
        return "datetime"
    if logical == "decimal":
        return "decimal"
    if logical == "uuid" or kind in ("string", "enum"):
        return "string"
    if kind in ("bytes", "fixed"):
        return "bytes"
    if kind in ("int", "long"):
        return "integer"
    if kind in ("float", "double"):
        return "float"
    if kind in ("record", "error"):
        return "record " + s["name"]  # fastavro names the record of a multi-record union
    return kind


class _Resolution:
    def __init__(self, writer_named: dict[str, Any], reader_named: dict[str, Any]):
        self.wn, self.rn = writer_named, reader_named

    @staticmethod
    def _deref(s: Any, named: dict[str, Any]) -> Any:
        while isinstance(s, str) and s in named:
            s = named[s]
        if isinstance(s, dict) and not s.get("logicalType"):
            t = s.get("type")
            if isinstance(t, (dict, list)) or (isinstance(t, str) and t in named):
                return _Resolution._deref(t, named)
        return s

    def _matches(self, w: Any, r: Any) -> bool:
        """Does resolved non-union writer ``w`` resolve to resolved non-union reader ``r``?"""
        kw, kr = _kind(w), _kind(r)
        if kw in _NAMED or kr in _NAMED:
            if kw != kr and not (kw in ("record", "error") and kr in ("record", "error")):
                return False
            if kw == "fixed" and w["size"] != r["size"]:
                return False
            wname = w["name"].rsplit(".", 1)[-1]
            aliases = r.get("aliases", [])
            return wname == r["name"].rsplit(".", 1)[-1] or w["name"] in aliases or wname in aliases
        if kw == kr:
            if kw == "array":
                return self._matches_any(w["items"], r["items"])
            if kw == "map":
                return self._matches_any(w["values"], r["values"])
            return True
        return (kw, kr) in _NARROWING or (kw, kr) in {
            ("int", "long"),
            ("int", "double"),
            ("float", "double"),
            ("string", "bytes"),
            ("bytes", "string"),
        }

    def _matches_any(self, w: Any, r: Any) -> bool:
        w, r = self._deref(w, self.wn), self._deref(r, self.rn)
        if isinstance(w, list) or isinstance(r, list):
            return True
        return self._matches(w, r)

    def _branch(self, w: Any, r: list) -> Any | None:
        for b in r:
            rb = self._deref(b, self.rn)
            if not isinstance(rb, list) and self._matches(w, rb):
                return rb
        return None

    def loss(self, w: Any, r: Any, path: str, seen: set[tuple[str, str]]) -> str | None:
        w, r = self._deref(w, self.wn), self._deref(r, self.rn)
        if isinstance(w, list):
            branches = [self._deref(b, self.wn) for b in w if b != "null"]
            classes: dict[str, str] = {}
            for b in branches:
                c = _row_class(b)
                if c in classes:
                    return (
                        f"{path or 'the value'}: union branches {classes[c]} and {_kind(b)} "
                        f"are not told apart in the row"
                    )
                classes[c] = _kind(b)
            for b in branches:
                rb = self._branch(b, r) if isinstance(r, list) else (r if self._matches(b, r) else None)
                if rb is not None and (why := self.loss(b, rb, path, seen)):
                    return why
            return None
        if isinstance(r, list):
            if w == "null":
                return None
            rb = self._branch(w, r)
            return None if rb is None else self.loss(w, rb, path, seen)
        if w == "null" or r == "null":
            return None
        kw, kr = _kind(w), _kind(r)
        wl = (w.get("logicalType"), w.get("precision"), w.get("scale")) if isinstance(w, dict) else None
        rl = (r.get("logicalType"), r.get("precision"), r.get("scale")) if isinstance(r, dict) else None
        if wl and rl and wl[0] and rl[0] and wl != rl:
            return f"{path or 'the value'}: {wl[0]} read as {rl[0]}"
        if (kw, kr) in _NARROWING:
            return f"{path or 'the value'}: {kw} read as {kr}"
        if kw in ("record", "error") and kr in ("record", "error"):
            key = (w["name"], r["name"])
            if key in seen:
                return None
            seen = seen | {key}
            by_name = {f["name"]: f for f in r["fields"]}
            for f in r["fields"]:
                for a in f.get("aliases", []):
                    by_name.setdefault(a, f)
            for f in w["fields"]:
                rf = by_name.get(f["name"])
                if rf is None:
                    return f"field {_join(path, f['name'])} is not in the table's schema"
                if why := self.loss(f["type"], rf["type"], _join(path, f["name"]), seen):
                    return why
            return None
        if kw == kr == "enum":
            missing = [x for x in w["symbols"] if x not in r["symbols"]]
            if missing and r.get("default") is not None:
                return f"{path or 'the value'}: enum symbols {missing} become {r['default']!r}"
            return None
        if kw == kr == "array":
            return self.loss(w["items"], r["items"], _join(path, "[]"), seen)
        if kw == kr == "map":
            return self.loss(w["values"], r["values"], _join(path, "{}"), seen)
        return None
