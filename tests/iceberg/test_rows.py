"""The row encoder without a registry: schema shape, alignment to an evolved table schema,
raw sides, the GC pause, and the seed-only (no WKT) decoding path."""

from __future__ import annotations

import datetime as dt
import gc
import json

import pyarrow as pa
import pytest

from rsm_sidecar.iceberg.decoding.proto_mapping import ProtoDecoder, ProtoOptions
from rsm_sidecar.iceberg.mapping.rows import EncoderSpec, RowEncoder, align
from rsm_sidecar.iceberg.reading.raw_records import RAW_RECORD_SCHEMA, KafkaRecord, raw_batch
from rsm_sidecar.iceberg.types import schema_to_arrow, spark_ddl
from tests.iceberg.test_proto_mapping import order_schema

UTC = dt.UTC


def test_raw_schema_and_rows():
    enc = RowEncoder(EncoderSpec())
    assert [f.name for f in enc.schema.fields] == ["key", "val", "headers", "kafka"]
    kafka = {f.name: str(f.field_type) for f in enc.schema.find_field("kafka").field_type.fields}
    assert kafka == {
        "partition": "int",
        "offset": "long",
        "event_timestamp": "timestamptz",
        "ingest_timestamp": "timestamptz",
        "batch_start": "long",
    }
    batch = enc.encode(
        raw_batch(
            [
                KafkaRecord(2, 100, 99, 1_000, None, b"k", b"v", [("a", b"1")]),
                KafkaRecord(2, 101, 99, None, -1, None, None, []),
            ]
        )
    )
    assert batch.schema == enc.arrow_schema
    a, b = batch.to_pylist()
    assert a["key"] == {"__raw__": b"k", "__prefix__": None, "__err__": None}
    assert a["val"] == {"__raw__": b"v", "__prefix__": None, "__err__": None}
    assert a["kafka"]["event_timestamp"] == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert a["kafka"]["ingest_timestamp"] is None and b["kafka"]["event_timestamp"] is None
    assert b["key"] is None and b["val"] is None and b["headers"] == []
    assert "`kafka` STRUCT<`partition`: INT, `offset`: BIGINT, `event_timestamp`: TIMESTAMP" in spark_ddl(
        enc.schema
    )
    assert RAW_RECORD_SCHEMA.names == [
        "partition",
        "offset",
        "batch_start",
        "timestamp",
        "ingest_timestamp",
        "key",
        "value",
        "headers",
    ]


def test_encode_pauses_gc_and_restores_it():
    enc = RowEncoder(EncoderSpec())
    assert gc.isenabled()
    enc.encode(raw_batch([KafkaRecord(0, 0, 0, 0, 0, b"k", b"v", [])]))
    assert gc.isenabled()
    gc.disable()
    try:
        enc.encode(raw_batch([KafkaRecord(0, 0, 0, 0, 0, b"k", b"v", [])]))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_align_to_an_evolved_table_type():
    s = pa.array(
        [
            {"a": 1, "gone": "x", "l": [1, None], "m": [("k", 1)]},
            None,
            {"a": None, "gone": None, "l": None, "m": None},
        ],
        pa.struct(
            [
                ("a", pa.int32()),
                ("gone", pa.string()),
                ("l", pa.list_(pa.int32())),
                ("m", pa.map_(pa.string(), pa.int32())),
            ]
        ),
    )
    target = pa.struct(
        [
            ("a", pa.int64()),
            ("l", pa.list_(pa.int64())),
            ("m", pa.map_(pa.string(), pa.int64())),
            ("new", pa.string()),
        ]
    )
    out = align(s, target)
    assert out.type == target
    assert out.to_pylist() == [
        {"a": 1, "l": [1, None], "m": [("k", 1)], "new": None},
        None,
        {"a": None, "l": None, "m": None, "new": None},
    ]
    # incompatible leaves cannot be cast: null rather than a crash (evolution prevents this)
    assert align(pa.array(["x"]), pa.int64()).to_pylist() == [None]


