"""Round-trips through bytes made by confluent-kafka's serializers against a real Apicurio
registry, decoded by the row encoder; record-level and job-level errors."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import uuid

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaReference
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from rsm_sidecar.iceberg.decoding import framing
from rsm_sidecar.iceberg.decoding.schema_registry import (
    RegistryUnavailable,
    SchemaRegistry,
    SubjectSpec,
    UnknownSchema,
    topic_subject,
)
from rsm_sidecar.iceberg.decoding.sides import SideSpec, descriptor_set_side, resolve_side
from rsm_sidecar.iceberg.mapping.rows import EncoderSpec, RowEncoder
from rsm_sidecar.iceberg.reading.raw_records import KafkaRecord, raw_batch

UTC = dt.UTC
# confluent-kafka 2.16 defaults to the ASSOCIATED strategy, which Apicurio does not serve.
SER_CONF = {"subject.name.strategy.type": "TOPIC", "use.deprecated.format": False}


def proto_ser(cls, client, topic, is_key=False, **conf):
    ser = ProtobufSerializer(cls, client, {**SER_CONF, **conf})
    field = MessageField.KEY if is_key else MessageField.VALUE
    return lambda m: ser(m, SerializationContext(topic, field))


def rec(offset, key, value, headers=(), ts=1_700_000_000_000):
    return KafkaRecord(3, offset, offset - offset % 10, ts, ts + 5, key, value, list(headers))


def encode(registry_url, topic, records, **side_kw):
    reg = SchemaRegistry(registry_url)
    keys = [r.key for r in records if r.key is not None]
    values = [r.value for r in records if r.value is not None]
    spec = EncoderSpec(
        resolve_side(reg, topic, True, samples=keys, **side_kw.get("key", {})),
        resolve_side(reg, topic, False, samples=values, **side_kw.get("val", {})),
    )
    enc = RowEncoder(spec)
    return enc, enc.encode(raw_batch(records)).to_pylist()


def test_protobuf_round_trip_with_references_and_wkts(registry_url, sr_client, topic, order_pb2):
    val_ser = proto_ser(order_pb2.Order, sr_client, topic)
    key_ser = proto_ser(order_pb2.OrderKey, sr_client, topic, is_key=True)
    o = order_pb2.Order(id="o-1", status=order_pb2.PLACED, card="4111", labels={"x": "y"})
    o.total.currency, o.total.units = "EUR", 42
    o.lines.add(sku="a", qty=1).attrs["w"] = 3
    o.placed_at.FromDatetime(dt.datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC))
    o.note.value = "gift wrap"
    o.attrs.update({"vip": True})
    o.category.name = "books"
    o.category.children.add(name="sf")
    v1 = val_ser(o)
    v2 = val_ser(order_pb2.Order(id="o-2")) + b"\xf8\x06\x2a"  # + unknown field 111 = 42
    k1 = key_ser(order_pb2.OrderKey(id="o-1", region=7))
    assert v1[:5] == b"\x00" + v1[1:5] and v1[5:7] == b"\x02\x02"  # Order is message [1]
    enc, rows = encode(
        registry_url,
        topic,
        [
            rec(10, k1, v1, [("trace", b"t-1"), ("empty", None)]),
            rec(11, k1, v2),
            rec(12, k1, None),  # tombstone
        ],
    )
    r, r2, tomb = rows
    assert r["key"]["id"] == "o-1" and r["key"]["region"] == 7
    assert r["key"]["__raw__"] == k1 and r["key"]["__prefix__"] == k1[:7]
    val = r["val"]
    assert val["__raw__"] is None and val["__err__"] is None and val["__prefix__"] == v1[:7]
    assert val["id"] == "o-1" and val["status"] == "PLACED" and val["card"] == "4111"
    assert val["iban"] is None and val["labels"] == [("x", "y")]
    assert val["total"]["currency"] == "EUR" and val["total"]["units"] == 42
    assert val["lines"][0]["attrs"] == [("w", 3)]
    assert val["placed_at"] == dt.datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    assert val["note"] == "gift wrap" and json.loads(val["attrs"]) == {"vip": True}
    assert (
        val["category"]["children"][0]["__unrecognized__"]
        == order_pb2.Category(name="sf").SerializeToString()
    )
    assert r["headers"] == [{"key": "trace", "value": b"t-1"}, {"key": "empty", "value": None}]
    assert r["kafka"] == {
        "partition": 3,
        "offset": 10,
        "batch_start": 10,
        "event_timestamp": dt.datetime.fromtimestamp(1_700_000_000, UTC),
        "ingest_timestamp": dt.datetime.fromtimestamp(1_700_000_000.005, UTC),
    }
    assert r2["val"]["id"] == "o-2" and r2["val"]["__unrecognized__"] == b"\xf8\x06\x2a"
    assert tomb["val"] is None and tomb["key"]["id"] == "o-1"
    # the table schema: key/val meta columns first, decoded fields, __unrecognized__ last
    val_names = [f.name for f in enc.schema.find_field("val").field_type.fields]
    assert val_names[:3] == ["__raw__", "__prefix__", "__err__"] and val_names[-1] == "__unrecognized__"


def test_first_message_fast_path_and_explicit_subject(registry_url, sr_client, topic, order_pb2):
    # Category is message [0]: the single-0x00 index shortcut (vectorised path).
    ser = proto_ser(order_pb2.Category, sr_client, topic)
    data = [ser(order_pb2.Category(name=f"c{i}")) for i in range(3)]
    assert all(d[5] == 0 for d in data)
    _, rows = encode(registry_url, topic, [rec(i, None, d) for i, d in enumerate(data)])
    assert [r["val"]["name"] for r in rows] == ["c0", "c1", "c2"]
    assert all(r["key"] is None for r in rows)  # null keys: null key struct
    # explicit subject + message name: decode another topic's bytes with that subject
    other = f"{topic}-other"
    _, rows = encode(
        registry_url,
        other,
        [rec(0, b"k", data[0])],
        val={"subject": SubjectSpec(subject=topic_subject(topic, False), message="shop.v1.Category")},
    )
    assert rows[0]["val"]["name"] == "c0"
    assert rows[0]["key"] == {"__raw__": b"k", "__prefix__": None, "__err__": None}  # no key schema


def test_record_level_errors(registry_url, sr_client, topic, order_pb2):
    ser = proto_ser(order_pb2.Order, sr_client, topic)
    good = ser(order_pb2.Order(id="ok"))
    sid = int.from_bytes(good[1:5], "big")
    avro_id = sr_client.register_schema(f"{topic}-avro", Schema('"string"', "AVRO"))
    bad = {
        "no magic": b"\x01" + good[1:],
        "unknown id": framing.encode_preamble(999_999, [1]) + good[7:],
        "bad protobuf": good[:7] + b"\x0a\xff\xff\xff\xff\x0f",  # length beyond the end
        "wrong message": framing.encode_preamble(sid, [2]) + good[7:],
        "not protobuf": framing.encode_preamble(avro_id, [0]) + b"\x02a",
        "short": b"\x00\x00",
    }
    _, rows = encode(
        registry_url, topic, [rec(0, b"k", good)] + [rec(i + 1, b"k", v) for i, v in enumerate(bad.values())]
    )
    assert rows[0]["val"]["id"] == "ok" and rows[0]["val"]["__err__"] is None
    errs = {name: r["val"] for name, r in zip(bad, rows[1:])}
    assert "missing magic byte" in errs["no magic"]["__err__"]
    assert errs["unknown id"]["__err__"] == "unknown schema id 999999"
    assert "invalid Protobuf for shop.v1.Order" in errs["bad protobuf"]["__err__"]
    assert "shop.v1.OrderKey, not the table's shop.v1.Order" in errs["wrong message"]["__err__"]
    assert "is AVRO, not PROTOBUF" in errs["not protobuf"]["__err__"]
    assert "too short" in errs["short"]["__err__"]
    for name, v in errs.items():
        assert v["__raw__"] == bad[name], name  # the original bytes are kept
        assert v["id"] is None and v["total"] is None and v["__unrecognized__"] is None, name


AVRO_ADDRESS = {
    "type": "record",
    "name": "Address",
    "namespace": "pay",
    "fields": [
        {"name": "city", "type": "string"},
        {"name": "zip", "type": ["null", "string"], "default": None},
    ],
}
AVRO_PAYMENT = {
    "type": "record",
    "name": "Payment",
    "namespace": "pay",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["CARD", "CASH"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "props", "type": {"type": "map", "values": "long"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "either", "type": ["int", "string", "pay.Address"]},
        {"name": "addr", "type": "pay.Address"},
        {"name": "n", "type": "int"},
    ],
}


def test_avro_round_trip_with_references(registry_url, sr_client, topic):
    from pyiceberg.types import DateType, DecimalType, StructType, TimestamptzType

    ref_subject = f"{topic}-pay.Address"
    sr_client.register_schema(ref_subject, Schema(json.dumps(AVRO_ADDRESS), "AVRO"))
    main = Schema(json.dumps(AVRO_PAYMENT), "AVRO", [SchemaReference("pay.Address", ref_subject, 1)])
    sr_client.register_schema(topic_subject(topic, False), main)
    ser = AvroSerializer(
        sr_client,
        main,
        conf={
            "subject.name.strategy.type": "TOPIC",
            "auto.register.schemas": False,
            "use.latest.version": True,
        },
    )
    ctx = SerializationContext(topic, MessageField.VALUE)
    u = uuid.uuid4()
    p1 = {
        "id": "p1",
        "amount": decimal.Decimal("12.34"),
        "at": dt.datetime(2025, 3, 4, 5, 6, 7, 8000, tzinfo=UTC),
        "day": dt.date(2025, 3, 4),
        "uid": str(u),
        "kind": "CASH",
        "tags": ["a", "b"],
        "props": {"x": 1},
        "note": None,
        "either": "str-branch",
        "addr": {"city": "Oslo", "zip": "0150"},
        "n": 5,
    }
    p2 = dict(p1, id="p2", note="hi", either=7, addr={"city": "Rome", "zip": None})
    p3 = dict(p1, id="p3", either={"city": "Nice", "zip": None})
    enc, rows = encode(registry_url, topic, [rec(i, None, ser(p, ctx)) for i, p in enumerate([p1, p2, p3])])
    t = {f.name: f.field_type for f in enc.schema.find_field("val").field_type.fields}
    assert isinstance(t["amount"], DecimalType) and isinstance(t["at"], TimestamptzType)
    assert isinstance(t["day"], DateType) and isinstance(t["either"], StructType)
    assert [f.name for f in t["either"].fields] == ["int", "string", "Address"]
    v1, v2, v3 = (r["val"] for r in rows)
    assert v1["__err__"] is None and v1["__raw__"] is None and v1["__prefix__"][0] == 0
    assert v1["amount"] == decimal.Decimal("12.34") and v1["at"] == p1["at"] and v1["day"] == p1["day"]
    assert v1["uid"] == str(u) and v1["kind"] == "CASH" and v1["tags"] == ["a", "b"]
    assert v1["props"] == [("x", 1)] and v1["note"] is None
    assert v1["either"] == {"int": None, "string": "str-branch", "Address": None}
    assert v1["addr"] == {"city": "Oslo", "zip": "0150"}
    assert v2["either"] == {"int": 7, "string": None, "Address": None} and v2["note"] == "hi"
    assert v3["either"]["Address"] == {"city": "Nice", "zip": None}


def test_avro_errors_and_evolved_writer(registry_url, sr_client, topic):
    v1 = {"type": "record", "name": "E", "fields": [{"name": "a", "type": "int"}]}
    v2 = {
        "type": "record",
        "name": "E",
        "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string", "default": "d"}],
    }
    subject = topic_subject(topic, False)
    id1 = sr_client.register_schema(subject, Schema(json.dumps(v1), "AVRO"))
    sr_client.set_compatibility(subject, "NONE")
    id2 = sr_client.register_schema(subject, Schema(json.dumps(v2), "AVRO"))
    assert id1 != id2
    old = framing.encode_preamble(id1) + b"\x0a"  # a=5 written with v1 (int)
    new = framing.encode_preamble(id2) + b"\x14\x02x"  # a=10, b="x" with v2
    _, rows = encode(
        registry_url,
        topic,
        [
            rec(0, None, old),
            rec(1, None, new),
            rec(2, None, framing.encode_preamble(id2) + b"\x14\x10"),  # string longer than the data
            rec(3, None, framing.encode_preamble(424242) + b"\x00"),
            rec(4, None, b"plain text"),
        ],
    )
    assert rows[0]["val"]["a"] == 5 and rows[0]["val"]["b"] == "d"  # resolved to the latest
    assert rows[1]["val"]["a"] == 10 and rows[1]["val"]["b"] == "x"
    assert rows[2]["val"]["__err__"].startswith(f"invalid Avro for schema id {id2}")
    assert rows[3]["val"]["__err__"] == "unknown schema id 424242"
    assert "missing magic byte" in rows[4]["val"]["__err__"]
    assert [r["val"]["__raw__"] is not None for r in rows] == [False, False, True, True, True]


def test_descriptor_set_side_without_registry(tmp_path, order_pb2):
    from tests.iceberg.conftest import descriptor_set

    out = descriptor_set(tmp_path / "order.binpb", "shop/v1/order.proto")
    enc = RowEncoder(EncoderSpec(SideSpec(), descriptor_set_side(out, "shop.v1.Order")))
    rows = enc.encode(
        raw_batch([rec(0, None, order_pb2.Order(id="raw").SerializeToString()), rec(1, None, b"\xff\xff")])
    ).to_pylist()
    assert rows[0]["val"]["id"] == "raw" and rows[0]["val"]["__prefix__"] is None
    assert (
        rows[1]["val"]["__err__"].startswith("invalid Protobuf") and rows[1]["val"]["__raw__"] == b"\xff\xff"
    )


def test_unknown_subject_means_raw_but_explicit_subject_must_exist(registry_url, topic):
    reg = SchemaRegistry(registry_url)
    assert resolve_side(reg, topic, False).kind == "raw"
    with pytest.raises(UnknownSchema, match="not found"):
        resolve_side(reg, topic, False, SubjectSpec(subject=f"{topic}-missing"))


def test_table_message_must_be_named_when_ambiguous(registry_url, sr_client, topic, order_pb2):
    from rsm_sidecar.errors import ConfigError

    proto_ser(order_pb2.Order, sr_client, topic)(order_pb2.Order())
    reg = SchemaRegistry(registry_url)
    with pytest.raises(ConfigError, match="defines 3 top-level messages"):
        resolve_side(reg, topic, False)
    assert resolve_side(reg, topic, False, SubjectSpec(message="shop.v1.Order")).message == "shop.v1.Order"
    with pytest.raises(LookupError, match="shop.v1.Nope"):
        resolve_side(reg, topic, False, SubjectSpec(message="shop.v1.Nope"))


def test_ambiguous_message_from_records_framed_with_the_pinned_id_or_from_the_table(
    registry_url, sr_client, topic, order_pb2
):
    """Several top-level messages and no configured message: a record framed with the pinned
    schema id names it; bytes that merely start with 0x00 (a random schema id) do not; an
    existing table's recorded message wins over samples."""
    from rsm_sidecar.errors import ConfigError

    framed = proto_ser(order_pb2.Order, sr_client, topic)(order_pb2.Order(id="1"))
    garbage = b"\x00\xa4\x06\xd8\xde\x05Q\xa4N\x05"  # magic byte, then an unknown id
    key_framed = framing.encode_preamble(framing.parse(framed, protobuf=True).schema_id, [2]) + b"\n\x01k"
    reg = SchemaRegistry(registry_url)
    assert resolve_side(reg, topic, False, samples=[garbage, b"\x00", framed]).message == "shop.v1.Order"
    with pytest.raises(ConfigError, match="no record to convert is framed with schema id"):
        resolve_side(reg, topic, False, samples=[garbage] * 5)
    assert resolve_side(reg, topic, False, recorded="shop.v1.Order").message == "shop.v1.Order"
    # the table's message wins over what the new records say; a message the schema no longer
    # defines falls back to the records
    assert (
        resolve_side(reg, topic, False, samples=[key_framed], recorded="shop.v1.Order").message
        == "shop.v1.Order"
    )
    assert (
        resolve_side(reg, topic, False, samples=[key_framed], recorded="shop.v1.Gone").message
        == "shop.v1.OrderKey"
    )

    # samples are read lazily and only when needed
    def never():
        raise AssertionError("samples read although the message was known")
        yield b""

    assert (
        resolve_side(reg, topic, False, SubjectSpec(message="shop.v1.Order"), samples=never()).message
        == "shop.v1.Order"
    )
    assert (
        resolve_side(reg, topic, False, samples=never(), recorded="shop.v1.Order").message == "shop.v1.Order"
    )


