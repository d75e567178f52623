"""Real local Spark (Iceberg runtime from Maven Central) sharing the JDBC/SQLite catalog with
PyIceberg, both directions, and the row encoder running inside ``mapInArrow``."""

from __future__ import annotations

import datetime as dt
import functools

import pyarrow as pa
import pytest

from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg import jars
from rsm_sidecar.iceberg.decoding.schema_registry import SchemaRegistry
from rsm_sidecar.iceberg.decoding.sides import resolve_side
from rsm_sidecar.iceberg.mapping.evolution import ensure_table
from rsm_sidecar.iceberg.mapping.rows import EncoderSpec, RowEncoder, map_in_arrow_fn
from rsm_sidecar.iceberg.reading.raw_records import RAW_RECORD_SCHEMA, KafkaRecord, raw_batch
from rsm_sidecar.iceberg.types import schema_to_arrow, spark_ddl

UTC = dt.UTC


def test_spark_writes_pyiceberg_reads(spark, local_catalog):
    spark.sql("CREATE NAMESPACE IF NOT EXISTS rsm.share")
    spark.sql(
        "CREATE TABLE rsm.share.from_spark (id BIGINT, s STRING, kafka STRUCT<ts: TIMESTAMP>) "
        "USING iceberg PARTITIONED BY (hours(kafka.ts))"
    )
    df = spark.sql("SELECT 1L AS id, 'a' AS s, named_struct('ts', timestamp'2024-01-01 10:00:00') AS kafka")
    df.writeTo("rsm.share.from_spark").option("snapshot-property.rsm.segment", "seg-1").append()
    t = local_catalog.pyiceberg().load_table("share.from_spark")
    assert t.scan().to_arrow().to_pylist() == [
        {"id": 1, "s": "a", "kafka": {"ts": dt.datetime(2024, 1, 1, 10, tzinfo=UTC)}}
    ]
    assert t.current_snapshot().summary["rsm.segment"] == "seg-1"
    # and PyIceberg appends to Spark's table: Spark sees it (no stale cached metadata)
    t.append(
        pa.table(
            {"id": [2], "s": ["b"], "kafka": [{"ts": dt.datetime(2024, 1, 2, tzinfo=UTC)}]},
            schema=t.schema().as_arrow(),
        )
    )
    assert [r.id for r in spark.sql("SELECT id FROM rsm.share.from_spark ORDER BY id").collect()] == [1, 2]


def test_pyiceberg_writes_spark_reads(spark, local_catalog):
    enc = RowEncoder(EncoderSpec())  # raw key/value: the schema without a registry
    catalog = local_catalog.pyiceberg()
    table = ensure_table(catalog, "share.from_py", enc.schema, partition="hour")
    batch = RowEncoder(EncoderSpec().with_table(schema_to_arrow(table.schema()))).encode(
        raw_batch(
            [
                KafkaRecord(1, 5, 5, 1_700_000_000_123, 1_700_000_000_456, b"k", b"v", [("h", b"1")]),
                KafkaRecord(1, 6, 5, -1, None, None, None),
            ]
        )
    )
    table.append(pa.Table.from_batches([batch]))
    rows = spark.sql(
        "SELECT key.__raw__ AS k, val.__raw__ AS v, headers, kafka FROM rsm.share.from_py "
        "ORDER BY kafka.offset"
    ).collect()
    assert rows[0].k == b"k" and rows[0].v == b"v"
    assert [(h.key, h.value) for h in rows[0].headers] == [("h", b"1")]
    assert rows[0].kafka.offset == 5 and rows[0].kafka.batch_start == 5
    # PySpark returns TIMESTAMP as a naive datetime in the driver's local zone
    assert rows[0].kafka.event_timestamp == dt.datetime.fromtimestamp(1_700_000_000.123)
    assert rows[1].k is None and rows[1].kafka.event_timestamp is None
    parts = spark.sql("SELECT partition FROM rsm.share.from_py.partitions").collect()
    assert len(parts) == 2  # hour(kafka.ingest_timestamp): one real hour + null


def test_map_in_arrow_encodes_on_workers(spark, local_catalog, registry_url, sr_client, topic, order_pb2):
    from tests.iceberg.test_registry import proto_ser

    ser = proto_ser(order_pb2.Order, sr_client, topic)
    values = [ser(order_pb2.Order(id=f"o{i}", status=1 + i % 2)) for i in range(500)]
    values[7] = b"garbage"
    reg = SchemaRegistry(registry_url)
    spec = EncoderSpec(resolve_side(reg, topic, True), resolve_side(reg, topic, False, samples=values[:1]))
    catalog = local_catalog.pyiceberg()
    ident = f"share.{topic.replace('-', '_')}"
    table = ensure_table(catalog, ident, RowEncoder(spec).schema)
    spec = spec.with_table(schema_to_arrow(table.schema()))
    raw = pa.Table.from_batches(
        [
            raw_batch(
                [
                    KafkaRecord(0, i, i, 1_700_000_000_000 + i, 1_700_000_000_000 + i, None, v)
                    for i, v in enumerate(values)
                ]
            )
        ]
    )
    assert raw.schema == RAW_RECORD_SCHEMA
    df = spark.createDataFrame(raw).repartition(2)
    out = df.mapInArrow(map_in_arrow_fn(spec), spark_ddl(table.schema()))
    out.writeTo(f"rsm.{ident}").option("snapshot-property.rsm.job", "t").append()
    got = catalog.load_table(ident).scan().to_arrow()
    assert got.num_rows == 500
    rows = {r["kafka"]["offset"]: r["val"] for r in got.to_pylist()}
    assert rows[3]["id"] == "o3" and rows[3]["status"] == "SHIPPED" and rows[3]["__raw__"] is None
    assert "missing magic byte" in rows[7]["__err__"] and rows[7]["__raw__"] == b"garbage"
    assert spark.sql(f"SELECT count(*) AS n FROM rsm.{ident} WHERE val.__err__ IS NULL").first().n == 499


