"""JSON -> Iceberg without Spark or a registry: every rule of the mapping table
(``decoding/json_mapping.py``), the columnar decoder on PyArrow's JSON reader against the
per-value path (the same rows and loss flags whenever it accepts a batch), error rows, rows that
keep ``__raw__``, and the inference rule (``decoding/json_inference.py``)."""

from __future__ import annotations

import datetime
import json
import random
import re

import pyarrow as pa
import pytest

from rsm_sidecar.iceberg.columnar_bytes import column_buffer
from rsm_sidecar.iceberg.decoding import json_columnar
from rsm_sidecar.iceberg.decoding.json_inference import infer
from rsm_sidecar.iceberg.decoding.json_mapping import JsonMapper, Mismatch, parse
from rsm_sidecar.iceberg.decoding.sides import SideSpec, inferred_json_side
from rsm_sidecar.iceberg.mapping.evolution import plan_update
from rsm_sidecar.iceberg.mapping.rows import EncoderSpec, RowEncoder
from rsm_sidecar.iceberg.mapping.table_schema import row_schema
from rsm_sidecar.iceberg.reading.raw_records import KafkaRecord, raw_batch
from rsm_sidecar.iceberg.types import ReservedFieldName

UTC = datetime.UTC


def types(schema, resources=None) -> dict[str, str]:
    return {f.name: str(f.field_type) for f in JsonMapper(schema, resources).iceberg_type.fields}


def obj(**props) -> dict:
    return {"type": "object", "properties": props}


