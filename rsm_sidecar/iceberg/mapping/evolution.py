"""Schema evolution with stable field ids.

Iceberg assigns fresh ids when a table is created or a column added, so the ids of our mapped
types are placeholders. The mapping "source field path -> Iceberg field id" is *derived from the
table schema by name path* (``val.user.name``, list elements ``.element``, map ``.key`` /
``.value``): the table schema is the one source of truth, committed atomically with every
change, so there is no second state to drift from it (Bufstream keeps such state in its metadata
store; our store is the Iceberg metadata itself). Rules, applied by :func:`plan_update` /
:func:`apply_update` through PyIceberg's ``update_schema()``:

* a field in the new source schema and not in the table -> a new column (a new id, after the
  table's ``last-column-id``; Iceberg never reuses ids);
* a field that is no longer in the source schema -> its column and id stay (nothing is ever
  dropped); for Protobuf its data then lands in ``__unrecognized__`` since decoding uses the
  current schema, and the old column is null for new rows;
* int -> long, float -> double, decimal(P,S) -> decimal(P2>P,S) (also inside lists and map
  values) -> promoted in place, same id;
* any other type change (string -> int, scalar -> struct, list -> map, map key change) -> the
  old column is renamed ``<name>__v<N>`` (smallest N >= 1 not taken in that struct), keeping its
  id and old data, and a new column ``<name>`` with a new id is added;
* struct vs struct recurses, so nested additions/promotions/replacements work the same way.

Renames and additions are committed in one transaction.

The table also declares the order its data files are written in (:func:`offset_sort_order`):
``kafka.partition, kafka.offset`` ascending - each task writes rows of one Kafka partition in
offset order - the way Bufstream keeps "sort order" in step with how it stores data. A new
table gets it, and a table without a sort order gets it at the next run; a sort order someone
declared on purpose is left alone. Schema evolution never touches it (the two fields never
change).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    PrimitiveType,
    StructType,
)

RETIRED_FORMAT = "{name}__v{n}"


@dataclass(frozen=True)
class Change:
    """One schema change. ``path`` is the column path in the table *before* the change."""

    kind: str  # "add" | "promote" | "retire"
    path: tuple[str, ...]
    field_type: IcebergType | None = None
    new_name: str | None = None

    def __str__(self) -> str:
        p = ".".join(self.path)
        if self.kind == "add":
            return f"add {p}: {self.field_type}"
        if self.kind == "promote":
            return f"promote {p} to {self.field_type}"
        return f"retire {p} as {self.new_name} (new {self.path[-1]}: {self.field_type})"


def same_type(a: IcebergType, b: IcebergType) -> bool:
    """Structural equality ignoring field ids and docs."""
    if isinstance(a, StructType) and isinstance(b, StructType):
        return len(a.fields) == len(b.fields) and all(
            x.name == y.name and x.required == y.required and same_type(x.field_type, y.field_type)
            for x, y in zip(a.fields, b.fields)
        )
    if isinstance(a, ListType) and isinstance(b, ListType):
        return same_type(a.element_type, b.element_type)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return same_type(a.key_type, b.key_type) and same_type(a.value_type, b.value_type)
    return a == b


def _promotable(cur: IcebergType, new: IcebergType) -> bool:
    if isinstance(cur, IntegerType) and isinstance(new, LongType):
        return True
    if isinstance(cur, FloatType) and isinstance(new, DoubleType):
        return True
    if isinstance(cur, DecimalType) and isinstance(new, DecimalType):
        return new.scale == cur.scale and new.precision > cur.precision
    return False


def _covers(cur: IcebergType, new: IcebergType) -> bool:
    """True when data of type ``new`` already fits column type ``cur`` (e.g. long column,
    int source after a narrowing in the source): no change needed."""
    return same_type(cur, new) or _promotable(new, cur)


def plan_update(current: Schema | StructType, target: Schema | StructType) -> list[Change]:
    """The changes that make the table (``current``) able to hold ``target`` rows."""
    changes: list[Change] = []
    _diff_struct(_struct(current), _struct(target), (), changes)
    return changes


def _struct(s: Schema | StructType) -> StructType:
    return s.as_struct() if isinstance(s, Schema) else s


def _retired_name(name: str, taken: set[str]) -> str:
    n = 1
    while RETIRED_FORMAT.format(name=name, n=n) in taken:
        n += 1
    return RETIRED_FORMAT.format(name=name, n=n)


def _diff_struct(cur: StructType, tgt: StructType, path: tuple[str, ...], out: list[Change]) -> None:
    by_name = {f.name: f for f in cur.fields}
    taken = set(by_name) | {f.name for f in tgt.fields}
    for tf in tgt.fields:
        cf = by_name.get(tf.name)
        p = path + (tf.name,)
        if cf is None:
            out.append(Change("add", p, tf.field_type))
            continue
        if not _diff_type(cf.field_type, tf.field_type, p, out):
            new_name = _retired_name(tf.name, taken)
            taken.add(new_name)
            out.append(Change("retire", p, tf.field_type, new_name))


def _diff_type(ct: IcebergType, tt: IcebergType, p: tuple[str, ...], out: list[Change]) -> bool:
    """Append in-place changes; return False when the column must be replaced."""
    if isinstance(ct, StructType) and isinstance(tt, StructType):
        _diff_struct(ct, tt, p, out)
        return True
    if isinstance(ct, ListType) and isinstance(tt, ListType):
        return _diff_nested(ct.element_type, tt.element_type, p + ("element",), out)
    if isinstance(ct, MapType) and isinstance(tt, MapType):
        if not same_type(ct.key_type, tt.key_type):
            return False
        return _diff_nested(ct.value_type, tt.value_type, p + ("value",), out)
    if isinstance(ct, PrimitiveType) and isinstance(tt, PrimitiveType):
        if _covers(ct, tt):
            return True
        if _promotable(ct, tt):
            out.append(Change("promote", p, tt))
            return True
    return False


def _diff_nested(ct: IcebergType, tt: IcebergType, p: tuple[str, ...], out: list[Change]) -> bool:
    """A list element / map value: changes are kept only if the element itself stays."""
    trial: list[Change] = []
    ok = _diff_type(ct, tt, p, trial)
    if ok:
        out.extend(trial)
    return ok


def apply_update(
    table: Any, target: Schema | StructType, properties: dict[str, str] | None = None
) -> list[Change]:
    """Plan and commit the changes on a PyIceberg ``Table`` (one transaction). Returns them."""
    changes = plan_update(table.schema(), target)
    if not changes and not properties:
        return changes
    with table.transaction() as tx:
        retire = [c for c in changes if c.kind == "retire"]
        if retire:
            with tx.update_schema() as u:
                for c in retire:
                    u.rename_column(c.path, c.new_name)
        rest = [c for c in changes if c.kind != "retire"]
        if rest or retire:
            with tx.update_schema() as u:
                for c in rest:
                    if c.kind == "add":
                        u.add_column(c.path, c.field_type)
                    else:
                        u.update_column(c.path, field_type=c.field_type)
                for c in retire:
                    u.add_column(c.path, c.field_type)
        if properties:
            tx.set_properties(properties)
    return changes


def field_ids(schema: Schema | StructType) -> dict[str, int]:
    """``"val.user.name" -> field id`` for every field (list ``element``, map ``key``/``value``)."""
    out: dict[str, int] = {}

    def walk(t: IcebergType, prefix: str) -> None:
        if isinstance(t, StructType):
            for f in t.fields:
                name = f"{prefix}{f.name}"
                out[name] = f.field_id
                walk(f.field_type, name + ".")
        elif isinstance(t, ListType):
            out[prefix + "element"] = t.element_id
            walk(t.element_type, prefix + "element.")
        elif isinstance(t, MapType):
            out[prefix + "key"] = t.key_id
            out[prefix + "value"] = t.value_id
            walk(t.key_type, prefix + "key.")
            walk(t.value_type, prefix + "value.")

    walk(_struct(schema), "")
    return out


#: the columns the data files are sorted by, in this order
SORT_COLUMNS = ("kafka.partition", "kafka.offset")


def offset_sort_order(schema: Schema) -> Any:
    """``kafka.partition ASC, kafka.offset ASC`` (nulls first, Spark's default for ASC) with the
    field ids of ``schema``."""
    from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
    from pyiceberg.transforms import IdentityTransform

    return SortOrder(
        *[
            SortField(
                source_id=schema.find_field(name).field_id,
                transform=IdentityTransform(),
                direction=SortDirection.ASC,
                null_order=NullOrder.NULLS_FIRST,
            )
            for name in SORT_COLUMNS
        ]
    )


def needs_sort_order(table: Any) -> bool:
    """A table without any sort order (made before tables declared one, or by someone else)."""
    return bool(table.sort_order().is_unsorted)


def ensure_table(
    catalog: Any,
    identifier: str | tuple[str, ...],
    target: Schema,
    *,
    partition: str | None = "day",
    properties: dict[str, str] | None = None,
) -> Any:
    """Create the table for ``target`` (partitioned by ``partition`` of
    ``kafka.ingest_timestamp``: ``hour``/``day``/``month``/None) or evolve an existing one."""
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, Transform

    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        ns = identifier[:-1] if isinstance(identifier, tuple) else tuple(identifier.split(".")[:-1])
        if ns:
            catalog.create_namespace_if_not_exists(ns)
        spec = UNPARTITIONED_PARTITION_SPEC
        if partition:
            transforms: dict[str, Transform[Any, Any]] = {
                "hour": HourTransform(),
                "day": DayTransform(),
                "month": MonthTransform(),
            }
            transform = transforms[partition]
            source = target.find_field("kafka.ingest_timestamp").field_id
            spec = PartitionSpec(
                PartitionField(
                    source_id=source, field_id=1000, transform=transform, name=f"ingest_{partition}"
                )
            )
        return catalog.create_table(
            identifier,
            schema=target,
            partition_spec=spec,
            sort_order=offset_sort_order(target),
            properties=properties or {},
        )
    apply_update(table, target, properties)
    table = catalog.load_table(identifier)
    if needs_sort_order(table):
        from pyiceberg.table.sorting import NullOrder
        from pyiceberg.transforms import IdentityTransform

        with table.update_sort_order() as order:
            for name in SORT_COLUMNS:
                order.asc(name, IdentityTransform(), NullOrder.NULLS_FIRST)
        table = catalog.load_table(identifier)
    return table


def describe(changes: Iterable[Change]) -> str:
    return "; ".join(map(str, changes)) or "no change"
