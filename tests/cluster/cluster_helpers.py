"""What the cluster tests do with a three-broker cluster (devstack/cluster.py): topics placed on
chosen brokers, leaders moved, each broker's disk and each sidecar's counters, the segments in
the shared bucket with the broker that copied them, and records checked by content, offset and
transaction outcome (built on tests/e2e/kafka_helpers.py)."""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from confluent_kafka import ElectionType, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devstack.cluster import ClusterNode, ClusterStack
from devstack.kafka import create_topics
from devstack.kafka_tools import tool_command
from rsm_sidecar.format.keys import KeyLayout
from rsm_sidecar.format.manifest import SegmentManifest
from tests.e2e.kafka_helpers import (
    KEY_PREFIX,
    BackgroundProducer,
    Rec,
    consume,
    local_segment_offsets,
    produce,
    records,
    send,
    tiered_topic_config,
    wait_for,
)
from tests.e2e.scenarios import assert_same_records

# -- topics and leaders -------------------------------------------------------------------------


def admin(cluster: ClusterStack) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap_servers})


def admin_request(cluster: ClusterStack, method: str, *args) -> list:
    """``AdminClient.<method>(*args)`` and the results of its futures, the client kept alive
    until they resolve (a client collected earlier fails them: "Broker handle destroyed")."""
    client = admin(cluster)
    futures = getattr(client, method)(*args)
    return [f.result(60) for f in futures.values()]


def create_topic(
    cluster: ClusterStack,
    name: str,
    partitions: int = 1,
    assignment: list[list[int]] | None = None,
    **config,
) -> None:
    """A tiered topic (tests/e2e's settings: 1 MiB segments, local retention 1 s) on three
    brokers, or on the brokers ``assignment`` names per partition (the first one leads)."""
    cfg = tiered_topic_config(**config)
    if assignment is not None:
        topic = NewTopic(name, len(assignment), replica_assignment=assignment, config=cfg)
    else:
        topic = NewTopic(name, partitions, 3, config=cfg)
    create_topics(cluster.bootstrap_servers, [topic])
    client = admin(cluster)
    count = len(assignment) if assignment is not None else partitions

    def ready() -> bool:
        parts = client.list_topics(name, timeout=10).topics[name].partitions
        return len(parts) == count and all(
            p.leader >= 0 and len(p.isrs) == len(p.replicas) for p in parts.values()
        )

    wait_for(f"{name}: every partition with a leader and all replicas in sync", ready, 30, 0.2)


@dataclasses.dataclass(frozen=True)
class PartitionState:
    leader: int
    replicas: tuple[int, ...]
    isr: frozenset[int]


def partition_state(
    cluster: ClusterStack, topic: str, partition: int = 0, appear_within: float = 30.0
) -> PartitionState:
    """Leader, replicas and ISR as the controller last told the brokers (a metadata request).
    A new admin client may ask a broker that has not applied the topic's creation yet (seen in
    CI right after ``create_topic`` had it ready on another broker): the partition gets
    ``appear_within`` seconds to show up; a KeyError after that."""
    client = admin(cluster)
    deadline = time.monotonic() + appear_within
    while True:
        try:
            md = client.list_topics(topic, timeout=10).topics[topic].partitions[partition]
            return PartitionState(md.leader, tuple(md.replicas), frozenset(md.isrs))
        except KeyError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def wait_value(what: str, read, predicate, timeout: float, interval: float, missing=()):
    """``read()``'s first value for which ``predicate`` holds, looked at every ``interval``
    seconds (``read`` raising one of ``missing``: not there yet); AssertionError naming ``what``
    after ``timeout`` seconds."""
    found: list = []

    def check():
        try:
            value = read()
        except missing:
            return False
        if predicate(value):
            found.append(value)
            return True
        return False

    wait_for(what, check, timeout, interval)
    return found[-1]


def wait_state(cluster: ClusterStack, topic: str, what: str, predicate, partition: int = 0, timeout=90):
    """Until ``predicate(PartitionState)`` holds; returns that state."""
    return wait_value(
        f"{topic}-{partition}: {what}",
        # KeyError: the topic or partition not in this broker's metadata yet
        lambda: partition_state(cluster, topic, partition, appear_within=0),
        predicate,
        timeout,
        0.2,
        missing=KeyError,
    )


