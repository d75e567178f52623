"""Schema evolution with stable field ids, on a real PyIceberg SqlCatalog table, with two
Protobuf schema versions registered in Apicurio and records of both versions."""

from __future__ import annotations

from confluent_kafka.schema_registry import Schema
from pyiceberg.types import IntegerType, LongType, NestedField, StringType, StructType

from rsm_sidecar.iceberg.decoding import framing
from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema
from rsm_sidecar.iceberg.decoding.schema_registry import SchemaRegistry, topic_subject
from rsm_sidecar.iceberg.decoding.sides import resolve_side
from rsm_sidecar.iceberg.mapping.evolution import ensure_table, field_ids, plan_update
from rsm_sidecar.iceberg.mapping.rows import EncoderSpec, RowEncoder
from rsm_sidecar.iceberg.reading.raw_records import KafkaRecord, raw_batch
from rsm_sidecar.iceberg.types import schema_to_arrow

V1 = """syntax = "proto3";
package evo;
message User {
  string name = 1;
  int32 age = 2;
  float score = 3;
  string nickname = 4;
  message Address { string city = 1; int32 zip = 2; }
  Address address = 5;
  repeated int32 points = 6;
}
"""
V2 = """syntax = "proto3";
package evo;
message User {
  int64 name = 1;          // incompatible: string -> int64
  int64 age = 2;           // promotion: int -> long
  double score = 3;        // promotion: float -> double
  // nickname (4) deleted
  message Address { string city = 1; int64 zip = 2; string street = 3; }
  Address address = 5;
  repeated int64 points = 6;
  string email = 7;        // added
}
"""


def _cls(text: str):
    s = ProtoSchema.from_sources("user.proto", {"user.proto": text})
    return ProtoSchema.message_class(s.message_by_name("evo.User"))


def _encoder(reg, topic, table):
    """(mapping's own encoder, encoder aligned to the table's current schema)."""
    spec = EncoderSpec(resolve_side(reg, topic, True), resolve_side(reg, topic, False))
    return RowEncoder(spec), RowEncoder(spec.with_table(schema_to_arrow(table.schema())))


