"""Kafka's on-disk log format in pure Python: streaming, bounded in memory.

One concept per module:

* :mod:`.batch` - v2 record batch header (fields, attributes, CRC32C).
* :mod:`.reader` - walking a segment batch by batch; header-only scans.
* :mod:`.records` - records inside a batch (varint fields, keys, values, headers).
* :mod:`.varint` - zig-zag varint/varlong.
* :mod:`.compression` - gzip/snappy/lz4/zstd decompression with a size cap.
* :mod:`.control` - control records (transaction markers).
* :mod:`.transactions` - read_committed filtering.
* :mod:`.indexes` - ``.index`` and ``.timeindex``.
* :mod:`.txnindex` - ``.txnindex`` (aborted transactions).
* :mod:`.checkpoint` - ``leader-epoch-checkpoint`` text format.
* :mod:`.snapshot` - producer state ``.snapshot`` files.
* :mod:`.builder` - building batches (tests and tools).
* :mod:`.errors` - the errors (``DataLoss`` / ``InvalidArgument`` subclasses).

The names below are the public API.
"""

from .batch import (
    BATCH_HEADER_SIZE,
    DEFAULT_MAX_BATCH_SIZE,
    BatchHeader,
    Compression,
    TimestampType,
    compute_batch_crc,
    parse_batch_header,
    verify_batch_crc,
)
from .checkpoint import EpochEntry, format_leader_epoch_checkpoint, parse_leader_epoch_checkpoint
from .compression import DEFAULT_MAX_DECOMPRESSED_SIZE, decompress
from .control import ControlRecord, ControlType, parse_control_record
from .errors import (
    BatchSizeError,
    CorruptIndexError,
    CorruptRecordError,
    CrcMismatchError,
    DecompressionError,
    KafkaLogError,
    LimitExceededError,
    TruncatedError,
    UnsupportedFormatError,
)
from .indexes import (
    OffsetPosition,
    TimestampOffset,
    base_offset_from_filename,
    iter_offset_index,
    iter_time_index,
    lookup_offset,
    lookup_timestamp,
    read_offset_index,
    read_time_index,
)
from .reader import PartialBatch, RecordBatch, ScanResult, read_batches, read_records, scan_batch_headers
from .records import Header, Record
from .snapshot import ProducerSnapshot, ProducerSnapshotEntry, read_producer_snapshot
from .transactions import ReadCommittedFilter, committed_batches, committed_records
from .txnindex import AbortedTxn, collect_aborted_txns, iter_txn_index, read_txn_index

__all__ = [
    "BATCH_HEADER_SIZE",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_DECOMPRESSED_SIZE",
    "AbortedTxn",
    "BatchHeader",
    "BatchSizeError",
    "Compression",
    "ControlRecord",
    "ControlType",
    "CorruptIndexError",
    "CorruptRecordError",
    "CrcMismatchError",
    "DecompressionError",
    "EpochEntry",
    "Header",
    "KafkaLogError",
    "LimitExceededError",
    "OffsetPosition",
    "PartialBatch",
    "ProducerSnapshot",
    "ProducerSnapshotEntry",
    "ReadCommittedFilter",
    "Record",
    "RecordBatch",
    "ScanResult",
    "TimestampOffset",
    "TimestampType",
    "TruncatedError",
    "UnsupportedFormatError",
    "base_offset_from_filename",
    "collect_aborted_txns",
    "committed_batches",
    "committed_records",
    "compute_batch_crc",
    "decompress",
    "format_leader_epoch_checkpoint",
    "iter_offset_index",
    "iter_time_index",
    "iter_txn_index",
    "lookup_offset",
    "lookup_timestamp",
    "parse_batch_header",
    "parse_control_record",
    "parse_leader_epoch_checkpoint",
    "read_batches",
    "read_offset_index",
    "read_producer_snapshot",
    "read_records",
    "read_time_index",
    "read_txn_index",
    "scan_batch_headers",
    "verify_batch_crc",
]
