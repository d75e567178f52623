"""The shim's read-ahead (rsm.config.fetch.readahead.bytes, 8 MiB by default: docs/shim.md) on a
real broker with its default settings."""

from __future__ import annotations

import random
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.e2e import scenarios
from tests.e2e.kafka_helpers import create_topic, filler, remote_segments, wait_tiered


def test_a_sequential_remote_read_makes_about_one_call_per_segment(stack, store):
    """A consumer reading tiered segments from the start in small fetches: the shim keeps each
    sequential read's hand-off file open (rsm.config.fetch.readahead.bytes), so the broker's
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
