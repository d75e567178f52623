"""Control records: the records of control batches (attribute bit 5).

Key (``ControlRecordType``): ``version int16 | type int16`` (at least 4 bytes; Kafka reads keys
of unknown newer versions as version 0). Types: 0 ABORT, 1 COMMIT (transaction markers),
2 LEADER_CHANGE, 3 SNAPSHOT_HEADER, 4 SNAPSHOT_FOOTER, 5 KRAFT_VERSION, 6 KRAFT_VOTERS (KRaft's
own log); anything else is unknown and ignored by clients.

Value of a transaction marker (``EndTransactionMarker``): ``version int16 | coordinatorEpoch
int32`` (at least 6 bytes, newer versions read as version 0).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from .errors import CorruptRecordError
from .records import Record


class ControlType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """A parsed control record. ``type_id`` is kept even when unknown (``control_type`` is
    then ``None``); ``coordinator_epoch``/``value_version`` are set for COMMIT/ABORT only."""

    offset: int
    timestamp: int
    key_version: int
    type_id: int
    value_version: int | None = None
    coordinator_epoch: int | None = None

    @property
    def control_type(self) -> ControlType | None:
        try:
            return ControlType(self.type_id)
        except ValueError:
            return None

    @property
    def is_transaction_marker(self) -> bool:
        return self.type_id in (ControlType.ABORT, ControlType.COMMIT)

    @property
    def is_commit(self) -> bool:
        return self.type_id == ControlType.COMMIT

    @property
    def is_abort(self) -> bool:
        return self.type_id == ControlType.ABORT


def parse_control_record(record: Record) -> ControlRecord:
    """Parse a record taken from a control batch. Raises :class:`CorruptRecordError` (with the
    record's offset) for keys or marker values that are null, too short or of negative version."""
    key = record.key
    if key is None or len(key) < 4:
        raise CorruptRecordError(
            f"control record key must have at least 4 bytes, found {'null' if key is None else len(key)}",
            offset=record.offset,
        )
    key_version, type_id = struct.unpack_from(">hh", key, 0)
    if key_version < 0:
        raise CorruptRecordError(f"invalid control record key version {key_version}", offset=record.offset)
    if type_id not in (ControlType.ABORT, ControlType.COMMIT):
        return ControlRecord(record.offset, record.timestamp, key_version, type_id)
    value = record.value
    if value is None or len(value) < 6:
        raise CorruptRecordError(
            f"transaction marker value must have at least 6 bytes, found "
            f"{'null' if value is None else len(value)}",
            offset=record.offset,
        )
    value_version, coordinator_epoch = struct.unpack_from(">hi", value, 0)
    if value_version < 0:
        raise CorruptRecordError(f"invalid transaction marker version {value_version}", offset=record.offset)
    return ControlRecord(
        record.offset, record.timestamp, key_version, type_id, value_version, coordinator_epoch
    )


def encode_marker_key(control_type: int, version: int = 0) -> bytes:
    return struct.pack(">hh", version, control_type)


def encode_marker_value(coordinator_epoch: int, version: int = 0) -> bytes:
    return struct.pack(">hi", version, coordinator_epoch)
