"""The core scenarios on a real broker with the shim in **stream** transfer mode: the shim reads
the broker's segment files and streams their bytes to the sidecar over gRPC (the sidecar never
opens the broker's files)."""

from __future__ import annotations

import re

import pytest

from tests.e2e import scenarios

TRANSFER_MODE = "stream"
COMPRESSIONS = ("zstd", "none")


@pytest.fixture(scope="module")
def tiered(stack):
    return scenarios.produce_and_tier_all_compressions(stack, "stream", COMPRESSIONS, seed=100)


def test_the_shim_copies_in_stream_mode(stack, tiered):
    assert stack.broker.properties()["rsm.config.transfer.mode"] == "stream"
    log = stack.broker.server_log.read_text(errors="replace")
    modes = {
        m.lower()
        for m in re.findall(
            r"copyLogSegmentData\(stream-(?:zstd|none)-0 [^\n]*copied in \d+ ms \((\w+) mode", log
        )
    }
    assert modes == {"stream"}, f"copy modes logged by the shim: {modes}"


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_offload_and_consume_from_offset_zero(stack, store, tiered, compression):
    topic, recs = tiered[compression]
    scenarios.check_consume_from_zero(stack, store, topic, recs)


def test_reads_at_random_offsets(stack, tiered):
    for compression in COMPRESSIONS:
        scenarios.check_random_offsets(stack, *tiered[compression])


def test_transactions_read_committed(stack, store):
    scenarios.check_transactions(stack, store, "txn-stream")
