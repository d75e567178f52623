"""Current-state tables (``iceberg.mode = upsert``) against a reference computed here from the
produced records: repeated keys (also within one batch), tombstones, keys re-created after a
tombstone, records without a key, committed and aborted transactions (aborted updates and
tombstones of existing keys, newer than the rows they would replace), a re-uploaded segment;
keys of every format (raw bytes, strings, Protobuf and Avro through a real Apicurio) with their
decoded columns; read back with PyIceberg and Spark. Then exactly once (a rerun, the CLI's
process group SIGKILLed while the executors read and after the ``MERGE`` is staged, two jobs
racing), the rule for a key in several partitions, the follow mode, maintenance, and an append
table beside the current-state table of one topic. Real Spark (the session's ``local[2]``),
segments stored by the sidecar's own copy code."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg import current_state
from rsm_sidecar.iceberg.committing import markers as mk
from rsm_sidecar.iceberg.settings import CURRENT_SUFFIX, JobSettings
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
from rsm_sidecar.kafka.records import Header
from tests.iceberg.convert_helpers import (
    T0,
    Produced,
    SyntheticTopic,
    following,
    kill_group,
    sample,
    wait_paused,
)

UPSERT = {"iceberg.mode": "upsert"}
# confluent-kafka 2.16 defaults to the ASSOCIATED strategy, which Apicurio does not serve
AVRO_SER_CONF = {"subject.name.strategy.type": "TOPIC"}
PROTO_SER_CONF = {**AVRO_SER_CONF, "use.deprecated.format": False}


# ============================================================================ the reference


def reference(records: list[Produced], order: Callable[[Produced], tuple] | None = None) -> dict:
    """The state a current-state table must hold, computed from the committed records alone:
    per key (bytes) its latest record - by offset within its partition, unless ``order`` says
    otherwise - left out when that record is a tombstone; records without a key have none."""
    order = order or (lambda r: (r.partition, r.offset))
    latest: dict[bytes, Produced] = {}
    for r in records:
        if r.key is not None and (r.key not in latest or order(r) > order(latest[r.key])):
            latest[r.key] = r
    return {k: r for k, r in latest.items() if r.value is not None}


def table_state(table) -> dict:
    """``key bytes -> (partition, offset, row)`` read with PyIceberg; fails on a key twice."""
    out: dict = {}
    for row in table.scan().to_arrow().to_pylist():
        key = row["key"]["__raw__"]
        assert key not in out, f"key {key!r} has two rows"
        out[key] = (row["kafka"]["partition"], row["kafka"]["offset"], row)
    return out


def spark_state(spark, table_name: str) -> dict:
    """The same read through Spark SQL: ``key bytes -> (partition, offset)``."""
    rows = spark.sql(
        f"SELECT key.__raw__ AS k, kafka.partition AS p, kafka.offset AS o FROM {table_name}"
    ).collect()
    out = {bytes(r.k): (r.p, r.o) for r in rows}
    assert len(out) == len(rows), "a key has two rows"
    return out


def assert_state(spark, t: SyntheticTopic, codec: Codec | None = None, **overrides) -> None:
    want = reference(t.records)
    got = table_state(t.table(**{**UPSERT, **overrides}))
    assert {k: v[:2] for k, v in got.items()} == {k: (r.partition, r.offset) for k, r in want.items()}
    for key, (_, _, row) in got.items():
        r = want[key]
        assert row["headers"] == [{"key": k, "value": v} for k, v in r.headers]
        if codec is not None:
            assert codec.decoded(row) == codec.expected(r.key, r.value), row
    name = f"{t.catalog_name}.kafka.{JobSettings(mode='upsert').table_name(t.topic)}"
    if "iceberg.table" in overrides:
        name = f"{t.catalog_name}.kafka.{overrides['iceberg.table']}"
    assert spark_state(spark, name) == {k: (r.partition, r.offset) for k, r in want.items()}


# ============================================================================ producing


class Producer:
    """Records with chosen keys and values into a :class:`SyntheticTopic`'s partitions, committed
    ones remembered in ``t.records`` (what the reference sees)."""

    def __init__(self, t: SyntheticTopic):
        self.t = t

    def batch(
        self,
        partition: int,
        pairs: list[tuple[bytes | None, bytes | None]],
        *,
        pid: int | None = None,
        committed: bool = True,
        ts: int | None = None,
    ) -> bytes:
        t = self.t
        off = t.next_offset.get(partition, 0)
        base = T0 + off * 10 if ts is None else ts
        recs = []
        for i, (key, value) in enumerate(pairs):
            headers = (Header("n", b"%d" % (off + i)),)
            recs.append(SimpleRecord(key, value, base + i, headers))
            if committed:
                t.records.append(
                    Produced(
                        partition, off + i, key, value, tuple((h.key, h.value) for h in headers), base + i
                    )
                )
        t.next_offset[partition] = off + len(pairs)
        kw = dict(transactional=True, producer_id=pid, producer_epoch=0) if pid is not None else {}
        return build_batch(recs, base_offset=off, **kw)


# ============================================================================ key formats


@dataclass
class Codec:
    """How one format's keys and values are made, and what their decoded columns must be."""

    name: str
    key: Callable[[int], bytes]
    value: Callable[[int, int], bytes]
    expected: Callable[[bytes, bytes], tuple]
    decoded: Callable[[dict], tuple]
    overrides: dict


