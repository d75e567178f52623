"""The columnar Avro decoder against fastavro: for any batch of framed values, ``AvroSide``'s
columnar path gives exactly the rows, prefixes and loss flags of its fastavro path, or declines
(None) and the fastavro path decodes the batch. It never accepts a batch in which fastavro (or
the table's Arrow types) rejects a value.

The schemas are generated: records (nested, and named types used again by name), arrays, maps,
enums, fixed, bytes, strings, unions with null and with several branches (records told apart
by name), every logical type the mapping reads (decimal on bytes and fixed, date,
time-millis/-micros, timestamp-millis/-micros, local-timestamp-millis/-micros, uuid). The
values are written by fastavro, then changed the way hostile or unusual producers change them:
two datums concatenated, cut, bytes flipped, bytes appended. Writer schemas that differ from the
table's (fields added, dropped with a default, reordered, promoted, enum symbols added, unions
widened or narrowed) resolve against it as fastavro resolves them.
"""

from __future__ import annotations

import datetime
import io
import itertools
import json
import uuid
from decimal import Context, Decimal
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from rsm_sidecar.iceberg.decoding import avro_columnar
from rsm_sidecar.iceberg.decoding.framing import encode_preamble
from rsm_sidecar.iceberg.decoding.schema_registry import AVRO, ResolvedSchema, SchemaRegistry, parse_avro
from rsm_sidecar.iceberg.decoding.sides import AvroSide, SideSpec
from tests.iceberg.differential import same

TABLE_ID, WRITER_ID = 11, 12
_confs = itertools.count()


def side_for(table: Any, writer: Any | None = None) -> AvroSide:
    """An ``AvroSide`` whose table schema is ``table`` (id 11), ``writer`` another writer
    schema (id 12); the schemas are seeded into the registry client's cache (no server)."""
    conf = {"url": f"http://127.0.0.1:9/unused-avro-columnar-{next(_confs)}"}
    reg = SchemaRegistry(conf)
    for sid, schema in ((TABLE_ID, table), (WRITER_ID, writer)):
        if schema is not None:
            named: dict = {}
            text = json.dumps(schema)
            reg.add_resolved(ResolvedSchema(sid, AVRO, text, avro=parse_avro(text, named), avro_named=named))
    return AvroSide(SideSpec("avro", conf, TABLE_ID), reg)


def write(schema: Any, datum: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), datum)
    return buf.getvalue()


def written(schema: Any, datum: Any) -> bytes:
    """:func:`write` for generated datums: one fastavro cannot write is not a case (it writes a
    string of a union whose ``date`` branch comes first as a date, and fails)."""
    try:
        return write(schema, datum)
    except (ValueError, TypeError, OverflowError):
        reject()


def framed(sid: int, payload: bytes) -> bytes:
    return encode_preamble(sid) + payload


def _rows(side: AvroSide, children: list[pa.Array]) -> list:
    return pa.StructArray.from_arrays(children, fields=side._fields).to_pylist()


def agree(side: AvroSide, values: list[bytes | None]) -> bool:
    """Columnar equals fastavro whenever columnar accepts the batch; returns whether it did."""
    col = pa.array(values, pa.binary())
    fast = side.decode_arrow(col)
    if fast is None:
        return False
    children, prefixes, errs, lossy = fast
    s_children, s_prefixes, s_errs, s_lossy = side.decode_keeping(values)
    assert s_errs == [None] * len(values), f"columnar accepted a batch fastavro rejects: {s_errs}"
    assert [c.type for c in children] == [c.type for c in s_children]
    assert same(_rows(side, children), _rows(side, s_children))
    assert prefixes.to_pylist() == s_prefixes and errs.null_count == len(values)
    assert (lossy.to_pylist() if lossy is not None else [False] * len(values)) == [
        i in set(s_lossy) for i in range(len(values))
    ]
    return True


# ============================================================================ schemas