def test_seed_only_mapping_decodes_wkts_as_messages(order_pb2):
    dec = ProtoDecoder(order_schema().message_by_name("shop.v1.Order"), ProtoOptions(well_known_types=False))
    o = order_pb2.Order()
    o.placed_at.seconds, o.placed_at.nanos = 10, 20
    o.note.value = "n"
    o.attrs.update({"a": 1})
    (r,) = pa.StructArray.from_arrays(
        dec.children([dec.parse(o.SerializeToString())]), fields=list(dec.arrow_type)
    ).to_pylist()
    assert r["placed_at"] == {"seconds": 10, "nanos": 20, "__unrecognized__": None}
    assert r["note"] == {"value": "n", "__unrecognized__": None}
    assert r["attrs"]["fields"][0][0] == "a"  # Struct as its message: map<string, Value struct>


def test_table_alignment_in_encoder_adds_retired_columns():
    enc = RowEncoder(EncoderSpec())
    arrow = schema_to_arrow(enc.schema)
    val = arrow.field("val").type
    wider = pa.schema(
        [
            arrow.field("key"),
            pa.field("val", pa.struct(list(val) + [pa.field("old__v1", pa.string())])),
            arrow.field("headers"),
            arrow.field("kafka"),
        ]
    )
    out = RowEncoder(EncoderSpec().with_table(wider)).encode(
        raw_batch([KafkaRecord(0, 0, 0, 0, 0, b"k", b"v", [])])
    )
    assert out.schema == wider and out.to_pylist()[0]["val"]["old__v1"] is None


def test_values_arrow_rejects_become_record_errors(tmp_path):
    """proto2 strings are not UTF-8-checked by upb (it hands out bytes); such a record gets
    __err__ + __raw__ instead of failing the batch."""
    from grpc_tools import protoc

    (tmp_path / "p2.proto").write_text('syntax = "proto2"; package p; message M { optional string s = 1; }')
    out = tmp_path / "p2.binpb"
    assert protoc.main(["protoc", f"-I{tmp_path}", f"--descriptor_set_out={out}", "p2.proto"]) == 0
    from rsm_sidecar.iceberg.decoding.sides import descriptor_set_side

    enc = RowEncoder(EncoderSpec(val=descriptor_set_side(out, "p.M")))
    rows = enc.encode(
        raw_batch(
            [
                KafkaRecord(0, 0, 0, 0, 0, None, b"\x0a\x02ok", []),
                KafkaRecord(0, 1, 0, 0, 0, None, b"\x0a\x02\xff\xfe", []),
            ]
        )
    ).to_pylist()
    assert rows[0]["val"]["s"] == "ok" and rows[0]["val"]["__err__"] is None
    assert rows[1]["val"]["s"] is None and rows[1]["val"]["__raw__"] == b"\x0a\x02\xff\xfe"
    assert rows[1]["val"]["__err__"].startswith("cannot convert p.M to the table types")


def _avro(fields_or_schema) -> object:
    from rsm_sidecar.iceberg.decoding.schema_registry import parse_avro

    schema = fields_or_schema
    if isinstance(fields_or_schema, list):
        schema = {
            "type": "record",
            "name": "E",
            "fields": [{"name": n, "type": t} for n, t in fields_or_schema],
        }
    return parse_avro(json.dumps(schema), {})