def test_two_versions_on_a_real_table(registry_url, sr_client, topic, local_catalog):
    subject = topic_subject(topic, False)
    id1 = sr_client.register_schema(subject, Schema(V1, "PROTOBUF"))
    U1 = _cls(V1)
    u1 = U1(name="ann", age=41, score=1.5, nickname="a", points=[1, 2])
    u1.address.city, u1.address.zip = "Oslo", 150
    rec1 = framing.encode_preamble(id1, [0]) + u1.SerializeToString()

    reg = SchemaRegistry(registry_url)
    catalog = local_catalog.pyiceberg()
    ident = f"evo.{topic.replace('-', '_')}"
    enc1 = RowEncoder(EncoderSpec(resolve_side(reg, topic, True), resolve_side(reg, topic, False)))
    table = ensure_table(catalog, ident, enc1.schema, partition="day")
    ids1 = field_ids(table.schema())
    _, aligned1 = _encoder(reg, topic, table)
    table.append(_to_table(aligned1, [KafkaRecord(0, 0, 0, 1_000, 1_000, None, rec1)]))

    # --- version 2 (incompatible change needs compatibility NONE in the registry)
    sr_client.set_compatibility(subject, "NONE")
    id2 = sr_client.register_schema(subject, Schema(V2, "PROTOBUF"))
    assert id2 != id1
    reg.client.clear_latest_caches()
    enc2 = RowEncoder(EncoderSpec(resolve_side(reg, topic, True), resolve_side(reg, topic, False)))
    changes = plan_update(table.schema(), enc2.schema)
    assert {str(c) for c in changes} == {
        "retire val.name as name__v1 (new name: long)",
        "promote val.age to long",
        "promote val.score to double",
        "promote val.address.zip to long",
        "add val.address.street: string",
        "promote val.points.element to long",
        "add val.email: string",
    }
    last_id = table.metadata.last_column_id
    table = ensure_table(catalog, ident, enc2.schema)
    ids2 = field_ids(table.schema())

    # ids: kept for unchanged, promoted and deleted fields; the retired column keeps the old id
    for path in [
        "key",
        "val",
        "val.__raw__",
        "val.age",
        "val.score",
        "val.nickname",
        "val.address",
        "val.address.city",
        "val.address.zip",
        "val.points",
        "val.points.element",
        "val.__unrecognized__",
        "kafka.offset",
        "headers.element.key",
    ]:
        assert ids2[path] == ids1[path], path
    assert ids2["val.name__v1"] == ids1["val.name"]
    new = {p: ids2[p] for p in ["val.name", "val.email", "val.address.street"]}
    assert all(i > last_id for i in new.values()) and len(set(new.values())) == 3
    assert set(ids2.values()) >= set(ids1.values())  # nothing dropped, nothing reused
    val = table.schema().find_field("val").field_type
    assert isinstance(val.field_by_name("name").field_type, LongType)
    assert isinstance(val.field_by_name("name__v1").field_type, StringType)
    assert isinstance(val.field_by_name("age").field_type, LongType)

    # v2 records and an old v1 record, both decoded with the table's current (v2) schema
    U2 = _cls(V2)
    u2 = U2(name=7, age=2**40, score=2.5, email="b@x", points=[2**40])
    u2.address.city, u2.address.street, u2.address.zip = "Rome", "Via 1", 2**33
    rec2 = framing.encode_preamble(id2, [0]) + u2.SerializeToString()
    _, aligned2 = _encoder(reg, topic, table)
    table.append(
        _to_table(
            aligned2,
            [KafkaRecord(0, 1, 1, 2_000, 2_000, None, rec2), KafkaRecord(0, 2, 2, 3_000, 3_000, None, rec1)],
        )
    )
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["kafka"]["offset"])
    r0, r1, r2 = (r["val"] for r in rows)
    assert r0["name__v1"] == "ann" and r0["name"] is None and r0["nickname"] == "a"
    assert r0["age"] == 41 and r0["points"] == [1, 2] and r0["address"]["zip"] == 150
    assert r1["name"] == 7 and r1["name__v1"] is None and r1["age"] == 2**40
    assert r1["email"] == "b@x" and r1["address"]["street"] == "Via 1" and r1["address"]["zip"] == 2**33
    assert r1["nickname"] is None and r1["points"] == [2**40]
    # the v1 record under the v2 schema: field 1 (string on the wire, int64 now) and the
    # deleted field 4 land in __unrecognized__; everything compatible decodes
    # (proto3 implicit presence: an absent int64 reads as 0)
    assert r2["__err__"] is None and r2["name"] == 0 and r2["nickname"] is None
    assert r2["age"] == 41 and r2["address"]["city"] == "Oslo"
    unknown = U1.FromString(r2["__unrecognized__"])
    assert unknown.name == "ann" and unknown.nickname == "a"

    # a third version that changes name again: the next retired name is name__v2
    later = StructType(*[f for f in enc2.schema.as_struct().fields])
    val_fields = [
        NestedField(900, "name", StringType(), required=False) if f.name == "name" else f
        for f in later.field(2).field_type.fields
    ]
    v3 = StructType(
        *[
            NestedField(f.field_id, f.name, StructType(*val_fields), required=False) if f.name == "val" else f
            for f in later.fields
        ]
    )
    assert [str(c) for c in plan_update(table.schema(), v3)] == [
        "retire val.name as name__v2 (new name: string)"
    ]


def _to_table(enc, records):
    import pyarrow as pa

    return pa.Table.from_batches([enc.encode(raw_batch(records))])


def test_plan_rules_without_a_table():
    cur = StructType(
        NestedField(1, "a", IntegerType(), required=False),
        NestedField(2, "b", StructType(NestedField(3, "x", IntegerType(), required=False)), required=False),
    )
    same = plan_update(cur, cur)
    assert same == []
    narrowed = StructType(NestedField(1, "a", IntegerType(), required=False))
    # a long column receiving int data needs nothing; a removed field needs nothing
    wide = StructType(NestedField(1, "a", LongType(), required=False))
    assert plan_update(wide, narrowed) == []
    # struct -> scalar is incompatible
    changed = StructType(NestedField(2, "b", StringType(), required=False))
    assert [str(c) for c in plan_update(cur, changed)] == ["retire b as b__v1 (new b: string)"]