UTC = datetime.UTC
LOGICAL = [
    {"type": "int", "logicalType": "date"},
    {"type": "int", "logicalType": "time-millis"},
    {"type": "long", "logicalType": "time-micros"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
    {"type": "string", "logicalType": "uuid"},
]
PRIMS = ["boolean", "int", "long", "float", "double", "string", "bytes"]


class Names:
    """The named types of one generated schema: fresh names, and the finished ones that a later
    field may use again by name."""

    def __init__(self) -> None:
        self.n = 0
        self.done: dict[str, Any] = {}

    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


def kind_of(s: Any, names: Names) -> str:
    """The kind of a branch's values (a union holds at most one branch of each), records apart."""
    if isinstance(s, str):
        return avro_columnar.KINDS[s] if s in PRIMS else kind_of(names.done[s], names)
    if s["type"] == "record":
        return "record"
    return avro_columnar.KINDS[s.get("logicalType") or s["type"]]


@st.composite
def avro_type(draw, names: Names, depth: int, in_union: bool = False) -> Any:
    options = ["prim"] * 4 + ["logical", "decimal", "enum", "fixed"]
    if depth > 0:
        options += ["record", "array", "map"] + ([] if in_union else ["union", "union"])
    if names.done:
        options.append("ref")
    what = draw(st.sampled_from(options))
    if what == "prim":
        return draw(st.sampled_from(PRIMS))
    if what == "logical":
        return dict(draw(st.sampled_from(LOGICAL)))
    if what == "decimal":
        if draw(st.booleans()):
            p = draw(st.integers(1, 38))
            return {
                "type": "bytes",
                "logicalType": "decimal",
                "precision": p,
                "scale": draw(st.integers(0, p)),
            }
        name = names.fresh("Dec")
        p = draw(st.integers(1, 18))
        t = {"type": "fixed", "name": name, "size": 8, "logicalType": "decimal", "precision": p}
        t["scale"] = draw(st.integers(0, p))
        names.done[name] = t
        return t
    if what == "enum":
        name = names.fresh("E")
        symbols = draw(st.lists(st.sampled_from("ABCDEFG"), min_size=1, max_size=5, unique=True))
        t = {"type": "enum", "name": name, "symbols": symbols}
        if draw(st.booleans()):
            t["default"] = symbols[0]
        names.done[name] = t
        return t
    if what == "fixed":
        name = names.fresh("F")
        t = {"type": "fixed", "name": name, "size": draw(st.integers(1, 6))}
        names.done[name] = t
        return t
    if what == "ref":
        return draw(st.sampled_from(sorted(names.done)))
    if what == "record":
        return draw(record(names, depth - 1))
    if what == "array":
        return {"type": "array", "items": draw(avro_type(names, depth - 1))}
    if what == "map":
        return {"type": "map", "values": draw(avro_type(names, depth - 1))}
    return draw(union(names, depth - 1))


@st.composite
def union(draw, names: Names, depth: int) -> list:
    """Branches of different kinds (a row tells them apart), records apart by name (the Avro
    spec allows two records in a union only under different names, and registries refuse
    others; fastavro's parser does not check it), maybe null."""
    branches: list = []
    kinds: set[str] = set()
    record_names: set[str] = set()
    for _ in range(draw(st.integers(1, 3))):
        before = dict(names.done)
        b = draw(avro_type(names, depth, in_union=True))
        k = kind_of(b, names)
        name = (b if isinstance(b, str) else b["name"]) if k == "record" else None
        if (
            (k in kinds and k != "record")
            or (k == "record" and "dict" in kinds)
            or (k == "dict" and "record" in kinds)
            or name in record_names
        ):
            names.done = before  # the branch and the named types in it are dropped
            continue
        kinds.add(k)
        if name is not None:
            record_names.add(name)
        branches.append(b)
    if draw(st.booleans()) or not branches:
        branches.insert(draw(st.integers(0, len(branches))), "null")
    return branches


@st.composite
def record(draw, names: Names, depth: int, top: bool = False) -> dict:
    name = names.fresh("R")
    fields = []
    for i in range(draw(st.integers(1, 4 if top else 3))):
        t = draw(avro_type(names, depth))
        f: dict[str, Any] = {"name": f"f{i}", "type": t}
        default = draw(default_for(t, names))
        if default is not _NONE:
            f["default"] = default
        fields.append(f)
    t = {"type": "record", "name": name, "fields": fields}
    if top and draw(st.booleans()):
        t["namespace"] = "ns"  # the named types inside are in it too
    names.done[name] = t
    return t


_NONE = object()


@st.composite
def default_for(draw, t: Any, names: Names) -> Any:
    if not draw(st.booleans()):
        return _NONE
    if isinstance(t, list):
        return None if t[0] == "null" else _NONE
    simple = {
        "boolean": True,
        "int": 7,
        "long": -3,
        "float": 0.5,
        "double": 2.5,
        "string": "d",
        "bytes": "\u00ff",
    }
    if isinstance(t, str):
        if t in simple:
            return simple[t]
        t = names.done[t]
    if t.get("logicalType"):
        return _NONE
    if t["type"] == "enum":
        return t["symbols"][-1]
    if t["type"] == "array":
        return []
    if t["type"] == "map":
        return {}
    return _NONE


@st.composite
def table_schema(draw, depth: int = 2) -> tuple[Any, Names]:
    names = Names()
    if draw(st.integers(0, 5)) == 0:  # a top-level schema that is not a record
        t = draw(avro_type(names, depth))
    else:
        t = draw(record(names, depth, top=True))
    fastavro.parse_schema(t)  # a schema the registry would accept
    return t, names


# ============================================================================ values


def lookup(named: dict[str, Any], name: str) -> Any:
    """A named type by its name as written (short inside a namespace)."""
    return named[name] if name in named else named[f"ns.{name}"]


def values_of(s: Any, names: dict[str, Any]) -> st.SearchStrategy:
    """Datums of schema ``s`` as fastavro writes them (``names``: the named types)."""
    if isinstance(s, list):
        return st.one_of(*[branch_value(b, names) for b in s])
    if isinstance(s, str):
        prim = {
            "null": st.none(),
            "boolean": st.booleans(),
            "int": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1),
            "float": st.floats(width=32),
            "double": st.floats(),
            "string": st.text(max_size=8),
            "bytes": st.binary(max_size=8),
        }
        return prim[s] if s in prim else values_of(lookup(names, s), names)
    logical = s.get("logicalType")
    if logical == "decimal":
        p, sc = s["precision"], s.get("scale", 0)
        return st.integers(-(10**p) + 1, 10**p - 1).map(lambda u: Decimal(u).scaleb(-sc, Context(prec=80)))
    if logical == "date":
        return st.dates()
    if logical in ("time-millis", "time-micros"):
        times = st.times()
        return (
            times.map(lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000))
            if "millis" in logical
            else times
        )
    if logical and "timestamp" in logical:
        dts = st.datetimes(min_value=datetime.datetime(1, 1, 2), max_value=datetime.datetime(9999, 12, 30))
        if "millis" in logical:
            dts = dts.map(lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))
        return dts if logical.startswith("local") else dts.map(lambda d: d.replace(tzinfo=UTC))
    if logical == "uuid":
        return st.uuids()
    t = s["type"]
    if t == "record":
        return st.fixed_dictionaries({f["name"]: values_of(f["type"], names) for f in s["fields"]})
    if t == "enum":
        return st.sampled_from(s["symbols"])
    if t == "fixed":
        return st.binary(min_size=s["size"], max_size=s["size"])
    if t == "array":
        return st.lists(values_of(s["items"], names), max_size=4)
    if t == "map":
        return st.dictionaries(st.text(max_size=4), values_of(s["values"], names), max_size=3)
    return values_of(t, names)


