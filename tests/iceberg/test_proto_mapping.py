"""Protobuf -> Iceberg types and Protobuf bytes -> Arrow, on schemas compiled by protoc."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestamptzType,
)

from rsm_sidecar.iceberg.decoding.proto_mapping import ProtoDecoder, ProtoOptions, encode_unknown
from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema, SchemaCompileError
from tests.iceberg.conftest import PROTO_DIR

UTC = dt.UTC


def order_schema() -> ProtoSchema:
    sources = {str(p.relative_to(PROTO_DIR)): p.read_text() for p in PROTO_DIR.rglob("*.proto")}
    return ProtoSchema.from_sources("shop/v1/order.proto", sources)


@pytest.fixture(scope="module")
def schema():
    return order_schema()


def field_types(st: StructType) -> dict:
    return {f.name: f.field_type for f in st.fields}


def rows(dec: ProtoDecoder, payloads: list[bytes]) -> list[dict]:
    msgs = [dec.parse(p) for p in payloads]
    return pa.StructArray.from_arrays(dec.children(msgs), fields=list(dec.arrow_type)).to_pylist()


def test_type_mapping(schema):
    dec = ProtoDecoder(schema.message_by_name("shop.v1.Order"))
    t = field_types(dec.iceberg_type)
    assert all(not f.required for f in dec.iceberg_type.fields)
    assert isinstance(t["id"], StringType) and isinstance(t["status"], StringType)
    assert [f.name for f in t["total"].fields] == ["currency", "units", "nanos", "__unrecognized__"]
    assert isinstance(t["lines"], ListType) and isinstance(t["lines"].element_type, StructType)
    assert isinstance(field_types(t["lines"].element_type)["attrs"], MapType)
    assert isinstance(t["labels"], MapType) and isinstance(t["labels"].value_type, StringType)
    assert isinstance(t["card"], StringType) and isinstance(t["iban"], StringType)  # oneof: siblings
    assert isinstance(t["priority"], IntegerType)
    assert isinstance(t["placed_at"], TimestamptzType)
    assert isinstance(t["ttl"], LongType)  # Duration -> micro-seconds
    assert isinstance(t["note"], StringType)  # StringValue -> nullable string
    assert isinstance(t["attrs"], StringType)  # Struct -> JSON
    assert isinstance(t["big"], IntegerType) and isinstance(t["f32"], IntegerType)  # seed: int
    assert isinstance(t["huge"], LongType) and isinstance(t["delta"], LongType)
    assert isinstance(t["blob"], BinaryType) and isinstance(t["ratio"], FloatType)
    assert isinstance(t["score"], DoubleType) and isinstance(t["gift"], BooleanType)
    assert isinstance(t["history"], ListType) and isinstance(t["history"].element_type, StringType)
    # recursion: Category.children / parent are the recursion points
    cat = field_types(t["category"])
    assert [f.name for f in cat["children"].element_type.fields] == ["__unrecognized__"]
    assert [f.name for f in cat["parent"].fields] == ["__unrecognized__"]
    assert list(t)[-1] == "__unrecognized__"


def test_options_change_only_what_they_name(schema):
    desc = schema.message_by_name("shop.v1.Order")
    t = field_types(ProtoDecoder(desc, ProtoOptions(uint32_as_long=True)).iceberg_type)
    assert isinstance(t["big"], LongType) and isinstance(t["f32"], LongType)
    assert isinstance(t["huge"], LongType)
    plain = field_types(ProtoDecoder(desc, ProtoOptions(well_known_types=False)).iceberg_type)
    assert [f.name for f in plain["placed_at"].fields] == ["seconds", "nanos", "__unrecognized__"]
    assert [f.name for f in plain["note"].fields] == ["value", "__unrecognized__"]


def test_values(schema, order_pb2):
    dec = ProtoDecoder(schema.message_by_name("shop.v1.Order"))
    o = order_pb2.Order(
        id="o-1",
        status=order_pb2.SHIPPED,
        labels={"a": "b"},
        iban="DE00",
        priority=0,
        big=2**32 - 1,
        huge=2**64 - 1,
        delta=-5,
        f32=2**31,
        blob=b"\x00\xff",
        ratio=0.5,
        score=2.25,
        gift=True,
        history=[order_pb2.PLACED, order_pb2.SHIPPED],
    )
    o.total.currency, o.total.units = "EUR", 12
    line = o.lines.add(sku="s1", qty=2)
    line.attrs["w"] = 7
    o.placed_at.FromDatetime(dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC))
    o.ttl.seconds, o.ttl.nanos = -3, -500_000
    o.note.value = ""
    o.attrs.update({"k": [1, "x"], "n": None})
    o.category.name = "root"
    o.category.children.add(name="leaf")
    o.category.parent.name = "up"
    empty = order_pb2.Order()
    r, e = rows(dec, [o.SerializeToString(), empty.SerializeToString()])
    assert r["id"] == "o-1" and r["status"] == "SHIPPED" and r["history"] == ["PLACED", "SHIPPED"]
    assert r["total"] == {"currency": "EUR", "units": 12, "nanos": 0, "__unrecognized__": None}
    assert r["lines"] == [{"sku": "s1", "qty": 2, "attrs": [("w", 7)], "__unrecognized__": None}]
    assert r["labels"] == [("a", "b")]
    assert (r["card"], r["iban"]) == (None, "DE00")  # oneof: unset member is null
    assert r["priority"] == 0  # optional set to 0: present
    assert r["placed_at"] == dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    assert r["ttl"] == -3_000_500  # -3 s - 500 µs
    assert r["note"] == ""  # wrapper set to "" is not null
    assert r["attrs"] == '{"k":[1.0,"x"],"n":null}'
    assert r["big"] == -1 and r["f32"] == -(2**31) and r["huge"] == -1  # seed: wrap around
    assert r["delta"] == -5 and r["blob"] == b"\x00\xff" and r["ratio"] == 0.5 and r["gift"]
    cat = r["category"]
    assert cat["name"] == "root"
    assert cat["children"] == [{"__unrecognized__": order_pb2.Category(name="leaf").SerializeToString()}]
    assert cat["parent"] == {"__unrecognized__": order_pb2.Category(name="up").SerializeToString()}
    # the empty message: implicit-presence scalars carry defaults, presence fields are null
    assert e["id"] == "" and e["status"] == "STATUS_UNSPECIFIED" and e["big"] == 0
    assert e["total"] is None and e["priority"] is None and e["placed_at"] is None
    assert e["note"] is None and e["card"] is None and e["category"] is None
    assert e["lines"] == [] and e["labels"] == [] and e["__unrecognized__"] is None


def test_uint32_as_long_is_lossless(schema, order_pb2):
    dec = ProtoDecoder(schema.message_by_name("shop.v1.Order"), ProtoOptions(uint32_as_long=True))
    (r,) = rows(dec, [order_pb2.Order(big=2**32 - 1, f32=2**31).SerializeToString()])
    assert (r["big"], r["f32"]) == (2**32 - 1, 2**31)


def test_unknown_fields_and_unknown_enum_numbers(schema, order_pb2):
    dec = ProtoDecoder(schema.message_by_name("shop.v1.Order"))
    unknown_top = (
        b"\xf8\x06\x2a" + b"\x82\x07\x03abc" + b"\x8d\x07\x01\x02\x03\x04"
    )  # 111 varint, 112 len, 113 fixed32
    total_with_unknown = order_pb2.Order(total={"currency": "X"}).SerializeToString()
    # field 3 (total) re-emitted with an unknown field 9 (fixed64) inside the sub-message
    inner = b"\x0a\x01Y" + b"\x49" + (5).to_bytes(8, "little")
    nested = b"\x1a" + bytes([len(inner)]) + inner
    open_enum = b"\x10\x63"  # status = 99, not a value of Status
    (r1, r2, r3) = rows(dec, [total_with_unknown + unknown_top, nested, open_enum])
    assert r1["__unrecognized__"] == unknown_top and r1["total"]["currency"] == "X"
    assert r2["total"] == {
        "currency": "Y",
        "units": 0,
        "nanos": 0,
        "__unrecognized__": b"\x49" + (5).to_bytes(8, "little"),
    }
    assert r2["__unrecognized__"] is None
    assert r3["status"] == "99"
    # a field whose wire type does not match the schema is unknown, not an error
    (r4,) = rows(dec, [b"\x0d\x01\x02\x03\x04"])  # field 1 (string) sent as fixed32
    assert r4["id"] == "" and r4["__unrecognized__"] == b"\x0d\x01\x02\x03\x04"


def test_encode_unknown_round_trips_groups(order_pb2):
    from google.protobuf import unknown_fields

    data = b"\xa3\x06" + b"\x08\x01" + b"\xa4\x06"  # group 100 { field 1 = 1 }
    m = order_pb2.Order.FromString(data)
    assert encode_unknown(unknown_fields.UnknownFieldSet(m)) == data


def test_compile_errors_name_the_problem():
    with pytest.raises(SchemaCompileError, match='"Nope" is not defined'):
        ProtoSchema.from_sources("x.proto", {"x.proto": 'syntax = "proto3"; message X { Nope n = 1; }'})
    with pytest.raises(SchemaCompileError, match="not a relative import path"):
        ProtoSchema.from_sources("x.proto", {"x.proto": "", "../etc/passwd": ""})


def test_descriptor_set_file_and_indexes(tmp_path):
    from tests.iceberg.conftest import descriptor_set

    s = ProtoSchema.from_descriptor_set_file(descriptor_set(tmp_path / "set.binpb", "shop/v1/order.proto"))
    assert s.file.name == "shop/v1/order.proto"
    assert s.message_by_indexes([0]).full_name == "shop.v1.Category"
    assert s.message_by_indexes([1, 0]).full_name == "shop.v1.Order.Line"
    assert s.indexes_of(s.message_by_name("shop.v1.OrderKey")) == (2,)
    with pytest.raises(LookupError, match="out of range"):
        s.message_by_indexes([7])


def test_descriptor_form_schema_strings(order_pb2):
    """Registry strings that are base64 FileDescriptorProtos (what confluent-kafka registers),
    alone, mixed with .proto text, and with well-known-type imports."""
    import base64

    from google.protobuf import descriptor_pb2

    from rsm_sidecar.iceberg.decoding.protobuf_schema import decode_schema_string

    def b64(fd) -> str:
        return base64.b64encode(fd.serialized_pb).decode()

    money = order_pb2.DESCRIPTOR.dependencies[-1]
    assert money.name == "common/v1/money.proto"
    # all descriptor form, no WKT import
    dep = 'syntax = "proto3"; package d; message D { int32 x = 1; }'
    d_fdp = ProtoSchema.from_sources("d.proto", {"d.proto": dep}).file
    p = descriptor_pb2.FileDescriptorProto()
    d_fdp.CopyToProto(p)
    only = ProtoSchema.from_sources("main", {"main": base64.b64encode(p.SerializeToString()).decode()})
    assert only.message_by_indexes([0]).full_name == "d.D"
    # descriptor-form main with WKT imports + descriptor-form reference
    s = ProtoSchema.from_sources(
        "main", {"main": b64(order_pb2.DESCRIPTOR), "common/v1/money.proto": b64(money)}
    )
    assert s.message_by_indexes([1]).full_name == "shop.v1.Order"
    # .proto text main importing a descriptor-form reference
    text = (
        'syntax = "proto3"; package t; import "common/v1/money.proto"; message T { common.v1.Money m = 1; }'
    )
    t = ProtoSchema.from_sources("t.proto", {"t.proto": text, "common/v1/money.proto": b64(money)})
    assert t.message_by_name("t.T").fields_by_name["m"].message_type.full_name == "common.v1.Money"
    assert decode_schema_string("x", 'syntax = "proto3";') is None
    assert decode_schema_string("x", "bm90IGEgZGVzY3JpcHRvcg==") is None  # "not a descriptor"


# ----------------------------------------------------------------------------- issue 14 §2 rows

NUMS = """
syntax = "proto2";
package n;
message Nums {
  optional sint32 s32 = 1;
  optional sfixed32 sf32 = 2;
  optional sfixed64 sf64 = 3;
  optional fixed64 f64 = 4;
  repeated sint32 packed_s32 = 5 [packed = true];
  repeated fixed64 many_f64 = 6;
}
"""


def test_signed_and_fixed_width_integers():
    """sint32/sfixed32 -> int, sfixed64 -> long, fixed64 -> long wrapping above 2^63-1."""
    desc = ProtoSchema.from_sources("n.proto", {"n.proto": NUMS}).message_by_name("n.Nums")
    dec = ProtoDecoder(desc)
    t = field_types(dec.iceberg_type)
    assert isinstance(t["s32"], IntegerType) and isinstance(t["sf32"], IntegerType)
    assert isinstance(t["sf64"], LongType) and isinstance(t["f64"], LongType)
    assert isinstance(t["packed_s32"].element_type, IntegerType)
    assert isinstance(t["many_f64"].element_type, LongType)
    cls = ProtoSchema.message_class(desc)
    low = cls(s32=-(2**31), sf32=-7, sf64=-(2**63), f64=2**64 - 1, packed_s32=[-1, 2**31 - 1])
    low.many_f64.extend([0, 2**63 - 1, 2**63, 2**64 - 1])
    high = cls(s32=2**31 - 1, sf32=2**31 - 1, sf64=2**63 - 1, f64=2**63)
    wire = low.SerializeToString()
    assert wire.startswith(b"\x08\xff\xff\xff\xff\x0f")  # sint32 -2^31 is zig-zag 2^32-1
    r1, r2, r3 = rows(dec, [wire, high.SerializeToString(), b""])
    assert (r1["s32"], r1["sf32"], r1["sf64"], r1["f64"]) == (-(2**31), -7, -(2**63), -1)
    assert r1["packed_s32"] == [-1, 2**31 - 1]
    assert r1["many_f64"] == [0, 2**63 - 1, -(2**63), -1]  # two's complement, as the seed
    assert (r2["s32"], r2["sf32"], r2["sf64"], r2["f64"]) == (2**31 - 1, 2**31 - 1, 2**63 - 1, -(2**63))
    assert (r3["s32"], r3["f64"], r3["many_f64"]) == (None, None, [])  # proto2: unset is null


GROUPS = """
syntax = "proto2";
package g;
message Search {
  optional string q = 1;
  optional group Paging = 2 { optional int32 page = 3; optional int32 size = 4; }
  repeated group Hit = 5 { optional string url = 6; optional sint64 rank = 7; }
}
"""


def test_proto2_groups_are_structs():
    desc = ProtoSchema.from_sources("g.proto", {"g.proto": GROUPS}).message_by_name("g.Search")
    dec = ProtoDecoder(desc)
    t = field_types(dec.iceberg_type)
    assert list(t) == ["q", "paging", "hit", "__unrecognized__"]  # a group's field is lower-cased
    assert [f.name for f in t["paging"].fields] == ["page", "size", "__unrecognized__"]
    assert [f.name for f in t["hit"].element_type.fields] == ["url", "rank", "__unrecognized__"]
    cls = ProtoSchema.message_class(desc)
    m = cls(q="x")
    m.paging.page = 2
    m.hit.add(url="a", rank=-1)
    m.hit.add(url="b")
    wire = m.SerializeToString()
    assert b"\x13" in wire and b"\x2b" in wire  # start-group tags of fields 2 and 5
    # field 9 inside the Paging group is unknown to the schema: the group's __unrecognized__
    paging_with_unknown = b"\x13" + b"\x18\x01" + b"\x48\x05" + b"\x14"
    r1, r2, r3 = rows(dec, [wire, paging_with_unknown, b"\x0a\x01y"])
    assert r1["q"] == "x" and r1["paging"] == {"page": 2, "size": None, "__unrecognized__": None}
    assert r1["hit"] == [
        {"url": "a", "rank": -1, "__unrecognized__": None},
        {"url": "b", "rank": None, "__unrecognized__": None},
    ]
    assert r2["paging"] == {"page": 1, "size": None, "__unrecognized__": b"\x48\x05"}
    assert r3["paging"] is None and r3["hit"] == []


EXT_BASE = """
syntax = "proto2";
package ext;
import "google/protobuf/descriptor.proto";
extend google.protobuf.FieldOptions { optional string doc = 50001; }
message Base {
  optional string name = 1 [(doc) = "custom options keep compiling"];
  optional Inner inner = 2;
  extensions 100 to 199;
}
message Inner { optional int32 n = 1; extensions 100 to 199; }
extend Base { optional string origin = 150; }
"""
EXT_MAIN = """
syntax = "proto2";
package app;
import "ext/base.proto";
message Event {
  optional string id = 1;
  optional ext.Base base = 2;
  extensions 50 to 60;
  extend ext.Inner { optional bool flag = 101; }
}
extend Event { optional string tag = 50; repeated int32 codes = 51; }
extend ext.Base { optional int64 seen_at = 100; }
"""


def ext_schema() -> ProtoSchema:
    return ProtoSchema.from_sources("app.proto", {"app.proto": EXT_MAIN, "ext/base.proto": EXT_BASE})


def ext_event(schema: ProtoSchema, i: int = 1):
    """An app.Event with extensions at three levels (declared in both files) + the expected
    ``__unrecognized__`` bytes of each level (the same extension values serialized alone)."""
    find = schema.pool.FindExtensionByName
    cls = ProtoSchema.message_class(schema.message_by_name("app.Event"))
    m = cls(id=f"e{i}")
    m.base.name = "b"
    m.base.inner.n = i
    m.Extensions[find("app.tag")] = "t"
    m.Extensions[find("app.codes")].extend([1, 2])
    m.base.Extensions[find("app.seen_at")] = 1_700_000_000 + i
    m.base.Extensions[find("ext.origin")] = "o"
    m.base.inner.Extensions[find("app.Event.flag")] = True
    top = cls()
    top.Extensions[find("app.tag")] = "t"
    top.Extensions[find("app.codes")].extend([1, 2])
    base = type(m.base)()
    base.Extensions[find("app.seen_at")] = 1_700_000_000 + i
    base.Extensions[find("ext.origin")] = "o"
    inner = type(m.base.inner)()
    inner.Extensions[find("app.Event.flag")] = True
    expected = (top.SerializeToString(), base.SerializeToString(), inner.SerializeToString())
    return m, expected


def test_extension_values_land_in_unrecognized():
    """Seed: extension values populate __unrecognized__ (no column), at every message level,
    whether the ``extend`` is in the message's file, another file, or nested in a message."""
    schema = ext_schema()
    desc = schema.message_by_name("app.Event")
    dec = ProtoDecoder(desc)
    assert dec.desc is not desc and dec.full_name == "app.Event"  # rebuilt without the extends
    t = field_types(dec.iceberg_type)
    assert list(t) == ["id", "base", "__unrecognized__"]
    assert [f.name for f in t["base"].fields] == ["name", "inner", "__unrecognized__"]
    m, (top, base, inner) = ext_event(schema)
    plain = type(m)(id="p")
    (r, p) = rows(dec, [m.SerializeToString(), plain.SerializeToString()])
    assert r["id"] == "e1" and r["__unrecognized__"] == top
    assert r["base"]["name"] == "b" and r["base"]["__unrecognized__"] == base
    assert r["base"]["inner"] == {"n": 1, "__unrecognized__": inner}
    assert p == {"id": "p", "base": None, "__unrecognized__": None}
    # the original pool is untouched: it still parses them as extensions
    assert schema.pool.FindAllExtensions(desc)
    # standard options survive the rebuild (map entries stay maps)
    src = 'syntax = "proto2"; package mx; message M { map<string, int32> m = 1; extensions 9 to 9; }'
    mx = ProtoDecoder(ProtoSchema.from_sources("mx.proto", {"mx.proto": src}).message_by_name("mx.M"))
    assert isinstance(field_types(mx.iceberg_type)["m"], MapType)
    # messages that cannot be extended keep their descriptor (nothing rebuilt)
    order = order_schema().message_by_name("shop.v1.Order")
    assert ProtoDecoder(order).desc is order


