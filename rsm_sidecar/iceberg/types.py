"""Iceberg <-> Arrow <-> Spark type helpers shared by the mappings, the encoder and evolution.

We build Iceberg types with *placeholder* field ids (a running counter); the table assigns
the real ids (see :mod:`rsm_sidecar.iceberg.mapping.evolution`). Arrow types are our own conversion
(not PyIceberg's) so that the encoder, Spark's ``mapInArrow`` schema and PyIceberg appends all
see plain ``string``/``binary``/``list`` (not the ``large_*`` variants) and UTC timestamps.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from rsm_sidecar.errors import ConfigError

UTC_US = pa.timestamp("us", tz="UTC")

#: The columns rows.py puts next to the fields of a side's top-level message or record in
#: ``key``/``val``.
SIDE_COLUMNS = ("__raw__", "__prefix__", "__err__")
RAW, PREFIX, ERR = SIDE_COLUMNS


class ReservedFieldName(ConfigError):
    """A schema field has the name of a column the mapping synthesizes at that level."""


def check_reserved(name: str, reserved: tuple[str, ...], level: str, field: str) -> None:
    """Raise :class:`ReservedFieldName` when a field called ``name`` would sit in ``level`` (e.g.
    "the top-level record's struct") next to the synthesized columns ``reserved``; ``field``
    describes the field for the message (format, name, where it is declared)."""
    if name in reserved:
        raise ReservedFieldName(
            f"{field} cannot become a column: {level} already has {', '.join(reserved)}. "
            f"Rename the field in the schema (the mapping names its synthesized columns "
            f"__like_this__: avoid such field names)"
        )


class IdCounter:
    """Placeholder field ids for freshly mapped types (``next(counter)``)."""

    def __init__(self, start: int = 1) -> None:
        self._it: Iterator[int] = itertools.count(start)

    def __next__(self) -> int:
        return next(self._it)

    def __iter__(self) -> IdCounter:
        return self


def opt(ids: IdCounter, name: str, typ: IcebergType, doc: str | None = None) -> NestedField:
    """An optional field (every field we create is optional)."""
    return NestedField(next(ids), name, typ, required=False, doc=doc)


def list_of(ids: IdCounter, element: IcebergType) -> ListType:
    return ListType(next(ids), element, element_required=False)


def map_of(ids: IdCounter, key: IcebergType, value: IcebergType) -> MapType:
    return MapType(next(ids), key, next(ids), value, value_required=False)


_PRIMITIVE_ARROW: dict[type, pa.DataType] = {
    BooleanType: pa.bool_(),
    IntegerType: pa.int32(),
    LongType: pa.int64(),
    FloatType: pa.float32(),
    DoubleType: pa.float64(),
    StringType: pa.string(),
    BinaryType: pa.binary(),
    DateType: pa.date32(),
    TimeType: pa.time64("us"),
    TimestampType: pa.timestamp("us"),
    TimestamptzType: UTC_US,
    UUIDType: pa.binary(16),
}


def to_arrow(t: IcebergType, *, field_ids: bool = False) -> pa.DataType:
    """The Arrow type we write for Iceberg type ``t`` (``field_ids`` adds PARQUET:field_id)."""
    if isinstance(t, StructType):
        return pa.struct([to_arrow_field(f, field_ids=field_ids) for f in t.fields])
    if isinstance(t, ListType):
        return pa.list_(to_arrow_field(t.element_field, field_ids=field_ids))
    if isinstance(t, MapType):
        k = to_arrow_field(t.key_field, field_ids=field_ids).with_nullable(False)
        v = to_arrow_field(t.value_field, field_ids=field_ids)
        return pa.map_(k, v)
    if isinstance(t, DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, FixedType):
        return pa.binary(len(t))
    try:
        return _PRIMITIVE_ARROW[type(t)]
    except KeyError:
        raise TypeError(f"no Arrow mapping for Iceberg type {t}") from None


def to_arrow_field(f: NestedField, *, field_ids: bool = False) -> pa.Field:
    md = {b"PARQUET:field_id": str(f.field_id).encode()} if field_ids else None
    return pa.field(f.name, to_arrow(f.field_type, field_ids=field_ids), nullable=not f.required, metadata=md)


def schema_to_arrow(schema: Schema | StructType, *, field_ids: bool = False) -> pa.Schema:
    fields = schema.fields
    return pa.schema([to_arrow_field(f, field_ids=field_ids) for f in fields])


def renumber(t: IcebergType, ids: IdCounter) -> IcebergType:
    """A copy of ``t`` with fresh placeholder ids (used when splicing mapped types together)."""
    if isinstance(t, StructType):
        return StructType(
            *[
                NestedField(next(ids), f.name, renumber(f.field_type, ids), required=f.required, doc=f.doc)
                for f in t.fields
            ]
        )
    if isinstance(t, ListType):
        return ListType(next(ids), renumber(t.element_type, ids), element_required=t.element_required)
    if isinstance(t, MapType):
        kid, vid = next(ids), next(ids)
        return MapType(
            kid, renumber(t.key_type, ids), vid, renumber(t.value_type, ids), value_required=t.value_required
        )
    return t


def spark_ddl(schema: Schema | StructType) -> str:
    """A Spark DDL schema string (``a INT, b STRUCT<...>``) for ``mapInArrow``/``createDataFrame``."""
    return ", ".join(f"`{f.name}` {_spark_type(f.field_type)}" for f in schema.fields)


def _spark_type(t: IcebergType) -> str:
    if isinstance(t, StructType):
        inner = ", ".join(f"`{f.name}`: {_spark_type(f.field_type)}" for f in t.fields)
        return f"STRUCT<{inner}>"
    if isinstance(t, ListType):
        return f"ARRAY<{_spark_type(t.element_type)}>"
    if isinstance(t, MapType):
        return f"MAP<{_spark_type(t.key_type)}, {_spark_type(t.value_type)}>"
    if isinstance(t, DecimalType):
        return f"DECIMAL({t.precision}, {t.scale})"
    simple: dict[type[IcebergType], str] = {
        BooleanType: "BOOLEAN",
        IntegerType: "INT",
        LongType: "BIGINT",
        FloatType: "FLOAT",
        DoubleType: "DOUBLE",
        StringType: "STRING",
        BinaryType: "BINARY",
        DateType: "DATE",
        TimestamptzType: "TIMESTAMP",
        TimestampType: "TIMESTAMP_NTZ",
        FixedType: "BINARY",
        UUIDType: "STRING",
    }
    try:
        return simple[type(t)]
    except KeyError:
        raise TypeError(f"no Spark type for Iceberg type {t}") from None
