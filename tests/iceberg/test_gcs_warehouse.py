"""The convert job with the embedded catalog (JDBC/SQLite) and the warehouse in GCS
(fake-gcs-server, ``devstack.gcsserver``), the segments themselves in GCS too (the sidecar's
GCS backend on the same server): Spark writes through ``GCSFileIO``, the driver commits and
reads through PyIceberg's PyArrow GCS file system; exactly-once re-run, Spark SQL, and
maintenance (compaction, expiry, orphan removal by prefix listing) on GCS."""

from __future__ import annotations

import json
import urllib.request

import pytest

from rsm_sidecar.iceberg.committing import markers as mk
from tests.iceberg.convert_helpers import MAINTAIN_EVERYTHING_NOW, SyntheticTopic, rows


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    from devstack.gcsserver import FakeGcsServer

    srv = FakeGcsServer(tmp_path_factory.mktemp("fake-gcs")).start()
    srv.create_bucket("segments")
    srv.create_bucket("lake")
    yield srv
    srv.stop()


def _object_names(gcs, bucket: str) -> list[str]:
    names, token = [], ""
    while True:
        url = f"{gcs.endpoint_url}/storage/v1/b/{bucket}/o?maxResults=1000" + (
            f"&pageToken={token}" if token else ""
        )
        with urllib.request.urlopen(url, timeout=10) as r:
            page = json.load(r)
        names += [o["name"] for o in page.get("items", [])]
        token = page.get("nextPageToken", "")
        if not token:
            return names


def test_local_catalog_with_gcs_warehouse_and_gcs_segments(spark, gcs, tmp_path):
    storage = (
        f'[storage]\nbackend = "gcs"\nkey_prefix = "tiered/"\n'
        f'[storage.gcs]\nbucket = "segments"\nendpoint_url = "{gcs.endpoint_url}"\n'
        f'credentials = "anonymous"\nproject = "test"\n'
    )
    t = SyntheticTopic(tmp_path, "clicks", catalog_name="gcslake", storage_toml=storage)
    t.transactional_segments()
    ov = {
        "iceberg.warehouse": "gs://lake/warehouse",
        "iceberg.gcs.endpoint": gcs.endpoint_url,
        "iceberg.gcs.project_id": "test",
        "iceberg.gcs.no_auth": True,
    }
    res = t.convert(spark, **ov)
    assert res.committed and res.records == len(t.records) == 190
    table = t.table(**ov)
    assert table.location().startswith("gs://lake/warehouse/")
    assert rows(table) == t.expected()  # PyIceberg reads the Parquet files back from GCS
    names = _object_names(gcs, "lake")
    assert any(n.endswith(".parquet") for n in names) and any(n.endswith(".metadata.json") for n in names)
    assert all(n.startswith("warehouse/") for n in names)
    assert not list((tmp_path / "catalog").rglob("*.parquet"))  # nothing fell back to local disk
    got = spark.sql(
        "SELECT count(*) AS n, count(DISTINCT kafka.partition, kafka.offset) AS d FROM gcslake.kafka.clicks"
    ).collect()[0]
    assert (got.n, got.d) == (190, 190)

    assert t.convert(spark, **ov).records == 0
    t.simple_segments(0, 1)
    assert t.convert(spark, **ov).records == 60
    assert rows(t.table(**ov)) == t.expected()

    # an object in the table's data folder that no snapshot references: an orphan
    stray = table.location().removeprefix("gs://lake/") + "/data/stray-from-a-killed-writer.parquet"
    req = urllib.request.Request(
        f"{gcs.endpoint_url}/upload/storage/v1/b/lake/o?uploadType=media&name={stray}",
        data=b"not parquet",
        method="POST",
    )
    urllib.request.urlopen(req, timeout=10).close()
    assert stray in _object_names(gcs, "lake")

    res = t.maintain(spark, ov, **MAINTAIN_EVERYTHING_NOW)
    assert res.compacted["rewritten_data_files_count"] >= 2
    assert res.orphans == [f"gs://lake/{stray}"]
    assert stray not in _object_names(gcs, "lake")
    table = t.table(**ov)
    assert rows(table) == t.expected()
    state = mk.read_state(table)
    assert state.next_offsets == {0: 137, 1: 120}
    assert state.marker_snapshot_id == table.metadata.refs[mk.MARKER_TAG].snapshot_id
