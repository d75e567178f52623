"""The same offsets copied twice under two segment ids after a leader change (KAFKA-15168), made
to happen on purpose, then served, converted to Iceberg and deleted.

A follower's segments do not have to end where the leader's do. Here the topic sets no
``segment.bytes``, so each broker rolls at its own ``log.segment.bytes`` (per-broker dynamic
configs): broker 1 leads with 1 MiB segments and copies them (its active segment is not
copied); brokers 2 and 3 hold the same records in one large segment. The topic's local
retention is by size only, so no broker rolls its active segment early to delete it. Broker 2
is made leader, rolls (its ``log.segment.bytes`` lowered) and copies its segment: it starts at
offset 0, so the offsets broker 1 copied are now in the bucket twice, under broker 1's segment
ids and under broker 2's. Then:

* both are served correctly while they exist: offset 0 on is read through broker 1 (its own
  segments, before the second copy) and through broker 2 (its segment, after); the segments
  decode to the same bytes for the offsets they share;
* the Iceberg job over the bucket writes each offset once, with the record's key, value and
  headers;
* retention deletes both: the bucket holds nothing of the topic afterwards (the segments the
  second copy superseded included, KAFKA-16511).
"""

from __future__ import annotations

import uuid
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from rsm_sidecar.config import Config
from rsm_sidecar.format.keys import KeyLayout
from rsm_sidecar.segment.reader import SegmentReader
from rsm_sidecar.segment.settings import ReaderSettings
from rsm_sidecar.transform.keyring import Keyring
from tests.cluster.cluster_helpers import (
    Written,
    admin_request,
    check_read,
    elect_preferred,
    local_start,
    produce_bytes,
    produce_records,
    reassign,
    remote_segments,
    served_bytes,
    wait_all_tiered,
    wait_local_start,
    wait_remote,
)
from tests.e2e.kafka_helpers import KEY_PREFIX, local_segment_offsets, tiered_topic_config, wait_for

SMALL, LARGE = 1024 * 1024, 64 * 1024 * 1024


@pytest.fixture(scope="module")
def spark_soon(tmp_path_factory):
    """A local Spark session on an embedded catalog, as the Iceberg tests start theirs
    (rsm_sidecar.iceberg.session.spark), started in a thread while the test drives Kafka;
    stopped at the end of the module (tests/iceberg then start their own on the same JVM)."""
    from rsm_sidecar.iceberg.jars import ensure_spark_jars
    from rsm_sidecar.iceberg.session.spark import LocalCatalog, spark_session

    catalog = LocalCatalog(tmp_path_factory.mktemp("iceberg")).prepare()

    def start():
        cloud = ("aws", "gcp")  # the jars tests/iceberg's session loads: the JVM keeps them
        ensure_spark_jars(cloud=cloud)
        return spark_session(catalog, app_name="rsm-cluster-tests", cloud=cloud)

    with ThreadPoolExecutor(1) as pool:
        future: Future = pool.submit(start)
        yield future
        future.result().stop()


def _broker_segment_bytes(cluster, sizes: dict[int, int | None]) -> None:
    """Per-broker dynamic ``log.segment.bytes`` (None: back to the static value); one request
    per broker (Kafka takes one broker resource per request)."""
    for node_id, size in sizes.items():
        op = AlterConfigOpType.DELETE if size is None else AlterConfigOpType.SET
        entry = ConfigEntry("log.segment.bytes", str(size or ""), incremental_operation=op)
        resource = ConfigResource(ConfigResource.Type.BROKER, str(node_id), incremental_configs=[entry])
        admin_request(cluster, "incremental_alter_configs", [resource])


def _segment_bytes(cluster, store, base: str) -> bytes:
    """A stored segment's bytes, decrypted and verified (the sidecar's own reader)."""
    cfg = Config.load(*cluster.sidecar_config_env())
    reader = SegmentReader(
        store,
        KeyLayout(cfg["storage.key_prefix"], cfg["storage.hashed_prefix_chars"]),
        Keyring.from_config(cfg),
        ReaderSettings(chunk_cache_bytes=0, prefetch_bytes=0),
    )
    opened = reader.open_base(base)
    return b"".join(reader.read(opened, 0, opened.manifest.original_size - 1))


