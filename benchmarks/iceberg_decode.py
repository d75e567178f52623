"""Decode + Arrow-build throughput of the Iceberg row encoder for Protobuf, Avro and JSON values.

Measures :meth:`rsm_sidecar.iceberg.mapping.rows.RowEncoder.encode` on one core: Confluent-framed
values (Protobuf: magic, schema id, ``[0]`` index, the 9-field ``bench.Event``, 91 bytes; Avro:
magic, schema id, the same event as an Avro record with a map, a nullable union and a date
besides, 84 bytes), 16-byte keys without a schema, two headers, in batches of 10 000 (Spark's
``arrow.maxRecordsPerBatch`` in :func:`rsm_sidecar.iceberg.session.spark.spark_session`). The
schemas are put into the registry client's id cache, so no registry server is involved: this is
the pure per-record cost that runs inside ``mapInArrow``. Each format is measured with its
columnar decoder and with its library path alone (upb, fastavro, :func:`json.loads` value by
value); with ``--format all`` (the default; ``both`` is Protobuf and Avro) they alternate in one
process, and the table ends with Avro's and JSON's columnar rates over Protobuf's. The JSON value
is the same event as Confluent-framed JSON Schema JSON (``JSON_SCHEMA``: ``at`` a ``date-time``,
``device`` an object, ``tags`` an array), 213 bytes, read by PyArrow's JSON reader.

    .venv/bin/python benchmarks/iceberg_decode.py [--format all|both|protobuf|avro|json] [--records 200000]
    .venv/bin/python benchmarks/iceberg_decode.py --spark --format protobuf|avro [--records 400000]

``--spark`` runs the same encoder inside ``mapInArrow`` on a local[2] Spark (jars from
``python -m rsm_sidecar.iceberg.jars --no-cloud``) over an in-memory DataFrame of raw records
and writes to Spark's ``noop`` sink, so the figure is decode+Arrow plus Spark's Arrow
transfer on 2 cores (no segment reading, no Parquet/Iceberg write).

``--spark --format avro`` also measures, in the same session over the same DataFrame, decoding on
the JVM with Spark's own ``from_avro`` (the ``spark-avro`` module, fetched from Maven Central into
``.cache/`` on first use): the value's 5-byte preamble cut off with ``substring`` and the rest
decoded against the same writer schema, key and headers passed through. That is the
"decode on the JVM" design (docs/performance.md, "Iceberg: converting segments") without any of
the seed's mapping rules on top (no
``__err__``/``__raw__`` for a value that does not decode: ``from_avro`` in ``PERMISSIVE`` mode
gives null; no schema-id check per record; no evolution), so it is an upper bound for that design.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.maven import maven_jar
from devstack.common import default_cache_dir
from rsm_sidecar.iceberg.decoding import framing
from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema
from rsm_sidecar.iceberg.decoding.schema_registry import (
    AVRO,
    JSON,
    PROTOBUF,
    ResolvedSchema,
    SchemaRegistry,
    parse_avro,
)
from rsm_sidecar.iceberg.decoding.sides import SideSpec
from rsm_sidecar.iceberg.mapping.rows import EncoderSpec, RowEncoder
from rsm_sidecar.iceberg.reading.raw_records import KafkaRecord, raw_batch

PROTO = """
syntax = "proto3";
package bench;
import "google/protobuf/timestamp.proto";
enum Kind { KIND_UNSPECIFIED = 0; CLICK = 1; VIEW = 2; }
message Event {
  string id = 1;
  int64 user_id = 2;
  Kind kind = 3;
  double amount = 4;
  bool ok = 5;
  google.protobuf.Timestamp at = 6;
  Device device = 7;
  repeated string tags = 8;
  uint32 count = 9;
}
message Device { string os = 1; int32 version = 2; }
"""
REGISTRY_CONF = {"url": "http://127.0.0.1:9/unused-benchmark"}
AVRO_ID = 2  # the Protobuf schema is id 1
JSON_ID = 3
JSON_SCHEMA = json.dumps(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Event",
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "user_id": {"type": "integer"},
            "kind": {"type": "string", "enum": ["CLICK", "VIEW"]},
            "amount": {"type": "number"},
            "ok": {"type": "boolean"},
            "at": {"type": "string", "format": "date-time"},
            "device": {
                "type": "object",
                "properties": {"os": {"type": "string"}, "version": {"type": "integer"}},
            },
            "tags": {"type": "array", "items": {"type": "string"}},
            "count": {"type": "integer"},
        },
    }
)

#: ``bench.Event`` as an Avro record, as a Confluent producer of Avro writes it: the Timestamp as
#: ``timestamp-micros``, plus what Avro schemas usually have and Protobuf's event has not: a map,
#: a nullable union and a date.
AVRO_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Event",
        "namespace": "bench",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "user_id", "type": "long"},
            {
                "name": "kind",
                "type": {"type": "enum", "name": "Kind", "symbols": ["KIND_UNSPECIFIED", "CLICK", "VIEW"]},
            },
            {"name": "amount", "type": "double"},
            {"name": "ok", "type": "boolean"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {
                "name": "device",
                "type": {
                    "type": "record",
                    "name": "Device",
                    "fields": [{"name": "os", "type": "string"}, {"name": "version", "type": "int"}],
                },
            },
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "count", "type": "int"},
            {"name": "attrs", "type": {"type": "map", "values": "string"}},
            {"name": "coupon", "type": ["null", "string"], "default": None},
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        ],
    }
)
SPARK_VERSION_AVRO = "4.1.1"  # spark-avro_2.13 versions the package registry serves: 4.1.1, 4.2.0


def proto_event(cls, i: int, rnd: random.Random, seconds: int) -> bytes:
    """The ``i``-th ``bench.Event`` (message class ``cls``) at ``seconds``, serialized."""
    m = cls(
        id=f"evt-{i:012d}-{rnd.randrange(1 << 30):08x}",
        user_id=rnd.randrange(1 << 40),
        kind=rnd.choice([1, 2]),
        amount=rnd.random() * 100,
        ok=bool(i & 1),
        tags=["alpha", "beta"][: rnd.randrange(3)],
        count=rnd.randrange(1000),
    )
    m.at.seconds, m.at.nanos = seconds, 123_000
    m.device.os, m.device.version = "linux-x86_64", 6
    return m.SerializeToString()


def make_values(n: int, schema: ProtoSchema) -> list[bytes]:
    cls = ProtoSchema.message_class(schema.message_by_name("bench.Event"))
    pre = framing.encode_preamble(1, [0])
    rnd = random.Random(1)
    return [pre + proto_event(cls, i, rnd, 1_700_000_000 + i) for i in range(n)]


def make_avro_values(n: int) -> list[bytes]:
    """The same events as :func:`make_values`, Avro-encoded behind the Confluent preamble."""
    import fastavro

    parsed = parse_avro(AVRO_SCHEMA, {})
    pre = framing.encode_preamble(AVRO_ID)
    rnd = random.Random(1)
    out = []
    for i in range(n):
        buf = io.BytesIO()
        event = avro_event(i, rnd)
        fastavro.schemaless_writer(buf, parsed, event)
        out.append(pre + buf.getvalue())
    return out


def _event_fields(i: int, rnd: random.Random) -> dict:
    """The fields every format's ``i``-th event has (``rnd`` draws the values)."""
    return {
        "id": f"evt-{i:012d}-{rnd.randrange(1 << 30):08x}",
        "user_id": rnd.randrange(1 << 40),
        "kind": rnd.choice(["CLICK", "VIEW"]),
        "amount": rnd.random() * 100,
        "ok": bool(i & 1),
        "tags": ["alpha", "beta"][: rnd.randrange(3)],
        "count": rnd.randrange(1000),
    }