def branch_value(b: Any, names: dict[str, Any]) -> st.SearchStrategy:
    """A branch's value; records in tuple notation (which record), as producers pick them."""
    r = b
    if isinstance(b, str) and b not in PRIMS and b != "null":
        r = lookup(names, b)
    if isinstance(r, dict) and r.get("type") == "record":
        full = lookup(names, r["name"])["name"]  # with the namespace it is in
        return values_of(r, names).map(lambda v, n=full: (n, v))
    return values_of(b, names)


def named_types(schema: Any) -> dict[str, Any]:
    named: dict = {}
    fastavro.parse_schema(schema, named_schemas=named)
    return named


@st.composite
def wire_variant(draw, payload: bytes, other: bytes) -> bytes:
    kind = draw(st.sampled_from(["plain"] * 4 + ["concat", "cut", "flip", "tail", "empty"]))
    if kind == "concat":
        return payload + other
    if kind == "cut" and payload:
        return payload[: draw(st.integers(0, len(payload) - 1))]
    if kind == "flip" and payload:
        i = draw(st.integers(0, len(payload) - 1))
        return payload[:i] + bytes([payload[i] ^ draw(st.integers(1, 255))]) + payload[i + 1 :]
    if kind == "tail":
        return payload + draw(st.binary(min_size=1, max_size=4))
    if kind == "empty":
        return b""
    return payload


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@st.composite
def table_and_payloads(draw, variants: bool):
    schema, _ = draw(table_schema())
    named = named_types(schema)
    datums = draw(st.lists(values_of(schema, named), min_size=1, max_size=6))
    payloads = [written(schema, d) for d in datums]
    if variants:
        payloads = [draw(wire_variant(p, payloads[-1])) for p in payloads]
    values: list[bytes | None] = [framed(TABLE_ID, p) for p in payloads]
    if draw(st.booleans()):
        values.insert(draw(st.integers(0, len(values))), None)
    return schema, values


