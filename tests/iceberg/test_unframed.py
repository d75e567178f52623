"""Values without the registry's framing decoded with the subject's latest schema
(``iceberg.<side>.unframed = latest``, the seed's deserializer rule), against a real Apicurio
registry: Avro and Protobuf, keys and values, the schema id of every row in ``__schema_id__``,
a new latest version recorded per row, the Avro values that start like a preamble, what stays
an error, and the default (``error``) unchanged."""

from __future__ import annotations

import io
import json

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg.decoding import framing
from rsm_sidecar.iceberg.decoding.schema_registry import SchemaRegistry, SubjectSpec, topic_subject
from rsm_sidecar.iceberg.decoding.sides import SCHEMA_ID, build_side, resolve_side
from rsm_sidecar.iceberg.mapping.rows import EncoderSpec, RowEncoder
from rsm_sidecar.iceberg.reading.raw_records import raw_batch
from rsm_sidecar.iceberg.types import ReservedFieldName
from tests.iceberg.test_registry import proto_ser, rec

CLICK_V1 = {
    "type": "record",
    "name": "Click",
    "namespace": "web",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "page", "type": "string"},
        {"name": "n", "type": ["null", "int"], "default": None},
    ],
}
CLICK_V2 = {**CLICK_V1, "fields": [*CLICK_V1["fields"], {"name": "ref", "type": "string", "default": "-"}]}


