"""The table's row schema and the raw-record -> ``pyarrow.RecordBatch`` encoder.

Row schema (Bufstream layout, docs/iceberg.md)::

    key      struct<__raw__ binary, __prefix__ binary, __err__ string, <decoded fields>...>
    val      struct<__raw__ binary, __prefix__ binary, __err__ string, <decoded fields>...>
    headers  list<struct<key string, value binary>>
    kafka    struct<partition int, offset long, event_timestamp timestamptz,
                    ingest_timestamp timestamptz, batch_start long>

For Protobuf the decoded fields end with the message's ``__unrecognized__``. ``key.__raw__`` is
always set; ``val.__raw__`` only when there is no schema, decoding failed, (Avro) the
record's writer schema loses data in the table's
(:func:`~rsm_sidecar.iceberg.avro_mapping.resolution_loss`), or (Protobuf) a Timestamp or
Duration in the record has nanos the µs columns cut
(:meth:`~rsm_sidecar.iceberg.proto_mapping.ProtoDecoder.children_lossy`). ``__prefix__``
is the schema-registry preamble (magic, id, message indexes). A null key/value (tombstone)
gives a null ``key``/``val`` struct. Record-level problems (no magic byte, unknown schema id, bytes
that do not decode) set ``__err__`` and ``__raw__`` and leave the decoded fields null; a
registry that is down raises :class:`~rsm_sidecar.iceberg.schema_registry.RegistryUnavailable`
out of :meth:`RowEncoder.encode` so the job fails.

Input is a *raw record batch* (:data:`RAW_RECORD_SCHEMA`, one row per Kafka record) so that
``headers`` and the ``kafka`` columns pass through as Arrow arrays without Python objects;
:func:`raw_batch` builds one from Python tuples.
"""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError
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

from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg import framing
from rsm_sidecar.iceberg.avro_mapping import AvroMapper, read_datum, resolution_loss
from rsm_sidecar.iceberg.proto_mapping import ProtoDecoder, ProtoOptions
from rsm_sidecar.iceberg.protobuf_schema import ProtoSchema
from rsm_sidecar.iceberg.schema_registry import (
    AVRO,
    PROTOBUF,
    RegistryAuthError,
    RegistryUnavailable,
    ResolvedSchema,
    SchemaRegistry,
    SchemaUnusable,
    SubjectSpec,
    UnknownSchema,
)
from rsm_sidecar.iceberg.types import IdCounter, list_of, opt, renumber, schema_to_arrow, to_arrow

RAW, PREFIX, ERR = "__raw__", "__prefix__", "__err__"

HEADER_TYPE = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))

#: One row per Kafka record; timestamps are epoch milliseconds (null or negative: none).
RAW_RECORD_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("batch_start", pa.int64()),
        ("timestamp", pa.int64()),
        ("ingest_timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADER_TYPE),
    ]
)


class KafkaRecord(NamedTuple):
    partition: int
    offset: int
    batch_start: int
    timestamp: int | None
    ingest_timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()


def raw_batch(records: Iterable[KafkaRecord | tuple]) -> pa.RecordBatch:
    """A :data:`RAW_RECORD_SCHEMA` batch from Python records (tests, small producers)."""
    cols: list[list] = [[] for _ in range(8)]
    for r in records:
        for i, v in enumerate(r):
            cols[i].append(v)
        if len(r) == 7:
            cols[7].append(())
    hdrs = [
        [(k if isinstance(k, str) else bytes(k).decode("utf-8", "replace"), v) for k, v in h] for h in cols[7]
    ]
    arrays = [pa.array(c, f.type) for c, f in zip(cols[:7], RAW_RECORD_SCHEMA)]
    arrays.append(pa.array(hdrs, HEADER_TYPE))
    return pa.RecordBatch.from_arrays(arrays, schema=RAW_RECORD_SCHEMA)


# ============================================================================ sides


@dataclass(frozen=True)
class SideSpec:
    """Picklable description of how one side (key or value) is decoded.

    ``kind``: ``raw`` (no schema), ``protobuf`` / ``avro`` (Confluent-framed, schema ids from
    ``registry``; the table schema is ``schema_id``, pinned at job start), or
    ``protobuf-unframed`` (no preamble; the message from ``descriptor_set``).
    """

    kind: str = "raw"
    registry: Mapping[str, Any] | None = field(default=None, repr=False)  # may hold credentials
    schema_id: int | None = None
    message: str | None = None
    descriptor_set: bytes | None = None
    proto_options: ProtoOptions = field(default_factory=ProtoOptions)