@SETTINGS
@given(table_and_payloads(variants=False))
def test_valid_datums_decode_columnar_exactly_as_fastavro(case):
    schema, values = case
    side = side_for(schema)
    if not agree(side, values):  # only where the fastavro path itself fails a valid datum
        assert any(side.decode_keeping(values)[2]), "the columnar path declined valid datums"


@SETTINGS
@given(table_and_payloads(variants=True))
def test_changed_bytes_agree_or_decline(case):
    schema, values = case
    agree(side_for(schema), values)


# ============================================================================ resolution


class Evolver:
    """A writer schema for a table schema, changed the ways schemas evolve."""

    PROMOTE = {"long": ["int"], "float": ["int", "long"], "double": ["int", "long", "float"]}

    def __init__(self, draw, table: Any):
        self.draw = draw
        self.table_named = named_types(table)
        self.done: set[str] = set()  # named types the writer has defined already
        self.finished: list[str] = []  # those defined whole (not a record being defined)
        self.extra = itertools.count()

    def type(self, s: Any) -> Any:
        draw = self.draw
        if isinstance(s, str):
            if s not in PRIMS:
                if s in self.done:
                    return s
                return self.type(lookup(self.table_named, s))
            options = [s, *self.PROMOTE.get(s, [])]
            if s in ("string", "bytes"):
                options = ["string", "bytes"]
            out = draw(st.sampled_from(options))
            if draw(st.integers(0, 9)) == 0:  # the writer's value becomes a nullable union
                return ["null", out]
            return out
        if isinstance(s, list):
            nn = [b for b in s if b != "null"]
            how = draw(st.sampled_from(["same", "same", "one", "extra"]))
            if how == "one":
                return self.type(draw(st.sampled_from(nn)))
            branches = [b if b == "null" else self.type(b) for b in s]
            branches = [b for b in branches if not isinstance(b, list)]  # no union in a union
            if how == "extra" and "boolean" not in branches:
                branches.append("boolean")  # a branch the table may not take
            return branches or ["null"]
        if s.get("logicalType"):
            if s["type"] == "fixed":
                self.done.add(s["name"])
                self.finished.append(s["name"])
            return dict(s)
        t = s["type"]
        if t == "record":
            earlier = list(self.finished)  # defined before this record's fields
            self.done.add(s["name"])
            fields = []
            for f in s["fields"]:
                if "default" in f and draw(st.integers(0, 3)) == 0:
                    continue  # the writer lacks it: the table's default
                fields.append({"name": f["name"], "type": self.type(f["type"])})
            if draw(st.booleans()):
                added = {"name": "added", "type": self.added(earlier)}
                fields.insert(draw(st.integers(0, len(fields))), added)
            if draw(st.booleans()):
                fields = draw(st.permutations(fields))
            out = {"type": "record", "name": s["name"], "fields": fields}
            if "namespace" in s:
                out["namespace"] = s["namespace"]
            self.finished.append(s["name"])
            return out
        if t == "enum":
            self.done.add(s["name"])
            self.finished.append(s["name"])
            symbols = list(s["symbols"])
            if draw(st.booleans()):
                symbols.append("Z")
            return {"type": "enum", "name": s["name"], "symbols": draw(st.permutations(symbols))}
        if t == "fixed":
            self.done.add(s["name"])
            self.finished.append(s["name"])
            return dict(s)
        if t == "array":
            return {"type": "array", "items": self.type(s["items"])}
        if t == "map":
            return {"type": "map", "values": self.type(s["values"])}
        return self.type(t)

    def added(self, earlier: list[str]) -> Any:
        """A field only the writer has (fastavro skips it unread): maybe one of the ``earlier``
        named types, by its name."""
        extra = {
            "type": "record",
            "name": f"Extra{next(self.extra)}",
            "fields": [
                {"name": "x", "type": "float"},
                {"name": "y", "type": {"type": "array", "items": "boolean"}},
            ],
        }
        options = [
            "long",
            "string",
            "double",
            {"type": "array", "items": "string"},
            {"type": "map", "values": ["null", "int"]},
            ["null", "bytes", "long"],
            extra,
            *earlier[:1],
        ]
        return self.draw(st.sampled_from(options))


