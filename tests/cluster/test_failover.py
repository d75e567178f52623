"""The partition leader is killed with SIGKILL while its sidecar copies a segment, under a
steady producer (acks=all, idempotent): a follower takes over, keeps tiering through its own
sidecar, and serves the segments the dead leader's sidecar copied; the dead broker is started
again, catches up, leads again and serves the segments the other broker's sidecar copied.
Every record is checked by content, offset and order; remote storage holds no partial segment
that could be read."""

from __future__ import annotations

import time

from tests.cluster.cluster_helpers import (
    LoadProducer,
    check_read,
    create_topic,
    elect_preferred,
    partition_state,
    produce_bytes,
    remote_segments,
    served_bytes,
    sidecar_metric,
    wait_local_start,
    wait_remote,
    wait_state,
)
from tests.e2e.test_restarts import check_no_partial_segment_readable


def _kill_during_a_copy(node, timeout: float = 30) -> bool:
    """SIGKILL the node's broker while its sidecar has a copy in progress (its
    ``rsm_in_flight{op="copy"}`` gauge); True if one was seen, else killed after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sidecar_metric(node, "rsm_in_flight", op="copy") > 0:
            node.broker.kill()
            return True
        time.sleep(0.005)
    node.broker.kill()
    return False


def test_leader_killed_during_a_copy_then_restarted(cluster, store):
    topic = "failover"
    create_topic(cluster, topic)
    victim_id = partition_state(cluster, topic).leader
    victim = cluster.nodes[victim_id]
    load = LoadProducer(cluster.bootstrap_servers, topic, partitions=1, seed=31, rate=500_000)
    load.start()
    try:
        wait_remote(
            store, topic, f"two segments copied by broker {victim_id}", lambda s: len(s) >= 2, timeout=120
        )
        during_copy = _kill_during_a_copy(victim)
        killed_at = time.monotonic()
        before = {s.segment_id for s in remote_segments(store, topic)}
        state = wait_state(
            cluster,
            topic,
            f"a new leader without broker {victim_id}",
            lambda s: s.leader not in (-1, victim_id),
        )
        failover = time.monotonic() - killed_at
        heir = cluster.nodes[state.leader]
        # the new leader tiers what was produced since, through its own sidecar
        wait_remote(
            store,
            topic,
            f"two segments copied by broker {heir.node_id}",
            lambda segs: sum(s.broker_id == heir.node_id and s.segment_id not in before for s in segs) >= 2,
            timeout=120,
        )
    finally:
        load.stopping.set()
    written = load.finish()[0]
    written.add(
        produce_bytes(cluster.bootstrap_servers, topic, 2_200_000, seed=32)
    )  # roll the last records out
    # every record the producer sent is tiered and gone from the new leader's disk
    last = max(r.offset for r in written.records if r.key.startswith(b"load-"))
    wait_local_start(heir, topic, last + 1)
    segments = remote_segments(store, topic)
    copied_by = {s.broker_id for s in segments}
    assert {victim_id, heir.node_id} <= copied_by, copied_by

    # the new leader's sidecar serves what the dead leader's sidecar copied
    served = served_bytes(heir)
    check_read(cluster.bootstrap_servers, topic, written, "read_uncommitted")
    assert served_bytes(heir) > served, f"broker {heir.node_id} read nothing from remote storage"

    # the dead broker comes back, catches up, leads again and serves the other broker's segments
    t0 = time.monotonic()
    victim.broker.start()
    wait_state(cluster, topic, f"broker {victim_id} back in sync", lambda s: victim_id in s.isr)
    rejoined = time.monotonic() - t0
    assert elect_preferred(cluster, topic) == victim_id
    wait_local_start(victim, topic, last + 1)  # what it had on disk is tiered: deleted locally
    served = served_bytes(victim)
    check_read(cluster.bootstrap_servers, topic, written, "read_uncommitted")
    assert served_bytes(victim) > served, f"broker {victim_id} read nothing from remote storage"

    # the killed copy left nothing half-written (its sidecar saw the call cancelled, or finished it)
    complete, orphans = check_no_partial_segment_readable(cluster, store, topic)
    assert {s.base for s in remote_segments(store, topic)} == set(complete)
    assert orphans == [], f"objects of unfinished copies left in the bucket: {orphans}"
    print(
        f"leader {victim_id} killed {'during a copy' if during_copy else 'without a copy seen in 30 s'}; "
        f"broker {heir.node_id} led after {failover:.1f}s; the dead broker was back in sync {rejoined:.1f}s "
        f"after its start; {len(segments)} segments copied by brokers {sorted(copied_by)}"
    )
    assert during_copy, "no copy was in progress when the leader was killed"
