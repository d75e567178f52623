"""Key and value bytes -> the decoded columns of one side (``key`` or ``val``) of the table.

:func:`resolve_side` / :func:`descriptor_set_side` decide, on the driver, how a side is decoded
(raw, Protobuf through the registry or a descriptor set, Avro through the registry, JSON through
the registry or a JSON Schema of its own) and give a
picklable :class:`SideSpec`; :func:`build_side` rebuilds it on an executor as a :class:`Side`,
whose ``decode`` turns a column of framed values into ``__raw__``, ``__prefix__``, ``__err__``
and the decoded fields (:mod:`~rsm_sidecar.iceberg.decoding.proto_mapping`,
:mod:`~rsm_sidecar.iceberg.decoding.avro_mapping`,
:mod:`~rsm_sidecar.iceberg.decoding.json_mapping`). Record-level problems (no magic byte,
unknown schema id, bytes that do not decode) set ``__err__`` and ``__raw__``; a registry that is
down raises :class:`~rsm_sidecar.iceberg.decoding.schema_registry.RegistryUnavailable`.

A registry side can also decode values *without* the registry's framing with the subject's
latest schema (``iceberg.<side>.unframed = latest``, the rule of the seed's deserializer:
:class:`UnframedLatest`); the schema id each row was decoded with is then the side's first
decoded field, ``__schema_id__``.
"""

from __future__ import annotations

import io
import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError
from pyiceberg.types import (
    IntegerType,
    NestedField,
    StructType,
)

from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg.columnar_bytes import column_buffer, preamble_ids
from rsm_sidecar.iceberg.decoding import avro_columnar, framing, json_columnar, proto_columnar
from rsm_sidecar.iceberg.decoding.avro_mapping import AvroMapper, read_datum, resolution_loss
from rsm_sidecar.iceberg.decoding.json_mapping import JsonMapper, Mismatch, parse, schema_from_text
from rsm_sidecar.iceberg.decoding.proto_mapping import ProtoDecoder, ProtoOptions
from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema
from rsm_sidecar.iceberg.decoding.schema_registry import (
    AVRO,
    JSON,
    PROTOBUF,
    RegistryAuthError,
    RegistryUnavailable,
    ResolvedSchema,
    SchemaRegistry,
    SchemaUnusable,
    SubjectSpec,
    UnknownSchema,
)
from rsm_sidecar.iceberg.types import SIDE_COLUMNS, check_reserved, to_arrow

#: The side's first decoded field when unframed values are decoded with the latest schema: the
#: id of the schema each row was decoded with (null when nothing was decoded).
SCHEMA_ID = "__schema_id__"
#: ``iceberg.<side>.unframed``: what a value without the registry's framing becomes
UNFRAMED_MODES = ("error", "latest")


@dataclass(frozen=True)
class SideSpec:
    """Picklable description of how one side (key or value) is decoded.

    ``kind``: ``raw`` (no schema), ``protobuf`` / ``avro`` / ``json`` (Confluent-framed, schema
    ids from ``registry``; the table schema is ``schema_id``, pinned at job start),
    ``protobuf-unframed`` (no preamble; the message from ``descriptor_set``) or ``json-unframed``
    (no preamble; the JSON Schema document ``json_schema``, from a file or inferred, as
    ``json_source`` says). ``unframed_latest`` (``protobuf`` / ``avro`` / ``json``): values
    without the registry's framing are decoded with the pinned latest schema ``schema_id``
    instead of being record-level errors.
    """

    kind: str = "raw"
    registry: Mapping[str, Any] | None = field(default=None, repr=False)  # may hold credentials
    schema_id: int | None = None
    message: str | None = None
    descriptor_set: bytes | None = None
    proto_options: ProtoOptions = field(default_factory=ProtoOptions)
    unframed_latest: bool = False
    #: the subject and version of ``schema_id`` (for the log)
    subject: str | None = None
    version: int | None = None
    #: ``json-unframed``: the JSON Schema's text, and where it comes from (for the log)
    json_schema: str | None = None
    json_source: str | None = None
    #: ``json_schema`` was inferred (the table records it: :func:`json_schema_property`)
    json_inferred: bool = False

    def describe(self) -> str:
        """How the side is decoded, for the job's log."""
        if self.kind in ("protobuf", "avro", "json"):
            what = " ".join(filter(None, (self.kind, self.message)))
            schema = f"{self.subject} version {self.version} (schema id {self.schema_id})"
            unframed = "decoded with it" if self.unframed_latest else "a record error"
            return f"{what} of {schema}; values without framing: {unframed}"
        if self.kind == "protobuf-unframed":
            return f"unframed protobuf {self.message} from a descriptor set"
        if self.kind == "json-unframed":
            return f"unframed JSON with {self.json_source}"
        return "raw"