def make_json_values(n: int, first: int = 0, seed: int = 1) -> list[bytes]:
    """The same events as :func:`make_values`, as JSON behind the Confluent preamble (events
    ``first`` to ``first + n - 1``, their random values drawn from ``seed``)."""
    pre = framing.encode_preamble(JSON_ID)
    rnd = random.Random(seed)
    out = []
    for i in range(first, first + n):
        at = datetime.datetime.fromtimestamp(1_700_000_000 + i, datetime.UTC).replace(microsecond=123)
        event = {
            **_event_fields(i, rnd),
            "at": at.isoformat().replace("+00:00", "Z"),
            "device": {"os": "linux-x86_64", "version": 6},
        }
        out.append(pre + json.dumps(event, separators=(",", ":")).encode())
    return out


def avro_event(i: int, rnd: random.Random) -> dict:
    """The ``i``-th event of :data:`AVRO_SCHEMA` (~80 bytes framed; ``rnd`` draws the values)."""
    return {
        **_event_fields(i, rnd),
        "at": (1_700_000_000 + i) * 1_000_000 + 123,
        "device": {"os": "linux", "version": 6},
        "attrs": {"src": "web"} if i % 3 else {},
        "coupon": "SAVE10" if i % 4 == 0 else None,
        "day": 19_700 + i % 30,
    }