def raw_codec() -> Codec:
    """Raw sides: keys of bytes that are no text, UTF-8 strings and the empty key."""

    def key(i: int) -> bytes:
        if i == 0:
            return b""
        return f"client-é-{i}".encode() if i % 2 else bytes([0, 255, i, 128, 0])

    return Codec(
        "raw",
        key,
        lambda i, version: b"value %d v%d" % (i, version),
        lambda k, v: (k, v),
        lambda row: (row["key"]["__raw__"], row["val"]["__raw__"]),
        {},
    )


def registry_codec(
    name: str,
    registry_url: str,
    key: Callable[[int], tuple[bytes, tuple]],
    value: Callable[[int, int], tuple[bytes, tuple]],
    key_columns: tuple[str, ...],
    value_columns: tuple[str, ...],
) -> Codec:
    """Keys and values serialized for the registry (``key``/``value`` give the bytes and the
    values their decoded columns must hold, in the order of ``key_columns``/``value_columns``)."""
    made: dict[bytes, tuple] = {}

    def remember(pair: tuple[bytes, tuple]) -> bytes:
        made[pair[0]] = pair[1]
        return pair[0]

    return Codec(
        name,
        lambda i: remember(key(i)),
        lambda i, version: remember(value(i, version)),
        lambda k, v: (made[k], made[v]),
        lambda row: (
            tuple(row["key"][c] for c in key_columns),
            tuple(row["val"][c] for c in value_columns),
        ),
        {"iceberg.registry.url": registry_url},
    )


def protobuf_codec(registry_url: str, topic: str, order_pb2) -> Codec:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    key_ser = ProtobufSerializer(order_pb2.OrderKey, client, PROTO_SER_CONF)
    val_ser = ProtobufSerializer(order_pb2.Order, client, PROTO_SER_CONF)

    def key(i: int) -> tuple[bytes, tuple]:
        msg = order_pb2.OrderKey(id=f"o-{i}", region=i)
        return key_ser(msg, SerializationContext(topic, MessageField.KEY)), (f"o-{i}", i)

    def value(i: int, version: int) -> tuple[bytes, tuple]:
        msg = order_pb2.Order(id=f"o-{i}", priority=version, labels={"v": str(version)})
        data = val_ser(msg, SerializationContext(topic, MessageField.VALUE))
        return data, (f"o-{i}", version, [("v", str(version))])

    return registry_codec(
        "protobuf", registry_url, key, value, ("id", "region"), ("id", "priority", "labels")
    )


AVRO_KEY = {
    "type": "record",
    "name": "CustomerKey",
    "namespace": "crm",
    "fields": [{"name": "id", "type": "string"}, {"name": "region", "type": "int"}],
}
AVRO_VALUE = {
    "type": "record",
    "name": "Customer",
    "namespace": "crm",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "version", "type": "long"},
        {"name": "tier", "type": ["null", "string"], "default": None},
    ],
}


def avro_codec(registry_url: str, topic: str) -> Codec:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry_url})
    key_ser = AvroSerializer(client, json.dumps(AVRO_KEY), conf=AVRO_SER_CONF)
    val_ser = AvroSerializer(client, json.dumps(AVRO_VALUE), conf=AVRO_SER_CONF)

    def key(i: int) -> tuple[bytes, tuple]:
        datum = {"id": f"c-{i}", "region": i}
        return key_ser(datum, SerializationContext(topic, MessageField.KEY)), (f"c-{i}", i)

    def value(i: int, version: int) -> tuple[bytes, tuple]:
        datum = {"name": f"customer {i}", "version": version, "tier": None if version % 2 else "gold"}
        data = val_ser(datum, SerializationContext(topic, MessageField.VALUE))
        return data, tuple(datum.values())

    return registry_codec("avro", registry_url, key, value, ("id", "region"), ("name", "version", "tier"))