@pytest.mark.parametrize(
    "proto, field, message, rule",
    [
        ("message M { string __err__ = 3; }", "'__err__' (number 3)", "r.M", "top-level message"),
        ("message M { bytes __raw__ = 1; }", "'__raw__' (number 1)", "r.M", "top-level message"),
        ("message M { bytes __prefix__ = 2; }", "'__prefix__' (number 2)", "r.M", "top-level message"),
        ("message M { bytes __unrecognized__ = 4; }", "'__unrecognized__' (number 4)", "r.M", "top-level"),
        (
            "message M { N n = 1; } message N { bytes __unrecognized__ = 7; }",
            "'__unrecognized__' (number 7)",
            "r.N",
            "every message struct already has __unrecognized__",
        ),
    ],
)
def test_fields_named_like_synthesized_columns_are_rejected_clearly(proto, field, message, rule):
    from rsm_sidecar.errors import ConfigError
    from rsm_sidecar.iceberg.decoding.proto_mapping import ReservedFieldName

    src = f'syntax = "proto3"; package r; {proto}'
    desc = ProtoSchema.from_sources("r.proto", {"r.proto": src}).message_by_name("r.M")
    with pytest.raises(ReservedFieldName) as info:
        ProtoDecoder(desc)
    text = str(info.value)
    assert field in text and f"of message {message} in r.proto" in text and rule in text
    assert "Rename the field" in text and isinstance(info.value, ConfigError)