def resolved(fmt: str) -> ResolvedSchema:
    if fmt == "json":
        return ResolvedSchema(JSON_ID, JSON, JSON_SCHEMA, json=json.loads(JSON_SCHEMA))
    if fmt == "avro":
        named: dict = {}
        return ResolvedSchema(
            AVRO_ID, AVRO, AVRO_SCHEMA, avro=parse_avro(AVRO_SCHEMA, named), avro_named=named
        )
    return ResolvedSchema(
        1, PROTOBUF, PROTO, proto=ProtoSchema.from_sources("bench.proto", {"bench.proto": PROTO})
    )


def spec(fmt: str) -> EncoderSpec:
    value = {
        "avro": SideSpec("avro", REGISTRY_CONF, AVRO_ID),
        "json": SideSpec("json", REGISTRY_CONF, JSON_ID),
    }.get(fmt, SideSpec("protobuf", REGISTRY_CONF, 1, "bench.Event"))
    return EncoderSpec(SideSpec(), value)


def _seed_worker_registry(fmt: str):
    """mapInArrow function for --spark: workers learn the schema ids without a registry server."""

    def fn(batches):
        reg = SchemaRegistry.shared(REGISTRY_CONF)
        if {"avro": AVRO_ID, "json": JSON_ID}.get(fmt, 1) not in reg._resolved:
            reg.add_resolved(resolved(fmt))
        from rsm_sidecar.iceberg.mapping.rows import map_in_arrow_fn

        yield from map_in_arrow_fn(spec(fmt))(batches)

    return fn


def spark_avro_jar() -> Path:
    """``spark-avro_2.13`` from Maven Central, into the project's cache (benchmark only)."""
    return maven_jar(
        default_cache_dir(),
        f"org.apache.spark:spark-avro_2.13:{SPARK_VERSION_AVRO}",
        f"spark-avro_2.13-{SPARK_VERSION_AVRO}",
    )


def _best(save, n: int, repeat: int) -> float:
    save()  # warm-up (worker start-up, JIT)
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        save()
        best = max(best, n / (time.perf_counter() - t0))
    return best