@pytest.mark.integration  # starts its own Apicurio registry
def test_registry_down_is_a_job_level_error(tmp_path, order_pb2):
    """A registry that stops answering must fail the encode (the job), not mark records."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from devstack.registry import ApicurioDistribution, ApicurioRegistry

    with ApicurioRegistry(ApicurioDistribution.ensure(), tmp_path / "reg") as own:
        client = SchemaRegistryClient({"url": own.ccompat_url})
        topic = "down"
        ser = proto_ser(order_pb2.Order, client, topic)
        first = ser(order_pb2.Order(id="1"))
        reg = SchemaRegistry({"url": own.ccompat_url, "max.retries": 0})
        enc = RowEncoder(EncoderSpec(SideSpec(), resolve_side(reg, topic, False, samples=[first])))
        assert enc.encode(raw_batch([rec(0, None, first)])).to_pylist()[0]["val"]["id"] == "1"
        url = own.ccompat_url
    # The registry is gone: a schema id the encoder has not seen yet cannot be checked.
    unseen = framing.encode_preamble(77, [1]) + first[7:]
    with pytest.raises(RegistryUnavailable, match="unreachable"):
        enc.encode(raw_batch([rec(1, None, unseen)]))
    # ... and a job cannot even start.
    with pytest.raises(RegistryUnavailable, match=url.split("//")[1]):
        resolve_side(SchemaRegistry({"url": url, "max.retries": 0}), topic, False, samples=[first])


def _avro_bytes(schema_id: int, schema: dict, datum: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), datum)
    return framing.encode_preamble(schema_id) + buf.getvalue()


def test_avro_writer_data_the_table_schema_cannot_hold_keeps_raw(registry_url, sr_client, topic):
    """Rows that cannot give back what the writer wrote keep its bytes in ``__raw__`` (no
    ``__err__``; the decoded fields are still filled); rows that can do not."""
    sub = {
        "type": "record",
        "name": "S",
        "fields": [{"name": "x", "type": "long"}, {"name": "y", "type": "int"}],
    }
    kind = {"type": "enum", "name": "K", "symbols": ["A", "B", "C"]}
    old = {  # fields the table's schema drops, an enum symbol it lacks, a long it reads as double
        "type": "record",
        "name": "E",
        "fields": [
            {"name": "a", "type": "int"},
            {"name": "gone", "type": "string"},
            {"name": "sub", "type": sub},
            {"name": "kind", "type": kind},
            {"name": "big", "type": "long"},
        ],
    }
    mid = {  # only the enum symbol C is lost
        "type": "record",
        "name": "E",
        "fields": [
            {"name": "a", "type": "int"},
            {"name": "sub", "type": dict(sub, fields=sub["fields"][:1])},
            {"name": "kind", "type": kind},
            {"name": "big", "type": "double"},
        ],
    }
    table = {
        "type": "record",
        "name": "E",
        "fields": [
            {"name": "a", "type": "long"},  # int -> long: lossless
            {"name": "sub", "type": dict(sub, fields=sub["fields"][:1])},
            {"name": "kind", "type": dict(kind, symbols=["A", "B"], default="A")},
            {"name": "big", "type": "double"},
            {"name": "added", "type": "string", "default": "d"},
        ],
    }
    subject = topic_subject(topic, False)
    sr_client.set_compatibility(subject, "NONE")
    ids = [sr_client.register_schema(subject, Schema(json.dumps(s), "AVRO")) for s in (old, mid, table)]
    full = {"a": 1, "gone": "kept only in __raw__", "sub": {"x": 2, "y": 3}, "kind": "B", "big": 2**60 + 1}
    values = [
        _avro_bytes(ids[0], old, full),
        _avro_bytes(ids[1], mid, {"a": 1, "sub": {"x": 2}, "kind": "B", "big": 0.5}),  # nothing lost...
        _avro_bytes(ids[1], mid, {"a": 1, "sub": {"x": 2}, "kind": "C", "big": 0.5}),  # ...but the schema can
        _avro_bytes(ids[2], table, {"a": 1, "sub": {"x": 2}, "kind": "B", "big": 0.5, "added": "z"}),
    ]
    enc, rows = encode(registry_url, topic, [rec(i, None, v) for i, v in enumerate(values)])
    vals = [r["val"] for r in rows]
    assert [v["__err__"] for v in vals] == [None] * 4
    assert [v["__raw__"] for v in vals] == values[:3] + [None]
    assert [v["__prefix__"] for v in vals] == [v[:5] for v in values]
    assert vals[0]["a"] == 1 and vals[0]["sub"] == {"x": 2} and vals[0]["kind"] == "B"
    assert vals[0]["big"] == float(2**60) and vals[0]["added"] == "d"
    assert vals[2]["kind"] == "A" and vals[3]["added"] == "z"
    # what the table cannot hold comes back from __raw__ with the writer schema its id names
    back = fastavro.schemaless_reader(io.BytesIO(vals[0]["__raw__"][5:]), fastavro.parse_schema(old), None)
    assert back == full


def test_avro_ambiguous_unions_keep_raw_and_values_keep_their_precision(registry_url, sr_client, topic):
    table = {
        "type": "record",
        "name": "U",
        "fields": [
            {"name": "n", "type": ["null", "int", "long"]},
            {"name": "f", "type": ["null", "float", "double"]},
        ],
    }
    plain = {"type": "record", "name": "P", "fields": [{"name": "s", "type": ["null", "string", "long"]}]}
    subject = topic_subject(topic, False)
    tid = sr_client.register_schema(subject, Schema(json.dumps(table), "AVRO"))
    values = [
        _avro_bytes(tid, table, {"n": 5, "f": 0.5}),
        _avro_bytes(tid, table, {"n": 2**40, "f": 0.1}),  # only long holds 2**40, only double 0.1
    ]
    _, rows = encode(registry_url, topic, [rec(i, None, v) for i, v in enumerate(values)])
    v1, v2 = (r["val"] for r in rows)
    assert v1["n"] == {"int": 5, "long": None} and v1["f"] == {"float": 0.5, "double": None}
    assert v2["n"] == {"int": None, "long": 2**40} and v2["f"] == {"float": None, "double": 0.1}
    # which branch was written (5 as int or as long?) is not in the row: the bytes are kept
    assert [v["__raw__"] for v in (v1, v2)] == values and v2["__err__"] is None
    # a union whose branches the row tells apart keeps nothing extra
    topic2 = topic + "-plain"
    pid = sr_client.register_schema(topic_subject(topic2, False), Schema(json.dumps(plain), "AVRO"))
    _, rows = encode(registry_url, topic2, [rec(0, None, _avro_bytes(pid, plain, {"s": 7}))])
    assert rows[0]["val"]["s"] == {"string": None, "long": 7} and rows[0]["val"]["__raw__"] is None


def test_avro_time_types_keep_their_precision(registry_url, sr_client, topic):
    """Nothing below a microsecond exists in the µs types, and the nanosecond types stay longs."""
    from pyiceberg.types import LongType, TimestampType, TimestamptzType, TimeType

    def lt(t, logical):
        return {"type": t, "logicalType": logical}

    schema = {
        "type": "record",
        "name": "T",
        "fields": [
            {"name": "ts_ns", "type": lt("long", "timestamp-nanos")},
            {"name": "lts_ns", "type": lt("long", "local-timestamp-nanos")},
            {"name": "ts_us", "type": lt("long", "timestamp-micros")},
            {"name": "lts_us", "type": lt("long", "local-timestamp-micros")},
            {"name": "t_us", "type": lt("long", "time-micros")},
            {"name": "t_ms", "type": lt("int", "time-millis")},
            {"name": "dur", "type": {"type": "fixed", "name": "D", "size": 12, "logicalType": "duration"}},
        ],
    }
    sid = sr_client.register_schema(topic_subject(topic, False), Schema(json.dumps(schema), "AVRO"))
    ns = 1_700_000_000_123_456_789
    datum = {
        "ts_ns": ns,
        "lts_ns": ns + 1,
        "ts_us": dt.datetime(2023, 11, 14, 22, 13, 20, 123457, tzinfo=UTC),
        "lts_us": dt.datetime(2023, 11, 14, 22, 13, 20, 123457),
        "t_us": dt.time(23, 59, 59, 999999),
        "t_ms": dt.time(1, 2, 3, 4000),
        "dur": (1).to_bytes(4, "little") + (2).to_bytes(4, "little") + (3).to_bytes(4, "little"),
    }
    enc, rows = encode(registry_url, topic, [rec(0, None, _avro_bytes(sid, schema, datum))])
    t = {f.name: f.field_type for f in enc.schema.find_field("val").field_type.fields}
    assert isinstance(t["ts_ns"], LongType) and isinstance(t["lts_ns"], LongType)
    assert isinstance(t["ts_us"], TimestamptzType) and isinstance(t["lts_us"], TimestampType)
    assert isinstance(t["t_us"], TimeType) and isinstance(t["t_ms"], TimeType)
    v = rows[0]["val"]
    assert v["__raw__"] is None and v["__err__"] is None
    assert {k: v[k] for k in datum} == datum


def test_avro_top_level_field_named_like_a_side_column_fails_the_job_clearly(registry_url, sr_client, topic):
    """Same rule and message as for Protobuf: the encoder is not built, naming field and record."""
    from rsm_sidecar.iceberg.decoding.proto_mapping import ReservedFieldName

    schema = {
        "type": "record",
        "name": "Event",
        "namespace": "app",
        "fields": [{"name": "id", "type": "string"}, {"name": "__raw__", "type": "bytes"}],
    }
    sr_client.register_schema(topic_subject(topic, True), Schema(json.dumps(schema), "AVRO"))
    reg = SchemaRegistry(registry_url)
    spec = EncoderSpec(key=resolve_side(reg, topic, True))
    assert spec.key.kind == "avro"
    with pytest.raises(ReservedFieldName, match=r"^Avro field '__raw__' of record app.Event cannot become"):
        RowEncoder(spec)


def test_protobuf_sub_microsecond_nanos_keep_the_value_bytes(registry_url, sr_client, topic):
    """A registry-framed value whose Timestamp (here inside a map value) has nanos below a µs
    keeps its framed bytes in ``__raw__``; the record with whole µs keeps none."""
    from tests.iceberg.test_proto_mapping import TIMES, times_schema

    sid = sr_client.register_schema(topic_subject(topic, False), Schema(TIMES, "PROTOBUF"))
    schema = times_schema()
    cls = schema.message_class(schema.message_by_name("tm.Times"))
    whole, cut = cls(id="whole"), cls(id="cut")
    whole.at.seconds, whole.at.nanos = 1_700_000_000, 250_000
    cut.at.seconds, cut.at.nanos = 1_700_000_000, 250_000
    whole.spans["x"].nanos, cut.spans["x"].nanos = 3000, 3001
    values = [framing.encode_preamble(sid, [0]) + m.SerializeToString() for m in (whole, cut)]
    enc, rows = encode(registry_url, topic, [rec(i, b"k", v) for i, v in enumerate(values)])
    assert enc.spec.val.kind == "protobuf" and enc.spec.val.message == "tm.Times"
    vals = [r["val"] for r in rows]
    assert [v["__raw__"] for v in vals] == [None, values[1]]
    assert [v["__err__"] for v in vals] == [None, None]
    assert vals[1]["spans"] == [("x", 3)] and vals[1]["at"] == vals[0]["at"]
    assert [r["key"]["__raw__"] for r in rows] == [b"k", b"k"]
    # the sub-µs digits come back from __raw__
    assert cls.FromString(vals[1]["__raw__"][len(vals[1]["__prefix__"]) :]).spans["x"].nanos == 3001
