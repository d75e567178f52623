"""Decode + Arrow-build throughput of the Iceberg row encoder for ~100-byte Protobuf values.

Measures :meth:`rsm_sidecar.iceberg.mapping.rows.RowEncoder.encode` on one core: Confluent-framed
Protobuf values (magic, schema id, ``[0]`` index) of about 100 bytes, 16-byte keys without a
schema, two headers, in batches of 10 000 (Spark's ``arrow.maxRecordsPerBatch`` in
:func:`rsm_sidecar.iceberg.session.spark.spark_session`). The schema is compiled with protoc and put
into the registry client's id cache, so no registry server is involved: this is the pure
per-record cost that runs inside ``mapInArrow``.

    .venv/bin/python benchmarks/iceberg_decode.py [--records 200000] [--batch 10000]
    .venv/bin/python benchmarks/iceberg_decode.py --spark [--records 400000]

``--spark`` runs the same encoder inside ``mapInArrow`` on a local[2] Spark (jars from
``python -m rsm_sidecar.iceberg.jars --no-cloud``) over an in-memory DataFrame of raw records
and writes to Spark's ``noop`` sink, so the figure is decode+Arrow plus Spark's Arrow
transfer on 2 cores (no segment reading, no Parquet/Iceberg write).
"""

from __future__ import annotations

import argparse
import random
import time

from rsm_sidecar.iceberg.decoding import framing
from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema
from rsm_sidecar.iceberg.decoding.schema_registry import PROTOBUF, ResolvedSchema, SchemaRegistry
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


def _seed_worker_registry(batches):
    """mapInArrow wrapper for --spark: workers learn schema id 1 without a registry server."""
    reg = SchemaRegistry.shared(REGISTRY_CONF)
    if 1 not in reg._resolved:
        reg.add_resolved(
            ResolvedSchema(
                1, PROTOBUF, PROTO, proto=ProtoSchema.from_sources("bench.proto", {"bench.proto": PROTO})
            )
        )
    from rsm_sidecar.iceberg.mapping.rows import map_in_arrow_fn

    yield from map_in_arrow_fn(SPEC)(batches)


SPEC = EncoderSpec(SideSpec(), SideSpec("protobuf", REGISTRY_CONF, 1, "bench.Event"))


def run_spark(args, batch) -> None:
    import tempfile
    from pathlib import Path

    import pyarrow as pa

    from rsm_sidecar.iceberg.session.spark import LocalCatalog, spark_session
    from rsm_sidecar.iceberg.types import spark_ddl

    enc = RowEncoder(SPEC)
    copies = max(1, args.records // batch.num_rows)
    table = pa.Table.from_batches([batch] * copies)
    with tempfile.TemporaryDirectory() as tmp:
        spark = spark_session(LocalCatalog(Path(tmp)), app_name="iceberg-decode-bench")
        try:
            df = spark.createDataFrame(table).repartition(2).cache()
            n = df.count()
            out = df.mapInArrow(_seed_worker_registry, spark_ddl(enc.schema))
            out.write.format("noop").mode("overwrite").save()  # warm-up (worker start-up)
            best = 0.0
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                out.write.format("noop").mode("overwrite").save()
                best = max(best, n / (time.perf_counter() - t0))
            print(
                f"Spark local[2] mapInArrow decode+Arrow: {best:,.0f} records/s "
                f"({n} records, best of {args.repeat})"
            )
        finally:
            spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--spark", action="store_true", help="measure inside Spark mapInArrow on local[2]")
    args = ap.parse_args()

    schema = ProtoSchema.from_sources("bench.proto", {"bench.proto": PROTO})
    SchemaRegistry.shared(REGISTRY_CONF).add_resolved(ResolvedSchema(1, PROTOBUF, PROTO, proto=schema))
    values = make_values(args.batch, schema)
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
    enc = RowEncoder(SPEC)
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
    print(f"value size avg {avg:.0f} B (framed), batch {args.batch}, {n_batches * args.batch} records")
    print(
        f"decode+Arrow: {best:,.0f} records/s wall, {best_cpu:,.0f} records per CPU-second "
        f"(one thread, best of {args.repeat}; the CPU figure is less sensitive to other load)"
    )


if __name__ == "__main__":
    main()