def scenario_round_1(t: SyntheticTopic, c: Codec) -> None:
    """Per partition p (keys i with i % 2 == p): every key twice, the first key a third time in
    the same batch; a record without a key; an aborted transaction updating one key and deleting
    another (its marker in the next segment); a tombstone; a committed transaction."""
    pr = Producer(t)
    for p in (0, 1):
        ks = [i for i in range(10) if i % 2 == p]
        first = [(c.key(i), c.value(i, 1)) for i in ks] + [(c.key(ks[0]), c.value(ks[0], 2))]
        t.segment(
            p,
            [
                pr.batch(p, first),
                pr.batch(p, [(c.key(i), c.value(i, 2)) for i in ks[1:]] + [(None, c.value(99, 1))]),
                pr.batch(
                    p, [(c.key(ks[1]), c.value(ks[1], 50)), (c.key(ks[2]), None)], pid=10 + p, committed=False
                ),
            ],
        )
        t.segment(
            p,
            [
                t.marker(p, 10 + p, commit=False),
                pr.batch(p, [(c.key(ks[3]), None)]),
                pr.batch(p, [(c.key(ks[4]), c.value(ks[4], 3))], pid=20 + p),
                t.marker(p, 20 + p, commit=True),
            ],
        )


def scenario_round_2(t: SyntheticTopic, c: Codec) -> None:
    """Per partition: the deleted key re-created, the first key deleted, an update, an aborted
    update newer than it, a key deleted and re-created in one batch; the segment re-uploaded
    under a new id."""
    pr = Producer(t)
    for p in (0, 1):
        ks = [i for i in range(10) if i % 2 == p]
        batches = [
            pr.batch(
                p,
                [(c.key(ks[3]), c.value(ks[3], 4)), (c.key(ks[0]), None), (c.key(ks[1]), c.value(ks[1], 5))],
            ),
            pr.batch(p, [(c.key(ks[1]), c.value(ks[1], 51))], pid=30 + p, committed=False),
            t.marker(p, 30 + p, commit=False),
            pr.batch(p, [(c.key(ks[2]), None), (c.key(ks[2]), c.value(ks[2], 6))]),
        ]
        t.segment(p, batches)
        t.segment(p, batches, track=False)  # the same offsets copied again under a new id


@pytest.mark.parametrize("fmt", ["raw", "protobuf", "avro"])
def test_the_table_holds_the_latest_committed_record_of_every_key(
    spark, tmp_path, fmt, registry_url, order_pb2
):
    t = SyntheticTopic(tmp_path / fmt, f"cs-{fmt}-{uuid.uuid4().hex[:8]}")
    codec = {
        "raw": raw_codec,
        "protobuf": lambda: protobuf_codec(registry_url, t.topic, order_pb2),
        "avro": lambda: avro_codec(registry_url, t.topic),
    }[fmt]()
    scenario_round_1(t, codec)
    first = t.convert(spark, **UPSERT, **codec.overrides)
    assert first.committed and first.mode == "upsert"
    assert first.records == len(t.records)  # aborted records are not read as records
    want = reference(t.records)
    assert first.merged == {"inserted": len(want), "updated": 0, "deleted": 0}
    assert_state(spark, t, codec)
    table = t.table(**UPSERT)
    assert table.name() == ("kafka", t.topic.replace("-", "_") + CURRENT_SUFFIX)
    assert table.properties[current_state.MODE_PROPERTY] == "upsert"
    assert table.spec().is_unpartitioned() and table.format_version == 2

    scenario_round_2(t, codec)
    second = t.convert(spark, **UPSERT, **codec.overrides)
    assert second.committed and second.records == len(t.records) - first.records
    assert_state(spark, t, codec)
    assert second.merged["deleted"] == 2 and second.merged["inserted"] == 2  # ks[0]; ks[3]
    # position deletes: the table's rows are what PyIceberg and Spark read (assert_state)
    assert t.table(**UPSERT).inspect.delete_files().num_rows >= 1

    # the append table of the same topic, beside it: every committed record
    append = t.convert(spark, **codec.overrides)
    assert append.committed and append.records == len(t.records)
    assert len(t.table().scan().to_arrow()) == len(t.records)
    assert_state(spark, t, codec)  # untouched


# ============================================================================ exactly once