def test_avro_resolution_loss_rules():
    from rsm_sidecar.iceberg.decoding.avro_mapping import resolution_loss

    def loss(w, r):
        return resolution_loss(_avro(w), _avro(r))

    sub = {
        "type": "record",
        "name": "S",
        "fields": [{"name": "x", "type": "int"}, {"name": "y", "type": "int"}],
    }
    sub_x = dict(sub, fields=sub["fields"][:1])
    # lossless: the same schema, int -> long/double, float -> double, string <-> bytes, added fields
    assert loss([("a", "int")], [("a", "int")]) is None
    assert (
        loss([("a", "int"), ("b", "float")], [("a", "long"), ("b", "double"), ("c", ["null", "int"])]) is None
    )
    assert loss([("s", "string")], [("s", "bytes")]) is None
    # a field the table lacks, at any depth, through unions, arrays and maps; aliases match
    assert loss([("a", "int"), ("gone", "int")], [("a", "int")]) == "field gone is not in the table's schema"
    assert loss([("s", sub)], [("s", sub_x)]) == "field s.y is not in the table's schema"
    assert loss([("s", ["null", sub])], [("s", ["null", sub_x])]) == "field s.y is not in the table's schema"
    assert loss([("l", {"type": "array", "items": sub})], [("l", {"type": "array", "items": sub_x})]) == (
        "field l.[].y is not in the table's schema"
    )
    assert loss([("m", {"type": "map", "values": sub})], [("m", {"type": "map", "values": sub_x})]) == (
        "field m.{}.y is not in the table's schema"
    )
    renamed = {"type": "record", "name": "E", "fields": [{"name": "b", "type": "int", "aliases": ["a"]}]}
    assert loss([("a", "int")], renamed) is None
    # narrowing promotions, a changed logical type, an enum symbol that becomes the default
    assert loss([("a", "long")], [("a", "double")]) == "a: long read as double"
    assert loss([("a", "int")], [("a", "float")]) == "a: int read as float"
    us, ms = ({"type": "long", "logicalType": f"timestamp-{u}"} for u in ("micros", "millis"))
    assert loss([("t", us)], [("t", ms)]) == "t: timestamp-micros read as timestamp-millis"
    assert loss([("t", us)], [("t", "long")]) is None  # the number itself is kept
    k = {"type": "enum", "name": "K", "symbols": ["A", "B"]}
    assert (
        loss([("k", k)], [("k", dict(k, symbols=["A"], default="A"))]) == "k: enum symbols ['B'] become 'A'"
    )
    assert loss([("k", k)], [("k", dict(k, symbols=["A"]))]) is None  # no default: B is a decode error
    # union branches a row cannot tell apart; records are told apart by name
    assert loss([("u", ["null", "int", "long"])], [("u", ["null", "int", "long"])]) == (
        "u: union branches int and long are not told apart in the row"
    )
    assert loss([("u", ["string", k])], [("u", ["string", k])]) == (
        "u: union branches string and enum are not told apart in the row"
    )
    two = ["null", sub, dict(sub_x, name="T")]
    assert loss([("u", two)], [("u", two)]) is None
    # a recursive type terminates
    node = {
        "type": "record",
        "name": "N",
        "fields": [{"name": "next", "type": ["null", "N"]}, {"name": "v", "type": "int"}],
    }
    assert loss(node, node) is None


def test_avro_union_members_take_only_values_they_hold_exactly():
    from rsm_sidecar.iceberg.decoding.avro_mapping import AvroMapper

    m = AvroMapper(_avro([("n", ["null", "int", "long"]), ("f", ["null", "float", "double", "string"])]))
    rows = [
        {"n": 5, "f": 0.5},
        {"n": 2**31, "f": 0.1},
        {"n": -(2**31), "f": float("nan")},
        {"n": None, "f": 1e300},
    ]
    got = m.to_arrow(rows).to_pylist()
    assert [r["n"] for r in got] == [
        {"int": 5, "long": None},
        {"int": None, "long": 2**31},
        {"int": -(2**31), "long": None},
        None,
    ]
    assert got[0]["f"]["float"] == 0.5 and got[1]["f"]["double"] == 0.1 and got[3]["f"]["double"] == 1e300
    assert got[2]["f"]["float"] != got[2]["f"]["float"]  # NaN stays in the float member


