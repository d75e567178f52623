"""Scenarios that more than one cluster runs (a Kafka 4.4 and a Kafka 3.9 cluster)."""

from __future__ import annotations

import shutil

from tests.cluster.cluster_helpers import (
    Written,
    check_read,
    create_topic,
    elect_preferred,
    index_fetches,
    local_start,
    log_since,
    log_size,
    partition_state,
    produce_bytes,
    produce_records,
    produce_transactions,
    remote_segments,
    served_bytes,
    wait_all_tiered,
    wait_remote,
    wait_state,
)
from tests.e2e.kafka_helpers import wait_for

KIP_1023 = "follower.fetch.last.tiered.offset.enable"
#: local.retention.bytes of the rebuilt topic
LOCAL_BYTES = 2_500_000


def _local_retention_done(node, topic: str) -> bool:
    """Whether the broker's size-based local retention has nothing left to delete: without its
    oldest segment the partition would be under ``LOCAL_BYTES`` (Kafka deletes oldest segments
    while what is left stays at or above the limit)."""
    sizes = [p.stat().st_size for p in sorted(node.broker.partition_dir(topic).glob("*.log"))]
    return len(sizes) > 1 and sum(sizes) - sizes[0] < LOCAL_BYTES


def rebuild_then_lead(cluster, store, topic: str, kip1023: bool) -> None:
    """A follower rebuilt from remote storage with an empty disk, then leading (test_rebuild.py)."""
    follower_id, leader_id, other_id = 3, 1, 2
    follower, leader = cluster.nodes[follower_id], cluster.nodes[leader_id]
    bootstrap = cluster.bootstrap_servers
    replicas = [follower_id, leader_id, other_id]  # the first one leads at first
    # the newest 2.5 MB stay on a broker's disk, tiered or not (-2: no time limit but retention.ms)
    retention = {"local_retention_ms": -2, "local_retention_bytes": LOCAL_BYTES}
    create_topic(cluster, topic, assignment=[replicas], **retention)

    # tiered while the follower-to-be leads, through its sidecar
    written = Written()
    produce_transactions(bootstrap, topic, written, rounds=6, seed=41)
    written.add(produce_records(bootstrap, topic, 300, seed=42))
    written.add(produce_bytes(bootstrap, topic, 2_200_000, seed=43))
    wait_remote(store, topic, f"segments of broker {follower_id}", lambda s: len(s) >= 2)

    # it stops; broker 1 leads and tiers more through its own sidecar
    follower.broker.stop()
    wait_state(cluster, topic, f"broker {leader_id} leads", lambda s: s.leader == leader_id)
    produce_transactions(bootstrap, topic, written, rounds=6, seed=44)
    written.add(produce_bytes(bootstrap, topic, 3_300_000, seed=45))
    last_tiered = wait_all_tiered(cluster, store, topic, leader_id, everything=False)
    copied_by = {s.broker_id for s in remote_segments(store, topic)}
    assert copied_by == {follower_id, leader_id}, copied_by
    wait_for(
        f"broker {leader_id} to have deleted its oldest tiered segments down to {LOCAL_BYTES} bytes",
        lambda: _local_retention_done(leader, topic),
        60,
    )
    leader_start = local_start(leader, topic)
    assert 0 < leader_start <= last_tiered, (leader_start, last_tiered)

    # a new, empty disk
    shutil.rmtree(follower.log_dir)
    follower.log_dir.mkdir()
    log_offset, indexes_before = log_size(follower), index_fetches(follower)
    if kip1023:
        follower.broker.extra_properties[KIP_1023] = "true"
    try:
        follower.broker.start()
        wait_state(cluster, topic, f"broker {follower_id} back in sync", lambda s: follower_id in s.isr)
    finally:
        follower.broker.extra_properties.pop(KIP_1023, None)  # for its next start

    # it built its leader-epoch cache and producer state from the remote segment below its start:
    # the leader's first local offset (classic) or the first one not tiered (KIP-1023)
    rebuilt_start = local_start(follower, topic)
    expected = last_tiered + 1 if kip1023 else leader_start
    assert rebuilt_start == expected, (rebuilt_start, leader_start, last_tiered)
    assert index_fetches(follower) >= indexes_before + 2, "the follower fetched no index from its sidecar"
    log = log_since(follower, log_offset)
    assert f"Updated the epoch cache from remote tier till offset: {expected} " in log, log[-3000:]

    # it leads: offsets below its first local one are remote reads through its own sidecar
    assert partition_state(cluster, topic).leader == leader_id
    assert elect_preferred(cluster, topic) == follower_id
    served = served_bytes(follower)
    check_read(bootstrap, topic, written, "read_committed")
    check_read(bootstrap, topic, written, "read_uncommitted")
    assert served_bytes(follower) > served, f"broker {follower_id} read nothing from remote storage"

    # and tiers what comes next, right after what is there
    written.add(produce_bytes(bootstrap, topic, 2_200_000, seed=46))
    segs = wait_remote(
        store,
        topic,
        f"a segment copied by the rebuilt broker {follower_id}",
        lambda segs: any(s.broker_id == follower_id and s.start > last_tiered for s in segs),
    )
    mine = min(
        (s for s in segs if s.broker_id == follower_id and s.start > last_tiered), key=lambda s: s.start
    )
    assert mine.start == last_tiered + 1, (mine, last_tiered)