def test_side_column_names_below_the_top_level_are_plain_fields():
    from rsm_sidecar.iceberg import types
    from rsm_sidecar.iceberg.decoding.proto_mapping import SIDE_COLUMNS

    assert SIDE_COLUMNS == (types.RAW, types.PREFIX, types.ERR)
    src = 'syntax = "proto3"; package r; message M { N n = 1; } message N { string __err__ = 1; }'
    dec = ProtoDecoder(ProtoSchema.from_sources("r.proto", {"r.proto": src}).message_by_name("r.M"))
    assert [f.name for f in field_types(dec.iceberg_type)["n"].fields] == ["__err__", "__unrecognized__"]


TIMES = """
syntax = "proto3";
package tm;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
message Times {
  string id = 1;
  google.protobuf.Timestamp at = 2;
  google.protobuf.Duration took = 3;
  Inner inner = 4;
  repeated google.protobuf.Timestamp history = 5;
  map<string, google.protobuf.Duration> spans = 6;
  repeated Inner inners = 7;
}
message Inner { google.protobuf.Timestamp at = 1; }
"""


def times_schema() -> ProtoSchema:
    return ProtoSchema.from_sources("tm.proto", {"tm.proto": TIMES})


def times_cases(schema: ProtoSchema) -> list[tuple[str, object, bool]]:
    """(what, message, whether sub-µs nanos are in it) for the ``tm.Times`` message."""
    cls = ProtoSchema.message_class(schema.message_by_name("tm.Times"))
    cases: list[tuple[str, object, bool]] = [("empty", cls(id="empty"), False)]

    def case(what: str, lossy: bool, fill) -> None:
        m = cls(id=what)
        fill(m)
        cases.append((what, m, lossy))

    def at(ns):
        return lambda m: (setattr(m.at, "seconds", 1_700_000_000), setattr(m.at, "nanos", ns))

    case("at whole µs", False, at(1_000_000))
    case("at sub-µs", True, at(1_000_001))
    case("took whole µs", False, lambda m: (setattr(m.took, "seconds", -1), setattr(m.took, "nanos", -2000)))
    case("took sub-µs", True, lambda m: (setattr(m.took, "seconds", -1), setattr(m.took, "nanos", -1999)))
    case("inner sub-µs", True, lambda m: setattr(m.inner.at, "nanos", 5))
    case("inner whole µs", False, lambda m: setattr(m.inner.at, "nanos", 5000))
    case(
        "history, last sub-µs",
        True,
        lambda m: [m.history.add(seconds=s, nanos=n) for s, n in ((1, 0), (2, 3000), (3, 999))],
    )
    case("history whole µs", False, lambda m: [m.history.add(seconds=s, nanos=1000 * s) for s in (1, 2)])
    case("spans sub-µs", True, lambda m: m.spans["b"].MergeFrom(type(m.took)(seconds=2, nanos=1)))
    case("spans whole µs", False, lambda m: m.spans["a"].MergeFrom(type(m.took)(nanos=7000)))
    case("inners sub-µs", True, lambda m: [m.inners.add().at.MergeFrom(type(m.at)(nanos=n)) for n in (0, 7)])
    return cases


