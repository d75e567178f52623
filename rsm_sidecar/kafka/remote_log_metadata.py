"""The records of Kafka's ``__remote_log_metadata`` topic, decoded: what the topic-based
``RemoteLogMetadataManager`` (TBRLMM, KIP-405) records about every tiered segment.

A record value is what Kafka's ``RemoteLogMetadataSerde`` writes (a ``BytesApiMessageSerde``):

    frame version (unsigned varint, 1) | api key (unsigned varint) | api version (unsigned varint)
    | the message

The messages are Kafka's generated messages in "flexible" encoding (every version so far):
compact strings and arrays (unsigned varint length + 1), compact nullable bytes (0 = null),
UUIDs as 16 bytes, big-endian fixed-width integers, and a tagged-field section (unsigned
varint count, then tag, size, bytes) after every struct, nested ones included. Their schemas
are ``storage/src/main/resources/message/*Record.json`` in Apache Kafka:

* api key 0, ``RemoteLogSegmentMetadataRecord`` (a copy started: the whole metadata):
  segment id {topic-id-partition {name, id, partition}, id}, start offset, end offset, broker
  id, max timestamp, event timestamp, leader epochs [{epoch, start offset}], size in bytes,
  custom metadata (nullable bytes), state (int8); tags 0 ``TxnIndexEmpty`` (4.0+), 1
  ``BrokerLeaderEpoch`` (version 1);
* api key 1, ``RemoteLogSegmentMetadataUpdateRecord`` (a later state of that segment): segment
  id, broker id, event timestamp, custom metadata, state; tags 0 ``BrokerLeaderEpoch``, 1
  ``EndOffset`` (version 1);
* api key 2, ``RemotePartitionDeleteMetadataRecord`` (a partition's remote data being deleted,
  e.g. topic deletion): topic-id-partition, broker id, event timestamp, state (int8); tags 0
  ``BrokerLeaderEpoch``, 1 ``EndOffset`` (version 1).

Versions 0 and 1 differ only in tagged fields; a version above 1 may add fields this reader
does not know, so it is refused (``UnsupportedFormatError``) rather than misread. Unknown tags
are skipped, as Kafka does. Api key 3 (``RemoteLogSegmentMetadataSnapshotRecord``) lives in
the metadata consumer's snapshot files, never in the topic.

The states, as Kafka numbers them (``RemoteLogSegmentState``, ``RemotePartitionDeleteState``):
segment 0 ``COPY_SEGMENT_STARTED``, 1 ``COPY_SEGMENT_FINISHED``, 2 ``DELETE_SEGMENT_STARTED``,
3 ``DELETE_SEGMENT_FINISHED``; partition 0 ``DELETE_PARTITION_MARKED``, 1
``DELETE_PARTITION_STARTED``, 2 ``DELETE_PARTITION_FINISHED``.

:func:`encode` writes the same format (tests and benchmarks feed it to the decoder and to a
broker).
"""

from __future__ import annotations

import base64
import dataclasses
import struct

from rsm_sidecar.format import varint as _codec

from .errors import CorruptRecordError, TruncatedError, UnsupportedFormatError

FRAME_VERSION = 1
SEGMENT, SEGMENT_UPDATE, PARTITION_DELETE, SNAPSHOT = 0, 1, 2, 3
MAX_VERSION = 1

COPY_SEGMENT_STARTED, COPY_SEGMENT_FINISHED = "COPY_SEGMENT_STARTED", "COPY_SEGMENT_FINISHED"
DELETE_SEGMENT_STARTED, DELETE_SEGMENT_FINISHED = "DELETE_SEGMENT_STARTED", "DELETE_SEGMENT_FINISHED"
SEGMENT_STATES = (
    COPY_SEGMENT_STARTED,
    COPY_SEGMENT_FINISHED,
    DELETE_SEGMENT_STARTED,
    DELETE_SEGMENT_FINISHED,
)
PARTITION_STATES = ("DELETE_PARTITION_MARKED", "DELETE_PARTITION_STARTED", "DELETE_PARTITION_FINISHED")
SOURCE = "<__remote_log_metadata record>"


def uuid_string(raw: bytes) -> str:
    """A Kafka ``Uuid``'s string form: URL-safe base64 of its 16 bytes, no padding."""
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@dataclasses.dataclass(frozen=True)
class SegmentRecord:
    """``RemoteLogSegmentMetadataRecord`` (``state`` is COPY_SEGMENT_STARTED when a broker
    writes it) or, with the fields it lacks left at their defaults,
    ``RemoteLogSegmentMetadataUpdateRecord`` (``update`` True)."""

    topic: str
    topic_id: str
    partition: int
    segment_id: str
    state: str
    broker_id: int
    event_timestamp_ms: int
    update: bool = False
    start_offset: int = -1
    end_offset: int = -1
    max_timestamp_ms: int = -1
    leader_epochs: tuple[tuple[int, int], ...] = ()
    segment_size: int = -1
    custom_metadata: bytes | None = None
    txn_index_empty: bool | None = None
    broker_leader_epoch: int = -1


