"""`inspect orphans --bootstrap-server`: the bucket against Kafka's `__remote_log_metadata`, on a
real broker, with the crash of issue 31 reproduced deterministically.

The sidecar holds one copy after it stored the whole segment (a fault,
``RSM_TEST_HOLD_COPY_DIR`` of tests/e2e/fault_sidecar.py: no real server can be made to die at
that instant), the broker is killed with -9 while it waits for the answer, so it never
records COPY_SEGMENT_FINISHED; restarted, it copies the same offsets again under a new segment
id. The cross-check must find exactly that segment, say which copy holds its offsets, and never
delete it (Kafka still lists it); it must also find a complete segment Kafka has no record of
(and delete it when asked) and a finished segment storage lost. Every record of the metadata
topic is decoded by our reader and by Kafka's own serde (its console formatter) and compared.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from devstack.kafka_tools import tool_command
from devstack.stack import LocalStack
from rsm_sidecar.config import Config
from rsm_sidecar.format.keys import KeyLayout
from rsm_sidecar.kafka import remote_log_metadata as rlm
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
from rsm_sidecar.transform.keyring import Keyring
from tests.e2e.fault_sidecar import FAULT_SIDECAR, HOLD_COPY_DIR
from tests.e2e.kafka_helpers import KEY_PREFIX, create_topic, filler, remote_segments, wait_for
from tests.helpers import BROKER_JVM_OPTIONS
from tests.inspect.conftest import InspectCli
from tests.tiered_writer import TieredWriter

TOPIC = "crash"
MANIFEST = "rsm-manifest"
FORMATTER = (
    "org.apache.kafka.server.log.remote.metadata.storage.serialization."
    "RemoteLogMetadataSerde$RemoteLogMetadataFormatter"
)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """A stack whose broker was killed during the first copy of ``crash``-0 and restarted."""
    work = tmp_path_factory.mktemp("orphans-kafka")
    hold = work / "hold"
    hold.mkdir()
    (hold / "hold").write_text("")
    stack = LocalStack(
        work / "stack",
        sidecar_env={HOLD_COPY_DIR: str(hold)},
        sidecar_prefix=FAULT_SIDECAR,
        broker_jvm_options=BROKER_JVM_OPTIONS,
    )
    stack.start()
    try:
        bs = stack.bootstrap_servers
        create_topic(bs, TOPIC, retention_ms=-1)  # unlimited retention: nothing else removes it
        filler(bs, TOPIC)  # two segments rolled
        held = wait_for("a copy held after its upload", lambda: list(hold.glob("held-*")), 120)[0]
        segment_id = held.name.removeprefix("held-")
        store = stack.object_store()
        (base,) = [b for b in remote_segments(store, TOPIC) if b.endswith(segment_id)]
        assert store.exists(f"{base}.{MANIFEST}")  # complete in storage, the broker not answered
        stack.broker.kill()  # -9: COPY_SEGMENT_FINISHED is never written
        stack.broker.start()
        recopies = wait_for(
            "the same offsets copied again under a new id",
            lambda: [
                b
                for b, s in remote_segments(store, TOPIC).items()
                if s["start_offset"] == 0 and b != base and MANIFEST in s["suffixes"]
            ],
        )
        yield stack, store, base, segment_id, recopies[0]
    finally:
        stack.stop()


def metadata_records_by_kafka(stack, count: int) -> list[tuple[int, int, str]]:
    """(partition, offset, value) of the ``count`` records of `__remote_log_metadata`, as Kafka's
    own serde prints them (``RemoteLogMetadataSerde$RemoteLogMetadataFormatter``)."""
    args = ["--bootstrap-server", stack.bootstrap_servers, "--topic", "__remote_log_metadata"]
    args += ["--from-beginning", "--formatter", FORMATTER, "--max-messages", str(count)]
    args += ["--timeout-ms", "60000"]
    out = subprocess.run(
        tool_command(stack.broker.dist, "kafka-console-consumer", args),
        capture_output=True,
        text=True,
        timeout=180,
    )
    rows = re.findall(r"^partition: (\d+), offset: (\d+), value: (.*)$", out.stdout, re.M)
    assert len(rows) == count, out.stderr[-2000:]
    return [(int(p), int(o), v) for p, o, v in rows]


def our_records(stack) -> dict[tuple[int, int], rlm.SegmentRecord | rlm.PartitionDeleteRecord]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "t", "enable.auto.commit": False})
    try:
        md = c.list_topics("__remote_log_metadata", timeout=30).topics["__remote_log_metadata"]
        out = {}
        for p in md.partitions:
            low, high = c.get_watermark_offsets(TopicPartition("__remote_log_metadata", p), timeout=30)
            if high == low:
                continue
            c.assign([TopicPartition("__remote_log_metadata", p, low)])
            while True:
                m = c.poll(5)
                assert m is not None and not m.error(), m and m.error()
                out[(p, m.offset())] = rlm.decode(m.value())
                if m.offset() + 1 >= high:
                    break
        return out
    finally:
        c.close()


def test_our_reader_decodes_every_record_as_kafkas_serde(crashed):
    stack, _, _, segment_id, _ = crashed
    ours = our_records(stack)
    theirs = metadata_records_by_kafka(stack, len(ours))
    assert {(p, o) for p, o, _ in theirs} == set(ours)
    for p, o, text in theirs:
        r = ours[(p, o)]
        assert isinstance(r, rlm.SegmentRecord), text
        assert f"id={r.segment_id}" in text and f"state={r.state}" in text, (r, text)
        assert f"{r.topic_id}:{r.topic}-{r.partition}" in text, (r, text)
        assert f"brokerId={r.broker_id}" in text and f"eventTimestampMs={r.event_timestamp_ms}" in text
        if not r.update:
            assert f"startOffset={r.start_offset}, endOffset={r.end_offset}" in text, (r, text)
            assert f"segmentSizeInBytes={r.segment_size}" in text, (r, text)
            assert "segmentLeaderEpochs={" + ", ".join(f"{e}={s}" for e, s in r.leader_epochs) + "}" in text
    held = [r for r in ours.values() if getattr(r, "segment_id", None) == segment_id]
    assert [r.state for r in held] == [rlm.COPY_SEGMENT_STARTED]  # what the crash left


def test_cross_check_finds_exactly_the_copy_the_killed_broker_never_recorded(crashed):
    stack, store, base, segment_id, recopy = crashed
    cli = InspectCli(stack)
    bs = ["--bootstrap-server", stack.bootstrap_servers]

    doc = cli("orphans", *bs, "--older-than", "0", "--json").expect(1).json()
    assert doc["orphans"] == []
    (finding,) = doc["segments"]
    assert finding["finding"] == "copy-not-finished" and finding["segment_id"] == segment_id
    assert finding["kafka_state"] == "COPY_SEGMENT_STARTED" and finding["base"] == base
    assert finding["start_offset"] == 0 and finding["action"] == "kept"
    assert recopy[-22:] in finding["note"]  # the copy Kafka reads these offsets from
    assert doc["kafka"]["findings"] == {"copy-not-finished": 1}

    # a complete segment no record names (written by our writer, not by the broker)
    cfg_path, env = stack.sidecar_config_env()
    cfg = Config.load(cfg_path, environ=env)
    topic_id = KeyLayout(KEY_PREFIX).parse(base + ".log").topic_id
    writer = TieredWriter(store, KeyLayout(KEY_PREFIX), Keyring.from_config(cfg), TOPIC, topic_id)
    try:
        stray = writer.write_segment(0, [build_batch([SimpleRecord(b"k", b"v", 1)], base_offset=0)])
    finally:
        writer.close()
    stray_base = KeyLayout(KEY_PREFIX).base(stray)
    # within the age guard: the crashed copy may be one in flight (not reported), the stray is
    # reported and kept
    doc = cli("orphans", *bs, "--delete", "--json").expect(1).json()
    assert {f["segment_id"]: (f["finding"], f["action"]) for f in doc["segments"]} == {
        stray.segment_id: ("not-in-kafka", "kept-too-young")
    }
    # past it: the stray is deleted; Kafka lists the crashed copy, so it is kept
    out = cli("orphans", *bs, "--older-than", "0", "--delete").expect(1).stdout
    assert "copy-not-finished" in out and segment_id in out and recopy[-22:] in out
    assert "1 copy-not-finished, 1 not-in-kafka; 1 deleted" in out, out
    assert not any(store.exists(f"{stray_base}.{s}") for s in ("log", "indexes", MANIFEST))
    assert store.exists(f"{base}.{MANIFEST}") and store.exists(f"{recopy}.{MANIFEST}")

    # a segment Kafka lists as finished whose manifest storage lost: Kafka would serve it
    manifest = store.get(f"{recopy}.{MANIFEST}")
    store.delete(f"{recopy}.{MANIFEST}")
    try:
        doc = cli("orphans", *bs, "--older-than", "0", "--json").expect(1).json()
        missing = [f for f in doc["segments"] if f["finding"] == "missing-in-storage"]
        assert [(f["segment_id"], f["kafka_state"]) for f in missing] == [
            (recopy[-22:], "COPY_SEGMENT_FINISHED")
        ]
        # its .log and .indexes without a manifest are the object-level orphans of before
        assert {o["reason"] for o in doc["orphans"]} == {"no-manifest"}
    finally:
        store.put(f"{recopy}.{MANIFEST}", manifest)