def test_sub_microsecond_nanos_mark_the_row_as_lossy():
    """A Timestamp/Duration whose nanos are not whole µs, at any depth (nested, repeated, map
    values), flags its row; the columns still hold the value cut to µs."""
    schema = times_schema()
    dec = ProtoDecoder(schema.message_by_name("tm.Times"))
    assert dec.may_lose
    cases = times_cases(schema)
    msgs = [dec.parse(m.SerializeToString()) for _, m, _ in cases]
    children, lossy = dec.children_lossy(msgs)
    assert lossy is not None
    assert dict(zip([w for w, _, _ in cases], lossy.to_pylist())) == {w: x for w, _, x in cases}
    got = pa.StructArray.from_arrays(children, fields=list(dec.arrow_type)).to_pylist()
    by = {r["id"]: r for r in got}
    assert by["at sub-µs"]["at"] == dt.datetime.fromtimestamp(1_700_000_000, UTC) + dt.timedelta(
        microseconds=1000
    )
    assert by["took sub-µs"]["took"] == -1_000_001 and by["took whole µs"]["took"] == -1_000_002
    assert by["history, last sub-µs"]["history"][2] == dt.datetime.fromtimestamp(3, UTC)
    assert by["spans sub-µs"]["spans"] == [("b", 2_000_000)]
    # only rows without sub-µs nanos: no mask at all (what the encoder's fast path relies on)
    clean = [m for (_, _, x), m in zip(cases, msgs) if not x]
    assert dec.children_lossy(clean)[1] is None


def test_nothing_is_lossy_without_timestamps_or_with_the_seed_only_mapping():
    schema = times_schema()
    plain = ProtoDecoder(schema.message_by_name("tm.Times"), ProtoOptions(well_known_types=False))
    assert not plain.may_lose
    cases = times_cases(schema)
    msgs = [plain.parse(m.SerializeToString()) for _, m, _ in cases]
    children, lossy = plain.children_lossy(msgs)
    assert lossy is None
    rows = pa.StructArray.from_arrays(children, fields=list(plain.arrow_type)).to_pylist()
    assert rows[2]["at"] == {"seconds": 1_700_000_000, "nanos": 1_000_001, "__unrecognized__": None}
    assert not ProtoDecoder(schema.message_by_name("tm.Inner"), ProtoOptions(well_known_types=False)).may_lose
    src = 'syntax = "proto3"; package nt; message M { string s = 1; repeated int64 n = 2; }'
    assert not ProtoDecoder(
        ProtoSchema.from_sources("nt.proto", {"nt.proto": src}).message_by_name("nt.M")
    ).may_lose