@dataclasses.dataclass(frozen=True)
class PartitionDeleteRecord:
    """``RemotePartitionDeleteMetadataRecord``."""

    topic: str
    topic_id: str
    partition: int
    state: str
    broker_id: int
    event_timestamp_ms: int


class _Reader:
    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.pos = 0

    def _take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise TruncatedError(f"the record ends inside {what}", source=SOURCE, position=self.pos)
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def uvarint(self, what: str) -> int:
        try:
            value, self.pos = _codec.read_unsigned_varint(self.data, self.pos)
        except _codec.TruncatedVarintError:
            raise TruncatedError(f"the record ends inside {what}", source=SOURCE, position=self.pos) from None
        except _codec.VarintError as e:
            raise CorruptRecordError(f"{what}: {e}", source=SOURCE, position=self.pos) from None
        return value

    def fixed(self, fmt: str, what: str) -> int:
        value: int = struct.unpack(fmt, self._take(struct.calcsize(fmt), what))[0]
        return value

    def int8(self, what: str) -> int:
        return self.fixed(">b", what)

    def int32(self, what: str) -> int:
        return self.fixed(">i", what)

    def int64(self, what: str) -> int:
        return self.fixed(">q", what)

    def uuid(self, what: str) -> str:
        return uuid_string(bytes(self._take(16, what)))

    def string(self, what: str) -> str:
        n = self.uvarint(what) - 1
        if n < 0:
            raise CorruptRecordError(f"{what} is null", source=SOURCE, position=self.pos)
        try:
            return bytes(self._take(n, what)).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptRecordError(f"{what} is not UTF-8: {e}", source=SOURCE, position=self.pos) from None

    def nullable_bytes(self, what: str) -> bytes | None:
        n = self.uvarint(what) - 1
        return None if n < 0 else bytes(self._take(n, what))

    def tags(self, what: str) -> dict[int, memoryview]:
        out = {}
        for _ in range(self.uvarint(f"{what} tagged-field count")):
            tag = self.uvarint(f"{what} tag")
            out[tag] = self._take(self.uvarint(f"{what} tag {tag} size"), f"{what} tag {tag}")
        return out

    def topic_id_partition(self) -> tuple[str, str, int]:
        name = self.string("topic name")
        topic_id = self.uuid("topic id")
        partition = self.int32("partition")
        self.tags("topic-id-partition")
        return name, topic_id, partition

    def segment_id(self) -> tuple[str, str, int, str]:
        name, topic_id, partition = self.topic_id_partition()
        segment_id = self.uuid("segment id")
        self.tags("segment id")
        return name, topic_id, partition, segment_id


def _state(states: tuple[str, ...], n: int, pos: int) -> str:
    if not 0 <= n < len(states):
        raise CorruptRecordError(f"unknown state {n}", source=SOURCE, position=pos)
    return states[n]


def _tag_int(tags: dict[int, memoryview], tag: int, fmt: str, default: int) -> int:
    raw = tags.get(tag)
    if raw is None:
        return default
    if len(raw) != struct.calcsize(fmt):
        raise CorruptRecordError(f"tagged field {tag} has {len(raw)} bytes", source=SOURCE)
    value: int = struct.unpack(fmt, raw)[0]
    return value


