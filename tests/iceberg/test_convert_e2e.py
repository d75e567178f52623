"""End to end on the real stack: a Kafka broker tiering through the shim and the sidecar
(local-directory storage, encrypted, compressed), Apicurio as the schema registry, confluent-kafka
serializers (TopicNameStrategy), real local Spark. Records are produced, tiered until they are
gone from the broker's disk, converted straight from object storage, and read back with PyIceberg
and Spark SQL."""

from __future__ import annotations

import datetime as dt
import math
import random
import shutil
import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyiceberg.exceptions import NoSuchTableError

from devstack.common import free_port
from rsm_sidecar.format.manifest import SegmentManifest
from rsm_sidecar.iceberg.committing import markers as mk
from rsm_sidecar.iceberg.decoding import framing
from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema
from rsm_sidecar.iceberg.decoding.schema_registry import RegistryUnavailable
from rsm_sidecar.iceberg.job import convert, load_config
from rsm_sidecar.iceberg.mapping.evolution import field_ids
from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
from rsm_sidecar.iceberg.settings import JobSettings
from rsm_sidecar.iceberg.source import read_topic
from tests.e2e.kafka_helpers import (
    Rec,
    consume,
    create_topic,
    filler,
    produce,
    remote_segments,
    sealed_manifest,
    wait_all_closed_tiered,
    wait_tiered,
)
from tests.helpers import BROKER_JVM_OPTIONS
from tests.iceberg.test_registry import proto_ser
from tests.tiered_writer import new_uuid

pytestmark = pytest.mark.e2e

UTC = dt.UTC
# recent: the topics' retention.ms (1 day) would delete older segments from remote storage
T0 = int(time.time() * 1000) - 3_600_000


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from devstack.stack import LocalStack

    st = LocalStack(
        tmp_path_factory.mktemp("stack"), storage="local", broker_jvm_options=BROKER_JVM_OPTIONS
    ).start()
    yield st
    st.stop()


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    return {
        "iceberg.catalog.local.root": str(tmp_path_factory.mktemp("lake")),
        "iceberg.catalog.name": f"e2e{uuid.uuid4().hex[:6]}",
    }


def run(stack, spark, lake, topic, log=lambda line: None, **overrides):
    cfg_file, env = stack.sidecar_config_env()
    return convert(cfg_file, topic, environ=env, overrides={**lake, **overrides}, spark=spark, log=log)


def table(stack, lake, topic, **overrides):
    cfg_file, env = stack.sidecar_config_env()
    cfg, _ = load_config(cfg_file, env, {**lake, **overrides})
    s = JobSettings.from_config(cfg)
    return CatalogSpec(s.catalog).pyiceberg().load_table((s.namespace, s.table_name(topic)))


def by_offset(t) -> dict[int, dict]:
    return {r["kafka"]["offset"]: r for r in t.scan().to_arrow().to_pylist()}


def ms(ts: dt.datetime | None) -> int | None:
    return None if ts is None else round(ts.timestamp() * 1000)


def _produce_txn(bootstrap, topic, values, commit: bool, key: bytes) -> list[int]:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}-{commit}", "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    offsets: dict[int, int] = {}
    for i, v in enumerate(values):
        p.produce(
            topic,
            key=key,
            value=v,
            timestamp=T0 + 5_000 + i,
            on_delivery=lambda e, m, i=i: e is None and offsets.__setitem__(i, m.offset()),
        )
    p.flush(30)  # on disk before the outcome, so the aborted data really is in the log
    (p.commit_transaction if commit else p.abort_transaction)(30)
    p.flush(30)
    return [offsets[i] for i in range(len(values))]