def run_spark(args, batch) -> None:
    import tempfile

    import pyarrow as pa

    from rsm_sidecar.iceberg.jars import spark_jars
    from rsm_sidecar.iceberg.session.catalogs import LocalCatalog
    from rsm_sidecar.iceberg.session.spark import spark_session
    from rsm_sidecar.iceberg.types import spark_ddl

    enc = RowEncoder(spec(args.format))
    copies = max(1, args.records // batch.num_rows)
    table = pa.Table.from_batches([batch] * copies)
    jvm = args.format == "avro"
    jars = None
    if jvm:
        jars = [*spark_jars(), spark_avro_jar()]
    with tempfile.TemporaryDirectory() as tmp:
        spark = spark_session(LocalCatalog(Path(tmp)), app_name="iceberg-decode-bench", jars=jars)
        try:
            df = spark.createDataFrame(table).repartition(2).cache()
            n = df.count()
            out = df.mapInArrow(_seed_worker_registry(args.format), spark_ddl(enc.schema))
            python = _best(lambda: out.write.format("noop").mode("overwrite").save(), n, args.repeat)
            print(
                f"Spark local[2] mapInArrow decode+Arrow ({args.format}, Python): {python:,.0f} records/s "
                f"({n} records, best of {args.repeat})"
            )
            if jvm:
                from pyspark.sql import functions as F
                from pyspark.sql.avro.functions import from_avro

                decoded = df.select(
                    "partition", "offset", "timestamp", "key", "headers",
                    from_avro(F.expr("substring(value, 6, length(value) - 5)"), AVRO_SCHEMA).alias("val"),
                )  # fmt: skip
                first = decoded.select("val.id", "val.at", "val.device.os").first()
                assert first is not None and first["id"].startswith("evt-") and first["os"] == "linux"
                save = lambda: decoded.write.format("noop").mode("overwrite").save()  # noqa: E731
                on_jvm = _best(save, n, args.repeat)
                print(
                    f"Spark local[2] from_avro on the JVM (spark-avro {SPARK_VERSION_AVRO}): {on_jvm:,.0f} "
                    f"records/s, {on_jvm / python:.2f}x the Python decoder in the same session"
                )
        finally:
            spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--spark", action="store_true", help="measure inside Spark mapInArrow on local[2]")
    ap.add_argument(
        "--format",
        choices=("protobuf", "avro", "json", "both", "all"),
        default="all",
        help="all: the three formats alternately in one process, and their ratios to Protobuf; "
        "both: Protobuf and Avro",
    )
    args = ap.parse_args()

    if args.spark and args.format in ("both", "all"):
        ap.error("--spark measures one format: --format protobuf, avro or json")
    formats = {"both": ("protobuf", "avro"), "all": ("protobuf", "avro", "json")}.get(
        args.format, (args.format,)
    )
    cases = {fmt: _case(fmt, args.batch) for fmt in formats}
    if args.spark:
        (fmt,) = formats
        print(f"value size avg {cases[fmt][1]:.0f} B (framed)")
        run_spark(args, cases[fmt][0])
        return
    n_batches = max(1, args.records // args.batch)
    runs = f"{n_batches * args.batch} records per run, best of {args.repeat}"
    print(f"batches of {args.batch}, {runs}, one thread, load average {os.getloadavg()[0]:.1f}")
    best: dict[tuple[str, str], tuple[float, float]] = {}
    encoders = {fmt: RowEncoder(spec(fmt)) for fmt in formats}
    for _ in range(args.repeat):  # the formats and paths alternate, so load hits them alike
        for fmt in formats:
            for path in ("columnar", "library"):
                rate = _encode_rate(encoders[fmt], cases[fmt][0], n_batches, columnar=path == "columnar")
                old = best.get((fmt, path), (0.0, 0.0))
                best[(fmt, path)] = (max(old[0], rate[0]), max(old[1], rate[1]))
    print("| format | value (framed) | path | records per CPU-second | records/s wall |")
    print("|---|---|---|---|---|")
    for (fmt, path), (wall, cpu) in best.items():
        short = {"protobuf": "proto"}.get(fmt, fmt)
        library = {"protobuf": "upb", "avro": "fastavro", "json": "json.loads per value"}[fmt]
        what = {"columnar": f"columnar ({short}_columnar)", "library": library}[path]
        print(f"| {fmt} | {cases[fmt][1]:.0f} B | {what} | {cpu:,.0f} | {wall:,.0f} |")
    for fmt in formats:
        fast, slow = best[(fmt, "columnar")], best[(fmt, "library")]
        print(f"{fmt}: columnar / library {fast[1] / slow[1]:.2f}x per CPU-second")
    for fmt in formats:
        if fmt != "protobuf" and "protobuf" in formats:
            ratio = best[(fmt, "columnar")][1] / best[("protobuf", "columnar")][1]
            print(f"{fmt} / protobuf, columnar, per CPU-second: {ratio:.2f}x")


def _case(fmt: str, batch_size: int):
    """(raw record batch, average framed value size) of ``batch_size`` events in ``fmt``."""
    schema = resolved(fmt)
    SchemaRegistry.shared(REGISTRY_CONF).add_resolved(schema)
    if fmt == "json":
        values = make_json_values(batch_size)
    elif schema.proto is not None:
        values = make_values(batch_size, schema.proto)
    else:
        values = make_avro_values(batch_size)
    recs = [
        KafkaRecord(
            0,
            i,
            i - i % 100,
            1_700_000_000_000 + i,
            1_700_000_000_000 + i,
            f"key-{i:012d}".encode(),
            v,
            [("trace", b"abc"), ("src", b"bench")],
        )
        for i, v in enumerate(values)
    ]
    return raw_batch(recs), sum(map(len, values)) / len(values)


def _encode_rate(enc: RowEncoder, batch, n_batches: int, columnar: bool) -> tuple[float, float]:
    """(records/s wall, records per CPU-second) of one run of ``encode`` over ``n_batches``
    batches, with the value's columnar decoder or without it (upb or fastavro alone)."""
    side = enc.val_side
    plan = getattr(side, "columnar_plan", None)
    if not columnar:
        if plan is not None:  # Protobuf: the side's plan
            side.columnar_plan = None
        else:  # Avro and JSON: the side's decode_arrow
            side.decode_arrow = lambda col: None  # type: ignore[method-assign]
    try:
        enc.encode(batch)  # warm-up
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n_batches):
            out = enc.encode(batch)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
    finally:
        if plan is not None:
            side.columnar_plan = plan
        side.__dict__.pop("decode_arrow", None)
    assert out.num_rows == batch.num_rows and out.column("val").field("__err__").null_count == batch.num_rows
    return n_batches * batch.num_rows / dt, n_batches * batch.num_rows / dc


if __name__ == "__main__":
    main()
