"""Decode + Arrow-build throughput of the Iceberg row encoder for ~100-byte Protobuf or Avro values.

Measures :meth:`rsm_sidecar.iceberg.mapping.rows.RowEncoder.encode` on one core: Confluent-framed
values of about 100 bytes (``--format protobuf``: magic, schema id, ``[0]`` index, the 9-field
``bench.Event``; ``--format avro``: magic, schema id, the same event as an Avro record), 16-byte
keys without a schema, two headers, in batches of 10 000 (Spark's ``arrow.maxRecordsPerBatch`` in
:func:`rsm_sidecar.iceberg.session.spark.spark_session`). The schema is put into the registry
client's id cache, so no registry server is involved: this is the pure per-record cost that runs
inside ``mapInArrow``.

    .venv/bin/python benchmarks/iceberg_decode.py [--format protobuf|avro] [--records 200000] [--batch 10000]
    .venv/bin/python benchmarks/iceberg_decode.py --spark [--format avro] [--records 400000]

``--spark`` runs the same encoder inside ``mapInArrow`` on a local[2] Spark (jars from
``python -m rsm_sidecar.iceberg.jars --no-cloud``) over an in-memory DataFrame of raw records
and writes to Spark's ``noop`` sink, so the figure is decode+Arrow plus Spark's Arrow
transfer on 2 cores (no segment reading, no Parquet/Iceberg write).

``--spark --format avro`` also measures, in the same session over the same DataFrame, decoding on
the JVM with Spark's own ``from_avro`` (the ``spark-avro`` module, fetched from Maven Central into
``.cache/`` on first use): the value's 5-byte preamble cut off with ``substring`` and the rest
decoded against the same writer schema, key and headers passed through. That is the
"decode on the JVM" design of issue 14 without any of the seed's mapping rules on top (no
``__err__``/``__raw__`` for a value that does not decode: ``from_avro`` in ``PERMISSIVE`` mode
gives null; no schema-id check per record; no evolution), so it is an upper bound for that design.
"""

from __future__ import annotations

import argparse
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

#: ``bench.Event`` as an Avro record (Timestamp as ``timestamp-micros``).
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
        ],
    }
)
SPARK_VERSION_AVRO = "4.1.1"  # spark-avro_2.13 versions the package registry serves: 4.1.1, 4.2.0


def make_values(n: int, schema: ProtoSchema) -> list[bytes]:
    cls = ProtoSchema.message_class(schema.message_by_name("bench.Event"))
    pre = framing.encode_preamble(1, [0])
    rnd = random.Random(1)
    out = []
    for i in range(n):
        m = cls(
            id=f"evt-{i:012d}-{rnd.randrange(1 << 30):08x}",
            user_id=rnd.randrange(1 << 40),
            kind=rnd.choice([1, 2]),
            amount=rnd.random() * 100,
            ok=bool(i & 1),
            tags=["alpha", "beta"][: rnd.randrange(3)],
            count=rnd.randrange(1000),
        )
        m.at.seconds, m.at.nanos = 1_700_000_000 + i, 123_000
        m.device.os, m.device.version = "linux-x86_64", 6
        out.append(pre + m.SerializeToString())
    return out


def make_avro_values(n: int) -> list[bytes]:
    """The same events as :func:`make_values`, Avro-encoded behind the Confluent preamble."""
    import fastavro

    parsed = parse_avro(AVRO_SCHEMA, {})
    pre = framing.encode_preamble(1)
    rnd = random.Random(1)
    out = []
    for i in range(n):
        buf = io.BytesIO()
        event = {
            "id": f"evt-{i:012d}-{rnd.randrange(1 << 30):08x}",
            "user_id": rnd.randrange(1 << 40),
            "kind": rnd.choice(["CLICK", "VIEW"]),
            "amount": rnd.random() * 100,
            "ok": bool(i & 1),
            "tags": ["alpha", "beta"][: rnd.randrange(3)],
            "count": rnd.randrange(1000),
            "at": (1_700_000_000 + i) * 1_000_000 + 123,
            "device": {"os": "linux-x86_64", "version": 6},
        }
        fastavro.schemaless_writer(buf, parsed, event)
        out.append(pre + buf.getvalue())
    return out