def decode(value: bytes) -> SegmentRecord | PartitionDeleteRecord:
    """One record value of ``__remote_log_metadata``."""
    r = _Reader(value)
    frame = r.uvarint("frame version")
    if frame != FRAME_VERSION:
        raise UnsupportedFormatError(f"frame version {frame} (only {FRAME_VERSION} is known)", source=SOURCE)
    api_key = r.uvarint("api key")
    version = r.uvarint("api version")
    if api_key not in (SEGMENT, SEGMENT_UPDATE, PARTITION_DELETE):
        raise UnsupportedFormatError(f"api key {api_key} is not a record of this topic", source=SOURCE)
    if version > MAX_VERSION:
        raise UnsupportedFormatError(
            f"api key {api_key} version {version}: written by a Kafka newer than this reader "
            f"(versions 0-{MAX_VERSION})",
            source=SOURCE,
        )
    if api_key == PARTITION_DELETE:
        name, topic_id, partition = r.topic_id_partition()
        broker, event_ts = r.int32("broker id"), r.int64("event timestamp")
        pos = r.pos
        state = _state(PARTITION_STATES, r.int8("state"), pos)
        r.tags("record")
        out: SegmentRecord | PartitionDeleteRecord = PartitionDeleteRecord(
            name, topic_id, partition, state, broker, event_ts
        )
    elif api_key == SEGMENT:
        name, topic_id, partition, segment_id = r.segment_id()
        start, end = r.int64("start offset"), r.int64("end offset")
        broker = r.int32("broker id")
        max_ts, event_ts = r.int64("max timestamp"), r.int64("event timestamp")
        epochs = []
        n = r.uvarint("leader epochs") - 1
        for _ in range(max(0, n)):
            epochs.append((r.int32("leader epoch"), r.int64("leader epoch start offset")))
            r.tags("leader epoch entry")
        size = r.int32("segment size")
        custom = r.nullable_bytes("custom metadata")
        pos = r.pos
        state = _state(SEGMENT_STATES, r.int8("state"), pos)
        tags = r.tags("record")
        txn = tags.get(0)
        out = SegmentRecord(
            name, topic_id, partition, segment_id, state, broker, event_ts,
            start_offset=start, end_offset=end, max_timestamp_ms=max_ts, leader_epochs=tuple(epochs),
            segment_size=size, custom_metadata=custom,
            txn_index_empty=None if txn is None else bool(_tag_int(tags, 0, ">?", 0)),
            broker_leader_epoch=_tag_int(tags, 1, ">i", -1),
        )  # fmt: skip
    else:
        name, topic_id, partition, segment_id = r.segment_id()
        broker, event_ts = r.int32("broker id"), r.int64("event timestamp")
        custom = r.nullable_bytes("custom metadata")
        pos = r.pos
        state = _state(SEGMENT_STATES, r.int8("state"), pos)
        tags = r.tags("record")
        out = SegmentRecord(
            name, topic_id, partition, segment_id, state, broker, event_ts, update=True,
            custom_metadata=custom, broker_leader_epoch=_tag_int(tags, 0, ">i", -1),
            end_offset=_tag_int(tags, 1, ">q", -1),
        )  # fmt: skip
    if r.pos != len(r.data):
        raise CorruptRecordError(
            f"{len(r.data) - r.pos} bytes after the message", source=SOURCE, position=r.pos
        )
    return out


# -- writing (tests, benchmarks) --------------------------------------------------------------
def _uv(n: int) -> bytes:
    return _codec.encode_unsigned_varint(n)


def _uuid_bytes(s: str) -> bytes:
    raw = base64.urlsafe_b64decode(s + "==")
    if len(raw) != 16:
        raise ValueError(f"{s!r} is not a Kafka Uuid")
    return raw


def _tip(topic: str, topic_id: str, partition: int) -> bytes:
    name = topic.encode()
    return _uv(len(name) + 1) + name + _uuid_bytes(topic_id) + struct.pack(">i", partition) + _uv(0)


def _tagged(fields: dict[int, bytes]) -> bytes:
    out = _uv(len(fields))
    for tag in sorted(fields):
        out += _uv(tag) + _uv(len(fields[tag])) + fields[tag]
    return out


def encode(record: SegmentRecord | PartitionDeleteRecord, version: int = 0) -> bytes:
    """The record value Kafka's serde writes for ``record`` (api ``version`` 0 or 1)."""
    head = _uv(FRAME_VERSION)
    if isinstance(record, PartitionDeleteRecord):
        body = _tip(record.topic, record.topic_id, record.partition)
        body += struct.pack(
            ">iqb", record.broker_id, record.event_timestamp_ms, PARTITION_STATES.index(record.state)
        )
        return head + _uv(PARTITION_DELETE) + _uv(version) + body + _uv(0)
    seg = _tip(record.topic, record.topic_id, record.partition) + _uuid_bytes(record.segment_id) + _uv(0)
    custom = (
        _uv(0)
        if record.custom_metadata is None
        else _uv(len(record.custom_metadata) + 1) + record.custom_metadata
    )
    state = struct.pack(">b", SEGMENT_STATES.index(record.state))
    tags: dict[int, bytes] = {}
    if record.update:
        body = seg + struct.pack(">iq", record.broker_id, record.event_timestamp_ms) + custom + state
        if version >= 1:
            tags = {0: struct.pack(">i", record.broker_leader_epoch), 1: struct.pack(">q", record.end_offset)}
        return head + _uv(SEGMENT_UPDATE) + _uv(version) + body + _tagged(tags)
    epochs = _uv(len(record.leader_epochs) + 1) + b"".join(
        struct.pack(">iq", e, o) + _uv(0) for e, o in record.leader_epochs
    )
    body = seg + struct.pack(
        ">qqiqq", record.start_offset, record.end_offset, record.broker_id, record.max_timestamp_ms,
        record.event_timestamp_ms,
    ) + epochs + struct.pack(">i", record.segment_size) + custom + state  # fmt: skip
    if record.txn_index_empty is not None:
        tags[0] = struct.pack(">?", record.txn_index_empty)
    if version >= 1:
        tags[1] = struct.pack(">i", record.broker_leader_epoch)
    return head + _uv(SEGMENT) + _uv(version) + body + _tagged(tags)
