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

from rsm_sidecar.iceberg.proto_mapping import ProtoDecoder, ProtoOptions, encode_unknown
from rsm_sidecar.iceberg.protobuf_schema import ProtoSchema, SchemaCompileError
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
    from grpc_tools import protoc

    from tests.iceberg.conftest import _wkt

    out = tmp_path / "set.binpb"
    assert (
        protoc.main(
            [
                "protoc",
                f"-I{PROTO_DIR}",
                f"-I{_wkt()}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                "shop/v1/order.proto",
            ]
        )
        == 0
    )
    s = ProtoSchema.from_descriptor_set_file(out)
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

    from rsm_sidecar.iceberg.protobuf_schema import decode_schema_string

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