@st.composite
def evolved_case(draw):
    table, _ = draw(table_schema())
    writer = Evolver(draw, table).type(table)
    try:
        fastavro.parse_schema(writer)
    except Exception:  # e.g. a record renamed into a clash: not a schema a registry keeps
        writer = table
    w_named, t_named = named_types(writer), named_types(table)
    values: list[bytes | None] = []
    for d in draw(st.lists(values_of(writer, w_named), min_size=1, max_size=5)):
        values.append(framed(WRITER_ID, written(writer, d)))
    for d in draw(st.lists(values_of(table, t_named), max_size=2)):
        values.insert(draw(st.integers(0, len(values))), framed(TABLE_ID, written(table, d)))
    return table, writer, values


@SETTINGS
@given(evolved_case())
def test_writer_schema_resolved_against_the_table_agrees_or_declines(case):
    table, writer, values = case
    agree(side_for(table, writer), values)


# ============================================================================ cases by hand

EVENT = {
    "type": "record",
    "name": "Event",
    "namespace": "app",
    "fields": [
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {
            "name": "device",
            "type": {"type": "record", "name": "Device", "fields": [{"name": "os", "type": "string"}]},
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"], "default": "A"}},
    ],
}


def event(i: int, **changes) -> dict:
    e = {
        "id": uuid.UUID(int=i),
        "at": datetime.datetime(2026, 1, 1, tzinfo=UTC) + datetime.timedelta(microseconds=i),
        "amount": Decimal(i).scaleb(-2),
        "device": {"os": "linux"},
        "tags": ["a", "b"][: i % 3],
        "attrs": {"k": i} if i % 2 else {},
        "note": None if i % 2 else "n",
        "kind": "AB"[i % 2],
    }
    e.update(changes)
    return e


def test_an_event_with_every_shape_decodes_columnar():
    side = side_for(EVENT)
    values = [framed(TABLE_ID, write(EVENT, event(i))) for i in range(20)]
    assert agree(side, values)
    rows = _rows(side, side.decode_arrow(pa.array(values))[0])
    assert rows[3]["id"] == str(uuid.UUID(int=3)) and rows[3]["amount"] == Decimal("0.03")
    assert rows[3]["attrs"] == [("k", 3)] and rows[4]["tags"] == ["a"] and rows[4]["note"] == "n"


@pytest.mark.parametrize(
    "name, payload",
    [
        # fastavro reads these, the table's types reject them (__err__): declined
        ("int above 32 bits", lambda: b"\x80\x80\x80\x80\x10"),
        ("uuid not canonical", lambda: write(["string"], str(uuid.UUID(int=1)).upper())),
        ("string not UTF-8", lambda: b"\x04\xff\xfe"),
        ("enum index out of range", lambda: b"\x04"),
        ("negative enum index (fastavro wraps it)", lambda: b"\x01"),
        ("negative length", lambda: b"\x01"),
        ("union index out of range", lambda: b"\x06"),
        ("map key given twice", lambda: b"\x04\x02a\x02\x02a\x04\x00"),
        ("array too long", lambda: b"\x82\x04" + b"\x00" * 257 + b"\x00"),
        ("datum cut short", lambda: b"\x08ab"),
    ],
)
def test_declines_what_fastavro_rejects_or_reads_otherwise(name, payload):
    schemas = {
        "int above 32 bits": "int",
        "uuid not canonical": {"type": "string", "logicalType": "uuid"},
        "string not UTF-8": "string",
        "enum index out of range": {"type": "enum", "name": "E", "symbols": ["A", "B"]},
        "negative enum index (fastavro wraps it)": {"type": "enum", "name": "E", "symbols": ["A", "B"]},
        "negative length": "bytes",
        "union index out of range": ["null", "int"],
        "map key given twice": {"type": "map", "values": "int"},
        "array too long": {"type": "array", "items": "string"},
        "datum cut short": "string",
    }
    schema = schemas[name]
    side = side_for(schema)
    ok = framed(TABLE_ID, write(schema, next(iter(_sample(schema)))))
    assert agree(side, [ok]), "the valid datum alone is read columnar"
    col = pa.array([ok, framed(TABLE_ID, payload())], pa.binary())
    assert side.decode_arrow(col) is None


def _sample(schema: Any) -> list:
    if schema == "int":
        return [5]
    if isinstance(schema, list):
        return [3]
    t = schema if isinstance(schema, str) else schema.get("logicalType") or schema["type"]
    return {
        "uuid": [uuid.UUID(int=9)],
        "string": ["x"],
        "bytes": [b"x"],
        "enum": ["B"],
        "map": [{"a": 1, "b": 2}],
        "array": [["x"] * 3],
    }[t]


def test_trailing_bytes_are_ignored_as_fastavro_ignores_them():
    side = side_for("long")
    values = [framed(TABLE_ID, write("long", 5) + b"\xff\xff"), framed(TABLE_ID, write("long", -1))]
    assert agree(side, values)
    assert side.decode_arrow(pa.array(values))[0][0].to_pylist() == [5, -1]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "record", "name": "N", "fields": [{"name": "next", "type": ["null", "N"]}]},  # recursion
        {"type": "record", "name": "A", "fields": [{"name": "a", "type": "int", "aliases": ["b"]}]},
        ["int", "long"],  # the row cannot tell the branches apart
        ["string", {"type": "enum", "name": "E", "symbols": ["A"]}],
        [
            {"type": "map", "values": "int"},
            {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]},
        ],
        {"type": "array", "items": {"type": "fixed", "name": "Z", "size": 0}},  # items of no bytes
        {
            "type": "record",
            "name": "A",
            "fields": [{"name": "e", "type": {"type": "record", "name": "E", "fields": []}}],
        },
    ],
)
def test_schemas_left_to_fastavro(schema):
    side = side_for(schema)
    named: dict = {}
    parsed = parse_avro(json.dumps(schema), named)
    assert avro_columnar.plan_for(parsed, None, side.mapper) is None


