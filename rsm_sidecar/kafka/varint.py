"""Kafka's variable-length integers, read with this package's errors.

The codec is :mod:`rsm_sidecar.format.varint` (``ByteUtils`` semantics); these readers raise
:class:`~rsm_sidecar.kafka.errors.TruncatedError` when the buffer ends inside a varint and
:class:`~rsm_sidecar.kafka.errors.CorruptRecordError` for an overlong one, so that
:func:`~rsm_sidecar.kafka.records.parse_records` can add where in the log it happened.
"""

from __future__ import annotations

from functools import partial

from rsm_sidecar.format import varint as _codec
from rsm_sidecar.format.varint import (
    encode_unsigned_varint,
    encode_varint,
    encode_varlong,
    size_of_varint,
    size_of_varlong,
)

from .errors import CorruptRecordError, TruncatedError

__all__ = [
    "encode_unsigned_varint",
    "encode_varint",
    "encode_varlong",
    "read_unsigned_varint",
    "read_varint",
    "read_varlong",
    "size_of_varint",
    "size_of_varlong",
]

KAFKA_ERRORS = _codec.VarintErrors(truncated=TruncatedError, overlong=CorruptRecordError)

read_unsigned_varint = partial(_codec.read_unsigned_varint, errors=KAFKA_ERRORS)
read_varint = partial(_codec.read_varint, errors=KAFKA_ERRORS)
read_varlong = partial(_codec.read_varlong, errors=KAFKA_ERRORS)