def resolve_side(
    registry: SchemaRegistry | None,
    topic: str,
    is_key: bool,
    subject: SubjectSpec | None = None,
    proto_options: ProtoOptions | None = None,
    samples: Iterable[bytes] = (),
    recorded: str | None = None,
) -> SideSpec:
    """Driver-side: pin the latest schema of the side's subject (TopicNameStrategy unless
    ``subject.subject``). No such subject -> ``raw``. Registry down -> RegistryUnavailable.

    For Protobuf the table's message is ``subject.message`` if given, else the only top-level
    message of the schema file, else ``recorded`` (the message the existing table was made
    from) if the schema still defines it, else the message named by the indexes of the first
    of ``samples`` (framed records of the topic, read lazily, at most
    :data:`MAX_SAMPLES`) that carries the pinned schema id; otherwise :class:`ConfigError`
    asks for ``SubjectSpec.message``.
    """
    opts = proto_options or ProtoOptions()
    if registry is None:
        return SideSpec("raw", proto_options=opts)
    subject = subject or SubjectSpec()
    name = subject.subject_for(topic, is_key)
    try:
        res = registry.resolve_latest(name)
    except UnknownSchema:
        if subject.subject:  # an explicitly configured subject must exist
            raise
        return SideSpec("raw", proto_options=opts)
    if res.schema_type == PROTOBUF:
        assert res.proto is not None
        msg = subject.message or _default_message(res, name, samples, recorded)
        res.proto.message_by_name(msg)  # fail early on a wrong message name
        return SideSpec("protobuf", dict(registry.conf), res.schema_id, msg, proto_options=opts)
    if res.schema_type == AVRO:
        return SideSpec("avro", dict(registry.conf), res.schema_id, proto_options=opts)
    return SideSpec("raw", proto_options=opts)


def message_property(is_key: bool) -> str:
    """Table property naming the Protobuf message a side's columns were made from."""
    return f"rsm.{'key' if is_key else 'value'}.message"


#: Framed records :func:`resolve_side` looks at to find one written with the pinned schema.
MAX_SAMPLES = 1000


def _default_message(
    res: ResolvedSchema, subject: str, samples: Iterable[bytes], recorded: str | None
) -> str:
    assert res.proto is not None
    top = list(res.proto.file.message_types_by_name.values())
    if len(top) == 1:
        return top[0].full_name
    if recorded is not None:
        try:
            return res.proto.message_by_name(recorded).full_name
        except LookupError:
            pass  # the schema no longer defines it: choose again
    for sample in itertools.islice(samples, MAX_SAMPLES):
        # Only a record framed with the pinned id says which message *this* schema's indexes
        # name: bytes that merely start with 0x00 (or records of another schema) do not.
        try:
            fr = framing.parse(sample, protobuf=True)
            if fr.schema_id == res.schema_id:
                return res.proto.message_by_indexes(fr.indexes or (0,)).full_name
        except (framing.FramingError, LookupError):
            continue
    raise ConfigError(
        f"subject {subject!r} (schema id {res.schema_id}) defines {len(top)} top-level messages "
        f"({', '.join(m.full_name for m in top)}) and no record to convert is framed with schema id "
        f"{res.schema_id}: name the table's message (iceberg.key.message / iceberg.value.message)"
    )


def descriptor_set_side(
    path: str | os.PathLike[str], message: str, proto_options: ProtoOptions | None = None
) -> SideSpec:
    """Unframed Protobuf decoded with a message from a descriptor-set file (no registry)."""
    with open(path, "rb") as fh:
        data = fh.read()
    return SideSpec(
        "protobuf-unframed",
        message=message,
        descriptor_set=data,
        proto_options=proto_options or ProtoOptions(),
    )


class _Side:
    """Decodes one column of key or value bytes into the side's struct children."""

    decoded_type: StructType  # decoded fields only (placeholder ids)

    def decode(self, datas: list) -> tuple[list[pa.Array], list[bytes | None], list[str | None]]:
        """-> (decoded children, prefixes, errors); rows with an error get null children."""
        raise NotImplementedError

    def decode_keeping(
        self, datas: list
    ) -> tuple[list[pa.Array], list[bytes | None], list[str | None], Sequence[int]]:
        """:meth:`decode` plus the rows without an error whose bytes ``__raw__`` keeps anyway
        (the decoded fields cannot give back everything that was written)."""
        return (*self.decode(datas), ())

    def decode_arrow(
        self, col: pa.Array
    ) -> tuple[list[pa.Array], pa.Array, pa.Array, pa.BooleanArray | None] | None:
        """Optional vectorised fast path over the Arrow column; None = use :meth:`decode`.
        -> (decoded children, prefixes, errors, per row whether ``__raw__`` keeps the bytes
        although nothing failed, or None for no row)."""
        return None


