"""Tiered storage through the shim and the sidecar on a real broker (path transfer mode,
local-directory storage)."""

from __future__ import annotations

import random
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, OffsetSpec

from tests.e2e import scenarios
from tests.e2e.kafka_helpers import (
    consume,
    consume_until_idle,
    create_topic,
    filler,
    produce,
    records,
    remote_segments,
    wait_for,
    wait_tiered,
)

TRANSFER_MODE = "path"


@pytest.fixture(scope="module")
def tiered(stack):
    return scenarios.produce_and_tier_all_compressions(stack, "comp")


@pytest.mark.parametrize("compression", scenarios.COMPRESSIONS)
def test_offload_and_consume_from_offset_zero(stack, store, tiered, compression):
    topic, recs = tiered[compression]
    scenarios.check_consume_from_zero(stack, store, topic, recs)


def test_remote_reads_come_over_the_fetch_channel(stack, store, tiered):
    topic, recs = tiered["lz4"]
    scenarios.check_remote_reads_use_the_fetch_channel(stack, store, topic, recs)


def test_a_sequential_remote_read_makes_about_one_call_per_segment(stack, store):
    """A consumer reading tiered segments from the start in small fetches: the shim keeps each
    sequential read's window (rsm.config.fetch.readahead.bytes), so the broker's
    remote reads, one per 64 KiB fetch, cost about one sidecar call per segment instead of one
    each, and every record arrives intact."""
    topic = "read-ahead"
    create_topic(stack.bootstrap_servers, topic)
    rng = random.Random(7)
    values = [rng.randbytes(10_000) for _ in range(400)]  # four 1 MiB segments of 10 kB batches
    p = Producer({"bootstrap.servers": stack.bootstrap_servers, "batch.num.messages": 1, "linger.ms": 0})
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(60) == 0
    filler(stack.bootstrap_servers, topic)
    wait_tiered(stack, topic, len(values))
    segments = len(remote_segments(store, topic))
    calls_before = scenarios.sidecar_fetch_calls(stack)
    c = Consumer(
        {
            "bootstrap.servers": stack.bootstrap_servers,
            "group.id": "read-ahead",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "max.partition.fetch.bytes": 65536,  # one partition: the broker's reads are 64 KiB
        }
    )
    got: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 120
        while len(got) < len(values) and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and not m.error():
                assert m.offset() == len(got), f"offset {m.offset()} after {len(got)} records"
                got.append(m.value())
    finally:
        c.close()
    calls = scenarios.sidecar_fetch_calls(stack) - calls_before
    assert got == values
    # ~60 remote reads of 64 KiB for the 4 MB asked for; at most one call per tiered segment the
    # consumer could reach (filler segments included), plus the first read of the partition
    assert 0 < calls <= segments + 2, f"{calls:.0f} fetch calls for {segments} remote segments"


def test_reads_at_random_offsets_inside_and_across_batches(stack, tiered):
    scenarios.check_random_offsets(stack, *tiered["zstd"])
    scenarios.check_random_offsets(stack, *tiered["none"])


def test_offsets_for_times_answered_from_remote_segments(stack, tiered):
    scenarios.check_offsets_for_times(stack, *tiered["lz4"])


def test_transactions_read_committed(stack, store):
    scenarios.check_transactions(stack, store, "txn-path")


def _earliest(admin: AdminClient, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    return admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(30).offset


def test_delete_records_deletes_remote_segments(stack, store):
    topic = "delete-records"
    create_topic(stack.bootstrap_servers, topic)
    recs = produce(
        stack.bootstrap_servers, topic, records(300, __import__("random").Random(3), 1_700_000_000_000)
    )
    end = filler(stack.bootstrap_servers, topic, 4 * 1024 * 1024)
    wait_tiered(stack, topic, recs[-1].offset + 1)
    # the filler's segments are tiered one after the other (asynchronously): wait for four
    wait_for("four segments tiered", lambda: len(remote_segments(store, topic)) >= 4)
    segments = sorted(s["start_offset"] for s in remote_segments(store, topic).values())
    cut = segments[2] + 5  # inside the third segment
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for f in admin.delete_records([TopicPartition(topic, 0, cut)]).values():
        f.result(30)
    wait_for(
        "remote segments below the new log start to be deleted",
        lambda: sorted(s["start_offset"] for s in remote_segments(store, topic).values())[0] == segments[2],
    )
    assert _earliest(admin, topic) == cut
    got = consume(stack.bootstrap_servers, topic, 0, 1)
    assert got[0].offset == cut  # reading from 0 resets to the new log start
    assert end > cut


def test_time_retention_deletes_remote_segments(stack, store):
    topic = "time-retention"
    create_topic(stack.bootstrap_servers, topic)
    produce(
        stack.bootstrap_servers, topic, records(300, __import__("random").Random(4), int(time.time() * 1000))
    )
    end = filler(stack.bootstrap_servers, topic, 3 * 1024 * 1024)
    wait_for("segments tiered", lambda: len(remote_segments(store, topic)) >= 3)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "2000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)
    wait_for(
        "every remote segment of the topic deleted by time retention",
        lambda: not remote_segments(store, topic),
        timeout=120,
    )
    wait_for("log start offset moved to the end", lambda: _earliest(admin, topic) == end, timeout=60)


def test_size_retention_deletes_remote_segments(stack, store):
    topic = "size-retention"
    create_topic(stack.bootstrap_servers, topic, retention_bytes=2_200_000)
    end = filler(stack.bootstrap_servers, topic, 7 * 1024 * 1024)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    wait_for("size retention to move the log start offset", lambda: _earliest(admin, topic) > 0, timeout=120)

    def remote_within_limit():
        """No remote segment below the log start, and at most 3 (1 MiB segments, 2.2 MB kept)."""
        segs = remote_segments(store, topic)
        return (
            segs
            and len(segs) <= 3
            and min(s["start_offset"] for s in segs.values()) >= _earliest(admin, topic) - 1
        )

    def state() -> str:
        segs = sorted(
            (s["start_offset"], sorted(s["suffixes"])) for s in remote_segments(store, topic).values()
        )
        log = stack.workdir / "kafka" / "logs" / "server.log"
        lines = (
            [ln for ln in log.read_text(errors="replace").splitlines() if topic in ln] if log.exists() else []
        )
        return f"log start {_earliest(admin, topic)}, remote segments {segs}\n" + "\n".join(lines[-40:])

    # retention deletes a segment at a time, each run of the broker's retention task (every second)
    wait_for(
        "size retention to delete the remote segments beyond it", remote_within_limit, 180, diagnose=state
    )
    # retention goes on while the consumer reads (the log start may move again): the read from 0
    # starts at the log start of some moment of the read and has every offset from there to the end
    before = _earliest(admin, topic)
    got = consume_until_idle(stack.bootstrap_servers, topic, 0, idle=5)
    after = _earliest(admin, topic)
    assert got and before <= got[0].offset <= after, (before, got[0].offset if got else None, after)
    assert [r.offset for r in got] == list(range(got[0].offset, end))


def test_deleting_the_topic_removes_every_remote_object(stack, store):
    topic = "to-delete"
    create_topic(stack.bootstrap_servers, topic)
    end = filler(stack.bootstrap_servers, topic, 3 * 1024 * 1024)
    wait_for("segments tiered", lambda: len(remote_segments(store, topic)) >= 2)
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    for f in admin.delete_topics([topic]).values():
        f.result(30)
    wait_for(
        "no remote object of the topic left",
        lambda: not [o for o in store.list("tiered/") if o.key.startswith(f"tiered/{topic}-")],
        timeout=120,
    )
    assert end > 0
