"""Segment identity and object keys.

Layout (Aiven-compatible): ``<prefix><topic>-<topicId>/<partition>/<20-digit
startOffset>-<segmentId>.{log,indexes,rsm-manifest}``. With
``storage.hashed_prefix_chars = N > 0`` the prefix is followed by ``<N hex chars of
sha256("<topicId>/<partition>")>/``, which spreads partitions over key ranges and is
still derived from the segment metadata alone.

A key's first path component ``<topic>-<topicId>`` must fit a file name (255 bytes) on
the local backend: topic names longer than 232 characters (Kafka allows 249) are written
as their first 223 characters, ``~`` (never part of a topic name) and 8 hex digits of
sha256(name) (``topic_component``). Shorter names are written verbatim, as Aiven does.

Keys that a request's KIP-917 custom metadata names (``OBJECT_PREFIX``/``OBJECT_KEY``)
are accepted only when they name that request's own segment under a clean prefix
(``KeyLayout.base``), so a client cannot steer a fetch or delete to another object.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from rsm_sidecar.errors import ConfigError, InvalidArgument, RsmError
from rsm_sidecar.format import custom_metadata

LOG, INDEXES, MANIFEST = "log", "indexes", "rsm-manifest"
SUFFIXES = (LOG, INDEXES, MANIFEST)
_UUID_RE = re.compile(r"[A-Za-z0-9_-]{22}")
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
_MAIN_RE = re.compile(
    r"(?P<topic>[A-Za-z0-9._-]{1,232}|[A-Za-z0-9._-]{223}~[0-9a-f]{8})-(?P<topic_id>[A-Za-z0-9_-]{22})/"
    r"(?P<partition>\d{1,10})/(?P<start>\d{20})-(?P<segment_id>[A-Za-z0-9_-]{22})\.(?P<suffix>log|indexes|rsm-manifest)"
)
#: longest topic name written verbatim in a key: ``<topic>-<22-char topic id>`` fits 255 bytes
MAX_VERBATIM_TOPIC = 255 - 1 - 22
_SHORTENED_TOPIC = MAX_VERBATIM_TOPIC - 1 - 8
#: longest key prefix accepted (configured or recorded in custom metadata)
MAX_PREFIX_BYTES = 512
_MAX_ECHO = 80


def echo(value: object) -> str:
    """A client-supplied value for an error message, cut short (a 100k-character topic
    name must not end up in a status message)."""
    text = repr(value)
    return text if len(text) <= _MAX_ECHO else f"{text[:_MAX_ECHO]}... ({len(text)} characters)"


def topic_component(topic: str) -> str:
    """The topic part of a key: the name itself, or for names longer than
    ``MAX_VERBATIM_TOPIC`` a shortened form that still fits a file name."""
    if len(topic) <= MAX_VERBATIM_TOPIC:
        return topic
    return f"{topic[:_SHORTENED_TOPIC]}~{hashlib.sha256(topic.encode()).hexdigest()[:8]}"


def check_key_prefix(prefix: str, what: str, error: type[RsmError] = InvalidArgument) -> str:
    """A key prefix is a relative path: no empty, ``.`` or ``..`` component (a trailing
    ``/`` is fine), no leading ``/``, no backslash or control character. Raises
    ``error`` naming ``what``."""
    if not prefix:
        return prefix
    bad = None
    if len(prefix.encode("utf-8", "surrogatepass")) > MAX_PREFIX_BYTES:
        bad = f"is longer than {MAX_PREFIX_BYTES} bytes"
    elif prefix.startswith("/"):
        bad = "starts with '/'"
    elif any(c == "\\" or ord(c) < 0x20 or ord(c) == 0x7F for c in prefix):
        bad = "contains a backslash or a control character"
    else:
        parts = prefix.split("/")
        if parts[-1] == "":
            parts = parts[:-1]
        if any(p in ("", ".", "..") for p in parts):
            bad = "has an empty, '.' or '..' path component"
    if bad:
        raise error(f"{what} {echo(prefix)} {bad}")
    return prefix


def uuid_bytes(kafka_uuid: str) -> bytes:
    """The 16 bytes of a Kafka Uuid string (URL-safe base64, no padding)."""
    return base64.urlsafe_b64decode(kafka_uuid + "==")


@dataclasses.dataclass(frozen=True)
class SegmentMetadata:
    """KIP-405 RemoteLogSegmentMetadata as the sidecar sees it."""

    topic_id: str
    topic_name: str
    partition: int
    segment_id: str
    start_offset: int
    end_offset: int
    max_timestamp_ms: int = -1
    broker_id: int = -1
    event_timestamp_ms: int = -1
    leader_epochs: Mapping[int, int] = dataclasses.field(default_factory=dict)
    segment_size: int = 0
    custom_metadata: bytes | None = None
    txn_index_empty: bool | None = None

    def validate(self) -> SegmentMetadata:
        if not _UUID_RE.fullmatch(self.topic_id or ""):
            raise InvalidArgument(f"topic_id {echo(self.topic_id)} is not a Kafka Uuid string")
        if not _UUID_RE.fullmatch(self.segment_id or ""):
            raise InvalidArgument(f"segment_id {echo(self.segment_id)} is not a Kafka Uuid string")
        if not _TOPIC_RE.fullmatch(self.topic_name or "") or self.topic_name in (".", ".."):
            raise InvalidArgument(f"topic name {echo(self.topic_name)} is not a valid Kafka topic name")
        if self.partition < 0:
            raise InvalidArgument(f"partition {self.partition} is negative")
        if self.start_offset < 0 or self.end_offset < self.start_offset:
            raise InvalidArgument(f"offsets {self.start_offset}..{self.end_offset} are invalid")
        if self.segment_size < 0:
            raise InvalidArgument(f"segment size {self.segment_size} is negative")
        return self

    @property
    def describe(self) -> str:
        return (
            f"{self.topic_name}-{self.partition}@{self.start_offset}..{self.end_offset} ({self.segment_id})"
        )

    def fill_proto(self, m: Any) -> None:
        """Sets an ``rsm.v1.SegmentMetadata`` message ``m`` to this (the reverse of
        :meth:`from_proto`; ``state`` is left as it is)."""
        m.topic_id, m.topic_name, m.partition = self.topic_id, self.topic_name, self.partition
        m.segment_id, m.start_offset, m.end_offset = self.segment_id, self.start_offset, self.end_offset
        m.max_timestamp_ms, m.broker_id = self.max_timestamp_ms, self.broker_id
        m.event_timestamp_ms, m.segment_size_in_bytes = self.event_timestamp_ms, self.segment_size
        m.segment_leader_epochs.update(self.leader_epochs)
        if self.custom_metadata is not None:
            m.custom_metadata = self.custom_metadata
        if self.txn_index_empty is not None:
            m.txn_index_empty = self.txn_index_empty

    @classmethod
    def from_proto(cls, m: Any) -> SegmentMetadata:
        return cls(
            topic_id=m.topic_id,
            topic_name=m.topic_name,
            partition=m.partition,
            segment_id=m.segment_id,
            start_offset=m.start_offset,
            end_offset=m.end_offset,
            max_timestamp_ms=m.max_timestamp_ms,
            broker_id=m.broker_id,
            event_timestamp_ms=m.event_timestamp_ms,
            leader_epochs=dict(m.segment_leader_epochs),
            segment_size=m.segment_size_in_bytes,
            custom_metadata=m.custom_metadata if m.HasField("custom_metadata") else None,
            txn_index_empty=m.txn_index_empty if m.HasField("txn_index_empty") else None,
        ).validate()


@dataclasses.dataclass(frozen=True)
class ParsedKey:
    prefix: str
    topic: str
    topic_id: str
    partition: int
    start_offset: int
    segment_id: str
    suffix: str

    @property
    def base(self) -> str:
        path = main_path_of(self.topic, self.topic_id, self.partition, self.start_offset, self.segment_id)
        return f"{self.prefix}{path}"

    def key(self, suffix: str) -> str:
        return f"{self.base}.{suffix}"

    def is_topic(self, name: str) -> bool:
        """Whether this key belongs to topic ``name`` (long names are shortened in keys)."""
        return self.topic == topic_component(name)


def main_path_of(topic: str, topic_id: str, partition: int, start_offset: int, segment_id: str) -> str:
    return f"{topic_component(topic)}-{topic_id}/{partition}/{start_offset:020d}-{segment_id}"


class KeyLayout:
    """Derives object keys from segment metadata under a configured prefix."""

    def __init__(self, prefix: str = "", hashed_prefix_chars: int = 0):
        self.prefix = check_key_prefix(prefix, "storage.key_prefix", ConfigError)
        self.hashed_prefix_chars = hashed_prefix_chars

    def partition_prefix(self, topic_id: str, partition: int) -> str:
        """Prefix + optional hash component for one partition."""
        if not self.hashed_prefix_chars:
            return self.prefix
        h = hashlib.sha256(f"{topic_id}/{partition}".encode()).hexdigest()[: self.hashed_prefix_chars]
        return f"{self.prefix}{h}/"

    def base(self, md: SegmentMetadata) -> str:
        """Key without suffix. Custom metadata from the copy (OBJECT_PREFIX/OBJECT_KEY)
        wins over the current configuration, so changing the prefix later keeps old
        segments readable and deletable. The client supplies that metadata, so it may
        only choose a clean prefix: the rest of the key always names this request's own
        topic id, partition, start offset and segment id (``InvalidArgument`` otherwise)."""
        try:
            fields = custom_metadata.decode(md.custom_metadata) if md.custom_metadata else {}
        except RsmError as e:
            raise InvalidArgument(
                f"segment {md.describe}: malformed custom metadata in the request ({e})"
            ) from None
        main = main_path_of(md.topic_name, md.topic_id, md.partition, md.start_offset, md.segment_id)
        recorded = fields.get(custom_metadata.OBJECT_KEY)
        if recorded is not None and recorded != main:
            raise InvalidArgument(
                f"segment {md.describe}: custom metadata OBJECT_KEY {echo(recorded)} does not name "
                f"this segment (expected {main!r})"
            )
        prefix = fields.get(custom_metadata.OBJECT_PREFIX)
        if prefix is None:
            return self.partition_prefix(md.topic_id, md.partition) + main
        if not isinstance(prefix, str):
            raise InvalidArgument(f"segment {md.describe}: custom metadata OBJECT_PREFIX is not a string")
        check_key_prefix(prefix, f"segment {md.describe}: custom metadata OBJECT_PREFIX")
        return prefix + main

    def key(self, md: SegmentMetadata, suffix: str) -> str:
        return f"{self.base(md)}.{suffix}"

    def partition_directory(self, topic: str, topic_id: str, partition: int) -> str:
        """Where the keys of one partition's segments start: ``<prefix><topic>-<id>/<partition>/``."""
        return f"{self.partition_prefix(topic_id, partition)}{topic_component(topic)}-{topic_id}/{partition}/"

    def topic_list_prefix(self) -> str:
        """Where to list to find every segment (all topics)."""
        return self.prefix

    def parse(self, key: str) -> ParsedKey | None:
        """The segment a key belongs to, or None for a key outside the layout."""
        if not key.startswith(self.prefix):
            return None
        rest = key[len(self.prefix) :]
        hashed = ""
        if self.hashed_prefix_chars:
            hashed, sep, rest = rest.partition("/")
            if not sep or len(hashed) != self.hashed_prefix_chars:
                return None
            hashed += "/"
        m = _MAIN_RE.fullmatch(rest)
        if not m:
            return None
        parsed = ParsedKey(
            self.prefix + hashed,
            m["topic"],
            m["topic_id"],
            int(m["partition"]),
            int(m["start"]),
            m["segment_id"],
            m["suffix"],
        )
        if (
            self.hashed_prefix_chars
            and self.partition_prefix(parsed.topic_id, parsed.partition) != parsed.prefix
        ):
            return None
        return parsed