def resolve_side(
    registry: SchemaRegistry | None,
    topic: str,
    is_key: bool,
    subject: SubjectSpec | None = None,
    proto_options: ProtoOptions | None = None,
    samples: Iterable[bytes] = (),
    recorded: str | None = None,
    unframed: str = "error",
) -> SideSpec:
    """Driver-side: pin the latest schema of the side's subject (TopicNameStrategy unless
    ``subject.subject``). No such subject -> ``raw``. Registry down -> RegistryUnavailable.

    For Protobuf the table's message is ``subject.message`` if given, else the only top-level
    message of the schema file, else ``recorded`` (the message the existing table was made
    from) if the schema still defines it, else the message named by the indexes of the first
    of ``samples`` (framed records of the topic, read lazily, at most
    :data:`MAX_SAMPLES`) that carries the pinned schema id; otherwise :class:`ConfigError`
    asks for ``SubjectSpec.message``.

    ``unframed``: ``error`` (a value without the registry's framing is a record-level error) or
    ``latest`` (it is decoded with the pinned latest schema: :class:`UnframedLatest`).
    """
    if unframed not in UNFRAMED_MODES:
        raise ConfigError(f"unframed: {unframed!r} is not one of {', '.join(UNFRAMED_MODES)}")
    latest = unframed == "latest"
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
        kind = PROTOBUF
    elif res.schema_type in (AVRO, JSON):
        msg, kind = None, res.schema_type
    else:
        return SideSpec("raw", proto_options=opts)
    return SideSpec(
        kind.lower(),
        dict(registry.conf),
        res.schema_id,
        msg,
        proto_options=opts,
        unframed_latest=latest,
        subject=name,
        version=res.version,
    )


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


def json_schema_side(path: str | os.PathLike[str]) -> SideSpec:
    """Unframed JSON decoded with the JSON Schema in the file ``path`` (no registry)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    where = f"the JSON Schema file {os.fspath(path)}"
    JsonMapper(schema_from_text(text, where), where=where)  # fail at start on a schema it cannot map
    return SideSpec("json-unframed", json_schema=text, json_source=where)


def json_schema_property(is_key: bool) -> str:
    """Table property holding a side's inferred JSON Schema (later runs merge with it)."""
    return f"rsm.{'key' if is_key else 'value'}.json-schema"


def inferred_json_side(values: Iterable[bytes], recorded: str | None = None) -> SideSpec:
    """Unframed JSON decoded with a JSON Schema inferred from ``values`` (a sample of the
    side's records; those that are not JSON are skipped) merged with ``recorded``, the schema
    an earlier run inferred (:mod:`.json_inference`); ``raw`` while nothing is known."""
    from rsm_sidecar.iceberg.decoding.json_inference import infer

    seen = 0

    def parsed():
        nonlocal seen
        for v in values:
            try:
                doc = parse(v)
            except (ValueError, RecursionError):
                continue
            seen += 1
            yield doc

    schema = infer(
        parsed(), schema_from_text(recorded, "the table's recorded JSON Schema") if recorded else None
    )
    if schema is None:
        return SideSpec("raw")
    text = json.dumps(schema, separators=(",", ":"))
    source = f"a JSON Schema inferred from {seen} value(s)" + (" and the table's" if recorded else "")
    return SideSpec("json-unframed", json_schema=text, json_source=source, json_inferred=True)


class Side:
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


class RawSide(Side):
    def __init__(self) -> None:
        self.decoded_type = StructType()

    def decode(self, datas):
        n = len(datas)
        return [], [None] * n, [None] * n

    def decode_arrow(self, col):
        n = len(col)
        return [], pa.nulls(n, pa.binary()), pa.nulls(n, pa.string()), None