class _RawSide(_Side):
    def __init__(self) -> None:
        self.decoded_type = StructType()

    def decode(self, datas):
        n = len(datas)
        return [], [None] * n, [None] * n

    def decode_arrow(self, col):
        n = len(col)
        return [], pa.nulls(n, pa.binary()), pa.nulls(n, pa.string()), None


def _null_rows(children: list[pa.Array], bad: list[bool], arrow_fields: list[pa.Field]) -> list[pa.Array]:
    """Null out rows where ``bad`` (via a temporary struct's validity, then flatten)."""
    if not children or not any(bad):
        return children
    tmp = pa.StructArray.from_arrays(children, fields=arrow_fields, mask=pa.array(bad, pa.bool_()))
    return tmp.flatten()


class _ProtoSide(_Side):
    def __init__(self, spec: SideSpec, registry: SchemaRegistry | None):
        self.registry = registry
        self.framed = spec.kind == "protobuf"
        if self.framed:
            assert registry is not None and spec.schema_id is not None
            res = registry.resolve(spec.schema_id)
            assert res.proto is not None
            desc = (
                res.proto.message_by_name(spec.message) if spec.message else res.proto.message_by_indexes([0])
            )
        else:
            from google.protobuf import descriptor_pb2

            fds = descriptor_pb2.FileDescriptorSet()
            fds.ParseFromString(spec.descriptor_set or b"")
            schema = ProtoSchema.from_file_descriptor_set(fds)
            desc = schema.message_by_name(spec.message or "")
        self.decoder = ProtoDecoder(desc, spec.proto_options)
        self.decoded_type = self.decoder.iceberg_type
        self._fields = list(self.decoder.arrow_type)
        self._ids: dict[tuple[int, tuple[int, ...]], str | None] = {}

    def _check_id(self, sid: int, indexes: tuple[int, ...]) -> str | None:
        key = (sid, indexes)
        if key in self._ids:
            return self._ids[key]
        err: str | None = None
        assert self.registry is not None  # only registry-framed values are checked
        try:
            res = self.registry.resolve(sid)
            if res.schema_type != PROTOBUF or res.proto is None:
                err = f"schema id {sid} is {res.schema_type}, not PROTOBUF"
            else:
                name = res.proto.message_by_indexes(indexes).full_name
                if name != self.decoder.full_name:
                    err = (
                        f"schema id {sid} message indexes {list(indexes)} name {name}, "
                        f"not the table's {self.decoder.full_name}"
                    )
        except (RegistryUnavailable, RegistryAuthError):
            raise
        except UnknownSchema:
            err = f"unknown schema id {sid}"
        except (SchemaUnusable, LookupError) as exc:
            err = str(exc)
        self._ids[key] = err
        return err

    def decode_arrow(self, col: pa.Array):
        """Vectorised fast path: every non-null value framed with the ``[0]`` shortcut, ids
        already valid, all payloads parse (or, unframed, all payloads parse). Returns None to
        fall back to :meth:`decode`."""
        if len(col) == 0:
            return None
        if not self.framed:
            return self._decode_unframed(col.cast(pa.binary()))
        col = col.cast(pa.binary())
        nonnull = col.drop_null() if col.null_count else col
        if len(nonnull) == 0:
            return None
        if pc.min(pc.binary_length(nonnull)).as_py() < 6:
            return None
        head = pc.binary_slice(nonnull, 0, 1)
        idx = pc.binary_slice(nonnull, 5, 6)
        if not (pc.all(pc.equal(head, b"\x00")).as_py() and pc.all(pc.equal(idx, b"\x00")).as_py()):
            return None
        for sid_bytes in pc.unique(pc.binary_slice(nonnull, 1, 5)).to_pylist():
            sid = int.from_bytes(sid_bytes, "big", signed=True)
            key = (sid, (0,))
            if (self._ids[key] if key in self._ids else self._check_id(sid, (0,))) is not None:
                return None
        payloads = pc.binary_slice(col, 6, 2**31 - 1).to_pylist()
        default = self.decoder.default_message
        parse = self.decoder.cls.FromString
        try:
            if col.null_count:
                msgs = [default if p is None else parse(p) for p in payloads]
            else:
                msgs = list(map(parse, payloads))
            children, lossy = self.decoder.children_lossy(msgs)
        except Exception:  # DecodeError, or a value Arrow rejects: isolate rows in decode()
            return None
        prefixes = pc.binary_slice(col, 0, 6)
        return children, prefixes, pa.nulls(len(col), pa.string()), lossy

    def _decode_unframed(self, col: pa.Array):
        parse = self.decoder.cls.FromString
        default = self.decoder.default_message
        payloads = col.to_pylist()
        try:
            if col.null_count:
                msgs = [default if p is None else parse(p) for p in payloads]
            else:
                msgs = list(map(parse, payloads))
            children, lossy = self.decoder.children_lossy(msgs)
        except Exception:  # DecodeError, or a value Arrow rejects: isolate rows in decode()
            return None
        n = len(col)
        return children, pa.nulls(n, pa.binary()), pa.nulls(n, pa.string()), lossy

    def decode(self, datas):
        return self.decode_keeping(datas)[:3]

    def decode_keeping(self, datas):
        parse = self.decoder.cls.FromString
        default = self.decoder.default_message
        msgs: list = []
        prefixes: list = []
        errs: list = []
        bad: list[bool] = []
        framed = self.framed
        check = self._check_id
        ids = self._ids
        for d in datas:
            if d is None:
                msgs.append(default)
                prefixes.append(None)
                errs.append(None)
                bad.append(False)
                continue
            err = None
            if framed:
                if len(d) >= 6 and d[0] == 0 and d[5] == 0:  # fast path: [0] index shortcut
                    hl = 6
                    sid = int.from_bytes(d[1:5], "big", signed=True)
                    key = (sid, (0,))
                    err = ids[key] if key in ids else check(sid, (0,))
                else:
                    try:
                        fr = framing.parse(d, protobuf=True)
                        hl = fr.header_len
                        err = check(fr.schema_id, fr.indexes or (0,))
                    except framing.FramingError as exc:
                        err, hl = str(exc), 0
                prefix = d[:hl] if hl else None
                payload = d[hl:]
            else:
                prefix, payload = None, d
            if err is None:
                try:
                    msgs.append(parse(payload))
                    prefixes.append(prefix)
                    errs.append(None)
                    bad.append(False)
                    continue
                except DecodeError as exc:
                    err = f"invalid Protobuf for {self.decoder.full_name}: {exc}"
            msgs.append(default)
            prefixes.append(prefix)
            errs.append(err)
            bad.append(True)
        children, lossy = self._children_isolating(msgs, errs, bad)
        children = _null_rows(children, bad, self._fields)
        # rows whose Timestamp/Duration nanos the µs columns cut (failed rows hold the default)
        keep = [] if lossy is None else [i for i, cut in enumerate(lossy.to_pylist()) if cut]
        return children, prefixes, errs, keep

    def _children_isolating(
        self, msgs: list, errs: list, bad: list
    ) -> tuple[list[pa.Array], pa.BooleanArray | None]:
        """Columns for ``msgs`` (and which rows lose data); a message whose values Arrow
        rejects (e.g. a proto2 string with invalid UTF-8, which upb hands out as bytes) becomes
        a record-level error."""
        try:
            return self.decoder.children_lossy(msgs)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            default = self.decoder.default_message
            for i, m in enumerate(msgs):
                if bad[i]:
                    continue
                try:
                    self.decoder.children([m])
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                    errs[i] = (
                        f"cannot convert {self.decoder.full_name} to the table types: "
                        f"{type(exc).__name__}: {exc}"
                    )
                    bad[i] = True
                    msgs[i] = default
            return self.decoder.children_lossy(msgs)