def test_a_batch_of_two_writer_schemas_nulls_and_loss():
    """Rows of the table's schema and of an older writer (a field the table lacks: those rows
    keep ``__raw__``), with null values, decode columnar in their order."""
    table = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string", "default": "x"}],
    }
    older = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "gone", "type": "string"}, {"name": "a", "type": "int"}],
    }
    side = side_for(table, older)
    values = [
        framed(WRITER_ID, write(older, {"gone": "g", "a": 1})),
        None,
        framed(TABLE_ID, write(table, {"a": 2, "b": "y"})),
        framed(WRITER_ID, write(older, {"gone": "h", "a": 3})),
    ]
    assert agree(side, values)
    children, prefixes, _, lossy = side.decode_arrow(pa.array(values))
    nothing = {"a": None, "b": None}  # a null value: every field null (RowEncoder nulls the struct)
    assert _rows(side, children) == [{"a": 1, "b": "x"}, nothing, {"a": 2, "b": "y"}, {"a": 3, "b": "x"}]
    assert lossy.to_pylist() == [True, False, False, True]
    assert prefixes.to_pylist()[:2] == [encode_preamble(WRITER_ID), None]


def test_a_sliced_large_binary_column_decodes_its_own_rows():
    side = side_for("string")
    col = pa.array([framed(TABLE_ID, write("string", f"v{i}")) for i in range(6)], pa.large_binary())[2:5]
    children = side.decode_arrow(col)[0]
    assert children[0].to_pylist() == ["v2", "v3", "v4"]