def test_cloud_bundles_build_s3_and_gcs_clients(spark):
    """iceberg-aws-bundle 1.12.0 and iceberg-gcp-bundle 1.11.0 next to the 1.12.0 runtime: the
    FileIO classes in the runtime find their SDKs (no request is made: clients are lazy)."""
    jvm = spark._jvm

    def props(d):
        m = jvm.java.util.HashMap()
        for k, v in d.items():
            m.put(k, v)
        return m

    s3 = jvm.org.apache.iceberg.aws.s3.S3FileIO()
    s3.initialize(
        props(
            {
                "s3.endpoint": "http://127.0.0.1:9",
                "client.region": "us-east-1",
                "s3.access-key-id": "x",
                "s3.secret-access-key": "y",
                "s3.path-style-access": "true",
            }
        )
    )
    assert s3.client().getClass().getName() == "software.amazon.awssdk.services.s3.DefaultS3Client"
    gcs = jvm.org.apache.iceberg.gcp.gcs.GCSFileIO()
    gcs.initialize(
        props({"gcs.project-id": "p", "gcs.no-auth": "true", "gcs.service.host": "http://127.0.0.1:9"})
    )
    assert gcs.client().getClass().getName() == "com.google.cloud.storage.StorageImpl"
    s3.close()
    gcs.close()


def test_missing_jars_name_the_setup_command(tmp_path):
    with pytest.raises(ConfigError, match="python -m rsm_sidecar.iceberg.jars"):
        jars.spark_jars(tmp_path)


def test_download_checks_checksums(tmp_path):
    """A real HTTP server on loopback standing in for a Maven repository."""
    import hashlib
    import http.server
    import threading

    root = tmp_path / "repo"
    (root / "g").mkdir(parents=True)
    (root / "g" / "a.jar").write_bytes(b"jar-bytes")
    (root / "g" / "a.jar.sha1").write_text(hashlib.sha1(b"jar-bytes").hexdigest())
    (root / "g" / "b.jar").write_bytes(b"tampered")
    (root / "g" / "b.jar.sha1").write_text(hashlib.sha1(b"original").hexdigest())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}/g"
    try:
        good = jars.download_verified(
            f"{base}/a.jar", tmp_path / "out" / "a.jar", sha256=hashlib.sha256(b"jar-bytes").hexdigest()
        )
        assert good.read_bytes() == b"jar-bytes"
        with pytest.raises(ConfigError, match="SHA-1 .* does not match the published"):
            jars.download_verified(f"{base}/b.jar", tmp_path / "out" / "b.jar", sha256=None)
        with pytest.raises(ConfigError, match="SHA-256 .* does not match the pinned"):
            jars.download_verified(f"{base}/a.jar", tmp_path / "out" / "c.jar", sha256="0" * 64)
        with pytest.raises(ConfigError, match="404"):
            jars.download_verified(f"{base}/missing.jar", tmp_path / "out" / "m.jar", sha256=None)
        assert not (tmp_path / "out" / "b.jar").exists() and not (tmp_path / "out" / "c.jar").exists()
    finally:
        srv.shutdown()


def test_registry_down_fails_the_spark_job_and_commits_nothing(spark, local_catalog, tmp_path, order_pb2):
    """The registry dies between planning and the Spark stage: the write fails, no snapshot."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from devstack.registry import ApicurioDistribution, ApicurioRegistry
    from tests.iceberg.test_registry import proto_ser

    topic = "spark-down"
    with ApicurioRegistry(ApicurioDistribution.ensure(), tmp_path / "reg") as own:
        ser = proto_ser(order_pb2.Order, SchemaRegistryClient({"url": own.ccompat_url}), topic)
        values = [ser(order_pb2.Order(id=str(i))) for i in range(20)]
        reg = SchemaRegistry({"url": own.ccompat_url, "max.retries": 0})
        spec = EncoderSpec(
            resolve_side(reg, topic, True), resolve_side(reg, topic, False, samples=values[:1])
        )
        catalog = local_catalog.pyiceberg()
        table = ensure_table(catalog, "share.spark_down", RowEncoder(spec).schema)
        spec = spec.with_table(schema_to_arrow(table.schema()))
    # registry stopped; the Python workers have never seen this registry's schema ids
    raw = pa.Table.from_batches(
        [raw_batch([KafkaRecord(0, i, i, 1_000, 1_000, None, v) for i, v in enumerate(values)])]
    )
    out = spark.createDataFrame(raw).mapInArrow(map_in_arrow_fn(spec), spark_ddl(table.schema()))
    with pytest.raises(Exception, match="RegistryUnavailable"):
        out.writeTo("rsm.share.spark_down").append()
    assert catalog.load_table("share.spark_down").current_snapshot() is None


def test_several_opening_a_new_embedded_catalog_at_once_all_get_it(tmp_path):
    """PyIceberg's SqlCatalog checks for its tables, then creates them: on a new catalog file,
    six openers at once (a follower starting while ``iceberg status`` runs) made some fail with
    "table ... already exists" (77 of 120 in 20 rounds before the retry)."""
    import threading

    from rsm_sidecar.iceberg.session.catalogs import LocalCatalog

    failures = []
    for i in range(10):
        root = tmp_path / f"c{i}"
        LocalCatalog(root).prepare()
        barrier = threading.Barrier(6)

        def open_catalog(root=root, barrier=barrier):
            barrier.wait()
            try:
                LocalCatalog(root).pyiceberg().list_namespaces()
            except Exception as exc:  # collected: the assertion names them
                failures.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=open_catalog) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert failures == []
