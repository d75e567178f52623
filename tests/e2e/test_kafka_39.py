"""The same shaded shim jar on a Kafka **3.9.2** broker (the other tests run the default, 4.4.0): offload,
local deletion, consume from offset zero, and read_committed over tiered transactional data.
Together with the 4.x suites this shows one jar serves 3.x and 4.x brokers."""

from __future__ import annotations

import re

import pytest

from tests.e2e import scenarios
from tests.e2e.kafka_helpers import (
    local_segment_offsets,
    produce_and_tier,
    remote_segments,
)

KAFKA_VERSION = "3.9.2"
TRANSFER_MODE = "path"
METRICS = False  # the conftest's stack on KAFKA_VERSION, without the metrics endpoint


@pytest.fixture(scope="module")
def tiered(stack):
    topic = "k39-basic"
    return topic, produce_and_tier(stack, {topic: "lz4"}, seed=39)[topic]


def test_the_broker_is_kafka_3_9_running_the_shim(stack, tiered):
    assert stack.broker.dist.version == KAFKA_VERSION
    log = stack.broker.server_log.read_text(errors="replace")
    assert re.search(r"Kafka version: 3\.9\.2\b", log), "server.log does not report Kafka 3.9.2"
    assert "SidecarRemoteStorageManager" in log and "configured on broker" in log
    copies = re.findall(r"copyLogSegmentData\(k39-basic-0 [^\n]*copied in \d+ ms \(path mode", log, re.I)
    assert copies, "the shim logged no copy of k39-basic-0"


def test_the_jar_loads_with_no_error_although_it_carries_kafka_4_1_classes(stack, tiered):
    """The jar holds MonitorableSidecarRemoteStorageManager (KIP-877, Kafka 4.1+), which cannot
    load on 3.9; the class the broker names loads and logs no error, nor anything missing."""
    log = stack.broker.server_log.read_text(errors="replace")
    assert "NoClassDefFoundError" not in log and "ClassNotFoundException" not in log
    assert "LinkageError" not in log
    # log entries (a line starting with the timestamp, and its stack trace) at ERROR that involve
    # the shim; 3.9's own start-up errors (the metadata manager not ready yet, KAFKA-19426) are not
    entries = re.split(r"\n(?=\[\d{4}-)", log)
    assert [e[:300] for e in entries if " ERROR " in e.split("\n", 1)[0] and "rsmsidecar" in e] == []


def test_offload_local_deletion_and_consume_from_offset_zero(stack, store, tiered):
    topic, recs = tiered
    # the records' segments are gone from the broker's disk, so the reads below are remote reads
    assert local_segment_offsets(stack.broker, topic)[0] > recs[-1].offset
    assert len(remote_segments(store, topic)) >= 2
    scenarios.check_consume_from_zero(stack, store, topic, recs)


def test_transactions_read_committed(stack, store):
    scenarios.check_transactions(stack, store, "k39-txn")
