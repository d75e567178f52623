"""JSON values as columns against the real registry (Apicurio's Confluent API) and real Spark:
Confluent-framed JSON Schema keys and values with a reference to another registered schema,
error rows (not JSON, not matching, an Avro id, an unknown id), ``unframed = latest``; the job
over two schema versions (a property added, one widened from integer to number, a nested one
added) with the field ids checked; plain JSON without a registry, with a JSON Schema file and
with an inferred schema that grows over two runs."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference

from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg.decoding import framing
from rsm_sidecar.iceberg.decoding.schema_registry import SchemaRegistry, topic_subject
from rsm_sidecar.iceberg.decoding.sides import json_schema_property, resolve_side
from rsm_sidecar.iceberg.mapping.evolution import field_ids
from rsm_sidecar.iceberg.mapping.rows import EncoderSpec, RowEncoder
from rsm_sidecar.iceberg.reading.raw_records import raw_batch
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
from tests.iceberg.convert_helpers import T0, SyntheticTopic
from tests.iceberg.test_registry import rec

DRAFT = "http://json-schema.org/draft-07/schema#"
CUSTOMER = {
    "$schema": DRAFT,
    "type": "object",
    "properties": {"cid": {"type": "integer"}, "tier": {"type": "string"}},
}
ORDER_V1 = {
    "$schema": DRAFT,
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "qty": {"type": "integer"},
        "at": {"type": "string", "format": "date-time"},
        "customer": {"$ref": "customer.json"},
        "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}},
    },
    "$defs": {"line": {"type": "object", "properties": {"sku": {"type": "string"}}}},
}
ORDER_V2 = json.loads(json.dumps(ORDER_V1))
ORDER_V2["properties"]["qty"] = {"type": "number"}
ORDER_V2["properties"]["note"] = {"type": ["string", "null"]}
ORDER_V2["$defs"]["line"]["properties"]["price"] = {"type": "number"}


def register_order(sr_client, topic: str, schema: dict) -> int:
    ref_subject = f"{topic}-customer"
    sr_client.register_schema(ref_subject, Schema(json.dumps(CUSTOMER), "JSON"))
    ref = SchemaReference("customer.json", ref_subject, 1)
    return sr_client.register_schema(topic_subject(topic, False), Schema(json.dumps(schema), "JSON", [ref]))


def framed(sid: int, value: dict | bytes) -> bytes:
    body = value if isinstance(value, bytes) else json.dumps(value).encode()
    return framing.encode_preamble(sid) + body


def test_framed_json_keys_and_values_from_the_registry(registry_url, sr_client, topic):
    sid = register_order(sr_client, topic, ORDER_V1)
    kid = sr_client.register_schema(
        topic_subject(topic, True),
        Schema(json.dumps({"$schema": DRAFT, "type": "string", "format": "uuid"}), "JSON"),
    )
    avro_id = sr_client.register_schema(f"{topic}-avro", Schema(json.dumps({"type": "string"}), "AVRO"))
    reg = SchemaRegistry(registry_url)
    spec = EncoderSpec(resolve_side(reg, topic, True), resolve_side(reg, topic, False))
    assert (spec.key.kind, spec.val.kind, spec.val.schema_id) == ("json", "json", sid)
    assert spec.val.describe().startswith(f"json of {topic}-value version 1 (schema id {sid})")
    enc = RowEncoder(spec)
    val_type = enc.schema.find_field("val").field_type
    assert [f.name for f in val_type.fields] == [
        "__raw__",
        "__prefix__",
        "__err__",
        "id",
        "qty",
        "at",
        "customer",
        "lines",
    ]
    assert [f.name for f in val_type.fields[-2].field_type.fields] == ["cid", "tier"]
    order = {
        "id": 1,
        "qty": 2,
        "at": "2026-12-01T10:00:00Z",
        "customer": {"cid": 7, "tier": "gold"},
        "lines": [{"sku": "a"}, {"sku": "b"}],
    }
    key = framed(kid, b'"0b7e4b9a-3d1c-4a2b-9c3e-5f6a7b8c9d0e"')
    good = [framed(sid, order), framed(sid, {"id": 2, "lines": []}), None]
    fast = enc.encode(raw_batch([rec(i, key, v) for i, v in enumerate(good)])).to_pylist()
    bad = [
        *good,
        framed(sid, b"{not json"),
        framed(sid, {"id": "two"}),
        framed(avro_id, {"id": 3}),
        framed(987654, {"id": 4}),
        b'{"id":5}',
        framed(sid, {"id": 6, "customer": {"cid": 1, "vip": True}}),
    ]
    slow = enc.encode(raw_batch([rec(i, key, v) for i, v in enumerate(bad)])).to_pylist()
    assert fast == slow[:3]
    row = slow[0]
    assert row["key"]["value"] == "0b7e4b9a-3d1c-4a2b-9c3e-5f6a7b8c9d0e" and row["key"]["__raw__"] == key
    v = row["val"]
    assert (v["__raw__"], v["__err__"], v["__prefix__"]) == (None, None, framing.encode_preamble(sid))
    assert (v["id"], v["qty"], v["customer"], v["lines"]) == (
        1,
        2,
        {"cid": 7, "tier": "gold"},
        order["lines"],
    )
    assert v["at"].isoformat() == "2026-12-01T10:00:00+00:00"
    assert slow[2]["val"] is None
    errs = [r["val"]["__err__"] for r in slow[3:]]
    assert errs[0].startswith("invalid JSON: JSONDecodeError")
    assert errs[1] == f"JSON does not match schema id {sid}: id: a JSON string, not an integer"
    assert errs[2] == f"schema id {avro_id} is AVRO, not JSON"
    assert errs[3] == "unknown schema id 987654"
    assert errs[4] == "missing magic byte: first byte is 0x7b, expected 0x00"
    assert errs[5] is None and slow[8]["val"]["__raw__"] == bad[8]  # an undeclared property: kept
    for r, b in zip(slow[3:8], bad[3:8]):
        assert r["val"]["__raw__"] == b and r["val"]["id"] is None


def test_unframed_json_with_the_latest_schema(registry_url, sr_client, topic):
    sid = register_order(sr_client, topic, ORDER_V1)
    reg = SchemaRegistry(registry_url)
    enc = RowEncoder(EncoderSpec(val=resolve_side(reg, topic, False, unframed="latest")))
    for datas in ([b'{"id":1}', b'{"id":2}'], [b'{"id":1}', framed(sid, {"id": 2}), b"nope"]):
        rows = [
            r["val"]
            for r in enc.encode(raw_batch([rec(i, None, d) for i, d in enumerate(datas)])).to_pylist()
        ]
        assert [(r["__schema_id__"], r["id"]) for r in rows[:2]] == [(sid, 1), (sid, 2)]
        assert rows[0]["__prefix__"] is None
    assert rows[2]["__err__"].startswith("invalid JSON") and rows[2]["__schema_id__"] is None


def test_convert_framed_json_over_two_schema_versions(spark, registry_url, sr_client, tmp_path):
    """The job with Spark: field ids stay across a new version (property added, nested property
    added, integer widened to number: the old column retired as ``qty__v1``), rows of both."""
    t = SyntheticTopic(tmp_path / "t", f"json-orders-{tmp_path.name[-12:]}")
    sr_client.set_compatibility(topic_subject(t.topic, False), "NONE")
    v1 = register_order(sr_client, t.topic, ORDER_V1)
    first = [framed(v1, {"id": i, "qty": i, "lines": [{"sku": f"s{i}"}]}) for i in range(10)]
    first[3] = framed(v1, b"[")
    t.segment(0, [build_batch([SimpleRecord(b"k", v, T0 + i) for i, v in enumerate(first)], base_offset=0)])
    res = t.convert(spark, **{"iceberg.registry.url": registry_url})
    assert res.records == 10
    before = field_ids(t.table().schema())
    v2 = register_order(sr_client, t.topic, ORDER_V2)
    second = [
        framed(v2, {"id": 10 + i, "qty": 0.5, "note": "n", "lines": [{"sku": "x", "price": 1.5}]})
        for i in range(5)
    ]
    second.append(framed(v1, {"id": 15, "qty": 3}))  # an old writer after the change
    t.segment(0, [build_batch([SimpleRecord(b"k", v, T0 + i) for i, v in enumerate(second)], base_offset=10)])
    t.convert(spark, **{"iceberg.registry.url": registry_url})
    table = t.table()
    after = field_ids(table.schema())
    for path in ("val.id", "val.lines", "val.lines.element.sku", "val.customer.cid", "val.at"):
        assert after[path] == before[path], path
    assert after["val.qty__v1"] == before["val.qty"]  # retired with its id and data
    assert {"val.qty", "val.note", "val.lines.element.price"} <= set(after) and after[
        "val.qty"
    ] not in before.values()
    rows = {r["kafka"]["offset"]: r["val"] for r in table.scan().to_arrow().to_pylist()}
    assert (
        rows[1]["qty__v1"] == 1
        and rows[1]["qty"] is None
        and rows[1]["lines"] == [{"sku": "s1", "price": None}]
    )
    assert rows[3]["__err__"].startswith("invalid JSON") and rows[3]["__raw__"] == first[3]
    assert (rows[12]["qty"], rows[12]["note"], rows[12]["lines"]) == (0.5, "n", [{"sku": "x", "price": 1.5}])
    assert rows[15]["qty"] == 3.0 and rows[15]["__err__"] is None
    # Spark reads the same table
    name = f"{t.catalog_name}.kafka.{t.table().name()[-1]}"
    got = spark.sql(f"SELECT val.qty, val.qty__v1 FROM {name} WHERE kafka.offset IN (1, 12)").collect()
    assert {(r[0], r[1]) for r in got} == {(None, 1), (0.5, None)}


def test_plain_json_with_a_schema_file_and_with_an_inferred_schema(spark, tmp_path):
    values = [json.dumps({"order_id": i, "status": "paid", "amount": i / 4}).encode() for i in range(30)]
    values[5] = b'{"order_id":5,"status":"paid","amount":1.25,"coupon":"X"}'  # not in the schema, not sampled
    values[7] = b"not json"
    schema_file = tmp_path / "orders.schema.json"
    schema_file.write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "order_id": {"type": "integer"},
                    "status": {"type": "string"},
                    "amount": {"type": "number"},
                },
            }
        )
    )
    for how, overrides in (
        ("file", {"iceberg.value.json_schema": str(schema_file)}),
        ("infer", {"iceberg.value.json_infer": 4}),
    ):
        t = SyntheticTopic(tmp_path / how, f"plain-{how}")
        t.segment(
            0, [build_batch([SimpleRecord(b"k", v, T0 + i) for i, v in enumerate(values)], base_offset=0)]
        )
        t.convert(spark, **overrides)
        table = t.table()
        names = [f.name for f in table.schema().find_field("val").field_type.fields]
        assert names == ["__raw__", "__prefix__", "__err__", "order_id", "status", "amount"], how
        rows = {r["kafka"]["offset"]: r["val"] for r in table.scan().to_arrow().to_pylist()}
        assert (rows[2]["order_id"], rows[2]["amount"], rows[2]["__raw__"]) == (2, 0.5, None)
        assert rows[5]["__raw__"] == values[5] and rows[5]["order_id"] == 5  # kept, never dropped
        assert rows[7]["__err__"].startswith("invalid JSON") and rows[7]["__raw__"] == b"not json"
    # inference goes on in the next run: a new property in its sample becomes a column
    later = [json.dumps({"order_id": 30 + i, "coupon": "Y", "gift": {"to": "me"}}).encode() for i in range(4)]
    t.segment(0, [build_batch([SimpleRecord(b"k", v, T0 + i) for i, v in enumerate(later)], base_offset=30)])
    t.convert(spark, **overrides)
    table = t.table()
    names = [f.name for f in table.schema().find_field("val").field_type.fields]
    assert names[3:] == ["order_id", "status", "amount", "coupon", "gift"]
    assert json.loads(table.properties[json_schema_property(False)])["properties"]["gift"]["type"] == "object"
    rows = {r["kafka"]["offset"]: r["val"] for r in table.scan().to_arrow().to_pylist()}
    assert (rows[31]["coupon"], rows[31]["gift"], rows[31]["__raw__"]) == ("Y", {"to": "me"}, None)
    assert rows[5]["coupon"] is None and rows[5]["__raw__"] == values[5]  # converted rows stay as they were


def test_settings_refuse_two_ways_for_one_side(tmp_path):
    from rsm_sidecar.iceberg.job import load_config
    from rsm_sidecar.iceberg.settings import JobSettings

    f = tmp_path / "s.json"
    f.write_text("{}")
    t = SyntheticTopic(tmp_path / "t", "x")
    for overrides, why in (
        ({"iceberg.value.json_schema": str(f), "iceberg.value.json_infer": 5}, "different ways"),
        ({"iceberg.value.json_schema": str(tmp_path / "none.json")}, "is not a file"),
        (
            {
                "iceberg.value.json_schema": str(f),
                "iceberg.value.unframed": "latest",
                "iceberg.registry.url": "http://x",
            },
            "cannot go with iceberg.value.json_schema",
        ),
    ):
        with pytest.raises(ConfigError, match=why):
            JobSettings.from_config(load_config(t.config_file, {}, overrides)[0])
