"""Errors raised by the Kafka log format library.

Every class is a :class:`rsm_sidecar.errors.DataLoss` (the bytes are corrupt or truncated) or an
:class:`rsm_sidecar.errors.InvalidArgument` (the bytes may be fine but this library will not read
them: an unsupported format version, a configured size limit). Messages name the source (file
name, or ``<bytes>``), the byte position and, when known, the batch's base offset.
"""

from __future__ import annotations

from typing import TypedDict, Unpack

from rsm_sidecar.errors import DataLoss, InvalidArgument, RsmError


class Where(TypedDict, total=False):
    """Where a problem is, as the keyword arguments of every error here take it."""

    source: str | None
    position: int | None
    offset: int | None


class KafkaLogError(RsmError):
    """Base of this package's errors. ``source``, ``position`` and ``offset`` locate the problem
    (each may be ``None``). The gRPC status comes from the DataLoss/InvalidArgument base."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        position: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.source = source
        self.position = position
        self.offset = offset
        self.detail = message
        super().__init__(_locate(message, source, position, offset))


def _locate(message: str, source: str | None, position: int | None, offset: int | None) -> str:
    where = []
    if source is not None:
        where.append(source)
    if position is not None:
        where.append(f"position {position}")
    if offset is not None:
        where.append(f"offset {offset}")
    return f"{', '.join(where)}: {message}" if where else message


class CorruptRecordError(KafkaLogError, DataLoss):
    """A batch or record is structurally invalid (bad magic, impossible sizes, counts that do not
    add up, malformed varints, control records of the wrong shape)."""


class CrcMismatchError(CorruptRecordError):
    """A batch's stored CRC32C differs from the one computed over its bytes."""

    def __init__(self, message: str, *, stored: int, computed: int, **where: Unpack[Where]) -> None:
        self.stored = stored
        self.computed = computed
        super().__init__(message, **where)


class BatchSizeError(CorruptRecordError):
    """A batch's length field is negative, below the batch header size, or above the configured
    maximum (cf. KAFKA-20966: read the length, refuse it, never allocate it)."""


class TruncatedError(KafkaLogError, DataLoss):
    """The data ends inside a batch, a record or an index entry."""


class DecompressionError(CorruptRecordError):
    """A compressed batch's payload could not be decompressed by its codec."""


class CorruptIndexError(KafkaLogError, DataLoss):
    """An offset, time or transaction index, a leader-epoch checkpoint or a producer snapshot is
    invalid."""


class UnsupportedFormatError(KafkaLogError, InvalidArgument):
    """Valid but unsupported data: message format v0/v1 batches, unknown compression codecs,
    index or snapshot versions newer than this library knows."""


class LimitExceededError(KafkaLogError, InvalidArgument):
    """A batch decompresses to more than the configured cap (``max_decompressed_size``). Raise the
    cap if such batches are legitimate."""
