"""A rolling restart of every sidecar and every broker under load, as an upgrade does it: for
each broker in turn, its sidecar is restarted (SIGTERM: it drains, the broker runs on and its
copies and remote reads fail until the sidecar is back), then the broker (controlled shutdown,
start, back in sync) before the next one. Meanwhile a producer writes to three partitions led
by the three brokers (idempotent, acks=all), one consumer follows the head, and another
re-reads the partitions from offset 0 over and over (remote reads). Nothing is lost, repeated
or changed: every record the producer was acknowledged is in the log at its offset, and every
consumer pass read the offsets without a gap, the local and the remote reads agreeing; every
closed segment is tiered. A record may be in the log twice when librdkafka's idempotent producer
sent it again under a new producer epoch at a leader change (confluentinc/librdkafka#4953): the
test names such records, and every later read must find both copies."""

from __future__ import annotations

import dataclasses
import time

from tests.cluster.cluster_helpers import (
    LoadConsumer,
    LoadProducer,
    Written,
    check_read,
    create_topic,
    partition_state,
    produce_bytes,
    wait_all_tiered,
    wait_remote,
    wait_state,
)

PARTITIONS = 3


def test_rolling_restart_of_every_sidecar_and_broker_under_load(cluster, store):
    topic = "rolling"
    bootstrap = cluster.bootstrap_servers
    create_topic(cluster, topic, assignment=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    # two segments per partition first, tiered before the restarts, so that the re-reader's
    # reads are remote reads from the start
    before = {
        p: Written().add(produce_bytes(bootstrap, topic, 2_200_000, seed=60 + p, partition=p))
        for p in range(3)
    }
    wait_remote(
        store, topic, "a segment of every partition", lambda s: {x.partition for x in s} == set(range(3))
    )
    load = LoadProducer(bootstrap, topic, PARTITIONS, seed=61, rate=300_000)
    head = LoadConsumer(bootstrap, load, seed=62, before=before)
    rereader = LoadConsumer(bootstrap, load, seed=63, rewind=True, before=before)
    for t in (load, head, rereader):
        t.start()
    steps = []
    try:
        for node in cluster.nodes.values():
            t0 = time.monotonic()
            node.restart_sidecar()
            t1 = time.monotonic()
            node.broker.restart()
            for p in range(PARTITIONS):
                wait_state(cluster, topic, "every replica in sync", lambda s: len(s.isr) == 3, partition=p)
            steps.append((node.node_id, t1 - t0, time.monotonic() - t1))
    finally:
        load.stopping.set()
    written = load.finish()
    read_head, read_again = head.finish(written), rereader.finish(written)
    # the head reader (local reads) and every pass of the re-reader (remote reads) agree on
    # every offset both read
    for n, again in enumerate(rereader.passes):
        for p, seen in again.items():
            differ = [o for o, i in seen.items() if head.passes[0].get(p, {}).get(o, i) != i]
            assert not differ, (
                f"re-reader pass {n}, partition {p}: offsets {differ[:5]} differ from the head's"
            )
    # records the producer wrote twice (librdkafka#4953: LoadConsumer.finish) are in the log
    # twice: later reads must find both copies
    duplicates = head.duplicates | rereader.duplicates
    for p, o, i in sorted(duplicates):
        written[p].records.append(dataclasses.replace(load.sent[i][1], offset=o))
    for p, w in before.items():
        written[p].records[:0] = w.records
    assert len(rereader.passes) >= 2, "the re-reader never came back to offset 0"

    # everything is tiered (the leaders roll their active segments once 1 s old, local retention)
    # and reads back from offset 0
    for p in range(PARTITIONS):
        leader = partition_state(cluster, topic, p).leader
        last_tiered = wait_all_tiered(cluster, store, topic, leader, partition=p)
        assert last_tiered >= max(r.offset for r in written[p].records if r.key.startswith(b"load-"))
        check_read(bootstrap, topic, written[p], "read_uncommitted", partition=p)
    produced = sum(len(w.records) for w in written.values())
    print(
        "restarts (broker: sidecar s, broker s): "
        + ", ".join(f"{n}: {a:.1f}, {b:.1f}" for n, a, b in steps)
        + f"; {produced} records produced, the head reader read {read_head} and the re-reader "
        f"{read_again} in {len(rereader.passes)} passes; client errors seen: "
        f"{len(head.errors) + len(rereader.errors)} {sorted(set(head.errors + rereader.errors))[:3]}; "
        f"records the producer wrote twice: {sorted(duplicates)}"
    )
