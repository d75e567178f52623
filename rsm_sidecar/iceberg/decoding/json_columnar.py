"""A columnar JSON decoder: a whole batch of JSON values parsed by PyArrow's JSON reader.

:class:`~rsm_sidecar.iceberg.decoding.json_mapping.JsonMapper` converts values parsed one by one
with :func:`json.loads`; this module gives the same Arrow columns and loss flags for a whole
batch at once: the values in one buffer, one per line (Confluent-framed values in a copy of the
column's bytes, each preamble overwritten with whitespace and a line break; others joined with
line breaks), read by ``pyarrow.json.read_json`` (C++, RapidJSON) with the mapped schema given
explicitly, then ``date``/``time``/``date-time`` strings converted with Arrow kernels (a batch
of ``date``/``date-time`` strings of one length and shape checked with numpy, others with the
regexes). Properties the schema does
not declare are read too (the reader infers their types) only to flag their rows as lossy, and
then dropped from the columns (the row keeps ``__raw__``).

It returns exactly what the per-value path returns, or refuses, and the caller then runs the
per-value path on the batch:

* at build time (:func:`plan_for` returns None), for a schema with a map, a union, a string of
  JSON (``{}``, recursion, free-form objects) or a non-object top level: the reader has no
  conversion for them;
* per batch (:func:`decode` returns None), for anything the reader would read otherwise or
  reject: a value not starting with ``{`` or not ending with ``}`` (leading or trailing
  whitespace, a top-level array, ``null``: the reader crashes on some of these), a line break
  inside a value, a type that does not fit its column (``1.0`` in an ``integer`` property is
  fine for JSON Schema but not for the reader), an integer beyond 64 bits, a duplicated key,
  invalid UTF-8 or JSON, types of undeclared properties that differ between rows, a
  ``date-time`` that is not ``...T...Z`` / ``+00:00`` with at most 6 fractional digits, a
  ``time`` with a non-UTC offset, or a date/time Arrow does not parse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from rsm_sidecar.iceberg.decoding.json_mapping import JsonMapper, Node

_DATE_RE = r"^\d{4}-\d{2}-\d{2}$"
_TS_RE = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|\+00:00)$"
_TIME_RE = r"^(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})(?:\.(?P<f>\d{1,6}))?(?:Z|z|[+-]00:00)?$"


class _Refuse(Exception):
    """The batch is left to the per-value path."""


@dataclass(frozen=True)
class Plan:
    mapper: JsonMapper
    #: what the reader is asked for: the mapped types with dates and times as strings
    read_schema: pa.Schema


def plan_for(mapper: JsonMapper) -> Plan | None:
    """How the reader reads ``mapper``'s schema; None when it cannot (maps, unions, JSON text,
    a non-object top level)."""
    if mapper.wrap:
        return None
    try:
        typ = _read_type(mapper.root)
    except _Refuse:
        return None
    return Plan(mapper, pa.schema(list(typ)))


def _read_type(node: Node) -> pa.DataType:
    k = node.kind
    if k == "struct":
        return pa.struct([pa.field(name, _read_type(sub)) for name, sub in node.fields])
    if k == "list":
        assert node.item is not None
        return pa.list_(pa.field("element", _read_type(node.item)))
    if k in ("date", "time", "timestamp"):
        return pa.string()
    if k in ("boolean", "long", "double", "string"):
        return node.arrow
    raise _Refuse(k)


def decode(plan: Plan, col: pa.Array) -> tuple[pa.StructArray, pa.BooleanArray | None] | None:
    """The values of the binary column ``col`` (JSON texts, nulls allowed: their rows are all
    null) as a struct of the mapper's Arrow type, and per row whether ``__raw__`` must keep
    the value (None: no row); None when the batch is left to the per-value path."""
    n = len(col)
    if n == 0:
        return None
    texts = col.cast(pa.binary())
    if texts.null_count:
        texts = texts.fill_null(b"{}")
    lines = pc.binary_join_element_wise(texts, pa.scalar(b"", pa.binary()), b"\n")
    offsets = np.frombuffer(lines.buffers()[1], np.int32, len(lines) + 1, lines.offset * 4)
    start, end = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(lines.buffers()[2], np.uint8, end - start, start)
    return _read(plan, data, offsets[:-1] - start, offsets[1:] - start - 2)


def decode_framed(
    plan: Plan, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[pa.StructArray, pa.BooleanArray | None] | None:
    """:func:`decode` of the values ``buf[starts + 5:ends]``, each behind a 5-byte Confluent
    preamble at ``buf[starts:starts + 5]`` (no null value; the caller checked the preambles).
    ``buf`` (a copy of the column's bytes, :func:`~rsm_sidecar.iceberg.columnar_bytes.column_buffer`)
    becomes the reader's input in place: each preamble is overwritten with four spaces and a
    line break, so the values need neither slicing nor joining."""
    if len(starts) == 0:
        return None
    for i, byte in enumerate(b"    \n"):
        buf[starts + i] = byte
    first = int(starts[0])
    return _read(plan, buf[first : int(ends[-1])], starts + 5 - first, ends - 1 - first)


def _read(
    plan: Plan, data: np.ndarray, firsts: np.ndarray, lasts: np.ndarray
) -> tuple[pa.StructArray, pa.BooleanArray | None] | None:
    """The reader over ``data``: JSON texts from ``firsts`` to ``lasts`` (their first and last
    byte), one line break between two of them and none inside."""
    n = len(firsts)
    # every line one object: "{" first, "}" last, no line break inside (a carriage return is
    # whitespace to the reader, so it may stay)
    if np.count_nonzero(data == 10) != n or (data[firsts] != 123).any() or (data[lasts] != 125).any():
        return None
    try:
        table = pj.read_json(
            pa.BufferReader(pa.py_buffer(data)),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(len(data), 1 << 16) + 1),
            parse_options=pj.ParseOptions(
                explicit_schema=plan.read_schema, unexpected_field_behavior="infer"
            ),
        )
    except Exception:  # ArrowInvalid for bad JSON or types, UnicodeDecodeError for bad UTF-8
        return None
    if table.num_rows != n:
        return None
    read = pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], fields=list(table.schema))
    lossy = np.zeros(n, np.bool_)
    try:
        out = _convert(plan.mapper.root, read, np.arange(n), lossy)
    except (_Refuse, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    assert isinstance(out, pa.StructArray)
    return out, pa.array(lossy) if lossy.any() else None


def _valid(arr: pa.Array) -> np.ndarray:
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _convert(node: Node, arr: pa.Array, rows: np.ndarray, lossy: np.ndarray) -> pa.Array:
    """``arr`` (read with :func:`_read_type`'s type, plus inferred undeclared properties) as
    ``node``'s Arrow type; ``rows``: the top-level row of each element; undeclared properties
    with a value flag their rows in ``lossy``."""
    k = node.kind
    if k == "struct":
        assert isinstance(arr, pa.StructArray)
        declared = dict(node.fields)
        children = arr.flatten()
        out = []
        for f, child in zip(arr.type, children):
            if f.name not in declared and child.null_count != len(child):
                lossy[rows[_valid(child)]] = True
        by_name = {f.name: child for f, child in zip(arr.type, children)}
        for name, sub in node.fields:
            out.append(_convert(sub, by_name[name], rows, lossy))
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(out, fields=list(node.arrow), mask=mask)
    if k == "list":
        assert node.item is not None and isinstance(arr, pa.ListArray)
        values = pc.list_flatten(arr)
        parents = pc.list_parent_indices(arr).to_numpy()
        inner = _convert(node.item, values, rows[parents], lossy)
        offsets = arr.offsets
        if arr.offset or offsets[0].as_py():
            offsets = pc.subtract(offsets, offsets[0])
        mask = arr.is_null() if arr.null_count else None
        return pa.ListArray.from_arrays(offsets, inner, type=node.arrow, mask=mask)
    if k == "date":
        if not _all_of_shape(arr, _DATE_SHAPES):
            _all_match(arr, _DATE_RE)
        return arr.cast(pa.date32())
    if k == "timestamp":
        if not _all_of_shape(arr, _TS_SHAPES):
            _all_match(arr, _TS_RE)
        return arr.cast(node.arrow)
    if k == "time":
        return _times(arr)
    return arr if arr.type == node.arrow else arr.cast(node.arrow)


def _shapes(*texts: str) -> dict[int, list[tuple[np.ndarray, np.ndarray]]]:
    """Fixed-width shapes by width: per shape the lowest byte at each position and how far
    above it a byte may be (``D`` any ASCII digit, any other character itself)."""
    out: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for text in texts:
        raw = np.frombuffer(text.encode(), np.uint8)
        digit = raw == ord("D")
        lo = np.where(digit, ord("0"), raw).astype(np.uint8)
        out.setdefault(len(text), []).append((lo, np.where(digit, 9, 0).astype(np.uint8)))
    return out


#: every value :data:`_DATE_RE` / :data:`_TS_RE` accepts, as fixed-width shapes
_DATE_SHAPES = _shapes("DDDD-DD-DD")
_TS_SHAPES = _shapes(
    *(
        "DDDD-DD-DDTDD:DD:DD" + frac + zone
        for frac in ["", *("." + "D" * k for k in range(1, 7))]
        for zone in ("Z", "+00:00")
    )
)


def _all_of_shape(arr: pa.Array, shapes: dict[int, list[tuple[np.ndarray, np.ndarray]]]) -> bool:
    """Whether the string array ``arr`` has no null and all its values have one length and one
    of ``shapes``: a vectorised accept for the common batch (a producer writes one format), each
    shape being values its regex accepts; False leaves the decision to the regex."""
    n = len(arr)
    if n == 0 or arr.null_count:
        return False
    offsets = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4)
    width = int(offsets[1] - offsets[0])
    if width not in shapes or int(offsets[-1] - offsets[0]) != n * width or (np.diff(offsets) != width).any():
        return False
    chars = np.frombuffer(arr.buffers()[2], np.uint8, n * width, int(offsets[0])).reshape(n, width)
    # a byte below lo wraps around to above any span
    return any(bool(((chars - lo) <= span).all()) for lo, span in shapes[width])


def _all_match(arr: pa.Array, pattern: str) -> None:
    if arr.null_count != len(arr) and not pc.all(pc.match_substring_regex(arr, pattern)).as_py():
        raise _Refuse(pattern)


def _times(arr: pa.Array) -> pa.Array:
    _all_match(arr, _TIME_RE)
    parts = pc.extract_regex(arr, _TIME_RE)
    h, m, s = (pc.struct_field(parts, x).cast(pa.int64()) for x in ("h", "m", "s"))
    if pc.any(
        pc.or_(pc.greater_equal(h, 24), pc.or_(pc.greater_equal(m, 60), pc.greater_equal(s, 60)))
    ).as_py():
        raise _Refuse("time out of range")
    frac = pc.utf8_rpad(pc.struct_field(parts, "f"), 6, "0")
    frac = pc.if_else(pc.equal(frac, ""), "000000", frac).cast(pa.int64())
    us = pc.add(pc.multiply(pc.add(pc.multiply(pc.add(pc.multiply(h, 60), m), 60), s), 1_000_000), frac)
    return us.cast(pa.time64("us"))