@pytest.fixture(scope="module")
def topics(stack, apicurio, registry_url, order_pb2):
    """Protobuf, Avro, raw (LogAppendTime) and bad-input topics, all tiered."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    bs = stack.bootstrap_servers
    client = SchemaRegistryClient({"url": registry_url})
    sfx = uuid.uuid4().hex[:6]
    out = {}

    # --- Protobuf keys and values (Confluent framing), headers, tombstones, transactions
    proto = f"proto-{sfx}"
    create_topic(bs, proto)
    vser = proto_ser(order_pb2.Order, client, proto)
    kser = proto_ser(order_pb2.OrderKey, client, proto, is_key=True)
    orders, recs = {}, []
    for i in range(40):
        o = order_pb2.Order(
            id=f"o-{i}",
            status=order_pb2.PLACED if i % 2 else order_pb2.SHIPPED,
            card=f"card-{i}",
            big=i,
            gift=bool(i % 3),
        )
        o.total.currency, o.total.units = "EUR", 100 + i
        o.placed_at.FromDatetime(dt.datetime(2025, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=i))
        value = None if i % 10 == 9 else vser(o)  # tombstones
        recs.append(
            Rec(
                kser(order_pb2.OrderKey(id=f"o-{i}", region=i % 4)),
                value,
                (("trace", b"t-%d" % i),) if i % 2 else (),
                T0 + i * 10,
            )
        )
        orders[i] = o
    recs = produce(bs, proto, recs)
    # an aborted transaction, then a committed one: their offsets under "aborted" and "committed"
    txns = {
        outcome: _produce_txn(
            bs,
            proto,
            [vser(order_pb2.Order(id=f"{outcome}-{i}")) for i in range(5)],
            outcome == "committed",
            kser(order_pb2.OrderKey(id="tx")),
        )
        for outcome in ("aborted", "committed")
    }
    out["proto"] = dict(topic=proto, recs=recs, orders=orders, **txns)

    # --- Avro values, raw string keys
    avro = f"avro-{sfx}"
    create_topic(bs, avro)
    schema = (
        '{"type":"record","name":"Payment","namespace":"pay","fields":['
        '{"name":"id","type":"string"},{"name":"amount","type":"double"},'
        '{"name":"memo","type":["null","string"],"default":null}]}'
    )
    aser = AvroSerializer(client, schema, conf={"subject.name.strategy.type": "TOPIC"})
    payments = [{"id": f"p-{i}", "amount": i * 1.5, "memo": None if i % 2 else f"m{i}"} for i in range(30)]
    arecs = [
        Rec(
            b"acct-%d" % (i % 5),
            aser(p, SerializationContext(avro, MessageField.VALUE)),
            (("src", b"web"),),
            T0 + i,
        )
        for i, p in enumerate(payments)
    ]
    arecs = produce(bs, avro, arecs)
    # the registered schema's preamble, then bytes that are not a Payment (a string length
    # beyond the end)
    (bad_avro,) = produce(bs, avro, [Rec(b"acct-x", arecs[0].value[:5] + b"\x7f", (), T0 + 40)])
    out["avro"] = dict(topic=avro, recs=arecs, payments=payments, bad=bad_avro)

    # --- raw bytes, LogAppendTime
    raw = f"raw-{sfx}"
    create_topic(bs, raw, message_timestamp_type="LogAppendTime")
    rng = random.Random(3)
    rrecs = [
        Rec(
            None if i % 4 == 0 else b"k%d" % i,
            None if i % 7 == 6 else rng.randbytes(rng.randrange(0, 300)),
            (("a", b"1"), ("null", None)) if i % 3 == 0 else (),
            T0 - 86_400_000 + i,
        )
        for i in range(50)
    ]
    out["raw"] = dict(topic=raw, recs=produce(bs, raw, rrecs))

    # --- bad input for a Protobuf value table
    bad = f"bad-{sfx}"
    create_topic(bs, bad)
    bser = proto_ser(order_pb2.Order, client, bad)
    good = bser(order_pb2.Order(id="fine"))
    brecs = [
        Rec(b"good", good, (), T0),
        Rec(b"unknown-id", framing.encode_preamble(987_654, [1]) + good[7:], (), T0 + 1),
        Rec(b"bad-protobuf", good[:7] + b"\x0a\xff\xff\xff\xff\x0f", (), T0 + 2),
        Rec(b"no-magic", b"plain text, not framed", (), T0 + 3),
    ]
    out["bad"] = dict(topic=bad, recs=produce(bs, bad, brecs))

    ends = {}
    for name, t in out.items():
        ends[name] = filler(bs, t["topic"])
    for t in out.values():
        # the tests convert more than once and compare: no segment may arrive in between
        wait_all_closed_tiered(stack, t["topic"])
    return out


def test_protobuf_topic_round_trip_transactions_tombstones(stack, spark, lake, topics, registry_url):
    info = topics["proto"]
    topic = info["topic"]
    res = run(
        stack,
        spark,
        lake,
        topic,
        **{"iceberg.registry.url": registry_url, "iceberg.key.message": "shop.v1.OrderKey"},
    )
    assert res.committed and res.schema_changes == "created"
    t = table(stack, lake, topic)
    # the value subject defines three top-level messages: the one the records are framed with
    # is remembered by the table, so later runs do not have to find one again
    assert (t.properties["rsm.value.message"], t.properties["rsm.key.message"]) == (
        "shop.v1.Order",
        "shop.v1.OrderKey",
    )
    got = by_offset(t)
    for r in info["recs"]:
        row = got.pop(r.offset)
        o = info["orders"][int(row["key"]["id"].split("-")[1])]
        assert row["key"]["__raw__"] == r.key and row["key"]["region"] == int(row["key"]["id"][2:]) % 4
        assert [(h["key"], h["value"]) for h in row["headers"]] == list(r.headers)
        assert ms(row["kafka"]["event_timestamp"]) == r.timestamp
        assert row["kafka"]["partition"] == 0
        if r.value is None:
            assert row["val"] is None  # tombstone
            continue
        val = row["val"]
        assert val["__raw__"] is None and val["__err__"] is None and val["__prefix__"] == r.value[:7]
        assert (val["id"], val["status"], val["card"], val["big"], val["gift"]) == (
            o.id,
            "SHIPPED" if o.status == 2 else "PLACED",
            o.card,
            o.big,
            o.gift,
        )
        assert (val["total"]["currency"], val["total"]["units"]) == ("EUR", o.total.units)
        assert val["placed_at"] == o.placed_at.ToDatetime(tzinfo=UTC)
    assert not set(info["aborted"]) & set(got)  # aborted transaction: absent
    assert [got.pop(o)["val"]["id"] for o in info["committed"]] == [f"committed-{i}" for i in range(5)]
    # what is left is the filler (random bytes: not framed -> record-level errors)
    assert got and all(r["val"]["__err__"] and r["val"]["__raw__"] for r in got.values())
    # ingest_timestamp: the running maximum of the record times, in offset order
    rows = sorted(by_offset(t).values(), key=lambda r: r["kafka"]["offset"])
    ingest = [ms(r["kafka"]["ingest_timestamp"]) for r in rows]
    assert ingest == sorted(ingest)
    assert all(i >= ms(r["kafka"]["event_timestamp"]) for i, r in zip(ingest, rows))
    # Spark SQL sees the same rows
    n = lake["iceberg.catalog.name"]
    sql = spark.sql(
        f"SELECT kafka.offset AS o, key.id AS k, val.id AS v, size(headers) AS h "
        f"FROM {n}.kafka.{t.name()[-1]} WHERE val.__err__ IS NULL ORDER BY kafka.offset"
    ).collect()
    expected = sorted(
        (r["kafka"]["offset"], r["key"]["id"], r["val"]["id"] if r["val"] else None, len(r["headers"]))
        for r in rows
        if not (r["val"] and r["val"]["__err__"])
    )
    assert [(x.o, x.k, x.v, x.h) for x in sql] == expected
    # the rsm-tiered data source reads the same rows from the broker's tiered segments, decoded
    # through the registry in Spark's Python workers, without the table
    cfg_file, env = stack.sidecar_config_env()
    options = {
        "iceberg.registry.url": registry_url,
        "iceberg.key.message": "shop.v1.OrderKey",
        **{  # the sidecar's storage and keys, given as options (the workers have no RSM__ env)
            k[len("RSM__") :].lower().replace("__", "."): v
            for k, v in env.items()
            if k.startswith(("RSM__STORAGE__", "RSM__ENCRYPTION__"))
        },
    }
    tiered = read_topic(spark, topic, cfg_file, **options).where("kafka.offset >= 0")
    table_rows = spark.table(f"{n}.kafka.{t.name()[-1]}")
    assert sorted(map(repr, tiered.collect())) == sorted(map(repr, table_rows.collect()))
    # a re-run adds nothing
    assert (
        run(
            stack,
            spark,
            lake,
            topic,
            **{"iceberg.registry.url": registry_url, "iceberg.key.message": "shop.v1.OrderKey"},
        ).records
        == 0
    )


@pytest.fixture(scope="module")
def avro_run(stack, spark, lake, topics, registry_url):
    """The Avro topic converted once, after a first attempt with the registry down."""
    topic = topics["avro"]["topic"]
    with pytest.raises(RegistryUnavailable) as down:  # nothing listens there
        run(stack, spark, lake, topic, **{"iceberg.registry.url": "http://127.0.0.1:9/apis/ccompat/v7"})
    with pytest.raises(NoSuchTableError):
        table(stack, lake, topic)  # not even created, nothing committed
    res = run(stack, spark, lake, topic, **{"iceberg.registry.url": registry_url})
    return down.value, res, by_offset(table(stack, lake, topic))


def test_registry_down_fails_clearly_commits_nothing_and_succeeds_on_rerun(avro_run):
    err, res, got = avro_run
    assert "schema registry at http://127.0.0.1:9/apis/ccompat/v7 is unreachable" in str(err)
    assert "subject" in str(err)
    assert res.committed and res.records == len(got)


def test_avro_values_and_raw_keys(avro_run, topics):
    info = topics["avro"]
    _, res, got = avro_run
    for r, p in zip(info["recs"], info["payments"]):
        row = got[r.offset]
        assert row["key"] == {"__raw__": r.key, "__prefix__": None, "__err__": None}  # no key schema
        assert {k: row["val"][k] for k in ("id", "amount", "memo")} == p
        assert row["val"]["__prefix__"] == r.value[:5] and row["val"]["__raw__"] is None
        assert row["headers"] == [{"key": "src", "value": b"web"}]


def test_raw_log_append_time_topic_and_reuploaded_segments(stack, spark, lake, topics):
    info = topics["raw"]
    topic = info["topic"]
    res = run(stack, spark, lake, topic)
    assert res.committed
    t = table(stack, lake, topic)
    got = by_offset(t)
    seen = {r.offset: r for r in consume(stack.bootstrap_servers, topic, 0, len(info["recs"]))}
    for r in info["recs"]:
        row = got[r.offset]
        assert row["key"]["__raw__"] if r.key is not None else row["key"] is None
        assert (row["key"] or {}).get("__raw__") == r.key
        assert (row["val"] or {}).get("__raw__") == r.value
        assert row["val"] is None if r.value is None else row["val"]["__raw__"] == r.value
        assert [(h["key"], h["value"]) for h in row["headers"]] == list(r.headers)
        # LogAppendTime: event = the producer's time, ingest = the append time consumers see
        assert ms(row["kafka"]["event_timestamp"]) == r.timestamp
        assert ms(row["kafka"]["ingest_timestamp"]) == seen[r.offset].timestamp != r.timestamp
    # the broker re-uploads a segment under a new segment id (failed copy, leader change):
    store_root = stack.remote_root
    base = sorted(b for b, s in remote_segments(stack.object_store(), topic).items())[0]
    new_id = new_uuid()
    new_base = base[:-22] + new_id
    for suffix in ("log", "indexes"):
        shutil.copyfile(store_root / f"{base}.{suffix}", store_root / f"{new_base}.{suffix}")
    # the same bytes under a new id, with the manifest the sidecar writes for that id
    manifest = SegmentManifest.from_bytes((store_root / f"{base}.rsm-manifest").read_bytes())
    manifest.segment["remoteLogSegmentId"]["id"] = new_id
    (store_root / f"{new_base}.rsm-manifest").write_bytes(sealed_manifest(stack, manifest))
    assert run(stack, spark, lake, topic).records == 0
    fresh = run(stack, spark, lake, topic, **{"iceberg.table": "raw_fresh"})
    assert fresh.records == res.records
    again = by_offset(table(stack, lake, topic, **{"iceberg.table": "raw_fresh"}))
    assert sorted(again) == sorted(got) and len(again) == fresh.records


@pytest.fixture(scope="module")
def bad_rows(stack, spark, lake, topics, registry_url):
    info = topics["bad"]
    res = run(
        stack,
        spark,
        lake,
        info["topic"],
        **{"iceberg.registry.url": registry_url, "iceberg.value.message": "shop.v1.Order"},
    )
    assert res.committed  # record-level problems do not fail the job
    got = by_offset(table(stack, lake, info["topic"]))
    good = got[info["recs"][0].offset]["val"]
    assert good["id"] == "fine" and good["__err__"] is None and good["__raw__"] is None
    return {r.key.decode(): (r.value, got[r.offset]["val"]) for r in info["recs"]}


def _is_error_row(val, raw: bytes) -> None:
    assert val["__raw__"] == raw and val["__err__"]
    assert val["id"] is None and val["total"] is None and val["status"] is None


def test_bad_input_unknown_schema_id(bad_rows):
    raw, val = bad_rows["unknown-id"]
    _is_error_row(val, raw)
    assert val["__err__"] == "unknown schema id 987654" and val["__prefix__"] == raw[:7]


def test_bad_input_bytes_that_are_not_protobuf_or_avro(bad_rows, avro_run, topics):
    raw, val = bad_rows["bad-protobuf"]
    _is_error_row(val, raw)
    assert val["__err__"].startswith("invalid Protobuf for shop.v1.Order")
    bad = topics["avro"]["bad"]
    val = avro_run[2][bad.offset]["val"]
    assert val["__raw__"] == bad.value and val["__err__"].startswith("invalid Avro for schema id")
    assert val["id"] is None and val["amount"] is None


def test_bad_input_missing_magic_byte(bad_rows):
    raw, val = bad_rows["no-magic"]
    _is_error_row(val, raw)
    assert val["__err__"] == "missing magic byte: first byte is 0x70, expected 0x00"
    assert val["__prefix__"] is None


EVO_V1 = """syntax = "proto3";
package evo;
message Item { string id = 1; int32 qty = 2; string note = 3; int32 code = 4; }
"""
EVO_V2 = """syntax = "proto3";
package evo;
message Item { string id = 1; int64 qty = 2; string code = 4; string email = 5; }
"""


def _item_cls(text):
    s = ProtoSchema.from_sources("item.proto", {"item.proto": text})
    return ProtoSchema.message_class(s.message_by_name("evo.Item"))


def test_schema_evolution_across_two_runs_keeps_field_ids(stack, spark, lake, apicurio, registry_url):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    bs = stack.bootstrap_servers
    topic = f"evo-{uuid.uuid4().hex[:6]}"
    create_topic(bs, topic)
    V1, V2 = _item_cls(EVO_V1), _item_cls(EVO_V2)
    ser1 = proto_ser(V1, client, topic)
    r1 = produce(
        bs,
        topic,
        [Rec(b"a", ser1(V1(id=f"i{i}", qty=i, note="n", code=7 * i)), (), T0 + i) for i in range(10)],
    )
    filler(bs, topic)
    wait_tiered(stack, topic, r1[-1].offset + 1)
    ov = {"iceberg.registry.url": registry_url}
    assert run(stack, spark, lake, topic, **ov).schema_changes == "created"
    ids1 = field_ids(table(stack, lake, topic).schema())

    client.set_compatibility(f"{topic}-value", "NONE")
    client.register_schema(f"{topic}-value", Schema(EVO_V2, "PROTOBUF"))
    ser2 = proto_ser(V2, client, topic)
    r2 = produce(
        bs,
        topic,
        [
            Rec(b"b", ser2(V2(id=f"j{i}", qty=2**40 + i, code=f"c{i}", email=f"{i}@x")), (), T0 + 100 + i)
            for i in range(10)
        ],
    )
    filler(bs, topic)
    wait_tiered(stack, topic, r2[-1].offset + 1)
    res = run(stack, spark, lake, topic, **ov)
    assert set(res.schema_changes.split("; ")) == {
        "promote val.qty to long",
        "retire val.code as code__v1 (new code: string)",
        "add val.email: string",
    }
    t = table(stack, lake, topic)
    ids2 = field_ids(t.schema())
    for kept in ("val.id", "val.qty", "val.note", "kafka.offset", "key.__raw__"):
        assert ids2[kept] == ids1[kept]
    assert ids2["val.code__v1"] == ids1["val.code"]
    assert ids2["val.code"] > max(ids1.values()) and ids2["val.email"] > max(ids1.values())
    got = by_offset(t)
    for r in r1:
        v = got[r.offset]["val"]
        i = int(v["id"][1:])
        assert (v["qty"], v["note"], v["code__v1"], v["code"], v["email"]) == (i, "n", 7 * i, None, None)
    for r in r2:
        v = got[r.offset]["val"]
        i = int(v["id"][1:])
        assert (v["qty"], v["note"], v["code__v1"], v["code"], v["email"]) == (
            2**40 + i,
            None,
            None,
            f"c{i}",
            f"{i}@x",
        )
    assert mk.read_state(t).next_offsets[0] > r2[-1].offset


def test_split_segments_give_the_same_ingest_timestamps_as_whole_ones(stack, spark, lake):
    """The broker's own offset and time indexes: 1 MiB segments of records with out-of-order
    timestamps converted with
    ``iceberg.task_bytes`` = 64 KiB and with 0 into two tables: the same rows and
    ``ingest_timestamp``s (each split task also checks the maximum it reaches against the one
    the time index gave the next task), with many more tasks than segments."""
    bs = stack.bootstrap_servers
    topic = f"split-{uuid.uuid4().hex[:6]}"
    create_topic(bs, topic)
    rng = random.Random(14)
    # all in the past: a timestamp ahead of the clock would keep its segment on the broker's
    # disk (local.retention.ms counts from the largest timestamp) until that time
    recs = []
    for i in range(900):
        ts = T0 + i * 1_000 - rng.randrange(0, 300_000)
        recs.append(Rec(b"k%d" % (i % 17), rng.randbytes(rng.randrange(500, 3_000)), (), ts))
    # small batches: many appends, so the broker writes offset- and time-index entries
    recs = produce(bs, topic, recs, **{"batch.size": 8192, "linger.ms": 0})
    filler(bs, topic)
    wait_all_closed_tiered(stack, topic)
    whole = run(stack, spark, lake, topic, **{"iceberg.task_bytes": 0, "iceberg.table": f"{topic}_whole"})
    lines: list[str] = []
    split = run(
        stack,
        spark,
        lake,
        topic,
        log=lines.append,
        **{"iceberg.task_bytes": 64 * 1024, "iceberg.table": f"{topic}_split"},
    )
    assert not [line for line in lines if "not split" in line]
    assert whole.committed and split.committed and whole.records == split.records
    assert whole.tasks == whole.segments >= 2 and split.tasks >= 4 * split.segments

    def ingest(name):
        kafka = table(stack, lake, topic, **{"iceberg.table": name}).scan(selected_fields=("kafka",))
        return sorted(
            (k["offset"], ms(k["ingest_timestamp"]), ms(k["event_timestamp"]))
            for k in kafka.to_arrow().column("kafka").to_pylist()
        )

    got = ingest(f"{topic}_split")
    assert got == ingest(f"{topic}_whole")
    assert len({o for o, _, _ in got}) == len(got) == split.records
    # the running maximum of the produced timestamps
    assert [o for o, _, _ in got[: len(recs)]] == [r.offset for r in recs] == list(range(len(recs)))
    state = -1
    for r in recs:
        state = max(state, r.timestamp)
        assert got[r.offset][1:] == (state, r.timestamp)


def test_copy_lag_is_read_from_the_broker_reported_and_warned_once(stack, lake, tmp_path, capsys):
    """KIP-1241 on the real broker (Kafka 4.4): a topic that delays uploads is reported by
    ``iceberg status --bootstrap-server`` and exported by the follower, which warns once; a topic
    that does not, is reported as such."""
    import json

    from rsm_sidecar.cli.main import main
    from rsm_sidecar.iceberg.follow import Follower, FollowMetrics

    bs = stack.bootstrap_servers
    lagged, prompt = f"lagged-{uuid.uuid4().hex[:6]}", f"prompt-{uuid.uuid4().hex[:6]}"
    create_topic(
        bs,
        lagged,
        local_retention_ms=300_000,
        remote_copy_lag_ms=60_000,
        remote_copy_lag_bytes=1 << 20,
    )
    create_topic(bs, prompt)
    cfg_file, env = stack.sidecar_config_env()
    args = ["--config", str(cfg_file), "--catalog-root", lake["iceberg.catalog.local.root"]]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        assert main(["iceberg", "status", *args, "--topic", lagged, "--bootstrap-server", bs]) == 0
        status = json.loads(capsys.readouterr().out)
        assert main(["iceberg", "status", *args, "--topic", prompt, "--bootstrap-server", bs]) == 0
        prompt_status = json.loads(capsys.readouterr().out)
    assert status["exists"] is False
    lag = status["copy_lag"]
    assert (lag["remote.copy.lag.ms"], lag["remote.copy.lag.bytes"]) == (60_000, 1 << 20)
    assert (lag["time_threshold_ms"], lag["size_threshold_bytes"], lag["delays_uploads"]) == (
        60_000,
        1 << 20,
        True,
    )
    assert "newest record is 60 s old or 1,048,576 bytes" in lag["summary"]
    assert prompt_status["copy_lag"]["remote.copy.lag.ms"] == 0
    assert prompt_status["copy_lag"]["delays_uploads"] is False
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        assert main(["iceberg", "status", *args, "--topic", "no-such-topic", "--bootstrap-server", bs]) == 0
        missing = json.loads(capsys.readouterr().out)["copy_lag"]
    assert missing["kind"] == "UNKNOWN_TOPIC_OR_PART", missing
    assert missing["error"].startswith("UNKNOWN_TOPIC_OR_PART: "), missing

    overrides = {**lake, "iceberg.kafka.bootstrap_servers": bs}
    cfg, storage = load_config(cfg_file, env, overrides)
    metrics, lines = FollowMetrics(), []
    follower = Follower(cfg, storage, lagged, metrics=metrics, log=lines.append)
    for _ in range(3):  # at start and at every maintenance: one warning per setting
        assert follower.check_copy_lag().delays_uploads
    assert [line for line in lines if "remote.copy.lag.ms" in line] == [f"[follow] WARNING: {lag['summary']}"]
    sample = metrics.registry.get_sample_value
    assert (sample("rsm_iceberg_follow_copy_lag_seconds"), sample("rsm_iceberg_follow_copy_lag_bytes")) == (
        60.0,
        float(1 << 20),
    )
    quiet = Follower(cfg, storage, prompt, metrics=FollowMetrics(), log=lines.append)
    assert not quiet.check_copy_lag().delays_uploads
    assert quiet.metrics.registry.get_sample_value("rsm_iceberg_follow_copy_lag_seconds") == 0.0
    # a broker that does not answer: said once, NaN exported, the follower goes on
    down = {
        **overrides,
        "iceberg.kafka.bootstrap_servers": f"127.0.0.1:{free_port()}",
        "iceberg.kafka.timeout": 2,
    }
    cfg_down, _ = load_config(cfg_file, env, down)
    unknown = Follower(cfg_down, storage, lagged, metrics=FollowMetrics(), log=lines.append)
    assert unknown.check_copy_lag() is None and unknown.check_copy_lag() is None
    said = [line for line in lines if "cannot read the topic's copy lag" in line]
    assert len(said) == 1, said  # however each wait ended (request timeout or ours), one kind
    assert "_TIMED_OUT: no answer from the broker within 2 s" in said[0], said
    assert math.isnan(unknown.metrics.registry.get_sample_value("rsm_iceberg_follow_copy_lag_seconds"))