def elect_preferred(cluster: ClusterStack, topic: str, partition: int = 0) -> int:
    """A preferred leader election (the first replica leads); returns the new leader."""
    client = admin(cluster)
    preferred = partition_state(cluster, topic, partition).replicas[0]
    result = client.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, partition)]).result(30)
    for tp, err in result.items():
        if err is not None and "ELECTION_NOT_NEEDED" not in str(err):
            raise AssertionError(f"preferred leader election of {tp.topic}-{tp.partition}: {err}")
    wait_state(cluster, topic, f"broker {preferred} leads", lambda s: s.leader == preferred, partition)
    return preferred


def reassign(cluster: ClusterStack, topic: str, replicas: list[int], partition: int = 0, timeout=120) -> None:
    """Move the partition to ``replicas`` with kafka-reassign-partitions.sh (Kafka's own tool, as
    an operator would) and wait until it is complete: the replica set is exactly ``replicas``,
    all in sync."""
    plan = Path(cluster.workdir) / f"reassign-{topic}-{partition}.json"
    plan.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": topic, "partition": partition, "replicas": replicas}]}
        )
    )
    base = ["--bootstrap-server", cluster.bootstrap_servers, "--reassignment-json-file", str(plan)]
    run = subprocess.run(
        tool_command(cluster.dist, "kafka-reassign-partitions", [*base, "--execute"]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "Successfully started partition reassignment" in run.stdout, (
        run.stdout + run.stderr
    )
    wait_state(
        cluster,
        topic,
        f"replicas {replicas}, all in sync",
        lambda s: list(s.replicas) == replicas and s.isr == set(replicas),
        partition,
        timeout,
    )


# -- what the brokers and the sidecars hold ---------------------------------------------------------


def local_start(node: ClusterNode, topic: str, partition: int = 0) -> int | None:
    """The base offset of the broker's first local segment of the partition (None: no segment)."""
    offsets = local_segment_offsets(node.broker, topic, partition)
    return offsets[0] if offsets else None


def wait_local_start(node: ClusterNode, topic: str, at_least: int, partition: int = 0, timeout=120) -> None:
    """Until the broker's disk holds nothing below ``at_least`` (tiered, then deleted locally)."""
    wait_for(
        f"broker {node.node_id}: {topic}-{partition} has nothing below offset {at_least} on its disk",
        lambda: (local_start(node, topic, partition) or 0) >= at_least,
        timeout,
    )


@dataclasses.dataclass(frozen=True)
class RemoteSegment:
    base: str  # object key without suffix
    segment_id: str
    partition: int
    start: int
    end: int
    broker_id: int  # the broker whose sidecar copied it
    leader_epochs: dict[int, int]


def remote_segments(store, topic: str, partition: int | None = None) -> list[RemoteSegment]:
    """The complete segments (manifest written, which comes last) of ``topic`` in the bucket,
    by start offset, with what their manifests say."""
    layout = KeyLayout(KEY_PREFIX)
    out = []
    for obj in store.list(KEY_PREFIX):
        key = layout.parse(obj.key)
        if key is None or key.topic != topic or key.suffix != "rsm-manifest":
            continue
        if partition is not None and key.partition != partition:
            continue
        m = SegmentManifest.from_bytes(store.get(obj.key), obj.key).segment or {}
        out.append(
            RemoteSegment(
                base=key.base,
                segment_id=key.segment_id,
                partition=key.partition,
                start=int(m["startOffset"]),
                end=int(m["endOffset"]),
                broker_id=int(m["brokerId"]),
                leader_epochs={int(k): int(v) for k, v in m.get("segmentLeaderEpochs", {}).items()},
            )
        )
    return sorted(out, key=lambda s: (s.partition, s.start, s.end))


def wait_remote(store, topic: str, what: str, predicate, timeout=120) -> list[RemoteSegment]:
    """Until ``predicate(remote_segments(store, topic))`` holds; returns those segments."""
    segments = functools.partial(remote_segments, store, topic)
    return wait_value(f"{topic} in the bucket: {what}", segments, predicate, timeout, 0.5)


def log_end(cluster: ClusterStack, topic: str, partition: int = 0) -> int:
    """The partition's high watermark (the next offset), from its leader."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "cluster-tests-watermarks"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)[1]
    finally:
        c.close()


def wait_all_tiered(
    cluster: ClusterStack, store, topic: str, leader_id: int, partition: int = 0, everything: bool = True
) -> int:
    """Until the bucket holds the partition up to its end (nothing is produced meanwhile);
    returns the last tiered offset. With a short ``local.retention.ms`` (tests/e2e's 1 s) that
    is every record: once the active segment's newest record is older than that, the leader
    rolls it ("Rolling the active segment to make it eligible for deletion") and tiers it too.
    With ``everything=False`` (a long local retention): every closed segment on the leader."""
    leader = cluster.nodes[leader_id]

    def done(segs: list[RemoteSegment]) -> bool:
        ends = [s.end for s in segs if s.partition == partition]
        if not ends:
            return False
        if everything:
            return max(ends) + 1 == log_end(cluster, topic, partition)
        return max(ends) + 1 == local_segment_offsets(leader.broker, topic, partition)[-1]

    what = "every record" if everything else f"every closed segment of broker {leader_id}"
    segs = wait_remote(store, topic, f"partition {partition}: {what}", done)
    return max(s.end for s in segs if s.partition == partition)


def sidecar_metric(node: ClusterNode, name: str, **labels: str) -> float:
    """The sum of the samples of metric ``name`` with ``labels`` in one scrape of the node's sidecar."""
    text = urllib.request.urlopen(node.metrics_url, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def served_bytes(node: ClusterNode) -> float:
    """Segment bytes the node's sidecar served to its broker's remote reads so far."""
    return sidecar_metric(node, "rsm_bytes_total", kind="fetch_served")


def index_fetches(node: ClusterNode) -> float:
    return sidecar_metric(node, "rsm_operations_total", op="fetch_index", outcome="OK")


def log_since(node: ClusterNode, offset: int) -> str:
    with open(node.broker.server_log, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def log_size(node: ClusterNode) -> int:
    path = node.broker.server_log
    return path.stat().st_size if path.exists() else 0


# -- records --------------------------------------------------------------------------------------


def produce_records(
    bootstrap: str, topic: str, n: int, seed: int, partition: int = 0, age_ms: int = 600_000, **extra
) -> list[Rec]:
    """``n`` records of tests/e2e's kinds (null keys, headers, tombstones, values of up to 3 KB)
    with timestamps from ``age_ms`` ago; returns them with their offsets."""
    t0 = int(time.time() * 1000) - age_ms
    return produce(bootstrap, topic, records(n, random.Random(seed), t0), partition=partition, **extra)


def produce_bytes(
    bootstrap: str, topic: str, size: int, seed: int, partition: int = 0, age_ms: int = 0
) -> list[Rec]:
    """About ``size`` bytes of 10 KB records (to roll segments), remembered like any other,
    with timestamps from ``age_ms`` ago."""
    rng = random.Random(seed)
    t0 = int(time.time() * 1000) - age_ms
    recs = [
        Rec(b"fill-%d" % i, b"fill-%d-" % i + rng.randbytes(10_000), (), t0 + i)
        for i in range(size // 10_000 + 1)
    ]
    return produce(bootstrap, topic, recs, partition=partition, **{"linger.ms": 20})


@dataclasses.dataclass
class Written:
    """Records of one partition as the producers wrote them: every record with its offset, and
    the offsets of those in aborted transactions."""

    records: list[Rec] = dataclasses.field(default_factory=list)
    aborted: set[int] = dataclasses.field(default_factory=set)

    def add(self, recs: list[Rec], aborted: bool = False) -> Written:
        self.records.extend(recs)
        if aborted:
            self.aborted.update(r.offset for r in recs)
        return self

    @property
    def end(self) -> int:
        return max(r.offset for r in self.records) + 1

    def visible(self, isolation: str, start: int = 0) -> list[Rec]:
        """What a consumer reading from ``start`` must get, in order."""
        recs = sorted((r for r in self.records if r.offset >= start), key=lambda r: r.offset)
        if isolation == "read_committed":
            recs = [r for r in recs if r.offset not in self.aborted]
        return recs


def produce_transactions(
    bootstrap: str, topic: str, written: Written, rounds: int, seed: int, partition: int = 0
) -> Written:
    """``rounds`` transactions of 20-60 records (every third one aborted, after its records
    reached the log), added to ``written``."""
    rng = random.Random(seed)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}-{seed}", "linger.ms": 5})
    p.init_transactions(60)
    t0 = int(time.time() * 1000) - 300_000
    for round_ in range(rounds):
        p.begin_transaction()
        batch = records(rng.randrange(20, 60), rng, t0 + round_ * 1000)
        batch = [
            dataclasses.replace(r, value=b"txn-%d-%d:" % (seed, round_) + (r.value or b"")) for r in batch
        ]
        offsets, errors = send(p, topic, batch, partition)
        p.flush(60)  # on the log before the outcome, so aborted records really are there
        assert not errors and len(offsets) == len(batch), f"transactional records not delivered: {errors}"
        aborted = round_ % 3 == 1
        if aborted:
            p.abort_transaction(60)
        else:
            p.commit_transaction(60)
        written.add([dataclasses.replace(r, offset=offsets[i]) for i, r in enumerate(batch)], aborted)
    return written


def check_read(
    bootstrap: str,
    topic: str,
    written: Written,
    isolation: str,
    start: int = 0,
    partition: int = 0,
    timeout: float = 180,
) -> None:
    """A consumer reading from ``start`` with ``isolation`` gets exactly the records it must:
    each once, in offset order, with its key, value, headers and timestamp; for
    read_committed none of an aborted transaction."""
    expected = written.visible(isolation, start)
    got = consume(bootstrap, topic, start, len(expected), partition, isolation, timeout)
    assert_same_records(got, expected)


class LoadProducer(BackgroundProducer):
    """A :class:`BackgroundProducer` over the topic's partitions whose records come back as
    :class:`Written` per partition."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, seed: int, rate: int = 1_000_000):
        super().__init__(bootstrap, topic, seed, partitions=partitions, rate=rate, prefix="load")

    def finish(self) -> dict[int, Written]:  # type: ignore[override]
        """Stop, wait for every delivery; the records of each partition."""
        return {p: Written(records) for p, records in super().finish().items()}


def produced_bytes(load: LoadProducer) -> int:
    return sum(len(r.value or b"") for _, r in list(load.sent))


class LoadConsumer(threading.Thread):
    """Reads every partition of a :class:`LoadProducer`'s topic from offset 0 while it runs and
    checks each record against what the producer sent (key, value, partition); with ``rewind``
    it starts over from offset 0 each time it has caught up (so it keeps reading tiered
    segments). Errors the client reports are counted, not fatal: the checks after :meth:`finish`
    say whether anything was lost, repeated or wrong."""

    def __init__(
        self,
        bootstrap: str,
        load: LoadProducer,
        seed: int,
        rewind: bool = False,
        pass_every: float = 2.0,
        before: dict[int, Written] | None = None,
    ):
        super().__init__(daemon=True)
        self.bootstrap, self.load, self.rewind = bootstrap, load, rewind
        #: records written before the load started, by partition and offset
        self.before = {(p, r.offset): r for p, w in (before or {}).items() for r in w.records}
        self.pass_every = pass_every  # a rewinding reader starts a pass at most this often (seconds)
        self.group = f"load-reader-{seed}"
        self.stopping = threading.Event()
        #: per pass: partition -> offset -> index of the record in load.sent
        self.passes: list[dict[int, dict[int, int]]] = [{}]
        #: (partition, offset, record index) of records found a second time at an offset no
        #: delivery report named, each acknowledged at another offset (see :meth:`finish`)
        self.duplicates: set[tuple[int, int, int]] = set()
        self.wrong: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        from confluent_kafka import Consumer, KafkaException

        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "enable.auto.commit": False,
                "fetch.max.bytes": 5_000_000,
            }
        )
        parts = [TopicPartition(self.load.topic, p, 0) for p in range(self.load.partitions)]
        c.assign(parts)
        ends: dict[int, int] | None = None  # a rewinding pass ends at the high watermarks of its start
        started = time.monotonic()
        try:
            while not self.stopping.is_set():
                if self.rewind and ends is None and time.monotonic() - started >= self.pass_every:
                    try:
                        ends = {
                            tp.partition: c.get_watermark_offsets(tp, timeout=5, cached=False)[1]
                            for tp in parts
                        }
                    except KafkaException:
                        pass  # a broker restarting: ask again
                m = c.poll(0.2)
                if m is not None and m.error():
                    self.errors.append(str(m.error()))
                elif m is not None:
                    self._check(m)
                if ends is not None and all(self._next(p) >= end for p, end in ends.items()):
                    self.passes.append({})
                    c.assign(parts)
                    ends, started = None, time.monotonic()
        finally:
            c.close()

    def _next(self, partition: int) -> int:
        """The offset after the last one this pass read of ``partition``."""
        seen = self.passes[-1].get(partition)
        return max(seen) + 1 if seen else 0

    def _check(self, m) -> None:
        key = m.key() or b""
        seen = self.passes[-1].setdefault(m.partition(), {})
        if m.offset() in seen:
            self.wrong.append(f"offset {m.partition()}/{m.offset()} read twice in one pass")
        earlier = self.before.get((m.partition(), m.offset()))
        if earlier is not None:
            if (key, m.value()) != (earlier.key, earlier.value):
                self.wrong.append(f"offset {m.partition()}/{m.offset()} is not what was written there")
            seen[m.offset()] = -1
            return
        if not key.startswith(b"load-"):
            self.wrong.append(f"unknown key {key[:40]!r} at {m.partition()}/{m.offset()}")
            return
        i = int(key[5:])
        part, rec = self.load.sent[i]
        if m.partition() != part or m.value() != rec.value:
            self.wrong.append(f"record {i} at {m.partition()}/{m.offset()} is not what was sent")
        seen[m.offset()] = i

    def finish(self, written: dict[int, Written]) -> int:
        """Stop; :func:`check_passes` on what it read (its duplicates go to
        :attr:`duplicates`). Returns the number of records read."""
        self.stopping.set()
        self.join(60)
        assert not self.wrong, self.wrong[:10]
        who = f"{'re-reader' if self.rewind else 'head reader'} ({self.group})"
        total, self.duplicates = check_passes(who, self.passes, written)
        return total


def check_passes(
    who: str, passes: list[dict[int, dict[int, int]]], written: dict[int, Written]
) -> tuple[int, set[tuple[int, int, int]]]:
    """Every pass (partition -> offset -> index of the load's record read there, -1 for a
    record written before the load) read each partition from offset 0 without a gap, each offset
    holding the record the producer was told it got. Returns the records read and the duplicates.

    One exception, the producer's and not the broker's or the plugin's: librdkafka's idempotent
    producer may write a record twice when a leader change makes it bump its producer epoch (a
    batch the old leader appended and never acknowledged is sent again under the new epoch;
    confluentinc/librdkafka#4953, open in 2.16). Such a record is read at an offset no delivery
    report named, and at the offset its report named: it is returned as (partition, offset,
    record index) for the caller to expect in later reads. Anything else at an unnamed offset,
    and any record at an offset named for another, fails."""
    by_offset = {
        p: {r.offset: int(r.key[5:]) for r in w.records if r.key.startswith(b"load-")}
        for p, w in written.items()
    }
    told = {  # record index -> (partition, offset) its delivery report gave
        int(r.key[5:]): (p, r.offset)
        for p, w in written.items()
        for r in w.records
        if r.key.startswith(b"load-")
    }
    total = 0
    duplicates: set[tuple[int, int, int]] = set()
    for n, seen_pass in enumerate(passes):
        for p, seen in seen_pass.items():
            offsets = sorted(seen)
            assert offsets == list(range(len(offsets))), (
                f"{who}, pass {n}, partition {p}: a gap in {offsets[:5]}..."
            )
            for o in offsets:
                i = seen[o]
                if i < 0:  # written before the load (compared when read)
                    continue
                acked = told.get(i)
                if by_offset[p].get(o) is None and acked is not None and acked[0] == p and acked[1] > o:
                    duplicates.add((p, o, i))  # sent again later, and acknowledged there
                    continue
                assert by_offset[p].get(o) == i, (
                    f"{who}, pass {n}: offset {p}/{o} holds record {i}, which the producer was told "
                    f"went to {told.get(i)}; the producer was told offset {p}/{o} holds record "
                    f"{by_offset[p].get(o)}; this pass read record {i} at offsets "
                    f"{sorted(x for x, r in seen.items() if r == i)}; near it (offset, read, told): "
                    f"{[(x, seen.get(x), by_offset[p].get(x)) for x in range(o - 3, o + 4)]}"
                )
            total += len(offsets)
    return total, duplicates