def test_an_avro_schema_the_loss_check_cannot_read_keeps_raw(monkeypatch):
    """If the schema comparison itself fails, the record keeps ``__raw__`` (the job goes on)."""
    from rsm_sidecar.iceberg.decoding import sides as sides_mod
    from rsm_sidecar.iceberg.decoding.framing import encode_preamble
    from rsm_sidecar.iceberg.decoding.schema_registry import AVRO, ResolvedSchema, SchemaRegistry

    conf = {"url": "http://127.0.0.1:9/unused-loss-check"}
    reg = SchemaRegistry.shared(conf)
    text = '{"type": "record", "name": "E", "fields": [{"name": "a", "type": "int"}]}'
    named: dict = {}
    reg.add_resolved(ResolvedSchema(7, AVRO, text, avro=_avro([("a", "int")]), avro_named=named))

    def broken(w, r):
        raise KeyError("type")

    monkeypatch.setattr(sides_mod, "resolution_loss", broken)
    enc = RowEncoder(EncoderSpec(val=sides_mod.SideSpec("avro", conf, 7)))
    value = encode_preamble(7) + b"\x0a"
    (row,) = enc.encode(raw_batch([KafkaRecord(0, 0, 0, 1, 1, None, value)])).to_pylist()
    assert row["val"]["a"] == 5 and row["val"]["__err__"] is None and row["val"]["__raw__"] == value


@pytest.mark.parametrize(
    "schema, message",
    [
        (
            {
                "type": "record",
                "name": "r.E",
                "fields": [{"name": "a", "type": "int"}, {"name": "__err__", "type": "string"}],
            },
            "Avro field '__err__' of record r.E",
        ),
        (
            [
                "null",
                {
                    "type": "record",
                    "name": "E",
                    "namespace": "r",
                    "fields": [{"name": "__raw__", "type": "bytes"}],
                },
            ],
            "Avro field '__raw__' of record r.E",
        ),
        (
            {"type": "record", "name": "E", "fields": [{"name": "__prefix__", "type": "int"}]},
            "Avro field '__prefix__' of record E",
        ),
        (
            ["int", {"type": "record", "name": "__raw__", "fields": [{"name": "a", "type": "int"}]}],
            "Avro union branch '__raw__'",
        ),
    ],
)
def test_avro_fields_named_like_side_columns_are_rejected_clearly(schema, message):
    """As for Protobuf: a top-level field called like a synthesized column is a ConfigError."""
    from rsm_sidecar.errors import ConfigError
    from rsm_sidecar.iceberg.decoding.avro_mapping import AvroMapper
    from rsm_sidecar.iceberg.decoding.proto_mapping import ReservedFieldName
    from rsm_sidecar.iceberg.decoding.schema_registry import parse_avro

    with pytest.raises(ReservedFieldName) as info:
        AvroMapper(parse_avro(json.dumps(schema), {}))
    text = str(info.value)
    assert text.startswith(message) and isinstance(info.value, ConfigError)
    assert "the top-level record's struct already has __raw__, __prefix__, __err__" in text
    assert "Rename the field" in text


def test_avro_side_column_names_below_the_top_level_are_plain_fields():
    from rsm_sidecar.iceberg.decoding.avro_mapping import AvroMapper

    inner = {"type": "record", "name": "N", "fields": [{"name": "__err__", "type": "string"}]}
    m = AvroMapper(_avro([("n", inner), ("l", {"type": "array", "items": "N"})]))
    assert [f.name for f in m.iceberg_type.fields] == ["n", "l"]
    assert [f.name for f in m.iceberg_type.fields[0].field_type.fields] == ["__err__"]


def _times_encoder(url: str, **opts) -> RowEncoder:
    """A RowEncoder whose value side is ``tm.Times`` framed with schema id 3 (held in the
    registry client's cache: no server)."""
    from rsm_sidecar.iceberg.decoding.schema_registry import PROTOBUF, ResolvedSchema, SchemaRegistry
    from rsm_sidecar.iceberg.decoding.sides import SideSpec
    from tests.iceberg.test_proto_mapping import TIMES, times_schema

    conf = {"url": url}
    SchemaRegistry.shared(conf).add_resolved(ResolvedSchema(3, PROTOBUF, TIMES, proto=times_schema()))
    return RowEncoder(
        EncoderSpec(val=SideSpec("protobuf", conf, 3, "tm.Times", proto_options=ProtoOptions(**opts)))
    )


