"""Scenarios shared by the path-mode and stream-mode suites (ported from Kafka's
tiered-storage integration tests and Aiven's single-broker e2e suite)."""

from __future__ import annotations

import random
import time
import urllib.request

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.e2e.kafka_helpers import (
    Rec,
    consume,
    consume_until_idle,
    create_topic,
    filler,
    produce_and_tier,
    remote_segments,
    wait_for,
    wait_tiered,
)

COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")


def produce_and_tier_all_compressions(
    stack, prefix: str, compressions: tuple[str, ...] = COMPRESSIONS, seed: int = 0
) -> dict[str, tuple[str, list[Rec]]]:
    """One topic per producer compression with the same kinds of records; returns
    compression -> (topic, produced records with offsets) once all are tiered."""
    topics = {f"{prefix}-{comp}": comp for comp in compressions}
    tiered = produce_and_tier(stack, topics, seed=seed)
    return {comp: (topic, tiered[topic]) for topic, comp in topics.items()}


def assert_same_records(got: list[Rec], expected: list[Rec]) -> None:
    assert len(got) == len(expected), f"{len(got)} records, expected {len(expected)}"
    for g, e in zip(got, expected):
        assert g.offset == e.offset
        assert g.key == e.key, f"key at offset {e.offset}"
        assert g.value == e.value, f"value at offset {e.offset}"
        assert g.timestamp == e.timestamp, f"timestamp at offset {e.offset}"
        assert [(k, v if v != b"" else b"") for k, v in g.headers] == [(k, v) for k, v in e.headers], (
            f"headers at offset {e.offset}"
        )


def check_consume_from_zero(stack, store, topic: str, recs: list[Rec]) -> None:
    # a later segment may be in the middle of its copy (objects before the manifest)
    complete = {"log", "indexes", "rsm-manifest"}
    wait_for(
        f"{topic}: every remote segment complete",
        lambda: all(s["suffixes"] == complete for s in remote_segments(store, topic).values()),
        60,
    )
    segments = remote_segments(store, topic)
    assert segments and min(s["start_offset"] for s in segments.values()) == 0
    got = consume(stack.bootstrap_servers, topic, 0, len(recs))
    assert_same_records(got, recs)


def sidecar_bytes(stack) -> dict[str, float]:
    """``rsm_bytes_total`` of the stack's sidecar by kind, from one scrape (the e2e stacks
    expose metrics)."""
    text = urllib.request.urlopen(stack.metrics_url, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith('rsm_bytes_total{kind="'):
            out[line.split('"')[1]] = float(line.split()[-1])
    return out


def sidecar_fetch_calls(stack) -> float:
    """``FetchSegment`` calls the stack's sidecar handled, whatever their outcome (one scrape)."""
    text = urllib.request.urlopen(stack.metrics_url, timeout=10).read().decode()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith('rsm_operations_total{op="fetch",')
    )


def check_remote_reads_use_the_fetch_channel(stack, store, topic: str, recs: list[Rec]) -> None:
    """A consumer's remote reads arrive over the sidecar's fetch channel, every byte (none over
    gRPC), and the broker logged no fall-back to gRPC."""
    log_start = stack.broker.server_log.stat().st_size
    before = sidecar_bytes(stack)
    check_consume_from_zero(stack, store, topic, recs)
    after = sidecar_bytes(stack)
    served = after["fetch_served"] - before.get("fetch_served", 0.0)
    channel = after.get("fetch_channel", 0.0) - before.get("fetch_channel", 0.0)
    assert served > 0, "the consumer's early records did not come from remote storage"
    assert channel == served, f"{channel:.0f} of {served:.0f} bytes served came over the fetch channel"
    with open(stack.broker.server_log, "rb") as f:
        f.seek(log_start)
        log = f.read().decode(errors="replace")
    assert "fetching over gRPC" not in log, log[log.index("fetching over gRPC") - 300 :][:1000]