def test_unframed_or_unknown_values_go_to_fastavro():
    side = side_for("int")
    good = framed(TABLE_ID, write("int", 1))
    for bad in (b"\x01" + good[1:], b"\x00\x00", good[:5]):
        assert side.decode_arrow(pa.array([good, bad], pa.binary())) is None


def test_long_fixed_size_arrays_are_read_a_block_at_once():
    schema = {"type": "array", "items": "double"}
    side = side_for(schema)
    values = [framed(TABLE_ID, write(schema, list(np.linspace(0, 1, n)))) for n in (0, 1, 1000, 3)]
    assert agree(side, values)


def test_a_primitive_top_level_schema_decodes_both_ways():
    """A value schema that is a bare type (``"string"``: a plain string once parsed) is a
    schema, not the reason a schema cannot be used (each row was an ``__err__`` reading
    "string")."""
    side = side_for("string")
    values = [framed(TABLE_ID, write("string", "a")), framed(TABLE_ID, write("string", "b"))]
    children, _, errs, _ = side.decode_keeping(values)
    assert errs == [None, None] and children[0].to_pylist() == ["a", "b"]
    assert agree(side, values)


REC_A = {"type": "record", "name": "A", "fields": [{"name": "x", "type": "int"}]}
REC_B = {
    "type": "record",
    "name": "B",
    "fields": [{"name": "x", "type": "int"}, {"name": "y", "type": "string"}],
}