def resolve_id(
    registry: SchemaRegistry, sid: int, schema_type: str
) -> tuple[ResolvedSchema | None, str | None]:
    """The schema of id ``sid`` if it is of ``schema_type``, else why a record framed with it is
    a record-level error (unknown, unusable, another type); a registry that is down or refuses
    our credentials raises (job-level)."""
    try:
        res = registry.resolve(sid)
    except (RegistryUnavailable, RegistryAuthError):
        raise
    except UnknownSchema:
        return None, f"unknown schema id {sid}"
    except SchemaUnusable as exc:
        return None, str(exc)
    if res.schema_type != schema_type:
        return None, f"schema id {sid} is {res.schema_type}, not {schema_type}"
    return res, None


def _null_rows(children: list[pa.Array], bad: list[bool], arrow_fields: list[pa.Field]) -> list[pa.Array]:
    """Null out rows where ``bad`` (via a temporary struct's validity, then flatten)."""
    if not children or not any(bad):
        return children
    tmp = pa.StructArray.from_arrays(children, fields=arrow_fields, mask=pa.array(bad, pa.bool_()))
    return tmp.flatten()


class ProtoSide(Side):
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
        #: how :mod:`.proto_columnar` reads the message (None: always upb)
        self.columnar_plan = proto_columnar.plan_for(self.decoder)
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
        decoded = self._decode_all(col, 6)
        if decoded is None:
            return None
        children, lossy = decoded
        prefixes = pc.binary_slice(col, 0, 6)
        return children, prefixes, pa.nulls(len(col), pa.string()), lossy

    def _decode_all(self, col: pa.Array, skip: int):
        """``(children, lossy)`` of every value of the binary column ``col`` after its first
        ``skip`` bytes (null: the default message): read columnar from the bytes when the schema
        and batch allow it (:mod:`.proto_columnar`), else parsed with upb; None when a payload
        does not parse."""
        plan = self.columnar_plan
        decoded = None if plan is None else proto_columnar.decode(plan, col, skip)
        if decoded is not None:
            return decoded
        payloads = (pc.binary_slice(col, skip, 2**31 - 1) if skip else col).to_pylist()
        default = self.decoder.default_message
        parse = self.decoder.cls.FromString
        try:
            if col.null_count:
                msgs = [default if p is None else parse(p) for p in payloads]
            else:
                msgs = list(map(parse, payloads))
            return self.decoder.children_lossy(msgs)
        except Exception:  # DecodeError, or a value Arrow rejects: isolate rows in decode()
            return None

    def _decode_unframed(self, col: pa.Array):
        decoded = self._decode_all(col, 0)
        if decoded is None:
            return None
        children, lossy = decoded
        n = len(col)
        return children, pa.nulls(n, pa.binary()), pa.nulls(n, pa.string()), lossy

    def decode(self, datas):
        return self.decode_keeping(datas)[:3]

    def decode_keeping(self, datas):
        return self._decode_values(datas, self.framed)

    def framed_value(self, data: bytes) -> bool:
        """Whether ``data`` is taken for a framed value (:class:`UnframedLatest`): it starts
        with the magic byte, which no Protobuf message does (its first byte is a tag, and field
        number 0 does not exist), or with KoP's marker (an error that names it, never decoded)."""
        return data[:1] == b"\x00" or (data[:2] == framing.KOP_MARKER and len(data) >= 10)

    def decode_unframed(self, datas: list) -> tuple[list[pa.Array], list[str | None], Sequence[int]]:
        """``datas`` (none null) decoded without a preamble with the side's message: (decoded
        children, errors, rows ``__raw__`` keeps although nothing failed)."""
        children, _, errs, keep = self._decode_values(datas, False)
        return children, errs, keep

    def decode_unframed_arrow(self, col: pa.Array):
        """:meth:`decode_unframed` vectorised: ``(children, lossy)``, or None (a row fails)."""
        return self._decode_all(col.cast(pa.binary()), 0)

    def why_unframed(self, data: bytes) -> str:
        return "missing magic byte"

    def _decode_values(self, datas, framed: bool):
        parse = self.decoder.cls.FromString
        default = self.decoder.default_message
        msgs: list = []
        prefixes: list = []
        errs: list = []
        bad: list[bool] = []
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


