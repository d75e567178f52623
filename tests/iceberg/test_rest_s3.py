"""The convert job against a real Iceberg REST catalog (Apache Iceberg's REST fixture,
``devstack.iceberg_rest``) with the warehouse in S3 (SeaweedFS), the segments themselves in
S3 too (the sidecar's S3 backend on the same server): conversion, exactly-once re-run, reads
from PyIceberg's RestCatalog and Spark SQL, and maintenance through the REST catalog."""

from __future__ import annotations

from rsm_sidecar.iceberg.committing import markers as mk
from tests.iceberg.convert_helpers import (
    MAINTAIN_EVERYTHING_NOW,
    SyntheticTopic,
    rest_s3_overrides,
    rows,
    s3_segments_toml,
)


def test_rest_catalog_with_s3_warehouse_and_s3_segments(spark, s3, rest, tmp_path):
    t = SyntheticTopic(
        tmp_path, "payments", catalog_name="lake", storage_toml=s3_segments_toml(s3.endpoint_url)
    )
    t.transactional_segments()
    ov = {**rest_s3_overrides(s3.endpoint_url, rest.uri), "iceberg.partitioning": "hour"}
    res = t.convert(spark, **ov)
    assert res.committed and res.records == len(t.records) == 190
    table = t.table(**ov)
    assert table.location().startswith("s3://lake/warehouse/")
    assert rows(table) == t.expected()
    assert str(table.spec().fields[0].transform) == "hour"
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket="lake")["Contents"]]
    assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".metadata.json") for k in keys)
    # Spark SQL through the same REST catalog
    got = spark.sql(
        "SELECT count(*) AS n, count(DISTINCT kafka.partition, kafka.offset) AS d, "
        "max(kafka.offset) AS m FROM lake.kafka.payments WHERE kafka.partition = 0"
    ).collect()[0]
    assert (got.n, got.d, got.m) == (70, 70, 76)
    assert t.convert(spark, **ov).records == 0
    t.simple_segments(1, 1)
    assert t.convert(spark, **ov).records == 60
    assert rows(t.table(**ov)) == t.expected()

    # maintenance through the REST catalog: compaction keeps the rows, expiry keeps the marker,
    # orphan removal (S3 prefix listing) finds an object no snapshot references
    stray = t.table(**ov).location().removeprefix("s3://lake/") + "/data/stray-from-a-killed-writer.parquet"
    s3.client().put_object(Bucket="lake", Key=stray, Body=b"not parquet")
    res = t.maintain(spark, ov, **MAINTAIN_EVERYTHING_NOW)
    assert res.compacted["rewritten_data_files_count"] >= 2
    assert res.orphans == [f"s3://lake/{stray}"]
    assert stray not in [o["Key"] for o in s3.client().list_objects_v2(Bucket="lake")["Contents"]]
    table = t.table(**ov)
    assert rows(table) == t.expected()
    state = mk.read_state(table)
    assert state.next_offsets == {0: 77, 1: 180}
    assert state.marker_snapshot_id == table.metadata.refs[mk.MARKER_TAG].snapshot_id
