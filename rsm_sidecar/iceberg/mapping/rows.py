"""Raw record batches -> ``pyarrow.RecordBatch``es of the table's schema (executors).

:class:`RowEncoder` decodes the key and value columns with their sides
(:mod:`~rsm_sidecar.iceberg.decoding.sides`), passes ``headers`` and the ``kafka`` columns
through as Arrow arrays, and aligns every column to the table's Arrow schema (:func:`align`:
columns the table has and this run's schema lacks are null, narrower types are cast), so a batch
can be written into a table whose schema has evolved. :class:`EncoderSpec` is its picklable
description; :func:`encoder_for` keeps one encoder per spec in each Python worker.
"""

from __future__ import annotations

import gc
import pickle
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from rsm_sidecar.iceberg.decoding.sides import RawSide, Side, SideSpec, build_side
from rsm_sidecar.iceberg.mapping.table_schema import row_schema
from rsm_sidecar.iceberg.types import schema_to_arrow


@dataclass(frozen=True)
class EncoderSpec:
    """Picklable: everything a Spark Python worker needs to rebuild the :class:`RowEncoder`."""

    key: SideSpec = field(default_factory=SideSpec)
    val: SideSpec = field(default_factory=SideSpec)
    #: The table's Arrow schema to align to (None: the mapping's own schema).
    table_arrow_schema: bytes | None = None

    def with_table(self, arrow_schema: pa.Schema) -> EncoderSpec:
        return EncoderSpec(self.key, self.val, arrow_schema.serialize().to_pybytes())


def _ms_to_ts(arr: pa.Array) -> pa.Array:
    arr = arr.cast(pa.int64())
    valid = pc.and_(pc.is_valid(arr), pc.greater_equal(arr, 0))
    us = pc.multiply(arr, 1000)
    return pc.if_else(valid, us, pa.scalar(None, pa.int64())).cast(pa.timestamp("us", tz="UTC"))


