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
decimal (bytes or fixed)               decimal(precision, scale)
uuid                                   string
a named type used inside itself        string holding the JSON of that value (Iceberg has no
                                       recursive types)
=====================================  ===================================================

Records are decoded with the writer's schema (the record's schema id) resolved against the
table's (latest) schema by fastavro, so promotions and added fields with defaults follow the
Avro resolution rules; a datum that cannot be resolved becomes a record-level ``__err__``.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
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

from rsm_sidecar.iceberg.types import IdCounter, list_of, map_of, opt, to_arrow

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
        ids = IdCounter()
        self.iceberg_type, self._norm = self._map(schema, ids, ())
        self.arrow_type = to_arrow(self.iceberg_type)

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
        n_records = sum(
            1 for _, r, _ in matchers if isinstance(r, dict) and r.get("type") in ("record", "error")
        )

        def norm_union(v: Any, _m=matchers, _multi=n_records > 1) -> dict | None:
            if v is None:
                return None
            if _multi and isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
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
            "int": lambda: isinstance(v, int) and not isinstance(v, bool),
            "long": lambda: isinstance(v, int) and not isinstance(v, bool),
            "float": lambda: isinstance(v, float),
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


def read_datum(payload: bytes, writer: Any, reader: Any | None) -> Any:
    """fastavro ``schemaless_reader`` with record names for multi-record unions."""
    import fastavro

    return fastavro.schemaless_reader(
        io.BytesIO(payload), writer, reader, return_record_name=True, return_record_name_override=True
    )