class _AvroSide(_Side):
    def __init__(self, spec: SideSpec, registry: SchemaRegistry):
        assert spec.schema_id is not None
        self.registry = registry
        self.table_id = spec.schema_id
        res = registry.resolve(spec.schema_id)
        self.reader = res.avro
        self.mapper = AvroMapper(res.avro, res.avro_named)
        decoded = self.mapper.iceberg_type
        # a non-record top-level Avro schema becomes a single field named "value"
        self._wrap = not isinstance(decoded, StructType)
        self.decoded_type: StructType = (
            decoded
            if isinstance(decoded, StructType)
            else StructType(NestedField(1, "value", decoded, required=False))
        )
        self._fields = list(to_arrow(self.decoded_type))
        #: schema id -> (writer schema or why it cannot be used, why its rows lose data or None)
        self._writers: dict[int, tuple[Any, str | None]] = {}

    def _writer(self, sid: int) -> tuple[Any, str | None]:
        if sid in self._writers:
            return self._writers[sid]
        loss = None
        try:
            res = self.registry.resolve(sid)
            if res.schema_type == AVRO:
                w = res.avro
                try:
                    loss = resolution_loss(w, self.reader)
                except Exception as exc:  # a schema shape the check does not know: keep the bytes
                    loss = f"cannot compare schema id {sid} with the table's: {type(exc).__name__}: {exc}"
            else:
                w = f"schema id {sid} is {res.schema_type}, not AVRO"
        except (RegistryUnavailable, RegistryAuthError):
            raise
        except UnknownSchema:
            w = f"unknown schema id {sid}"
        except SchemaUnusable as exc:
            w = str(exc)
        self._writers[sid] = (w, loss)
        return w, loss

    def decode(self, datas):
        return self.decode_keeping(datas)[:3]

    def decode_keeping(self, datas):
        datums, prefixes, errs, bad = [], [], [], []
        lossy: list[int] = []  # rows whose writer schema loses data in the table's
        for d in datas:
            if d is None:
                datums.append(None)
                prefixes.append(None)
                errs.append(None)
                bad.append(False)
                continue
            try:
                fr = framing.parse(d, protobuf=False)
            except framing.FramingError as exc:
                datums.append(None)
                prefixes.append(None)
                errs.append(str(exc))
                bad.append(True)
                continue
            prefix = d[:5]
            w, loss = self._writer(fr.schema_id)
            if isinstance(w, str):
                datums.append(None)
                prefixes.append(prefix)
                errs.append(w)
                bad.append(True)
                continue
            try:
                datum = read_datum(d[5:], w, None if fr.schema_id == self.table_id else self.reader)
                datum = self.mapper.normalize(datum)
                if self._wrap:
                    datum = {"value": datum}
                if loss is not None:
                    lossy.append(len(datums))
                datums.append(datum)
                prefixes.append(prefix)
                errs.append(None)
                bad.append(False)
            except Exception as exc:  # fastavro raises many types for corrupt input
                datums.append(None)
                prefixes.append(prefix)
                errs.append(f"invalid Avro for schema id {fr.schema_id}: {type(exc).__name__}: {exc}")
                bad.append(True)
        arr = self._to_arrow(datums, errs, bad)
        if self._wrap:
            children = [arr]
        else:
            children = [arr.field(i) for i in range(arr.type.num_fields)]
            if arr.null_count:
                children = pa.StructArray.from_arrays(
                    children, fields=self._fields, mask=arr.is_null()
                ).flatten()
        return children, prefixes, errs, lossy

    def _to_arrow(self, datums: list, errs: list, bad: list) -> pa.Array:
        """Arrow for the datums; rows Arrow rejects become record-level errors."""
        vals = [None if x is None else x["value"] for x in datums] if self._wrap else datums
        try:
            return self.mapper.to_arrow(vals, normalized=True)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            # find the rows Arrow rejects; they become record-level errors
            out = []
            for i, v in enumerate(vals):
                try:
                    out.append(self.mapper.to_arrow([v], normalized=True))
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                    errs[i] = f"Avro value does not fit the table type: {type(exc).__name__}: {exc}"
                    bad[i] = True
                    datums[i] = None
                    out.append(self.mapper.to_arrow([None], normalized=True))
            return pa.concat_arrays(out)