class RowEncoder:
    """Raw record batches -> row batches of the table schema."""

    def __init__(self, spec: EncoderSpec):
        self.spec = spec
        self.key_side = build_side(spec.key)
        self.val_side = build_side(spec.val)
        self.schema = row_schema(self.key_side.decoded_type, self.val_side.decoded_type)
        self.mapped_arrow_schema = schema_to_arrow(self.schema)
        self.arrow_schema = (
            pa.ipc.read_schema(pa.py_buffer(spec.table_arrow_schema))
            if spec.table_arrow_schema
            else self.mapped_arrow_schema
        )
        self._key_fields = list(self.mapped_arrow_schema.field("key").type)
        self._val_fields = list(self.mapped_arrow_schema.field("val").type)

    def _side(self, side: Side, col: pa.Array, fields: list[pa.Field], always_raw: bool) -> pa.Array:
        fast = side.decode_arrow(col)
        if fast is not None:
            children, prefixes, errs, lossy = fast
            keep = always_raw or isinstance(side, RawSide)  # no schema: the bytes are the value
            if keep:
                raw = col
            elif lossy is not None:  # the decoded fields cannot give back all of these rows
                raw = pc.if_else(lossy, col.cast(pa.binary()), pa.scalar(None, pa.binary()))
            else:
                raw = pa.nulls(len(col), pa.binary())
        else:
            datas = col.to_pylist()
            children, prefixes, errs, lossy = side.decode_keeping(datas)
            if always_raw or isinstance(side, RawSide):
                raw = col
            else:
                raws = [d if e is not None else None for d, e in zip(datas, errs)]
                for i in lossy:
                    raws[i] = datas[i]
                raw = pa.array(raws, pa.binary())
            prefixes, errs = pa.array(prefixes, pa.binary()), pa.array(errs, pa.string())
        arrays = [raw.cast(pa.binary()), prefixes, errs, *children]
        mask = col.is_null() if col.null_count else None
        return pa.StructArray.from_arrays(arrays, fields=fields, mask=mask)

    def encode(self, raw: pa.RecordBatch) -> pa.RecordBatch:
        """Encode one :data:`RAW_RECORD_SCHEMA` batch into a batch of :attr:`arrow_schema`.

        The cyclic garbage collector is paused for the batch: decoding allocates ~10 objects
        per record, none of them in reference cycles, and gen-0 collections scanning the
        batch's lists otherwise halve the throughput.
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._encode(raw)
        finally:
            if was_enabled:
                gc.enable()

    def _encode(self, raw: pa.RecordBatch) -> pa.RecordBatch:
        key = self._side(self.key_side, raw.column("key"), self._key_fields, True)
        val = self._side(self.val_side, raw.column("value"), self._val_fields, False)
        kafka = pa.StructArray.from_arrays(
            [
                raw.column("partition").cast(pa.int32()),
                raw.column("offset").cast(pa.int64()),
                _ms_to_ts(raw.column("timestamp")),
                _ms_to_ts(raw.column("ingest_timestamp")),
                raw.column("batch_start").cast(pa.int64()),
            ],
            fields=list(self.mapped_arrow_schema.field("kafka").type),
        )
        headers = raw.column("headers")
        if headers.type != self.mapped_arrow_schema.field("headers").type:
            headers = headers.cast(self.mapped_arrow_schema.field("headers").type)
        cols = [key, val, headers, kafka]
        if self.arrow_schema is not self.mapped_arrow_schema:
            cols = [
                align(c, self.arrow_schema.field(f.name).type) for c, f in zip(cols, self.mapped_arrow_schema)
            ]
        return pa.RecordBatch.from_arrays(cols, schema=self.arrow_schema)


# ============================================================================ alignment


def _null_offsets(arr: pa.Array) -> pa.Array:
    """Offsets with a null where the list/map slot is null (how ``from_arrays`` takes nulls)."""
    if not arr.null_count:
        return arr.offsets
    valid = pa.concat_arrays([arr.is_valid(), pa.array([True])])
    return pc.if_else(valid, arr.offsets, pa.scalar(None, pa.int32()))


def align(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """Make ``arr`` have type ``target``: struct children matched by name (missing -> null,
    extra dropped), lists/maps recursively, primitives cast (int->long, float->double)."""
    if arr.type == target:
        return arr
    if pa.types.is_struct(target) and pa.types.is_struct(arr.type):
        have = {arr.type.field(i).name: i for i in range(arr.type.num_fields)}
        children = []
        for f in target:
            if f.name in have:
                children.append(align(arr.field(have[f.name]), f.type))
            else:
                children.append(pa.nulls(len(arr), f.type))
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_list(target) and pa.types.is_list(arr.type):
        values = align(arr.values, target.value_type)
        return pa.ListArray.from_arrays(_null_offsets(arr), values, type=target)
    if pa.types.is_map(target) and pa.types.is_map(arr.type):
        keys = align(arr.keys, target.key_type)
        items = align(arr.items, target.item_type)
        return pa.MapArray.from_arrays(_null_offsets(arr), keys, items, type=target)
    try:
        return arr.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.nulls(len(arr), target)


# ============================================================================ mapInArrow

_ENCODERS: dict[bytes, RowEncoder] = {}
_ENC_LOCK = threading.Lock()


def encoder_for(spec: EncoderSpec) -> RowEncoder:
    """One :class:`RowEncoder` per spec per process (Spark reuses Python workers)."""
    key = pickle.dumps(spec)
    with _ENC_LOCK:
        enc = _ENCODERS.get(key)
        if enc is None:
            enc = _ENCODERS[key] = RowEncoder(spec)
        return enc


def map_in_arrow_fn(spec: EncoderSpec) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A function for ``df.mapInArrow(fn, schema)`` turning raw record batches into rows."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        enc = encoder_for(spec)
        for b in batches:
            if b.num_rows:
                yield enc.encode(b)

    return fn