class AvroSide(Side):
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
        #: schema id -> (writer schema, why it cannot be used, why its rows lose data); a schema
        #: may be a plain string (``"string"``), so the reason it cannot be used is apart
        self._writers: dict[int, tuple[Any, str | None, str | None]] = {}
        #: schema id -> (its columnar plan or None, whether its rows lose data)
        self._plans: dict[int, tuple[avro_columnar.Plan | None, bool]] = {}

    def _writer(self, sid: int) -> tuple[Any, str | None, str | None]:
        if sid in self._writers:
            return self._writers[sid]
        w = loss = None
        res, err = resolve_id(self.registry, sid, AVRO)
        if res is not None:
            w = res.avro
            try:
                loss = resolution_loss(w, self.reader)
            except Exception as exc:  # a schema shape the check does not know: keep the bytes
                loss = f"cannot compare schema id {sid} with the table's: {type(exc).__name__}: {exc}"
        self._writers[sid] = (w, err, loss)
        return w, err, loss

    def decode_arrow(self, col: pa.Array):
        """The batch read columnar from its bytes (:mod:`.avro_columnar`); None when a value
        is not framed, its schema id has no plan or it does not decode: :meth:`decode_keeping`
        then decodes the batch value by value with fastavro."""
        if len(col) == 0:
            return None
        return avro_columnar.decode_framed(col, self.mapper.arrow_type, self._wrap, self._plan)

    def _plan(self, sid: int) -> tuple[avro_columnar.Plan | None, bool]:
        if sid not in self._plans:
            w, err, loss = self._writer(sid)
            reader = None if sid == self.table_id else self.reader
            plan = None if err is not None else avro_columnar.plan_for(w, reader, self.mapper)
            self._plans[sid] = (plan, loss is not None)
        return self._plans[sid]

    def decode(self, datas):
        return self.decode_keeping(datas)[:3]

    def framed_value(self, data: bytes) -> bool:
        """Whether ``data`` is taken for a framed value (:class:`UnframedLatest`): the magic
        byte and a schema id the registry has as an Avro schema, or KoP's marker (an error that
        names it, never decoded). An unframed datum may start with ``0x00`` too (a first field
        0, false or empty), so the id must exist."""
        if data[:2] == framing.KOP_MARKER and len(data) >= 10:
            return True
        if len(data) < 5 or data[0] != 0:
            return False
        _, err, _ = self._writer(int.from_bytes(data[1:5], "big", signed=True))
        return err is None

    def why_unframed(self, data: bytes) -> str:
        """Why ``data``, which starts like a preamble, was not taken for a framed value."""
        _, err, _ = self._writer(int.from_bytes(data[1:5], "big", signed=True))
        return err if err is not None else "framed"

    def decode_unframed_arrow(self, col: pa.Array):
        """No vectorised unframed path: :meth:`decode_unframed` decodes them."""
        return None

    def decode_unframed(self, datas: list) -> tuple[list[pa.Array], list[str | None], Sequence[int]]:
        """``datas`` (none null) decoded as datums of the table's schema without a preamble:
        (decoded children, errors, rows ``__raw__`` keeps although nothing failed). A datum
        must use every byte of its value: fastavro stops where the schema ends, and bytes left
        over mean the value is not a datum of this schema."""
        import fastavro

        _, _, loss = self._writer(self.table_id)
        datums: list = []
        errs: list[str | None] = []
        bad: list[bool] = []
        lossy: list[int] = []
        for d in datas:
            buf = io.BytesIO(d)
            try:
                datum = fastavro.schemaless_reader(
                    buf, self.reader, None, return_record_name=True, return_record_name_override=True
                )
                if buf.tell() != len(d):
                    raise ValueError(f"{len(d) - buf.tell()} byte(s) left after the datum")
                datum = self.mapper.normalize(datum)
            except Exception as exc:  # fastavro raises many types for corrupt input
                datums.append(None)
                errs.append(
                    f"invalid Avro for the latest schema id {self.table_id} (unframed value): "
                    f"{type(exc).__name__}: {exc}"
                )
                bad.append(True)
                continue
            if loss is not None:
                lossy.append(len(datums))
            datums.append({"value": datum} if self._wrap else datum)
            errs.append(None)
            bad.append(False)
        return self._children(datums, errs, bad), errs, lossy

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
            w, err, loss = self._writer(fr.schema_id)
            if err is not None:
                datums.append(None)
                prefixes.append(prefix)
                errs.append(err)
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
        return self._children(datums, errs, bad), prefixes, errs, lossy

    def _children(self, datums: list, errs: list, bad: list) -> list[pa.Array]:
        """The decoded children of the datums (rows Arrow rejects become errors)."""
        arr = self._to_arrow(datums, errs, bad)
        if self._wrap:
            children = [arr]
        else:
            children = [arr.field(i) for i in range(arr.type.num_fields)]
            if arr.null_count:
                children = pa.StructArray.from_arrays(
                    children, fields=self._fields, mask=arr.is_null()
                ).flatten()
        return children

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