def test_sub_microsecond_nanos_keep_the_value_bytes():
    """A record with a Timestamp/Duration the µs columns cut keeps its value bytes in
    ``val.__raw__`` (no ``__err__``, decoded fields filled), on the vectorised path and on the
    per-record one; the other records keep none."""
    from rsm_sidecar.iceberg.decoding.framing import encode_preamble
    from tests.iceberg.test_proto_mapping import times_cases, times_schema

    enc = _times_encoder("http://127.0.0.1:9/unused-sub-micros")
    cases = times_cases(times_schema())
    values = [encode_preamble(3, [0]) + m.SerializeToString() for _, m, _ in cases]
    recs = [KafkaRecord(0, i, 0, 1, 1, b"k%d" % i, v) for i, v in enumerate(values)]
    assert enc.val_side.decode_arrow(raw_batch(recs).column("value")) is not None  # vectorised
    fast = enc.encode(raw_batch(recs)).to_pylist()
    # a value without the magic byte sends the batch through the per-record path
    slow = enc.encode(raw_batch([*recs, KafkaRecord(0, 99, 0, 1, 1, b"x", b"\x05bad-magic")])).to_pylist()
    assert slow[-1]["val"]["__err__"].startswith("missing magic byte")
    for rows in (fast, slow):
        for (what, _, lossy), value, row in zip(cases, values, rows):
            val = row["val"]
            assert val["__raw__"] == (value if lossy else None), what
            assert val["__err__"] is None and val["id"] == what and val["__prefix__"] == value[:6]
            assert row["key"]["__raw__"] == b"k%d" % row["kafka"]["offset"]
        assert rows[2]["val"]["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 1000, tzinfo=dt.UTC)
    # only whole microseconds (the usual batch): no __raw__ at all
    whole = [r for (_, _, lossy), r in zip(cases, recs) if not lossy]
    assert [r["val"]["__raw__"] for r in enc.encode(raw_batch(whole)).to_pylist()] == [None] * len(whole)
    # the seed-only mapping (well_known_types=False) keeps seconds and nanos: nothing is lost
    plain = _times_encoder("http://127.0.0.1:9/unused-sub-micros-plain", well_known_types=False)
    rows = plain.encode(raw_batch(recs)).to_pylist()
    assert [r["val"]["__raw__"] for r in rows] == [None] * len(recs)
    assert rows[2]["val"]["at"]["nanos"] == 1_000_001


def test_sub_microsecond_nanos_unframed(tmp_path):
    """Unframed values (descriptor-set side): ``__raw__`` is the payload itself."""
    from google.protobuf import descriptor_pb2

    from rsm_sidecar.iceberg.decoding.sides import descriptor_set_side
    from tests.iceberg.test_proto_mapping import times_cases, times_schema

    schema = times_schema()
    fds = descriptor_pb2.FileDescriptorSet()
    main = schema.message_by_name("tm.Times").file
    for f in (*main.dependencies, main):
        f.CopyToProto(fds.file.add())
    (tmp_path / "tm.binpb").write_bytes(fds.SerializeToString())
    enc = RowEncoder(EncoderSpec(val=descriptor_set_side(tmp_path / "tm.binpb", "tm.Times")))
    cases = times_cases(schema)
    payloads = [m.SerializeToString() for _, m, _ in cases]
    rows = enc.encode(
        raw_batch([KafkaRecord(0, i, 0, 1, 1, None, p) for i, p in enumerate(payloads)])
    ).to_pylist()
    assert [r["val"]["__raw__"] for r in rows] == [
        p if lossy else None for (_, _, lossy), p in zip(cases, payloads)
    ]
    assert [r["val"]["__err__"] for r in rows] == [None] * len(cases)
    assert (
        rows[1]["val"]["__raw__"] is None and rows[2]["val"]["__raw__"] == payloads[2]
    )  # 1_000_000 / 1_000_001
