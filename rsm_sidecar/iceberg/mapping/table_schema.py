"""The table's row schema (Bufstream layout, docs/iceberg.md)::

    key      struct<__raw__ binary, __prefix__ binary, __err__ string, <decoded fields>...>
    val      struct<__raw__ binary, __prefix__ binary, __err__ string, <decoded fields>...>
    headers  list<struct<key string, value binary>>
    kafka    struct<partition int, offset long, event_timestamp timestamptz,
                    ingest_timestamp timestamptz, batch_start long>

For Protobuf the decoded fields end with the message's ``__unrecognized__``. ``key.__raw__`` is
always set; ``val.__raw__`` only when there is no schema, decoding failed, (Avro) the record's
writer schema loses data in the table's
(:func:`~rsm_sidecar.iceberg.decoding.avro_mapping.resolution_loss`), or (Protobuf) a Timestamp
or Duration in the record has nanos the µs columns cut. ``__prefix__`` is the schema-registry
preamble (magic, id, message indexes). A null key/value (tombstone) gives a null ``key``/``val``.
"""

from __future__ import annotations

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from rsm_sidecar.iceberg.types import ERR, PREFIX, RAW, IdCounter, list_of, opt, renumber


def side_type(decoded: StructType, ids: IdCounter) -> StructType:
    meta = [opt(ids, RAW, BinaryType()), opt(ids, PREFIX, BinaryType()), opt(ids, ERR, StringType())]
    rest = renumber(decoded, ids)
    assert isinstance(rest, StructType)  # renumber keeps the kind of type
    return StructType(*meta, *rest.fields)


def kafka_type(ids: IdCounter) -> StructType:
    return StructType(
        opt(ids, "partition", IntegerType()),
        opt(ids, "offset", LongType()),
        opt(ids, "event_timestamp", TimestamptzType()),
        opt(ids, "ingest_timestamp", TimestamptzType()),
        opt(ids, "batch_start", LongType()),
    )


def headers_type(ids: IdCounter):
    return list_of(ids, StructType(opt(ids, "key", StringType()), opt(ids, "value", BinaryType())))


def row_schema(key_decoded: StructType, val_decoded: StructType) -> Schema:
    """The full table schema (placeholder ids) for the given decoded key/value types."""
    ids = IdCounter(1)
    top_ids = [next(ids) for _ in range(4)]
    return Schema(
        NestedField(top_ids[0], "key", side_type(key_decoded, ids), required=False),
        NestedField(top_ids[1], "val", side_type(val_decoded, ids), required=False),
        NestedField(top_ids[2], "headers", headers_type(ids), required=False),
        NestedField(top_ids[3], "kafka", kafka_type(ids), required=False),
    )