class JsonSide(Side):
    """JSON values: Confluent-framed with a registry schema id of type JSON (``json``; any
    JSON id decodes with the side's pinned schema, as Protobuf does, since JSON needs no
    writer schema), or unframed with a JSON Schema of the side's own (``json-unframed``).
    Batches are read columnar by PyArrow's JSON reader (:mod:`.json_columnar`) where it can,
    else value by value (:func:`~.json_mapping.parse`, :class:`~.json_mapping.JsonMapper`)."""

    def __init__(self, spec: SideSpec, registry: SchemaRegistry | None):
        self.registry = registry
        self.framed = spec.kind == "json"
        if self.framed:
            assert registry is not None and spec.schema_id is not None
            res = registry.resolve(spec.schema_id)
            where = f"schema id {spec.schema_id}"
            self.mapper = JsonMapper(res.json, res.json_refs, where)
        else:
            where = spec.json_source or "the JSON Schema"
            self.mapper = JsonMapper(schema_from_text(spec.json_schema or "true", where), where=where)
        self.plan = json_columnar.plan_for(self.mapper)
        self.decoded_type = self.mapper.iceberg_type
        self._fields = list(self.mapper.arrow_type)
        self._ids: dict[int, str | None] = {}

    def _check_id(self, sid: int) -> str | None:
        if sid in self._ids:
            return self._ids[sid]
        assert self.registry is not None
        err = self._ids[sid] = resolve_id(self.registry, sid, JSON)[1]
        return err

    def _columnar(self, payloads: pa.Array):
        """``(children, lossy)`` of a column of JSON texts, or None (:mod:`.json_columnar`)."""
        if self.plan is None:
            return None
        decoded = json_columnar.decode(self.plan, payloads)
        if decoded is None:
            return None
        struct, lossy = decoded
        return struct.flatten(), lossy

    def decode_arrow(self, col: pa.Array):
        """Vectorised: every non-null value framed with a JSON schema id (or, unframed, any
        batch) that the columnar reader accepts; None otherwise (:meth:`decode_keeping`)."""
        if len(col) == 0:
            return None
        col = col.cast(pa.binary())
        n = len(col)
        if not self.framed:
            decoded = self._columnar(col)
            if decoded is None:
                return None
            return decoded[0], pa.nulls(n, pa.binary()), pa.nulls(n, pa.string()), decoded[1]
        if self.plan is None:
            return None
        buf, offsets = column_buffer(col)
        rows = np.flatnonzero(np.asarray(col.is_valid())) if col.null_count else None
        starts, ends = (
            (offsets[:-1], offsets[1:]) if rows is None else (offsets[:-1][rows], offsets[1:][rows])
        )
        sids = preamble_ids(buf, starts, ends, 6)
        if sids is None or len(sids) == 0:
            return None
        for sid in np.unique(sids).tolist():
            if self._check_id(sid) is not None:
                return None
        if rows is None:  # the reader reads the column's bytes in place of their preambles
            decoded = json_columnar.decode_framed(self.plan, buf, starts, ends)
        else:
            decoded = json_columnar.decode(self.plan, pc.binary_slice(col, 5, 2**31 - 1))
        if decoded is None:
            return None
        struct, lossy = decoded
        return struct.flatten(), pc.binary_slice(col, 0, 5), pa.nulls(n, pa.string()), lossy

    def decode(self, datas):
        return self.decode_keeping(datas)[:3]

    def framed_value(self, data: bytes) -> bool:
        """Whether ``data`` is taken for a framed value (:class:`UnframedLatest`): it starts with
        the magic byte, which no JSON text does, or with KoP's marker (an error, never decoded)."""
        return data[:1] == b"\x00" or (data[:2] == framing.KOP_MARKER and len(data) >= 10)

    def why_unframed(self, data: bytes) -> str:
        return "missing magic byte"

    def decode_unframed_arrow(self, col: pa.Array):
        return self._columnar(col.cast(pa.binary()))

    def decode_unframed(self, datas: list) -> tuple[list[pa.Array], list[str | None], Sequence[int]]:
        children, _, errs, keep = self._decode_values(datas, False)
        return children, errs, keep

    def decode_keeping(self, datas):
        return self._decode_values(datas, self.framed)

    def _decode_values(self, datas: list, framed: bool):
        n = len(datas)
        values: list[Any] = [None] * n
        prefixes: list[bytes | None] = [None] * n
        errs: list[str | None] = [None] * n
        for i, d in enumerate(datas):
            if d is None:
                continue
            payload = d
            if framed:
                try:
                    fr = framing.parse(d, protobuf=False)
                except framing.FramingError as exc:
                    errs[i] = str(exc)
                    continue
                prefixes[i], payload = d[:5], d[5:]
                if (err := self._check_id(fr.schema_id)) is not None:
                    errs[i] = err
                    continue
            try:
                values[i] = parse(payload)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
                errs[i] = f"invalid JSON: {type(exc).__name__}: {exc}"
        rows, lossy = self._rows(values, errs)
        keep = [i for i in range(n) if lossy[i] and errs[i] is None]
        return self._children(rows, errs), prefixes, errs, keep

    def _rows(self, values: list, errs: list) -> tuple[list[Any], list[bool]]:
        """The Python values Arrow takes (rows that do not fit the schema become errors)."""
        rows: list[Any] = [None] * len(values)
        lossy = [False] * len(values)
        convert = self.mapper.convert
        for i, v in enumerate(values):
            if v is None or errs[i] is not None:
                continue
            try:
                rows[i], lossy[i] = convert(v)
            except Mismatch as exc:
                errs[i] = f"JSON does not match {self.mapper.where}: {exc}"
            except RecursionError:
                errs[i] = f"JSON nested too deeply for {self.mapper.where}"
        return rows, lossy

    def _children(self, rows: list, errs: list[str | None]) -> list[pa.Array]:
        try:
            arr = pa.array(rows, self.mapper.arrow_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            # a value Arrow rejects (a lone surrogate in a string) makes its row an error
            parts = []
            for i, r in enumerate(rows):
                try:
                    parts.append(pa.array([r], self.mapper.arrow_type))
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                    errs[i] = f"JSON value does not fit the table types: {type(exc).__name__}: {exc}"
                    parts.append(pa.array([None], self.mapper.arrow_type))
            arr = pa.concat_arrays(parts)
        return pa.StructArray.from_arrays(
            [arr.field(i) for i in range(arr.type.num_fields)], fields=self._fields, mask=arr.is_null()
        ).flatten()


class UnframedLatest(Side):
    """A registry side whose values without the registry's framing are decoded with the
    side's pinned latest schema instead of being errors (the seed's deserializer rule: KoP
    decodes a value that names no schema version with the subject's latest schema).

    Which values are framed is the inner side's call (``framed_value``): for Protobuf every
    value starting with the magic byte; for Avro only those whose schema id the registry has as
    an Avro schema, because an unframed datum can start with ``0x00`` too. Such a value read as
    unframed also keeps its bytes in ``__raw__`` (it may be a framed value whose schema was
    deleted). KoP's marker stays an error. Unframed rows get a null ``__prefix__``.
    ``__schema_id__``, the side's first decoded field, is the id of the schema each decoded row
    was read with: the id in its preamble, or the latest schema's; null where nothing was
    decoded (errors, tombstones).
    """

    def __init__(self, inner: ProtoSide | AvroSide | JsonSide, schema_id: int):
        self.inner, self.schema_id = inner, schema_id
        for f in inner.decoded_type.fields:
            check_reserved(
                f.name,
                (*SIDE_COLUMNS, SCHEMA_ID),
                "the side's struct (iceberg.<side>.unframed = latest)",
                f"field {f.name!r} of schema id {schema_id}",
            )
        fields = inner.decoded_type.fields
        self.decoded_type = StructType(
            NestedField(1, SCHEMA_ID, IntegerType(), required=False),
            *[NestedField(i + 2, f.name, f.field_type, required=False) for i, f in enumerate(fields)],
        )

    def decode(self, datas):
        return self.decode_keeping(datas)[:3]

    def decode_arrow(self, col: pa.Array):
        """Vectorised when no value of the batch starts with the magic byte (or KoP's marker)
        and the inner side decodes them all unframed, or when every value starts with it and the
        inner side's own fast path decodes every row; None otherwise (:meth:`decode_keeping`)."""
        col = col.cast(pa.binary())
        nonnull = col.drop_null() if col.null_count else col
        if len(nonnull) == 0:
            return None
        n = len(col)
        magic = pc.equal(pc.binary_slice(nonnull, 0, 1), b"\x00")
        if not pc.any(magic).as_py():
            if pc.any(pc.equal(pc.binary_slice(nonnull, 0, 2), framing.KOP_MARKER)).as_py():
                return None
            decoded = self.inner.decode_unframed_arrow(col)
            if decoded is None:
                return None
            children, lossy = decoded
            ids = pc.if_else(
                col.is_valid(), pa.scalar(self.schema_id, pa.int32()), pa.scalar(None, pa.int32())
            )
            return [ids, *children], pa.nulls(n, pa.binary()), pa.nulls(n, pa.string()), lossy
        if not pc.all(magic).as_py():
            return None
        fast = self.inner.decode_arrow(col)
        if fast is None:
            return None
        children, prefixes, errs, lossy = fast
        if errs.null_count != len(errs):
            return None  # a framed row failed: for Avro it may be an unframed datum
        return [_preamble_ids(prefixes), *children], prefixes, errs, lossy

    def decode_keeping(self, datas):
        framed: list[int] = []
        unframed: list[int] = []
        ambiguous: list[int] = []  # unframed although it starts like a preamble
        for i, d in enumerate(datas):
            if d is None or self.inner.framed_value(d):
                framed.append(i)
            else:
                unframed.append(i)
                if len(d) >= 5 and d[0] == 0:
                    ambiguous.append(i)
        n = len(datas)
        prefixes: list[bytes | None] = [None] * n
        errs: list[str | None] = [None] * n
        ids: list[int | None] = [None] * n
        keep: list[int] = list(ambiguous)
        parts: list[list[pa.Array]] = []
        if framed or not unframed:
            f_children, f_prefixes, f_errs, f_keep = self.inner.decode_keeping([datas[i] for i in framed])
            parts.append(f_children)
            for k, i in enumerate(framed):
                prefixes[i], errs[i] = f_prefixes[k], f_errs[k]
                if f_errs[k] is None and f_prefixes[k] is not None:
                    ids[i] = int.from_bytes(f_prefixes[k][1:5], "big", signed=True)
            keep.extend(framed[k] for k in f_keep)
        if unframed:
            u_children, u_errs, u_keep = self.inner.decode_unframed([datas[i] for i in unframed])
            parts.append(u_children)
            for k, i in enumerate(unframed):
                errs[i] = u_errs[k]
                if u_errs[k] is None:
                    ids[i] = self.schema_id
            keep.extend(unframed[k] for k in u_keep)
            for i in ambiguous:
                if errs[i] is not None:
                    errs[i] = f"{self.inner.why_unframed(datas[i])}, and as an unframed value: {errs[i]}"
        if len(parts) == 1:
            children = parts[0]
        else:  # the rows of both groups back in their order
            where = [0] * n
            for k, i in enumerate(framed + unframed):
                where[i] = k
            order = pa.array(where, pa.int32())
            children = [pc.take(pa.concat_arrays([f, u]), order) for f, u in zip(*parts)]
        return [pa.array(ids, pa.int32()), *children], prefixes, errs, keep


def _preamble_ids(prefixes: pa.Array) -> pa.Array:
    """The schema ids (bytes 1-4, big-endian) of a column of preambles (null stays null)."""
    ids = pc.fill_null(pc.binary_slice(prefixes, 1, 5), b"\x00" * 4).cast(pa.binary())
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    offsets = np.frombuffer(ids.buffers()[1], np.int32, len(ids) + 1, ids.offset * 4)
    values = np.frombuffer(ids.buffers()[2], ">i4", len(ids), int(offsets[0])).astype(np.int32)
    return pa.array(values, pa.int32(), mask=prefixes.is_null().to_numpy(zero_copy_only=False))


def build_side(spec: SideSpec) -> Side:
    registry = SchemaRegistry.shared(spec.registry) if spec.registry else None
    side: Side
    if spec.kind == "raw":
        return RawSide()
    if spec.kind in ("protobuf", "protobuf-unframed"):
        side = ProtoSide(spec, registry)
    elif spec.kind == "avro":
        assert registry is not None
        side = AvroSide(spec, registry)
    elif spec.kind in ("json", "json-unframed"):
        side = JsonSide(spec, registry)
    else:
        raise ValueError(f"unknown side kind {spec.kind!r}")
    if spec.unframed_latest:
        assert spec.schema_id is not None and isinstance(side, ProtoSide | AvroSide | JsonSide)
        return UnframedLatest(side, spec.schema_id)
    return side