def build_side(spec: SideSpec) -> _Side:
    registry = SchemaRegistry.shared(spec.registry) if spec.registry else None
    if spec.kind == "raw":
        return _RawSide()
    if spec.kind in ("protobuf", "protobuf-unframed"):
        return _ProtoSide(spec, registry)
    if spec.kind == "avro":
        assert registry is not None
        return _AvroSide(spec, registry)
    raise ValueError(f"unknown side kind {spec.kind!r}")


# ============================================================================ row schema


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


# ============================================================================ encoder


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

    def _side(self, side: _Side, col: pa.Array, fields: list[pa.Field], always_raw: bool) -> pa.Array:
        fast = side.decode_arrow(col)
        if fast is not None:
            children, prefixes, errs, lossy = fast
            keep = always_raw or isinstance(side, _RawSide)  # no schema: the bytes are the value
            if keep:
                raw = col
            elif lossy is not None:  # the decoded fields cannot give back all of these rows
                raw = pc.if_else(lossy, col.cast(pa.binary()), pa.scalar(None, pa.binary()))
            else:
                raw = pa.nulls(len(col), pa.binary())
        else:
            datas = col.to_pylist()
            children, prefixes, errs, lossy = side.decode_keeping(datas)
            if always_raw or isinstance(side, _RawSide):
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