def small_topic(tmp_path, name: str = "eo") -> SyntheticTopic:
    t = SyntheticTopic(tmp_path / name, name)
    scenario_round_1(t, raw_codec())
    return t


def test_a_rerun_adds_nothing_and_a_later_round_merges_only_what_is_new(spark, tmp_path):
    t = small_topic(tmp_path)
    assert t.convert(spark, **UPSERT).committed
    snapshot = t.table(**UPSERT).current_snapshot().snapshot_id
    again = t.convert(spark, **UPSERT)
    assert not again.committed and t.table(**UPSERT).current_snapshot().snapshot_id == snapshot
    scenario_round_2(t, raw_codec())
    assert t.convert(spark, **UPSERT).committed
    assert_state(spark, t)
    state = mk.read_state(t.table(**UPSERT))
    assert state.next_offsets == dict(t.next_offset)


@pytest.mark.parametrize("point", ["write", "staged"])
def test_killed_while_reading_or_after_the_merge_is_staged_then_rerun(spark, tmp_path, point):
    """SIGKILL of the CLI's process group (driver, Spark's JVM, its Python workers) while an
    executor reads the last segment, or with the ``MERGE``'s snapshot staged and the commit
    not made: nothing is visible, and the next run gives the reference state."""
    t = small_topic(tmp_path)
    assert t.convert(spark, **UPSERT).committed
    scenario_round_2(t, raw_codec())
    before = table_state(t.table(**UPSERT))
    main = t.table(**UPSERT).current_snapshot().snapshot_id
    pause = tmp_path / "pause"
    proc = t.cli("convert", "--mode", "upsert", "--json", pause_at=point, pause_dir=pause)
    wait_paused(proc, pause, point)
    kill_group(proc)
    table = t.table(**UPSERT)
    assert table.current_snapshot().snapshot_id == main and table_state(table) == before
    if point == "staged":  # the MERGE's snapshot is in the metadata, unreferenced
        assert len(table.metadata.snapshots) == 2
    res = t.convert(spark, **UPSERT)
    assert res.committed
    assert_state(spark, t)
    # the killed run's staged snapshot (and its files) go with the next expiry
    t.maintain(spark, UPSERT, expire=True, expire_older_than=dt.timedelta(0))
    table = t.table(**UPSERT)
    assert [s.snapshot_id for s in table.metadata.snapshots] == [table.current_snapshot().snapshot_id]
    assert_state(spark, t)


