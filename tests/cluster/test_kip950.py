"""Tiered storage turned off and on again for one topic (KIP-950, Kafka 3.9+), as an operator
does it with incremental config changes, on the three-broker cluster:

1. ``remote.log.copy.disable=true`` is refused while ``local.retention.ms`` differs from
   ``retention.ms`` (Kafka 4.4), and accepted with ``local.retention.ms=-2``: new segments stay
   on the brokers' disks, what is tiered is still served;
2. ``remote.storage.enable=false`` with ``remote.log.delete.on.disable=true``: the leader
   deletes every remote segment of the topic at once (a burst of DeleteSegment calls through
   its sidecar), the log now starts at the leader's first local offset, and what is left reads
   back intact;
3. ``remote.storage.enable=true`` again: new segments are tiered and read back, from the log's
   new start."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from tests.cluster.cluster_helpers import (
    Written,
    admin_request,
    check_read,
    create_topic,
    local_start,
    partition_state,
    produce_bytes,
    produce_records,
    remote_segments,
    sidecar_metric,
    wait_all_tiered,
    wait_local_start,
    wait_remote,
)
from tests.e2e.kafka_helpers import KEY_PREFIX, local_segment_offsets, wait_for

#: remote.log.manager.task.interval.ms (config/broker-tiered.properties): how often a leader copies
COPY_INTERVAL_S = 1.0


def alter(cluster, topic: str, **settings: str | None) -> None:
    """Set (or, for None, delete) topic configs with one IncrementalAlterConfigs request."""
    entries = [
        ConfigEntry(
            name,
            value or "",
            incremental_operation=AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET,
        )
        for name, value in settings.items()
    ]
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=entries)
    admin_request(cluster, "incremental_alter_configs", [resource])


def _objects(store, topic: str) -> list[str]:
    return [o.key for o in store.list(KEY_PREFIX) if o.key.startswith(f"{KEY_PREFIX}{topic}-")]


def _deletes(cluster) -> float:
    return sum(sidecar_metric(n, "rsm_operations_total", op="delete") for n in cluster.nodes.values())


def _low_watermark(cluster, topic: str) -> int:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "kip950-watermarks"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[0]
    finally:
        c.close()


def test_copy_disable_then_delete_on_disable_then_enable_again(cluster, store):
    topic = "kip950"
    bootstrap = cluster.bootstrap_servers
    create_topic(cluster, topic)
    leader = cluster.nodes[partition_state(cluster, topic).leader]
    written = Written()
    written.add(produce_records(bootstrap, topic, 400, seed=71))
    written.add(produce_bytes(bootstrap, topic, 3_300_000, seed=72))
    last_tiered = wait_all_tiered(cluster, store, topic, leader.node_id)
    wait_local_start(leader, topic, last_tiered + 1)
    tiered = remote_segments(store, topic)
    assert len(tiered) >= 3

    # 1. copies off: refused while local retention is shorter than retention, then accepted
    with pytest.raises(KafkaException, match="local.retention.ms") as refused:
        alter(cluster, topic, **{"remote.log.copy.disable": "true"})
    alter(cluster, topic, **{"remote.log.copy.disable": "true", "local.retention.ms": "-2"})
    local_before = local_start(leader, topic)
    written.add(produce_bytes(bootstrap, topic, 2_200_000, seed=73))
    wait_for(
        "two segments rolled on the leader since copies were disabled",
        lambda: len([o for o in local_segment_offsets(leader.broker, topic) if o > last_tiered + 1]) >= 2,
        60,
    )
    time.sleep(3 * COPY_INTERVAL_S)  # three copy rounds: none may copy the rolled segments
    assert remote_segments(store, topic) == tiered, "a segment was copied with remote.log.copy.disable=true"
    assert local_start(leader, topic) == local_before
    check_read(bootstrap, topic, written, "read_uncommitted")  # the tiered part is still served

    # 2. tiering off, remote data deleted: a burst of deletes through the leader's sidecar
    deletes_before, t0 = _deletes(cluster), time.monotonic()
    alter(cluster, topic, **{"remote.storage.enable": "false", "remote.log.delete.on.disable": "true"})
    wait_for(f"no object of {topic} left in the bucket", lambda: not _objects(store, topic), 120, 0.2)
    burst = time.monotonic() - t0
    deleted = _deletes(cluster) - deletes_before
    assert deleted >= len(tiered), (deleted, len(tiered))
    low = _low_watermark(cluster, topic)
    assert low == last_tiered + 1, (
        f"the log starts at {low}, the leader's first local offset is {last_tiered + 1}"
    )
    check_read(bootstrap, topic, written, "read_uncommitted", start=low)

    # 3. tiering on again: new segments are tiered and read back from the log's new start
    alter(
        cluster,
        topic,
        **{"remote.storage.enable": "true", "remote.log.copy.disable": "false", "local.retention.ms": "1000"},
    )
    written.add(produce_bytes(bootstrap, topic, 2_200_000, seed=74))
    again = wait_remote(store, topic, "segments tiered after re-enabling", lambda s: len(s) >= 2)
    assert min(s.start for s in again) >= low
    last_tiered = wait_all_tiered(cluster, store, topic, leader.node_id)
    wait_local_start(leader, topic, last_tiered + 1)
    check_read(bootstrap, topic, written, "read_uncommitted", start=low)
    print(
        f"copy.disable refused with: {str(refused.value)[:200]}; {len(tiered)} remote segments deleted "
        f"in {burst:.1f}s ({deleted:.0f} DeleteSegment calls); {len(again)} segments tiered after re-enabling"
    )
