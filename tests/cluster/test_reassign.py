"""A partition moved to a new broker with its own sidecar (kafka-reassign-partitions.sh, as
an operator adds capacity): the new replica starts empty and builds its state from remote
storage through its own sidecar, leads, serves every record from offset 0 (read_committed and
read_uncommitted) from segments the old leader's sidecar copied, and tiers new segments
itself, contiguous with the old leader's."""

from __future__ import annotations

import threading

from tests.cluster.cluster_helpers import (
    Written,
    check_read,
    create_topic,
    elect_preferred,
    index_fetches,
    local_start,
    partition_state,
    produce_bytes,
    produce_records,
    produce_transactions,
    reassign,
    served_bytes,
    wait_all_tiered,
    wait_local_start,
    wait_remote,
)


def test_partition_reassigned_to_a_new_broker_with_its_own_sidecar(cluster, store):
    topic = "reassign"
    bootstrap = cluster.bootstrap_servers
    create_topic(cluster, topic, assignment=[[1, 2, 3]])
    # the fourth broker and its sidecar start while the first three tier the topic
    added: list = []
    starting = threading.Thread(target=lambda: added.append(cluster.add_broker()), daemon=True)
    starting.start()
    try:
        written = Written()
        produce_transactions(bootstrap, topic, written, rounds=6, seed=51)
        written.add(produce_records(bootstrap, topic, 300, seed=52))
        written.add(produce_bytes(bootstrap, topic, 2_200_000, seed=53))
        last_tiered = wait_all_tiered(cluster, store, topic, 1)
        wait_local_start(cluster.nodes[1], topic, last_tiered + 1)
        starting.join(180)
        assert added, "the fourth broker did not start"
        new = added[0]
        assert new.node_id == 4 and new.sidecar.is_running()

        indexes_before = index_fetches(new)
        reassign(cluster, topic, [4, 2, 3])
        # the new replica did not copy the tiered offsets: it starts at the leader's first local one
        assert local_start(new, topic) == last_tiered + 1
        assert index_fetches(new) >= indexes_before + 2, "the new replica fetched no index from its sidecar"
        assert elect_preferred(cluster, topic) == 4

        served = served_bytes(new)
        check_read(bootstrap, topic, written, "read_committed")
        check_read(bootstrap, topic, written, "read_uncommitted")
        assert served_bytes(new) > served, "broker 4 read nothing from remote storage"

        written.add(produce_bytes(bootstrap, topic, 2_200_000, seed=54))
        segs = wait_remote(
            store, topic, "a segment copied by broker 4", lambda s: any(x.broker_id == 4 for x in s)
        )
        assert min(s.start for s in segs if s.broker_id == 4) == last_tiered + 1
        check_read(bootstrap, topic, written, "read_uncommitted", start=written.end - 50)
        assert partition_state(cluster, topic).leader == 4
    finally:
        starting.join(180)
        if 4 in cluster.nodes:
            cluster.remove_broker(4)
