"""What the end-to-end tests do with Kafka: produce remembered records, wait for tiering,
consume, and look at remote storage."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from devstack.common import wait_for
from devstack.kafka import create_topics
from rsm_sidecar.format.keys import KeyLayout

SEGMENT_BYTES = 1024 * 1024  # the smallest topic segment.bytes Kafka 4.1+ accepts
KEY_PREFIX = "tiered/"  # config/sidecar.toml


@dataclasses.dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int
    offset: int = -1


class BackgroundProducer(threading.Thread):
    """Produces known records (5 KB values) round-robin to the topic's first ``partitions``
    partitions until stopped, about ``rate`` bytes/s, idempotent (acks=all); remembers the
    offset the broker gave each one. Delivery errors are collected, not ignored: :meth:`finish`
    fails on any, and on a record without an offset."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        seed: int,
        partitions: int = 1,
        rate: int = 1_000_000,
        prefix: str = "bg",
    ):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.partitions, self.rate = bootstrap, topic, partitions, rate
        self.prefix = prefix.encode()
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        #: (partition, record) in the order produced
        self.sent: list[tuple[int, Rec]] = []
        #: index in ``sent`` -> the offset the broker gave the record
        self.offsets: dict[int, int] = {}
        self.errors: list[str] = []

    def run(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True})
        t0 = int(time.time() * 1000)
        per_tick = max(1, self.rate // 10 // 5000)
        while not self.stopping.is_set():
            for _ in range(per_tick):
                i = len(self.sent)
                part = i % self.partitions
                name = b"%s-%d" % (self.prefix, i)
                rec = Rec(name, name + b"-" + self.rng.randbytes(5000), (), t0 + i)
                self.sent.append((part, rec))

                def delivered(err, msg, i=i):
                    if err is not None:
                        self.errors.append(str(err))
                    else:
                        self.offsets[i] = msg.offset()

                p.produce(
                    self.topic,
                    key=rec.key,
                    value=rec.value,
                    timestamp=rec.timestamp,
                    partition=part,
                    on_delivery=delivered,
                )
            p.poll(0)
            time.sleep(0.1)
        if p.flush(120) != 0:
            self.errors.append("flush left messages undelivered")

    def finish(self) -> dict[int, list[Rec]]:
        """Stop, wait for every delivery; each partition's records with their offsets."""
        self.stopping.set()
        self.join(150)
        assert not self.is_alive(), "the background producer did not stop"
        assert not self.errors, f"delivery errors: {self.errors[:5]}"
        assert len(self.offsets) == len(self.sent)
        out: dict[int, list[Rec]] = {p: [] for p in range(self.partitions)}
        for i, (part, rec) in enumerate(self.sent):
            out[part].append(dataclasses.replace(rec, offset=self.offsets[i]))
        return out


def tiered_topic_config(**overrides) -> dict[str, str]:
    cfg = {
        "remote.storage.enable": "true",
        "local.retention.ms": "1000",
        "retention.ms": "86400000",
        "segment.bytes": str(SEGMENT_BYTES),
        "file.delete.delay.ms": "1000",
        "max.message.bytes": "3000000",
    }
    cfg.update({k.replace("_", "."): str(v) for k, v in overrides.items()})
    return cfg


def create_topic(bootstrap: str, name: str, partitions: int = 1, **config) -> None:
    create_topics(bootstrap, [NewTopic(name, partitions, 1, config=tiered_topic_config(**config))])


def records(n: int, rng: random.Random, t0: int, big_every: int = 0) -> list[Rec]:
    """Null keys, headers (with a null header value), tombstones, varied and 1 MB values,
    strictly increasing create timestamps."""
    out = []
    for i in range(n):
        key = None if i % 7 == 0 else b"key-%d" % rng.randrange(1000)
        if i % 11 == 5:
            value = None  # tombstone
        elif big_every and i % big_every == big_every - 1:
            value = rng.randbytes(1_000_000)
        else:
            value = rng.randbytes(rng.randrange(0, 80)) + b"v" * rng.randrange(0, 3000)
        headers = () if i % 3 else (("trace", b"%d" % i), ("empty", b""), ("null", None))
        out.append(Rec(key, value, headers, t0 + i * 10))
    return out


def produce(
    bootstrap: str, topic: str, recs: list[Rec], compression: str = "none", partition: int = 0, **extra
) -> list[Rec]:
    """Produce in order; return the records with the offsets the broker assigned."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": compression,
            "linger.ms": 5,
            "enable.idempotence": True,
            "message.max.bytes": 3_000_000,
            **extra,
        }
    )
    offsets, errors = send(p, topic, recs, partition)
    assert p.flush(60) == 0
    assert not errors, errors
    return [dataclasses.replace(r, offset=offsets[i]) for i, r in enumerate(recs)]


def send(p: Producer, topic: str, recs: list[Rec], partition: int = 0) -> tuple[dict[int, int], list[str]]:
    """Produce ``recs`` in order (key, value, headers, timestamp) to ``partition``: returns the
    offset of each record by its index and the delivery errors, filled as the producer reports
    deliveries (by the caller's ``flush``)."""
    offsets: dict[int, int] = {}
    errors: list[str] = []

    def on_delivery(i):
        def cb(err, msg):
            if err is not None:
                errors.append(f"record {i}: {err}")
            else:
                offsets[i] = msg.offset()

        return cb

    for i, r in enumerate(recs):
        p.produce(
            topic,
            key=r.key,
            value=r.value,
            headers=list(r.headers) or None,
            timestamp=r.timestamp,
            partition=partition,
            on_delivery=on_delivery(i),
        )
        p.poll(0)
    return offsets, errors


def filler(bootstrap: str, topic: str, size: int = 2 * SEGMENT_BYTES + 100_000, partition: int = 0) -> int:
    """Push the test records out of the active segment so they become copyable; returns
    the offset after the filler."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    last = {}
    for _i in range(size // 10_000 + 1):
        p.produce(
            topic,
            value=os.urandom(10_000),
            partition=partition,
            on_delivery=lambda e, m: last.__setitem__("o", m.offset()),
        )
    assert p.flush(60) == 0
    return last["o"] + 1


def produce_and_tier(
    stack,
    topics: dict[str, str],
    n: int = 400,
    seed: int = 0,
    age_ms: int = 3_600_000,
    big_every: int = 150,
) -> dict[str, list[Rec]]:
    """For each topic -> producer compression: create the topic, produce ``n`` records (the
    i-th topic's drawn with random seed ``seed + i``, timestamps from ``age_ms`` ago) and roll
    them out of the active segment with filler; then wait until all of them are tiered.
    Returns topic -> the produced records with their offsets."""
    t0 = int(time.time() * 1000) - age_ms
    out = {}
    for i, (topic, compression) in enumerate(topics.items()):
        create_topic(stack.bootstrap_servers, topic)
        recs = records(n, random.Random(seed + i), t0, big_every=big_every)
        out[topic] = produce(stack.bootstrap_servers, topic, recs, compression)
        filler(stack.bootstrap_servers, topic)
    for topic, recs in out.items():
        wait_tiered(stack, topic, recs[-1].offset + 1)
    return out


def error_keeping_consumer(bootstrap: str, group: str, errors: list[str], **config: object) -> Consumer:
    """A consumer in ``group`` that commits no offsets and appends each error the client reports
    (``error_cb``) to ``errors``; ``config``: more consumer settings."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "error_cb": lambda err: errors.append(str(err)),
            **config,
        }
    )


class PassReader(threading.Thread):
    """A consumer reading ``produced`` (partition -> its records, from offset 0) again and again,
    ``batch`` records per poll, until stopped after a pass that started after the stop was asked
    (:attr:`stop_after`). Keeps each pass (partition -> the records read, at most as many as
    produced), every error the consumer reported, how many records arrived and the longest wait
    between two of them. ``config``: more consumer settings (``max.partition.fetch.bytes`` for
    many small remote reads)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        produced: dict[int, list[Rec]],
        group: str,
        batch: int = 100,
        **config,
    ):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.produced = bootstrap, topic, produced
        self.group, self.batch, self.config = group, batch, config
        self.passes: list[dict[int, list[Rec]]] = []
        self.errors: list[str] = []
        self.stop_after = threading.Event()
        self.received = 0
        self.longest_wait = 0.0

    def run(self) -> None:
        c = error_keeping_consumer(self.bootstrap, self.group, self.errors, **self.config)
        try:
            while True:
                last_pass = self.stop_after.is_set()
                c.assign([TopicPartition(self.topic, p, 0) for p in self.produced])
                got: dict[int, list[Rec]] = {p: [] for p in self.produced}
                deadline = last = time.monotonic()
                deadline += 120
                while (
                    any(len(got[p]) < len(r) for p, r in self.produced.items())
                    and time.monotonic() < deadline
                ):
                    for m in c.consume(self.batch, 0.5):
                        if m.error():
                            self.errors.append(str(m.error()))
                            continue
                        now = time.monotonic()
                        self.longest_wait, last = max(self.longest_wait, now - last), now
                        if len(got[m.partition()]) < len(self.produced[m.partition()]):
                            got[m.partition()].append(
                                Rec(
                                    m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()[1], m.offset()
                                )
                            )
                        self.received += 1
                self.passes.append(got)
                if last_pass:
                    return
        finally:
            c.close()


def local_segment_offsets(broker, topic: str, partition: int = 0) -> list[int]:
    d: Path = broker.partition_dir(topic, partition)
    if not d.exists():
        return []
    return sorted(int(p.name.split(".")[0]) for p in d.iterdir() if p.name.endswith(".log"))


def remote_segments(store, topic: str | None = None) -> dict[str, dict]:
    """Remote segments by base key: {suffixes: set, start_offset, partition, topic}."""
    layout = KeyLayout(KEY_PREFIX)
    out: dict[str, dict] = {}
    for obj in store.list(KEY_PREFIX):
        parsed = layout.parse(obj.key)
        if parsed is None or (topic is not None and parsed.topic != topic):
            continue
        seg = out.setdefault(
            parsed.base,
            {
                "suffixes": set(),
                "start_offset": parsed.start_offset,
                "partition": parsed.partition,
                "topic": parsed.topic,
            },
        )
        seg["suffixes"].add(parsed.suffix)
    return out


def wait_tiered(stack, topic: str, up_to: int, partition: int = 0, timeout: float = 180) -> None:
    """Until offsets below ``up_to`` are in remote storage and gone from the broker's disk."""
    wait_for(
        f"{topic}-{partition} offsets < {up_to} tiered and deleted locally",
        lambda: (local_segment_offsets(stack.broker, topic, partition) or [0])[0] >= up_to,
        timeout,
    )


def wait_all_closed_tiered(stack, topic: str, partition: int = 0, timeout: float = 180) -> None:
    """Until only the active segment is left on the broker's disk: every closed segment is in
    remote storage, so a job reading remote storage sees the same segments until more is
    produced (tiering is asynchronous: waiting for some offsets only can race a later copy)."""
    wait_for(
        f"{topic}-{partition}: every closed segment tiered and deleted locally",
        lambda: len(local_segment_offsets(stack.broker, topic, partition)) == 1,
        timeout,
    )


def _records(
    bootstrap: str, topic: str, partition: int, start: int, isolation: str, poll: float, **conf: object
) -> Iterator[Rec | None]:
    """The records of ``topic``-``partition`` from ``start`` as a new consumer of its own reads
    them (``None`` after each ``poll`` seconds without one), until the caller stops."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"e2e-{os.urandom(4).hex()}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            **conf,
        }
    )
    try:
        c.assign([TopicPartition(topic, partition, start)])
        while True:
            m = c.poll(poll)
            if m is not None and m.error():
                raise KafkaException(m.error())
            yield (
                None
                if m is None
                else Rec(m.key(), m.value(), tuple(m.headers() or ()), m.timestamp()[1], m.offset())
            )
    finally:
        c.close()


def consume(
    bootstrap: str,
    topic: str,
    start: int,
    count: int,
    partition: int = 0,
    isolation: str = "read_uncommitted",
    timeout: float = 120,
) -> list[Rec]:
    out: list[Rec] = []
    deadline = time.monotonic() + timeout
    big = {"fetch.max.bytes": 5_000_000, "max.partition.fetch.bytes": 5_000_000}
    with contextlib.closing(_records(bootstrap, topic, partition, start, isolation, 1.0, **big)) as records:
        for rec in records:
            if rec is not None:
                out.append(rec)
            if len(out) >= count or time.monotonic() >= deadline:
                break
    return out


def consume_until_idle(
    bootstrap: str,
    topic: str,
    start: int,
    idle: float = 8.0,
    partition: int = 0,
    isolation: str = "read_uncommitted",
) -> list[Rec]:
    """Everything from ``start`` until no message arrives for ``idle`` seconds."""
    out: list[Rec] = []
    last = time.monotonic()
    with contextlib.closing(_records(bootstrap, topic, partition, start, isolation, 0.5)) as records:
        for rec in records:
            if rec is not None:
                last = time.monotonic()
                out.append(rec)
            elif time.monotonic() - last >= idle:
                break
    return out


def sealed_manifest(stack, manifest) -> bytes:
    """``manifest`` serialised with its authenticator recomputed under the stack's keys:
    what the sidecar itself writes (tests use it to plant segments a key holder made)."""
    from rsm_sidecar.config import Config
    from rsm_sidecar.transform import authentication
    from rsm_sidecar.transform.keyring import Keyring

    if manifest.encryption is not None:
        cfg, env = stack.sidecar_config_env()
        keyring = Keyring.from_config(Config.load(cfg, environ=env))
        data_key = keyring.unwrap(manifest.encryption.key_id, manifest.encryption.wrapped_key)
        manifest.auth = authentication.authenticator(manifest, data_key)
    return manifest.to_bytes()