def resolved(fmt: str) -> ResolvedSchema:
    if fmt == "avro":
        named: dict = {}
        return ResolvedSchema(1, AVRO, AVRO_SCHEMA, avro=parse_avro(AVRO_SCHEMA, named), avro_named=named)
    return ResolvedSchema(
        1, PROTOBUF, PROTO, proto=ProtoSchema.from_sources("bench.proto", {"bench.proto": PROTO})
    )


def spec(fmt: str) -> EncoderSpec:
    value = (
        SideSpec("avro", REGISTRY_CONF, 1)
        if fmt == "avro"
        else SideSpec("protobuf", REGISTRY_CONF, 1, "bench.Event")
    )
    return EncoderSpec(SideSpec(), value)


def _seed_worker_registry(fmt: str):
    """mapInArrow function for --spark: workers learn schema id 1 without a registry server."""

    def fn(batches):
        reg = SchemaRegistry.shared(REGISTRY_CONF)
        if 1 not in reg._resolved:
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
                assert first is not None and first["id"].startswith("evt-") and first["os"] == "linux-x86_64"
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
    ap.add_argument("--format", choices=("protobuf", "avro"), default="protobuf")
    args = ap.parse_args()

    schema = resolved(args.format)
    SchemaRegistry.shared(REGISTRY_CONF).add_resolved(schema)
    if schema.proto is not None:
        values = make_values(args.batch, schema.proto)
    else:
        values = make_avro_values(args.batch)
    avg = sum(map(len, values)) / len(values)
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
    batch = raw_batch(recs)
    if args.spark:
        print(f"value size avg {avg:.0f} B (framed)")
        run_spark(args, batch)
        return
    print(
        f"{args.format}: value size avg {avg:.0f} B (framed), batch {args.batch}, "
        f"{max(1, args.records // args.batch) * args.batch} records"
    )
    enc = RowEncoder(spec(args.format))
    decoder = getattr(enc.val_side, "decoder", None)
    plan = getattr(decoder, "columnar_plan", None)
    if plan is not None:  # Protobuf: the columnar decoder, then upb alone, same batches
        fast = _encode_rate(enc, batch, args)
        decoder.columnar_plan = None
        slow = _encode_rate(enc, batch, args)
        decoder.columnar_plan = plan
        _print_rate("decode+Arrow, columnar (proto_columnar)", fast, args)
        _print_rate("decode+Arrow, upb (the fallback)", slow, args)
        print(f"columnar / upb: {fast[1] / slow[1]:.2f}x per CPU-second, {fast[0] / slow[0]:.2f}x wall")
    else:
        _print_rate("decode+Arrow", _encode_rate(enc, batch, args), args)


def _encode_rate(enc: RowEncoder, batch, args) -> tuple[float, float]:
    """Best (records/s wall, records per CPU-second) of ``args.repeat`` runs of ``encode``."""
    enc.encode(batch)  # warm-up
    n_batches = max(1, args.records // args.batch)
    best = best_cpu = 0.0
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n_batches):
            out = enc.encode(batch)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        best = max(best, n_batches * args.batch / dt)
        best_cpu = max(best_cpu, n_batches * args.batch / dc)
    assert out.num_rows == args.batch and out.column("val").field("__err__").null_count == args.batch
    return best, best_cpu


def _print_rate(what: str, rate: tuple[float, float], args) -> None:
    print(
        f"{what}: {rate[0]:,.0f} records/s wall, {rate[1]:,.0f} records per CPU-second "
        f"(one thread, best of {args.repeat}; the CPU figure is less sensitive to other load)"
    )


if __name__ == "__main__":
    main()