@pytest.mark.parametrize(
    "writer_record, table_union, accepted",
    [
        # fastavro gives a plain dict; the mapping puts it in the first record whose fields hold its keys
        (REC_A, ["null", REC_A, REC_B], True),
        (REC_B, ["null", REC_A, REC_B], True),  # A lacks y: B, as read
        (REC_A, ["null", REC_B, REC_A], False),  # B holds x: A's value lands in B (declined)
    ],
)
def test_a_record_read_into_a_union_of_several_records(writer_record, table_union, accepted):
    """A writer record (not a union) read into the table's union of records: the member the
    fastavro path puts it in, or a decline where that depends on more than the branch."""
    table = {"type": "record", "name": "T", "fields": [{"name": "u", "type": table_union}]}
    writer = {"type": "record", "name": "T", "fields": [{"name": "u", "type": writer_record}]}
    side = side_for(table, writer)
    datum = {"x": 1, "y": "b"} if writer_record is REC_B else {"x": 1}
    values = [framed(WRITER_ID, write(writer, {"u": datum}))]
    assert agree(side, values) is accepted
    if not accepted:
        assert side.decode_keeping(values)[2] == [None]  # fastavro reads it: a decline, not an error


def test_writer_fields_the_table_lacks_are_skipped_as_fastavro_skips_them():
    """Writer-only fields of every shape (a record, a named type by name, arrays, maps,
    unions) are moved past unread; a negative block count in one goes to fastavro, which skips
    such a block by its byte size."""
    kind = {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}
    writer = {
        "type": "record",
        "name": "T",
        "fields": [
            {"name": "kind", "type": kind},
            {
                "name": "old",
                "type": {
                    "type": "record",
                    "name": "Old",
                    "fields": [
                        {"name": "k", "type": "Kind"},
                        {"name": "m", "type": {"type": "map", "values": "bytes"}},
                    ],
                },
            },
            {"name": "again", "type": ["null", "Kind", "Old"]},
            {"name": "xs", "type": {"type": "array", "items": "double"}},
            {"name": "a", "type": "long"},
        ],
    }
    table = {
        "type": "record",
        "name": "T",
        "fields": [{"name": "a", "type": "long"}, {"name": "kind", "type": kind}],
    }
    side = side_for(table, writer)
    old = {"k": "B", "m": {"x": b"\xff"}}
    datum = {"kind": "B", "old": old, "again": ("Old", old), "xs": [1.0, 2.0], "a": 7}
    values = [
        framed(WRITER_ID, write(writer, datum)),
        framed(WRITER_ID, write(writer, {**datum, "again": "A"})),
    ]
    assert agree(side, values)
    assert _rows(side, side.decode_arrow(pa.array(values))[0]) == [{"a": 7, "kind": "B"}] * 2
    # xs as one block of -2 items and 16 bytes (two doubles): fastavro skips the 16 bytes unread
    head = write(writer, {**datum, "xs": []})[:-2]
    blocked = framed(WRITER_ID, head + b"\x03\x20" + b"\x00" * 16 + b"\x00\x0e")
    children, _, errs, _ = side.decode_keeping([blocked])
    assert errs == [None] and _rows(side, children) == [{"a": 7, "kind": "B"}]
    assert side.decode_arrow(pa.array([blocked])) is None


def test_a_union_of_a_record_and_a_named_type_by_its_name():
    """fastavro names both values of such a union (it counts the named type as a record): each
    lands in its member (every row was an ``__err__``), on both paths."""
    kind = {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}
    rec = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "int"}]}
    schema = {
        "type": "record",
        "name": "T",
        "fields": [{"name": "k", "type": kind}, {"name": "u", "type": ["null", rec, "Kind"]}],
    }
    side = side_for(schema)
    values = [framed(TABLE_ID, write(schema, {"k": "A", "u": u})) for u in ("B", ("R", {"x": 1}), None)]
    children, _, errs, _ = side.decode_keeping(values)
    assert errs == [None] * 3
    assert [r["u"] for r in _rows(side, children)] == [
        {"R": None, "Kind": "B"},
        {"R": {"x": 1}, "Kind": None},
        None,
    ]
    assert agree(side, values)