def unframed(schema: dict, datum: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def encoder(registry_url: str, topic: str, samples=(), **val) -> RowEncoder:
    reg = SchemaRegistry(registry_url)
    reg.client.clear_latest_caches()  # as every run of the job does: the latest version as of now
    return RowEncoder(EncoderSpec(resolve_side(reg, topic, True), resolve_side(reg, topic, False, **val)))


def values(enc: RowEncoder, datas: list) -> list[dict]:
    batch = raw_batch([rec(i, None, d) for i, d in enumerate(datas)])
    return [r["val"] for r in enc.encode(batch).to_pylist()]


def test_unframed_avro_values_are_decoded_with_the_latest_schema_and_its_id_recorded(
    registry_url, sr_client, topic
):
    subject = topic_subject(topic, False)
    id1 = sr_client.register_schema(subject, Schema(json.dumps(CLICK_V1), "AVRO"))
    conf = {"subject.name.strategy.type": "TOPIC", "auto.register.schemas": False}
    ser = AvroSerializer(sr_client, json.dumps(CLICK_V1), conf=conf)
    framed = ser({"id": 7, "page": "/framed", "n": 1}, SerializationContext(topic, MessageField.VALUE))
    plain = unframed(CLICK_V1, {"id": 8, "page": "/plain", "n": None})
    # id 0 and a 3-character page: 00 06 'a' 'b' 'c' 00 starts like a preamble of schema id
    # 0x06616263, which the registry does not have: read as unframed, and the bytes kept
    zero = unframed(CLICK_V1, {"id": 0, "page": "abc", "n": None})
    assert zero[0] == 0 and len(zero) >= 5
    leftover = plain + b"\x02"  # one byte more than a datum of the schema
    kop = framing.KOP_MARKER + (3).to_bytes(8, "big") + plain
    enc = encoder(registry_url, topic, unframed="latest")
    names = [f.name for f in enc.schema.find_field("val").field_type.fields]
    assert names[:4] == ["__raw__", "__prefix__", "__err__", SCHEMA_ID]
    rows = values(enc, [framed, plain, zero, leftover, kop, None])
    f, p, z, left, k, tomb = rows
    assert (f["id"], f["page"], f["n"], f[SCHEMA_ID]) == (7, "/framed", 1, id1)
    assert f["__prefix__"] == framed[:5] and f["__raw__"] is None and f["__err__"] is None
    assert (p["id"], p["page"], p["n"], p[SCHEMA_ID]) == (8, "/plain", None, id1)
    assert p["__prefix__"] is None and p["__raw__"] is None and p["__err__"] is None
    assert (z["id"], z["page"], z[SCHEMA_ID], z["__err__"]) == (0, "abc", id1, None)
    assert z["__raw__"] == zero  # it might have been a framed value of a deleted schema
    assert "1 byte(s) left after the datum" in left["__err__"] and left["__raw__"] == leftover
    assert left[SCHEMA_ID] is None and left["id"] is None
    assert "KoP schema-version marker" in k["__err__"] and k["__raw__"] == kop and k[SCHEMA_ID] is None
    assert tomb is None
    # the next run pins the new latest version: its unframed rows record the new id, framed
    # rows keep theirs
    id2 = sr_client.register_schema(subject, Schema(json.dumps(CLICK_V2), "AVRO"))
    assert id2 != id1
    enc2 = encoder(registry_url, topic, unframed="latest")
    newer = unframed(CLICK_V2, {"id": 9, "page": "/v2", "n": 3, "ref": "mail"})
    f2, p2 = values(enc2, [framed, newer])
    assert (f2["id"], f2["ref"], f2[SCHEMA_ID]) == (7, "-", id1)
    assert (p2["id"], p2["n"], p2["ref"], p2[SCHEMA_ID], p2["__raw__"]) == (9, 3, "mail", id2, None)
    # a preamble-like start whose unframed reading fails too names both readings
    bad = values(enc2, [b"\x00\x10\x00\x00\x01\x7f"])[0]
    assert bad["__err__"].startswith("unknown schema id 268435457, and as an unframed value: invalid Avro")


def test_the_default_keeps_unframed_values_record_errors(registry_url, sr_client, topic):
    sr_client.register_schema(topic_subject(topic, False), Schema(json.dumps(CLICK_V1), "AVRO"))
    enc = encoder(registry_url, topic)
    names = [f.name for f in enc.schema.find_field("val").field_type.fields]
    assert SCHEMA_ID not in names
    (row,) = values(enc, [unframed(CLICK_V1, {"id": 8, "page": "/plain", "n": None})])
    assert "missing magic byte" in row["__err__"] and row["__raw__"] is not None and row["id"] is None


def test_unframed_protobuf_keys_and_values_on_the_vectorised_and_the_per_record_path(
    registry_url, sr_client, topic, order_pb2
):
    val_ser = proto_ser(order_pb2.Order, sr_client, topic)
    key_ser = proto_ser(order_pb2.OrderKey, sr_client, topic, is_key=True)
    framed_val = val_ser(order_pb2.Order(id="framed", status=order_pb2.SHIPPED))
    framed_key = key_ser(order_pb2.OrderKey(id="framed", region=1))
    orders = [order_pb2.Order(id=f"o-{i}", status=order_pb2.PLACED, big=i) for i in range(4)]
    orders[1].lines.add(sku="s", qty=2)
    plain_vals = [o.SerializeToString() for o in orders]
    plain_keys = [order_pb2.OrderKey(id=f"o-{i}", region=i).SerializeToString() for i in range(4)]
    reg = SchemaRegistry(registry_url)
    spec = EncoderSpec(
        resolve_side(reg, topic, True, SubjectSpec(message="shop.v1.OrderKey"), unframed="latest"),
        resolve_side(reg, topic, False, samples=[framed_val], unframed="latest"),
    )
    assert spec.val.message == "shop.v1.Order" and spec.val.unframed_latest
    val_id = int.from_bytes(framed_val[1:5], "big")
    key_id = int.from_bytes(framed_key[1:5], "big")
    enc = RowEncoder(spec)
    # every value unframed: the side's vectorised path takes the whole batch
    side = build_side(spec.val)
    assert side.decode_arrow(raw_batch([rec(i, None, v) for i, v in enumerate(plain_vals)]).column("value"))
    alone = enc.encode(raw_batch([rec(i, k, v) for i, (k, v) in enumerate(zip(plain_keys, plain_vals))]))
    # mixed with framed ones, a tombstone and an error: the per-record path
    mixed = enc.encode(
        raw_batch(
            [rec(i, k, v) for i, (k, v) in enumerate(zip(plain_keys, plain_vals))]
            + [rec(4, framed_key, framed_val), rec(5, None, None), rec(6, b"\xff\xff", b"\xff\xff")]
        )
    ).to_pylist()
    assert alone.to_pylist() == mixed[:4]
    for i, row in enumerate(mixed[:4]):
        assert (row["val"]["id"], row["val"]["big"], row["val"][SCHEMA_ID]) == (f"o-{i}", i, val_id)
        assert (row["key"]["id"], row["key"]["region"], row["key"][SCHEMA_ID]) == (f"o-{i}", i, key_id)
        assert row["val"]["__prefix__"] is None and row["val"]["__raw__"] is None
        assert row["key"]["__raw__"] == plain_keys[i]  # key.__raw__ is always set
    assert mixed[1]["val"]["lines"][0]["qty"] == 2
    framed_row, tomb, bad = mixed[4:]
    assert framed_row["val"]["id"] == "framed" and framed_row["val"][SCHEMA_ID] == val_id
    assert framed_row["val"]["__prefix__"] == framed_val[:7]
    assert framed_row["key"]["region"] == 1 and framed_row["key"][SCHEMA_ID] == key_id
    assert tomb["val"] is None and tomb["key"] is None
    assert bad["val"]["__err__"].startswith("invalid Protobuf for shop.v1.Order")
    assert bad["val"][SCHEMA_ID] is None and bad["val"]["__raw__"] == b"\xff\xff"
    assert bad["key"]["__err__"].startswith("invalid Protobuf for shop.v1.OrderKey")


def test_unframed_latest_is_refused_where_it_cannot_apply(registry_url, sr_client, topic, tmp_path):
    from rsm_sidecar.config import Config
    from rsm_sidecar.iceberg.settings import JobSettings

    def settings(**values):
        storage = {"backend": "local", "local": {"root": str(tmp_path)}}
        return JobSettings.from_config(Config({"storage": storage, "iceberg": values}, environ={}))

    assert settings(value={"unframed": "latest"}, registry={"url": registry_url}).value.unframed == "latest"
    with pytest.raises(ConfigError, match="set iceberg.registry.url"):
        settings(value={"unframed": "latest"})
    with pytest.raises(ConfigError, match="cannot go with iceberg.key.raw"):
        settings(key={"unframed": "latest", "raw": True}, registry={"url": registry_url})
    with pytest.raises(ConfigError, match="unframed"):
        settings(value={"unframed": "newest"}, registry={"url": registry_url})
    # a field named like the column the fallback adds fails the job at start
    clash = {"type": "record", "name": "C", "fields": [{"name": SCHEMA_ID, "type": "int"}]}
    sr_client.register_schema(topic_subject(topic, False), Schema(json.dumps(clash), "AVRO"))
    reg = SchemaRegistry(registry_url)
    with pytest.raises(ReservedFieldName, match=SCHEMA_ID):
        RowEncoder(EncoderSpec(val=resolve_side(reg, topic, False, SubjectSpec(), unframed="latest")))