def test_the_mapping_table():
    got = types(
        obj(
            i={"type": "integer"},
            n={"type": "number"},
            b={"type": "boolean"},
            s={"type": "string"},
            d={"type": "string", "format": "date"},
            ts={"type": "string", "format": "date-time"},
            t={"type": "string", "format": "time"},
            u={"type": "string", "format": "uuid"},
            o=obj(x={"type": "integer"}),
            a={"type": "array", "items": {"type": "string"}},
            m={"type": "object", "additionalProperties": {"type": "number"}},
            p={"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
            opt={"type": ["string", "null"]},
            one_null={"oneOf": [{"type": "null"}, {"type": "integer"}]},
            e={"enum": ["a", "b"]},
            c={"const": 3},
            mixed_enum={"enum": ["a", 1]},
            anything={},
            free={"type": "object"},
            tuple={"type": "array", "prefixItems": [{"type": "integer"}]},
            untyped_items={"type": "array"},
        )
    )
    assert got == {
        "i": "long",
        "n": "double",
        "b": "boolean",
        "s": "string",
        "d": "date",
        "ts": "timestamptz",
        "t": "time",
        "u": "string",
        "o": "struct<1: x: optional long>",
        "a": "list<string>",
        "m": "map<string, double>",
        "p": "map<string, long>",
        "opt": "string",
        "one_null": "long",
        "e": "string",
        "c": "long",
        "mixed_enum": "string",
        "anything": "string",
        "free": "string",
        "tuple": "string",
        "untyped_items": "list<string>",
    }
    assert types({"type": "array", "items": {"type": "integer"}}) == {"value": "list<long>"}


def test_refs_defs_references_recursion_and_all_of():
    schema = {
        "$defs": {
            "addr": obj(zip={"type": "string"}, next={"$ref": "#/$defs/addr"}),
            "base": obj(id={"type": "integer"}),
        },
        "definitions": {"old": {"type": "boolean"}},
        "allOf": [{"$ref": "#/$defs/base"}, obj(name={"type": "string"})],
        "properties": {
            "home": {"$ref": "#/$defs/addr"},
            "flag": {"$ref": "#/definitions/old"},
            "customer": {"$ref": "customer.json"},
            "items": {"$ref": "https://example.com/item.json#/$defs/item"},
        },
    }
    resources = {
        "customer.json": obj(cid={"type": "integer"}),
        "other": {"$id": "https://example.com/item.json", "$defs": {"item": obj(sku={"type": "string"})}},
    }
    got = types(schema, resources)
    assert got == {
        "home": "struct<1: zip: optional string, 2: next: optional string>",
        "flag": "boolean",
        "customer": "struct<3: cid: optional long>",
        "items": "struct<4: sku: optional string>",
        "id": "long",
        "name": "string",
    }
    m = JsonMapper(schema, resources)
    row, lossy = m.convert(parse(b'{"id":1,"home":{"zip":"z","next":{"zip":"y","next":null}}}'))
    # the recursion point holds the JSON text of its value
    assert row["home"] == {"zip": "z", "next": '{"zip":"y","next":null}'} and not lossy
    with pytest.raises(ValueError, match=r"\$ref 'missing.json' names no schema it references"):
        JsonMapper({"properties": {"x": {"$ref": "missing.json"}}})
    with pytest.raises(ValueError, match="points to nothing"):
        JsonMapper({"properties": {"x": {"$ref": "#/$defs/nope"}}})


def test_unions_members_and_values():
    schema = obj(
        u={"oneOf": [{"type": "integer"}, {"type": "string", "format": "date"}, {"type": "string"}]},
        t={"type": ["integer", "boolean", "null"]},
        shapes={
            "anyOf": [
                {"title": "circle", **obj(r={"type": "number"})},
                {"$ref": "#/$defs/square"},
                {"type": "null"},
            ]
        },
        only_constraints={"type": "integer", "oneOf": [{"minimum": 0}, {"maximum": -10}]},
    )
    schema["$defs"] = {"square": obj(side={"type": "number"})}
    m = JsonMapper(schema)
    assert {f.name: str(f.field_type) for f in m.iceberg_type.fields} == {
        "u": "struct<1: integer: optional long, 2: date: optional date, 3: string: optional string>",
        "t": "struct<4: integer: optional long, 5: boolean: optional boolean>",
        "shapes": "struct<8: circle: optional struct<6: r: optional double>, "
        "9: square: optional struct<7: side: optional double>>",
        "only_constraints": "long",
    }
    rows = [
        m.convert(parse(v))
        for v in (b'{"u":3,"t":true}', b'{"u":"2026-01-02"}', b'{"u":"x","shapes":{"side":2}}')
    ]
    assert rows[0] == ({"u": {"integer": 3}, "t": {"boolean": True}}, False)
    assert rows[1] == ({"u": {"date": datetime.date(2026, 1, 2)}}, False)
    assert rows[2] == ({"u": {"string": "x"}, "shapes": {"square": {"side": 2.0}}}, False)
    # an object only a member with loss holds: the first such member, and the row keeps __raw__
    assert m.convert(parse(b'{"shapes":{"r":1,"colour":"red"}}')) == (
        {"shapes": {"circle": {"r": 1.0}}},
        True,
    )
    with pytest.raises(Mismatch, match="fits no member"):
        m.convert(parse(b'{"u":[1]}'))


def test_values_errors_and_loss():
    m = JsonMapper(
        obj(
            i={"type": "integer"},
            n={"type": "number"},
            ts={"type": "string", "format": "date-time"},
            t={"type": "string", "format": "time"},
            d={"type": "string", "format": "date"},
            o=obj(x={"type": "integer"}),
            m={"additionalProperties": {"type": "integer"}},
            j={},
        )
    )
    ok = m.convert(
        parse(
            b'{"i":1.0,"n":2,"ts":"2026-01-01T00:00:00.123456Z","t":"10:11:12","d":"2026-02-28",'
            b'"o":{"x":1},"m":{"a":1,"b":2},"j":{"k":[1,"x"]}}'
        )
    )
    assert ok == (
        {
            "i": 1,
            "n": 2.0,
            "ts": datetime.datetime(2026, 1, 1, 0, 0, 0, 123456, UTC),
            "t": datetime.time(10, 11, 12),
            "d": datetime.date(2026, 2, 28),
            "o": {"x": 1},
            "m": [("a", 1), ("b", 2)],
            "j": '{"k":[1,"x"]}',
        },
        False,
    )
    lossy = [
        b'{"ts":"2026-01-01T02:00:00+02:00"}',  # the writer's offset
        b'{"ts":"2026-01-01T00:00:00.1234567Z"}',  # below the microsecond
        b'{"t":"10:00:00+01:00"}',
        b'{"n":9007199254740993}',  # not a double
        b'{"o":{"x":1,"y":2}}',  # a property the schema lacks, nested
        b'{"extra":[]}',
        b'{"m":{"a":1,"a":2}}',  # a duplicated key
    ]
    for v in lossy:
        assert m.convert(parse(v))[1], v
    assert m.convert(parse(b'{"ts":"2026-01-01T02:00:00+02:00"}'))[0]["ts"] == datetime.datetime(
        2026, 1, 1, tzinfo=UTC
    )
    assert not m.convert(parse(b'{"extra":null,"ts":"2026-01-01T00:00:00+00:00"}'))[1]
    for v, why in [
        (b'{"i":"1"}', "i: a JSON string, not an integer"),
        (b'{"i":1.5}', "not an integer"),
        (b'{"i":9223372036854775808}', "does not fit a long"),
        (b'{"d":"2026-02-30"}', "day is out of range"),
        (b'{"d":"2026-2-3"}', "is not a date"),
        (b'{"ts":"yesterday"}', "not an RFC 3339 date-time"),
        (b'{"o":[1]}', "o: a JSON array, not an object"),
        (b"[1]", "the value is a JSON array"),
    ]:
        with pytest.raises(Mismatch, match=why):
            m.convert(parse(v))
    for bad in (b"{", b"NaN", b'{"a":1} x', b"\xff"):
        with pytest.raises(ValueError):
            parse(bad)


def test_reserved_names():
    with pytest.raises(ReservedFieldName, match="JSON property '__raw__' of the schema"):
        JsonMapper(obj(__raw__={"type": "string"}))
    JsonMapper(obj(o=obj(__raw__={"type": "string"})))  # nested: a plain column


EVENT = obj(
    id={"type": "integer"},
    name={"type": "string"},
    price={"type": "number"},
    ok={"type": "boolean"},
    at={"type": "string", "format": "date-time"},
    day={"type": "string", "format": "date"},
    t={"type": "string", "format": "time"},
    tags={"type": "array", "items": {"type": "string"}},
    addr=obj(zip={"type": "string"}, geo=obj(lat={"type": "number"})),
    pts={
        "type": "array",
        "items": obj(x={"type": "integer"}, ys={"type": "array", "items": {"type": "number"}}),
    },
)


def _random_event(rng: random.Random) -> bytes:
    """An event, sometimes with fields absent, null, of the wrong type, undeclared, or with
    date-times the columnar path leaves to the per-value one."""
    v: dict = {}
    choices = {
        "id": lambda: rng.choice([rng.randrange(-(2**62), 2**62), 1.0, "7", 2**64]),
        "name": lambda: rng.choice(["a", "é\u2028", "\\", "\u0000x", 3]),
        "price": lambda: rng.choice([1.5, 2, -0.0, 1e300, True]),
        "ok": lambda: rng.choice([True, False, 0]),
        "at": lambda: rng.choice(
            ["2026-01-01T00:00:00Z", "2026-01-01T00:00:00.5+00:00", "2026-01-01T01:00:00+01:00", "bad"]
        ),
        "day": lambda: rng.choice(["2026-03-04", "2026-13-01", "x"]),
        "t": lambda: rng.choice(["10:11:12", "23:59:59.999999Z", "10:00:00+02:00", "25:00:00"]),
        "tags": lambda: rng.choice([[], ["a", "b"], [None], "x"]),
        "addr": lambda: rng.choice([{"zip": "1"}, {"zip": "2", "geo": {"lat": 1.5, "alt": 3}}, {}, []]),
        "pts": lambda: [
            {"x": rng.randrange(10), "ys": [1.5] * rng.randrange(3)} for _ in range(rng.randrange(3))
        ],
        "extra": lambda: rng.choice([1, None, {"q": [1]}, "s"]),
    }
    weights = {k: (0.97 if k != "extra" else 0.05) for k in choices}
    for k, make in choices.items():
        if rng.random() < weights[k]:
            val = make()
            if rng.random() < 0.9 or k == "extra":
                v[k] = val
            else:
                v[k] = None
    return json.dumps(v, separators=(",", ":"), ensure_ascii=rng.random() < 0.5).encode()


def _per_value(m: JsonMapper, values: list[bytes | None]):
    rows, flags = [], []
    for v in values:
        if v is None:
            rows.append(None)
            flags.append(False)
            continue
        r, f = m.convert(parse(v))
        rows.append(r)
        flags.append(f)
    return pa.array(rows, m.arrow_type).to_pylist(), flags


def test_columnar_equals_per_value_whenever_it_accepts():
    """Batches of generated events (types right, wrong, absent, undeclared): whenever the
    columnar decoder accepts a batch its rows and loss flags are those of the per-value path, and
    it never accepts a batch with a value the per-value path rejects."""
    m = JsonMapper(EVENT)
    plan = json_columnar.plan_for(m)
    assert plan is not None
    rng = random.Random(44)
    accepted = refused = framed = 0
    read: list[bytes] = []
    for _ in range(300):
        good_only = rng.random() < 0.5
        values: list[bytes | None] = []
        while len(values) < rng.randrange(1, 12):
            v = _random_event(rng) if rng.random() > 0.1 else None
            if good_only and v is not None:
                try:
                    m.convert(parse(v))
                except (Mismatch, ValueError):
                    continue
            values.append(v)
        got = json_columnar.decode(plan, pa.array(values, pa.binary()))
        present = [v for v in values if v is not None]
        if present:  # framed (never null): the reader reads them in place of their preambles
            plain = got if len(present) == len(values) else json_columnar.decode(plan, pa.array(present))
            assert _same(_decode_framed(plan, present, rng), plain), present
            if plain is not None:
                framed += 1
                read += present
        try:
            want = _per_value(m, values)
        except (Mismatch, ValueError):
            assert got is None, values
            refused += 1
            continue
        if got is None:
            refused += 1
            continue
        accepted += 1
        arr, lossy = got
        rows = [None if v is None else r for v, r in zip(values, arr.to_pylist())]
        assert rows == want[0], values
        assert (lossy.to_pylist() if lossy is not None else [False] * len(values)) == want[1], values
    assert accepted > 50 and refused > 50 and framed > 10, (accepted, refused, framed)
    # the values of the accepted batches (but undeclared properties: types may differ) at once
    good = [v for v in read if b'"extra"' not in v]
    assert len(good) > 15
    got = json_columnar.decode(plan, pa.array(good))
    assert got is not None and _same(_decode_framed(plan, good, rng), got)


def _decode_framed(plan: json_columnar.Plan, values: list[bytes], rng: random.Random):
    """:func:`json_columnar.decode_framed` of ``values`` behind preambles of random bytes (a
    line break or a brace among them too)."""
    pre = [bytes([0, *rng.choices([10, 123, 125, 32, 0, 7], k=4)]) for _ in values]
    buf, offsets = column_buffer(pa.array([p + v for p, v in zip(pre, values)], pa.binary()))
    return json_columnar.decode_framed(plan, buf, offsets[:-1], offsets[1:])


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a[0].equals(b[0]) and (a[1] is None) == (b[1] is None) and (a[1] is None or a[1].equals(b[1]))


def test_date_time_shapes_are_what_the_regexes_accept():
    """The vectorised accept of a batch of ``date``/``date-time`` strings of one length: every
    shape is a string the regex accepts, and a batch of one length the shapes do not cover (an
    offset other than UTC, a lower-case ``t``) is left to the regex, which refuses it."""
    rng = random.Random(7)
    for shapes, pattern in (
        (json_columnar._TS_SHAPES, json_columnar._TS_RE),
        (json_columnar._DATE_SHAPES, json_columnar._DATE_RE),
    ):
        for width, of_width in shapes.items():
            for lo, span in of_width:
                for _ in range(20):
                    text = bytes(int(a) + rng.randint(0, int(s)) for a, s in zip(lo, span)).decode()
                    assert len(text) == width and re.fullmatch(pattern[1:-1], text), text
    for batch in (
        ["2026-01-01T00:00:00+00:00", "2026-01-01T01:00:00+01:00"],
        ["2026-01-01T00:00:00Z", "2026-01-01t00:00:00Z"],
        ["2026-01-01T00:00:00.1234567Z"] * 2,
    ):
        arr = pa.array(batch)
        assert not json_columnar._all_of_shape(arr, json_columnar._TS_SHAPES), batch
        with pytest.raises(json_columnar._Refuse):
            json_columnar._all_match(arr, json_columnar._TS_RE)
    ok = pa.array(["x", "2026-01-01T00:00:00.5Z", "2026-01-01T00:00:00.7Z"]).slice(1)
    assert json_columnar._all_of_shape(ok, json_columnar._TS_SHAPES)
    assert not json_columnar._all_of_shape(pa.array(["2026-01-01T00:00:00Z", None]), json_columnar._TS_SHAPES)


def test_what_the_columnar_path_refuses():
    m = JsonMapper(EVENT)
    plan = json_columnar.plan_for(m)
    for batch in (
        [b' {"id":1}'],  # leading whitespace
        [b'{"id":1}\n'],
        [b'{"id":\n1}'],  # a line break inside
        [b"null"],
        [b"[1]"],
        [b'{"id":1} {"id":2}'],
        [b'{"id":1,"id":2}'],
        [b'{"extra":1}', b'{"extra":"s"}'],  # undeclared, of two types
        [b'{"at":"2026-01-01T00:00:00"}'],  # no offset: read as UTC by the per-value path
    ):
        assert json_columnar.decode(plan, pa.array(batch, pa.binary())) is None, batch
    for schema in (
        obj(m={"additionalProperties": {"type": "integer"}}),
        obj(u={"type": ["integer", "string"]}),
        obj(j={}),
        {"type": "array", "items": {"type": "integer"}},
    ):
        assert json_columnar.plan_for(JsonMapper(schema)) is None, schema
    # sliced and large_binary columns
    col = pa.array([b'{"id":1}', b'{"id":2}', b'{"id":3,"extra":[1]}'], pa.large_binary()).slice(1)
    arr, lossy = json_columnar.decode(plan, col)
    assert [r["id"] for r in arr.to_pylist()] == [2, 3] and lossy.to_pylist() == [False, True]


def rec(o: int, value: bytes | None) -> KafkaRecord:
    return KafkaRecord(0, o, o, 1_700_000_000_000, 1_700_000_000_000, b"k", value, [])


def test_rows_errors_and_raw_through_the_encoder():
    """The side through ``RowEncoder``: decoded rows without ``__raw__``, lossy rows with it,
    error rows with ``__err__`` + ``__raw__``, tombstones null; the columnar and per-value paths
    (one bad value sends the batch to the latter) give the same rows."""
    spec = SideSpec("json-unframed", json_schema=json.dumps(EVENT), json_source="the test's schema")
    enc = RowEncoder(EncoderSpec(val=spec))
    names = [f.name for f in enc.schema.find_field("val").field_type.fields]
    assert names[:4] == ["__raw__", "__prefix__", "__err__", "id"]
    good = [b'{"id":1,"tags":["a"],"pts":[{"x":1,"ys":[2.5]}]}', None, b'{"id":2,"new":true}', b"{}"]
    fast = enc.encode(raw_batch([rec(i, v) for i, v in enumerate(good)])).to_pylist()
    bad = [*good, b"not json", b'{"id":"one"}', b'{"pts":[{"x":"1"}]}', b'{"name":"\\ud800"}']
    slow = enc.encode(raw_batch([rec(i, v) for i, v in enumerate(bad)])).to_pylist()
    for rows in (fast, slow):
        assert rows[0]["val"]["id"] == 1 and rows[0]["val"]["__raw__"] is None
        assert rows[0]["val"]["pts"] == [{"x": 1, "ys": [2.5]}]
        assert rows[1]["val"] is None
        assert rows[2]["val"]["id"] == 2 and rows[2]["val"]["__raw__"] == good[2]  # undeclared: kept
        assert rows[2]["val"]["__err__"] is None
        assert rows[3]["val"]["__raw__"] is None and rows[3]["val"]["id"] is None
    assert fast == slow[:4]
    errs = [r["val"]["__err__"] for r in slow[4:]]
    assert errs[0].startswith("invalid JSON: JSONDecodeError")
    assert errs[1] == "JSON does not match the test's schema: id: a JSON string, not an integer"
    assert errs[2] == "JSON does not match the test's schema: pts[].x: a JSON string, not an integer"
    assert errs[3].startswith("JSON value does not fit the table types")
    for r, v in zip(slow[4:], bad[4:]):
        assert r["val"]["__raw__"] == v and r["val"]["id"] is None


def test_inference_rule_and_evolution():
    values = [
        {"a": 1, "b": "x", "c": None, "e": [], "o": {}},
        {"a": 2.5, "b": "y", "d": {"k": True}, "l": [1, 2]},
        {"b": 3, "l": [1.5]},
    ]
    first = infer(values[:2])
    assert first == {
        "type": "object",
        "properties": {
            "a": {"type": "number"},
            "b": {"type": "string"},
            "d": {"type": "object", "properties": {"k": {"type": "boolean"}}},
            "l": {"type": "array", "items": {"type": "integer"}},
        },
    }
    second = infer(values[2:], first)
    assert second["properties"]["b"] == {} and second["properties"]["l"]["items"] == {"type": "number"}
    # as columns: a later run's schema only adds or retires (string of JSON for mixed types)
    t1 = row_schema(pa_struct := JsonMapper(first).iceberg_type, pa_struct)
    t2 = row_schema(JsonMapper(second).iceberg_type, JsonMapper(second).iceberg_type)
    changes = [str(c) for c in plan_update(t1, t2)]
    assert "retire val.l as l__v1 (new l: list<double>)" in changes
    side = inferred_json_side([json.dumps(v).encode() for v in values[:2]] + [b"not json"])
    assert side.kind == "json-unframed" and side.json_inferred
    assert side.json_source == "a JSON Schema inferred from 2 value(s)"
    assert json.loads(side.json_schema) == first
    again = inferred_json_side([b'{"z":1}'], side.json_schema)
    assert list(json.loads(again.json_schema)["properties"]) == ["a", "b", "d", "l", "z"]
    assert inferred_json_side([b"null", b"{}"]).kind == "raw"