def test_same_offsets_copied_again_after_a_leader_change(cluster, store, spark_soon):
    topic = "overlap"
    first, second, third = 1, 2, 3
    bootstrap = cluster.bootstrap_servers
    try:
        _broker_segment_bytes(cluster, {first: SMALL, second: LARGE, third: LARGE})
        # no segment.bytes: each broker's own log.segment.bytes. Local retention by size only
        # (1 byte: every tiered segment but the active one leaves the disk): a time limit would
        # have each broker roll its active segment once it is older than that, whatever its size
        config = tiered_topic_config(local_retention_ms=-2, local_retention_bytes=1)
        del config["segment.bytes"]
        topic_spec = NewTopic(topic, 1, replica_assignment=[[first, second, third]], config=config)
        admin_request(cluster, "create_topics", [topic_spec])
        written = Written()
        written.add(produce_records(bootstrap, topic, 500, seed=81))
        written.add(produce_bytes(bootstrap, topic, 3_300_000, seed=82))

        # broker 1 copies its closed 1 MiB segments and reads them back through its sidecar
        copied_first = wait_all_tiered(cluster, store, topic, first, everything=False)
        wait_local_start(cluster.nodes[first], topic, copied_first + 1)
        segments_first = remote_segments(store, topic)
        assert {s.broker_id for s in segments_first} == {first} and len(segments_first) >= 3
        served = served_bytes(cluster.nodes[first])
        check_read(bootstrap, topic, written, "read_uncommitted")
        assert served_bytes(cluster.nodes[first]) > served

        # broker 2 leads: all of it is one local segment there, from offset 0
        reassign(cluster, topic, [second, first, third])
        assert elect_preferred(cluster, topic) == second
        assert local_segment_offsets(cluster.nodes[second].broker, topic) == [0]
        # ... until it rolls at 1 MiB too, and copies that segment: offsets 0 on, again
        _broker_segment_bytes(cluster, {second: SMALL})
        written.add(produce_bytes(bootstrap, topic, 50_000, seed=83))
        segs = wait_remote(
            store,
            topic,
            f"broker {second}'s segment from offset 0",
            lambda segs: any(s.broker_id == second and s.start == 0 for s in segs),
        )
        again = next(s for s in segs if s.broker_id == second and s.start == 0)
        assert again.end > copied_first
        assert [s for s in segs if s.broker_id == first] == segments_first, "broker 1's copies are gone"
        assert [s.start for s in segs if s.broker_id == second] == [0], "broker 2 copied more"
        wait_local_start(cluster.nodes[second], topic, again.end + 1)
        served = served_bytes(cluster.nodes[second])
        check_read(bootstrap, topic, written, "read_uncommitted")
        assert served_bytes(cluster.nodes[second]) > served
        assert local_start(cluster.nodes[second], topic) > again.end

        # the two copies of the shared offsets are the same bytes (replicas hold the leader's batches)
        twice = b"".join(_segment_bytes(cluster, store, s.base) for s in segments_first)
        assert _segment_bytes(cluster, store, again.base)[: len(twice)] == twice

        # the Iceberg job writes each offset once
        rows = _convert(cluster, spark_soon.result(), topic)
        expected = {r.offset: r for r in written.records if r.offset <= again.end}
        assert sorted(rows) == sorted(expected), "offsets missing or written twice"
        for offset, r in expected.items():
            row = rows[offset]
            assert (row["key"] or {}).get("__raw__") == r.key, offset
            assert (row["val"] or {}).get("__raw__") == r.value, offset
            assert [(h["key"], h["value"]) for h in row["headers"]] == list(r.headers), offset

        # retention deletes both copies
        entries = [
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in (("retention.ms", "1000"), ("local.retention.ms", "-2"))
        ]
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
        admin_request(cluster, "incremental_alter_configs", [resource])
        wait_for(
            f"no object of {topic} left in the bucket",
            lambda: not [o for o in store.list(KEY_PREFIX) if o.key.startswith(f"{KEY_PREFIX}{topic}-")],
            120,
        )
    finally:
        _broker_segment_bytes(cluster, {first: None, second: None, third: None})


def _convert(cluster, spark, topic: str) -> dict[int, dict]:
    """`rsm-sidecar iceberg convert` of ``topic`` (its Python API, on ``spark``) into a table of
    a local catalog; its rows by offset (a row per offset, or the offset's last row)."""
    from rsm_sidecar.iceberg.job import convert, load_config
    from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
    from rsm_sidecar.iceberg.settings import JobSettings

    lake = {
        "iceberg.catalog.local.root": str(cluster.workdir / "lake"),
        "iceberg.catalog.name": f"cluster{uuid.uuid4().hex[:6]}",
    }
    cfg_file, env = cluster.sidecar_config_env()
    result = convert(cfg_file, topic, environ=env, overrides=lake, spark=spark)
    assert result.committed
    cfg, _ = load_config(cfg_file, env, lake)
    settings = JobSettings.from_config(cfg)
    table = (
        CatalogSpec(settings.catalog).pyiceberg().load_table((settings.namespace, settings.table_name(topic)))
    )
    rows = table.scan().to_arrow().to_pylist()
    offsets = [r["kafka"]["offset"] for r in rows]
    assert len(offsets) == len(set(offsets)), "an offset written twice"
    return {r["kafka"]["offset"]: r for r in rows}
