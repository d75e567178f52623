"""What Kafka records about tiered segments: the ``__remote_log_metadata`` topic read to its end
(the records decoded by :mod:`rsm_sidecar.kafka.remote_log_metadata`) and folded into each
segment's latest state, as Kafka's topic-based ``RemoteLogMetadataManager`` folds them.

Every record of one topic partition goes to the same partition of the metadata topic, so the
records of a segment arrive in the order they were written and the last one read is its state.
The topic is read from its first offset up to the end offsets taken when reading starts. Memory:
one small entry per segment Kafka ever recorded (about 300 bytes; 100,000 segments about 30 MB).

Reading needs ``confluent-kafka`` (the ``kafka`` extra of the package).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping

from rsm_sidecar.errors import ConfigError, RsmError, Unavailable
from rsm_sidecar.kafka import remote_log_metadata as rlm

TOPIC = "__remote_log_metadata"
#: no record for this long while the end is not reached: the read fails
STALL_SECONDS = 60.0


@dataclasses.dataclass
class KafkaSegment:
    """One segment as Kafka's metadata has it, after every record about it."""

    topic: str
    topic_id: str
    partition: int
    segment_id: str
    state: str
    start_offset: int = -1  # -1: the COPY_SEGMENT_STARTED record was not read (see ``incomplete``)
    end_offset: int = -1
    broker_id: int = -1
    #: when the copy started (the COPY_SEGMENT_STARTED record's event time, ms)
    started_ms: int = -1
    #: when the latest state was recorded (ms)
    updated_ms: int = -1
    custom_metadata: bytes | None = None

    @property
    def describe(self) -> str:
        end = self.end_offset if self.end_offset >= 0 else "?"
        return f"{self.topic}-{self.partition}@{self.start_offset}..{end} ({self.segment_id})"


@dataclasses.dataclass
class KafkaMetadata:
    """The folded records: segments by segment id, partition deletions, and what was read."""

    segments: dict[str, KafkaSegment] = dataclasses.field(default_factory=dict)
    #: (topic id, partition) -> state of the latest RemotePartitionDeleteMetadataRecord
    deleted_partitions: dict[tuple[str, int], str] = dataclasses.field(default_factory=dict)
    #: topic ids that any record names (topics this cluster tiered)
    topic_ids: set[str] = dataclasses.field(default_factory=set)
    records: int = 0
    #: metadata partitions whose first records were removed (their earliest offset is above 0):
    #: segments they recorded may be missing from ``segments``
    incomplete: dict[int, int] = dataclasses.field(default_factory=dict)

    def apply(self, record: rlm.SegmentRecord | rlm.PartitionDeleteRecord) -> None:
        self.records += 1
        self.topic_ids.add(record.topic_id)
        if isinstance(record, rlm.PartitionDeleteRecord):
            self.deleted_partitions[(record.topic_id, record.partition)] = record.state
            return
        seg = self.segments.get(record.segment_id)
        if seg is None:
            seg = self.segments[record.segment_id] = KafkaSegment(
                record.topic, record.topic_id, record.partition, record.segment_id, record.state
            )
        seg.state = record.state
        seg.updated_ms = record.event_timestamp_ms
        seg.broker_id = record.broker_id
        if not record.update:
            seg.start_offset, seg.end_offset = record.start_offset, record.end_offset
            seg.started_ms = record.event_timestamp_ms
        if record.custom_metadata is not None:
            seg.custom_metadata = record.custom_metadata

    def partition_deleted(self, topic_id: str, partition: int) -> bool:
        """Kafka finished deleting the partition's remote data (it lists nothing of it)."""
        return self.deleted_partitions.get((topic_id, partition)) == "DELETE_PARTITION_FINISHED"


def fold(values: Iterable[bytes]) -> KafkaMetadata:
    """Record values in the order of one metadata partition (tests, benchmarks)."""
    out = KafkaMetadata()
    for v in values:
        out.apply(rlm.decode(v))
    return out


def load_client_config(path: str | None) -> dict[str, str]:
    """``key=value`` lines of a client properties file (librdkafka's names: security.protocol,
    sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, ...); ``#`` comments."""
    if not path:
        return {}
    out: dict[str, str] = {}
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise ConfigError(f"--command-config: cannot read {path}: {e.strerror}") from None
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"--command-config {path} line {n}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def read(
    bootstrap: str,
    client_config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    progress: Callable[[int], None] | None = None,
) -> KafkaMetadata:
    """Read ``__remote_log_metadata`` of the cluster at ``bootstrap`` from its first offset to
    the end offsets of the moment reading starts, and fold it."""
    try:
        from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
    except ImportError:
        raise ConfigError(
            "reading Kafka's __remote_log_metadata needs confluent-kafka: pip install 'rsm-sidecar[kafka]'"
        ) from None
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": "rsm-sidecar-inspect",  # required by the client; nothing is committed
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "earliest",
        **(client_config or {}),
    }
    try:
        consumer = Consumer(conf)
    except KafkaException as e:
        raise ConfigError(f"Kafka client configuration: {e}") from None
    try:
        try:
            md = consumer.list_topics(TOPIC, timeout=timeout)
        except KafkaException as e:
            raise Unavailable(f"cannot reach the Kafka cluster at {bootstrap}: {e}") from None
        topic = md.topics.get(TOPIC)
        if topic is None or topic.error is not None or not topic.partitions:
            raise RsmError(
                f"the cluster at {bootstrap} has no readable {TOPIC} topic"
                + (f" ({topic.error})" if topic is not None and topic.error is not None else "")
                + ": is tiered storage (remote.log.storage.system.enable) on, with the topic-based "
                "RemoteLogMetadataManager?"
            )
        out = KafkaMetadata()
        ends: dict[int, int] = {}
        starts = []
        for p in sorted(topic.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=timeout)
            if low > 0:
                out.incomplete[p] = low
            if high > low:
                ends[p] = high
                starts.append(TopicPartition(TOPIC, p, low))
        if not starts:
            return out
        consumer.assign(starts)
        position = {tp.partition: tp.offset for tp in starts}
        last_progress = time.monotonic()
        while any(position[p] < end for p, end in ends.items()):
            batch = consumer.consume(1000, timeout=1.0)
            if not batch:
                if time.monotonic() - last_progress > STALL_SECONDS:
                    behind = {p: end - position[p] for p, end in ends.items() if position[p] < end}
                    raise Unavailable(
                        f"reading {TOPIC} stalled for {STALL_SECONDS:.0f} s ({behind} records left)"
                    )
                continue
            last_progress = time.monotonic()
            for m in batch:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise Unavailable(f"reading {TOPIC}: {err}")
                p, offset = m.partition(), m.offset()
                if p is None or offset is None or offset >= ends.get(p, 0):
                    continue
                position[p] = offset + 1
                value = m.value()
                if value is None:
                    continue
                try:
                    out.apply(rlm.decode(value))
                except RsmError as e:
                    raise type(e)(f"{TOPIC} partition {p} offset {offset}: {e}") from None
            if progress:
                progress(out.records)
        return out
    finally:
        consumer.close()