def test_two_jobs_racing_merge_once(spark, tmp_path, monkeypatch):
    """One job staged its ``MERGE`` and waits before its commit while a second job plans from
    the same markers and commits: the first one's commit fails and commits nothing."""
    from rsm_sidecar.iceberg.job import ConvertJob, load_config

    t = small_topic(tmp_path)
    pause = tmp_path / "pause"
    monkeypatch.setenv("RSM_ICEBERG_PAUSE_AT", "staged")
    monkeypatch.setenv("RSM_ICEBERG_PAUSE_DIR", str(pause))
    cfg, storage = load_config(t.config_file, {}, UPSERT)
    slow = ConvertJob(cfg, storage, t.topic, spark=spark, log=lambda line: None)
    failure: list[BaseException] = []

    def run_slow():
        try:
            slow.run()
        except BaseException as exc:  # the outcome the test checks
            failure.append(exc)

    thread = threading.Thread(target=run_slow, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while not (pause / "staged.paused").exists():
        assert thread.is_alive() and time.monotonic() < deadline, failure
        time.sleep(0.1)
    monkeypatch.delenv("RSM_ICEBERG_PAUSE_AT")
    fast = t.convert(spark, **UPSERT)
    assert fast.committed
    (pause / "staged.resume").write_text("go")
    thread.join(120)
    assert len(failure) == 1 and isinstance(failure[0], mk.CommitConflict), failure
    table = t.table(**UPSERT)
    assert table.current_snapshot().summary[mk.P_JOB] == fast.job_id
    assert_state(spark, t)


# ============================================================================ several partitions


def test_a_key_in_several_partitions_takes_its_latest_record_by_ingest_time(spark, tmp_path):
    """A key written to several partitions: the later ``ingest_timestamp`` wins (in one round or
    across rounds), a tie goes to the higher partition; the documented limit: a record earlier
    than a tombstone of another partition, converted in a later round, inserts the key again."""
    t = SyntheticTopic(tmp_path / "xp", "xp")
    pr = Producer(t)

    def values() -> dict:
        return {k: v[2]["val"]["__raw__"] for k, v in table_state(t.table(**UPSERT)).items()}

    def ingest(r: Produced) -> int:  # the running maximum along the partition, as the job makes it
        return max(x.timestamp for x in t.records if x.partition == r.partition and x.offset <= r.offset)

    def by_ingest(r: Produced) -> tuple:
        return (ingest(r), r.partition, r.offset)

    # round 1: "a" at 2000 in p0 beats 1000 in p1; "b" at 3000 in both: p1's
    t.segment(0, [pr.batch(0, [(b"a", b"a-p0")], ts=T0 + 2000), pr.batch(0, [(b"b", b"b-p0")], ts=T0 + 3000)])
    t.segment(
        1,
        [
            pr.batch(1, [(b"a", b"a-p1")], ts=T0 + 1000),
            pr.batch(1, [(b"b", b"b-p1")], ts=T0 + 3000),
            pr.batch(1, [(b"d", b"d-p1")], ts=T0 + 3500),
        ],
    )
    assert t.convert(spark, **UPSERT).committed
    assert values() == {b"a": b"a-p0", b"b": b"b-p1", b"d": b"d-p1"}
    # round 2: "a" at 4000 in p1 replaces p0's; "d" at 3200 in p0 does not replace p1's 3500
    # (converted later, received earlier); "c" made and deleted in p0 at 6000
    t.segment(1, [pr.batch(1, [(b"a", b"a-p1-later")], ts=T0 + 4000)])
    t.segment(
        0,
        [
            pr.batch(0, [(b"d", b"d-p0-earlier")], ts=T0 + 3200),
            pr.batch(0, [(b"c", b"c"), (b"c", None)], ts=T0 + 6000),
        ],
    )
    assert t.convert(spark, **UPSERT).committed
    assert values() == {b"a": b"a-p1-later", b"b": b"b-p1", b"d": b"d-p1"}
    want = reference(t.records, order=by_ingest)
    assert values() == {k: r.value for k, r in want.items()}
    # round 3: p1's "c" at 5000 comes after p0's tombstone (6001) was merged: nothing remembers
    # the deleted key, so the earlier record inserts it again (docs/iceberg.md: the limit)
    t.segment(1, [pr.batch(1, [(b"c", b"c-p1-earlier")], ts=T0 + 5000)])
    assert t.convert(spark, **UPSERT).committed
    assert b"c" not in reference(t.records, order=by_ingest)
    assert values() == {b"a": b"a-p1-later", b"b": b"b-p1", b"d": b"d-p1", b"c": b"c-p1-earlier"}


# ============================================================================ follow, maintenance


def test_the_follower_and_maintenance_keep_the_table(spark, tmp_path):
    t = small_topic(tmp_path, "fo")
    with following(spark, t, maintain_interval=0, **UPSERT) as (follower, metrics, lines):
        _wait_for_state(t)
        scenario_round_2(t, raw_codec())
        _wait_for_state(t)
        extra = Producer(t)
        for p in (0, 1):  # one more round: more delete files
            t.segment(p, [extra.batch(p, [(raw_codec().key(i), b"third %d" % i) for i in range(p, 10, 2)])])
        _wait_for_state(t)
    assert any("key(s) inserted" in line for line in lines), lines
    assert sample(metrics, "rsm_iceberg_follow_rounds_total", outcome="committed") >= 3
    name = f"{t.catalog_name}.kafka.fo_current"
    # three rounds, but a read applies one delete file per data file: each merge replaces the
    # delete file of a data file it deletes rows of (file-scoped deletes, Iceberg 1.12)
    per_file = _deletes_per_data_file(spark, name)
    assert len(per_file) >= 2 and set(per_file.values()) == {1}
    # the follower's maintenance (expiry, orphans, compaction) rewrites the small data files
    # and those with deleted rows, without those rows, and drops their delete files
    data_files = t.table(**UPSERT).inspect.data_files().num_rows
    assert data_files >= 3 and follower.maintain()
    table = t.table(**UPSERT)
    assert table.inspect.data_files().num_rows == 1 and table.inspect.delete_files().num_rows == 0
    assert spark.table(f"{name}.position_deletes").count() == 0
    assert_state(spark, t)
    res = t.maintain(spark, UPSERT, compact=True)  # nothing left to rewrite
    assert res.compacted.get("rewritten_data_files_count", 0) == 0
    assert t.convert(spark, **UPSERT).records == 0  # the markers survive the maintenance


def test_compact_deletes_drops_the_delete_files_of_rewritten_data_files(spark, tmp_path):
    """Data files rewritten by someone else's compaction (without ``remove-dangling-deletes``)
    leave their delete files behind; ``maintain --compact-deletes`` removes them."""
    t = small_topic(tmp_path, "dd")
    t.convert(spark, **UPSERT)
    scenario_round_2(t, raw_codec())
    t.convert(spark, **UPSERT)
    assert t.table(**UPSERT).inspect.delete_files().num_rows >= 1
    spark.sql(
        f"CALL {t.catalog_name}.system.rewrite_data_files(table => 'kafka.dd_current', "
        "options => map('rewrite-all', 'true'))"
    ).collect()
    dangling = t.table(**UPSERT).inspect.delete_files().num_rows
    assert dangling >= 1
    res = t.maintain(spark, UPSERT, compact_deletes=True)
    assert t.table(**UPSERT).inspect.delete_files().num_rows == 0, res
    assert_state(spark, t)


def test_retention_removes_the_keys_whose_latest_record_kafka_deleted(spark, tmp_path):
    """``maintain --drop-deleted-offsets`` on a current-state table: a key whose latest record
    is below the earliest offset remote storage still has leaves the table, as it left the
    topic; the other keys stay."""
    t = small_topic(tmp_path, "ret")
    t.convert(spark, **UPSERT)
    first = next(md for md in t.segments if md.partition == 0)
    for path in t.objects_of(first):  # retention deletes partition 0's oldest segment
        path.unlink()
    earliest = first.end_offset + 1
    gone = {k for k, r in reference(t.records).items() if r.partition == 0 and r.offset < earliest}
    assert gone and len(gone) < len(reference(t.records))
    res = t.maintain(spark, UPSERT, drop_deleted_offsets=True)
    assert res.dropped == {0: len(gone), 1: 0}
    want = {k: (r.partition, r.offset) for k, r in reference(t.records).items() if k not in gone}
    assert {k: v[:2] for k, v in table_state(t.table(**UPSERT)).items()} == want


def _deletes_per_data_file(spark, name: str) -> dict[str, int]:
    """Per data file with deleted rows: how many position-delete files a read must apply."""
    rows = spark.sql(
        f"SELECT file_path, count(DISTINCT delete_file_path) AS n FROM {name}.position_deletes GROUP BY 1"
    ).collect()
    return {r.file_path: r.n for r in rows}


def _wait_for_state(t: SyntheticTopic, timeout: float = 240.0) -> None:
    want = {k: (r.partition, r.offset) for k, r in reference(t.records).items()}
    deadline = time.monotonic() + timeout
    got: dict = {}
    while time.monotonic() < deadline:
        try:
            got = {k: v[:2] for k, v in table_state(t.table(**UPSERT)).items()}
        except Exception:  # the table does not exist yet
            got = {}
        if got == want:
            return
        time.sleep(0.3)
    raise AssertionError(f"the table has {len(got)} of {len(want)} keys after {timeout:.0f}s")


# ============================================================================ the two modes


def test_each_mode_refuses_the_other_modes_table(spark, tmp_path):
    t = small_topic(tmp_path, "mix")
    assert t.convert(spark).committed  # the append table, kafka.mix
    with pytest.raises(ConfigError, match=r"kafka\.mix is an append table .* iceberg\.mode = 'upsert'"):
        t.convert(spark, **UPSERT, **{"iceberg.table": "mix"})
    assert t.convert(spark, **UPSERT).committed  # kafka.mix_current
    with pytest.raises(ConfigError, match=r"mix_current is a current-state table .* iceberg\.table"):
        t.convert(spark, **{"iceberg.table": "mix_current"})


def test_check_mode_and_names():
    settings = JobSettings()
    assert settings.table_name("orders.v1") == "orders_v1"
    assert JobSettings(mode="upsert").table_name("orders.v1") == "orders_v1_current"
    assert JobSettings(mode="upsert", table="o").table_name("orders") == "o"
    current_state.check_mode({}, "append", "kafka.t")  # tables made before the mode existed
    current_state.check_mode({"rsm.mode": "upsert"}, "upsert", "kafka.t")
    with pytest.raises(ConfigError, match="kafka.t is an append table"):
        current_state.check_mode({}, "upsert", "kafka.t")
    assert current_state.merge_counts(
        {"spark.merge-into.num-target-rows-inserted": "3", "spark.merge-into.num-target-rows-deleted": "1"}
    ) == {"inserted": 3, "updated": 0, "deleted": 1}