def check_random_offsets(stack, topic: str, recs: list[Rec]) -> None:
    rng = random.Random(42)
    by_offset = {r.offset: r for r in recs}
    c = Consumer(
        {
            "bootstrap.servers": stack.bootstrap_servers,
            "group.id": "random-offsets",
            "enable.auto.commit": False,
            "fetch.max.bytes": 5_000_000,
        }
    )
    try:
        starts = rng.sample(sorted(by_offset), 15) + [0, recs[-1].offset]
        for start in starts:
            c.assign([TopicPartition(topic, 0, start)])
            got = []
            deadline = time.monotonic() + 60
            while len(got) < 3 and time.monotonic() < deadline:
                m = c.poll(1.0)
                if m is None or m.error():
                    continue
                got.append(m)
                if m.offset() >= recs[-1].offset:
                    break
            assert got and got[0].offset() == start, (
                f"seek to {start} returned {got[0].offset() if got else None}"
            )
            for m in got:
                if m.offset() in by_offset:
                    assert m.value() == by_offset[m.offset()].value and m.key() == by_offset[m.offset()].key
    finally:
        c.close()


def offset_for_time(c: Consumer, topic: str, ts: int, attempts: int = 5) -> TopicPartition:
    """``offsetsForTimes`` of partition 0, retrying the answer REQUEST_TIMED_OUT as Kafka's Java
    consumer does: a 4.x broker gives it at once, with no timeout passed, when the remote
    lookup ends between the two checks of ``DelayedRemoteListOffsets.tryComplete`` (a race in
    Kafka, docs/operations.md §2.3); librdkafka returns it to the caller."""
    for _ in range(attempts):
        got = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=30)[0]
        if got.error is None or got.error.code() != KafkaError.REQUEST_TIMED_OUT:
            return got
    return got


def check_offsets_for_times(stack, topic: str, recs: list[Rec]) -> None:
    c = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": "times"})
    try:
        for r in recs[::37] + [recs[-1]]:
            for ts, expected in ((r.timestamp, r.offset), (r.timestamp - 5, r.offset)):
                got = offset_for_time(c, topic, ts)
                assert got.error is None and got.offset == expected, (
                    f"offsetsForTimes({ts}) = {got.offset} ({got.error}), expected {expected}"
                )
    finally:
        c.close()


def check_transactions(stack, store, topic: str) -> None:
    """Committed and aborted transactions; read_committed sees exactly the committed
    records, which needs the transaction index served from remote storage."""
    create_topic(stack.bootstrap_servers, topic)
    rng = random.Random(7)
    p = Producer(
        {"bootstrap.servers": stack.bootstrap_servers, "transactional.id": f"tx-{topic}", "linger.ms": 5}
    )
    p.init_transactions(30)
    committed, aborted = [], []
    delivered: dict[int, int] = {}
    n = 0
    for round_ in range(12):
        p.begin_transaction()
        batch = []
        for _ in range(rng.randrange(20, 60)):
            value = b"txn-%d-%d-" % (round_, n) + rng.randbytes(rng.randrange(200, 4000))
            i = n
            p.produce(
                topic,
                key=b"k%d" % n,
                value=value,
                on_delivery=lambda e, m, i=i: e is None and delivered.__setitem__(i, m.offset()),
            )
            batch.append((i, value))
            n += 1
        p.flush(30)  # written to the log before the outcome, so aborted data really is on disk
        if round_ % 3 == 1:
            p.abort_transaction(30)
            aborted += batch
        else:
            p.commit_transaction(30)
            committed += batch
    p.flush(30)
    last = filler(stack.bootstrap_servers, topic)
    wait_tiered(stack, topic, max(delivered.values()) + 1)
    manifests = [b for b, s in remote_segments(store, topic).items()]
    assert manifests
    got = [
        r
        for r in consume_until_idle(stack.bootstrap_servers, topic, 0, isolation="read_committed")
        if r.value and r.value.startswith(b"txn-")
    ]
    assert [r.value for r in got] == [v for _, v in committed]
    assert {r.offset for r in got}.isdisjoint({delivered[i] for i, _ in aborted})
    assert len(delivered) == n
    segs = [b for b in manifests if stack.object_store().exists(b + ".rsm-manifest")]
    with_txn = [b for b in segs if _has_txn_index(stack, b)]
    assert with_txn, "no tiered segment carries a transaction index"
    everything = [
        r for r in consume_until_idle(stack.bootstrap_servers, topic, 0) if r.value.startswith(b"txn-")
    ]
    assert [r.value for r in everything] == [v for _, v in sorted(committed + aborted)]
    assert last > 0


def _has_txn_index(stack, base: str) -> bool:
    from rsm_sidecar.format.manifest import SegmentManifest

    m = SegmentManifest.from_bytes(stack.object_store().get(base + ".rsm-manifest"))
    return m.indexes["transaction"] is not None
