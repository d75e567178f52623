"""JSON Schema -> Iceberg types, and parsed JSON values -> Arrow.

==========================================  ===============================================
JSON Schema                                 Iceberg (every field optional)
==========================================  ===============================================
``object`` with ``properties``              struct of the properties, in declared order
``object`` without ``properties``, with     map<string, V> (several patterns: V is their
``additionalProperties`` or                 common type, or a string of JSON)
``patternProperties`` schemas
``array`` with an ``items`` schema          list
``integer`` / ``number`` / ``boolean``      long / double / boolean
``string``                                  string
``string`` + ``format: date``               date
``string`` + ``format: date-time``          timestamptz (µs)
``string`` + ``format: time``               time (µs, the time as written)
``string`` + ``format: uuid``               string (as Avro's uuid: Spark shows Iceberg's
                                            uuid as a string anyway)
``enum`` / ``const`` without ``type``       the type of their values (mixed: string of JSON)
``type: [T, "null"]``, ``oneOf``/``anyOf``  optional T
with ``null`` and one other branch
other ``oneOf`` / ``anyOf`` / ``type``      struct of optional members, one per branch,
lists                                       named by its ``title``, else its ``$ref``'s
                                            last name, else its type (``string``,
                                            ``integer``, ``date_time``, ...); a value fills
                                            the first member that holds it exactly
``allOf``                                   the branches merged (properties of all of them)
``$ref`` (``#/$defs/...``, ``definitions``,  what it points to
another registered schema by reference
name or ``$id``)
a ``$ref`` used inside itself (recursion),  string holding the JSON text of the value
``{}`` / ``true``, an ``object`` with no
properties, an ``array`` without ``items``
or with ``prefixItems``, mixed types
a non-object top-level schema               a single field ``value``
==========================================  ===============================================

Keywords that only validate (``required``, ``minimum``, ``pattern``, ``if``/``then``, ``not``,
branches of ``oneOf`` that declare no type, ...) do not change the columns, and the converter
does not check them: it is not a validator. A value whose JSON type does not fit its column
(a string where the schema says ``integer``, an integer beyond 64 bits, a date that is not
``YYYY-MM-DD``) makes its record an error (``__err__`` + ``__raw__``).

:class:`JsonMapper` also says, per row, whether the columns can give back the JSON value that
was written ("lossy" rows keep their bytes in ``__raw__``, as for Avro and Protobuf): a property
the schema does not declare (at any depth), a ``date-time`` or ``time`` with an offset other
than UTC or digits below the microsecond, an integer in a ``number`` column that a double does
not hold exactly, an object with a duplicated key, a union value only a member holds with loss.
What the JSON *text* looks like (whitespace, key order, ``1.0`` against ``1``, escapes,
``Z`` against ``+00:00``) is not kept, nor whether an absent property was absent or ``null``.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyiceberg.types import (
    BooleanType,
    DateType,
    DoubleType,
    IcebergType,
    LongType,
    StringType,
    StructType,
    TimestamptzType,
    TimeType,
)

from rsm_sidecar.iceberg.types import SIDE_COLUMNS, IdCounter, check_reserved, list_of, map_of, opt, to_arrow

#: Keywords whose presence makes a sub-schema say something about the value's type.
_TYPING = ("type", "properties", "items", "$ref", "enum", "const", "format", "oneOf", "anyOf", "allOf")
_JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_MAX_LONG = 2**63
#: a JSON ``type`` other than string, object and array -> (``Node.kind``, its Iceberg type);
#: any other (null, none): a string of JSON text
_SCALARS: dict[str | None, tuple[str, type[IcebergType]]] = {
    "integer": ("long", LongType),
    "number": ("double", DoubleType),
    "boolean": ("boolean", BooleanType),
}
#: a string's ``format`` -> (``Node.kind``, its Iceberg type); any other: a plain string
_STRING_FORMATS: dict[str | None, tuple[str, type[IcebergType]]] = {
    "date": ("date", DateType),
    "date-time": ("timestamp", TimestamptzType),
    "time": ("time", TimeType),
}


class Mismatch(ValueError):
    """A JSON value does not fit its column's type (a record-level error)."""


@dataclass
class Node:
    """One mapped sub-schema. ``kind``: ``boolean``, ``long``, ``double``, ``string``,
    ``date``, ``time``, ``timestamp``, ``json`` (a string of JSON text), ``struct``,
    ``list``, ``map`` or ``union``."""

    kind: str
    iceberg: IcebergType
    #: struct: (property, node); union: (member name, node)
    fields: list[tuple[str, Node]] = field(default_factory=list)
    #: list element / map value
    item: Node | None = None

    @property
    def arrow(self) -> pa.DataType:
        return to_arrow(self.iceberg)


def _json_text(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class JsonMapper:
    """Maps one JSON Schema (a parsed document; ``resources``: the documents its ``$ref``s may
    name, by reference name or ``$id``) to the side's Iceberg struct, and parsed JSON values to
    its Arrow columns. ``where`` names the schema in messages (``schema id 7``, a file)."""

    def __init__(self, schema: Any, resources: Mapping[str, Any] | None = None, where: str = "the schema"):
        self.schema, self.where = schema, where
        self.resources: dict[str, Any] = dict(resources or {})
        for doc in [schema, *self.resources.values()]:
            if isinstance(doc, dict) and isinstance(doc.get("$id"), str):
                self.resources.setdefault(doc["$id"], doc)
        ids = IdCounter()
        root = self._map(schema, schema, ids, ())
        #: a non-object top-level schema becomes a single field named "value"
        self.wrap = root.kind != "struct"
        if self.wrap:
            root = Node("struct", StructType(opt(ids, "value", root.iceberg)), [("value", root)])
        self.root = root
        assert isinstance(root.iceberg, StructType)
        self.iceberg_type: StructType = root.iceberg
        for name, _ in root.fields:
            check_reserved(
                name, SIDE_COLUMNS, "the top-level object's struct", f"JSON property {name!r} of {where}"
            )
        self.arrow_type = to_arrow(self.iceberg_type)

    # ------------------------------------------------------------------ references
    def _deref(
        self, s: Any, doc: Any, stack: tuple[str, ...]
    ) -> tuple[Any, Any, tuple[str, ...], str | None]:
        """Follow ``$ref``s: (sub-schema, its document, the stack of refs, the ref's last name);
        a ref already on the stack (recursion) gives ``None`` as the sub-schema."""
        name = None
        while isinstance(s, dict) and isinstance(s.get("$ref"), str):
            ref = s["$ref"]
            base, _, pointer = ref.partition("#")
            target = doc if not base else self._resource(base)
            key = f"{id(target)}#{pointer}"
            if key in stack:
                return None, doc, stack, name
            stack = stack + (key,)
            doc, s = target, _pointer(target, pointer, ref, self.where)
            name = (
                pointer.rstrip("/").rsplit("/", 1)[-1] if pointer.strip("/") else base.rsplit("/", 1)[-1]
            ) or name
        return s, doc, stack, name

    def _resource(self, base: str) -> Any:
        for key in (base, base.rsplit("/", 1)[-1]):
            if key in self.resources:
                return self.resources[key]
        for rid, doc in self.resources.items():
            if rid.rsplit("/", 1)[-1] == base.rsplit("/", 1)[-1]:
                return doc
        raise ValueError(
            f"{self.where}: $ref {base!r} names no schema it references (references: "
            f"{', '.join(sorted(self.resources)) or 'none'})"
        )

    # ------------------------------------------------------------------ mapping
    def _map(self, s: Any, doc: Any, ids: IdCounter, stack: tuple[str, ...]) -> Node:
        s, doc, stack, _ = self._deref(s, doc, stack)
        if s is None or s is True or s == {}:
            return Node("json", StringType())
        if s is False or not isinstance(s, dict):
            return Node("json", StringType())
        if "allOf" in s:
            s, doc, stack = self._merge_all_of(s, doc, stack)
        branches = self._branches(s, doc, stack)
        if branches is not None:
            if len(branches) == 1:  # T or null
                _, sub, bdoc, bstack = branches[0]
                return self._map(sub, bdoc, ids, bstack)
            return self._union(branches, ids)
        kind = _type_of(s)
        if kind == "object":
            return self._object(s, doc, ids, stack)
        if kind == "array":
            items = s.get("items")
            if "prefixItems" in s or isinstance(items, list):
                return Node("json", StringType())
            item = self._map(items if items is not None else True, doc, ids, stack)
            return Node("list", list_of(ids, item.iceberg), item=item)
        if kind == "string":
            fmt = s.get("format")  # a schema may hold anything there (a list: not a format)
            node_kind, iceberg = _STRING_FORMATS.get(
                fmt if isinstance(fmt, str) else None, ("string", StringType)
            )
            return Node(node_kind, iceberg())
        node_kind, iceberg = _SCALARS.get(kind, ("json", StringType))
        return Node(node_kind, iceberg())

    def _object(self, s: dict, doc: Any, ids: IdCounter, stack: tuple[str, ...]) -> Node:
        props = s.get("properties")
        if isinstance(props, dict) and props:
            fields = []
            for name, sub in props.items():
                fields.append((name, self._map(sub, doc, ids, stack)))
            return Node(
                "struct",
                StructType(*[opt(ids, n, f.iceberg) for n, f in fields]),
                fields,
            )
        values = [v for v in (s.get("patternProperties") or {}).values()]
        extra = s.get("additionalProperties")
        if isinstance(extra, dict) or (extra is None and values):
            values.append(extra if extra is not None else False)
        values = [v for v in values if v is not False]
        if values:
            nodes = [self._map(v, doc, ids, stack) for v in values]
            item = nodes[0] if all(_same(n, nodes[0]) for n in nodes) else Node("json", StringType())
            return Node("map", map_of(ids, StringType(), item.iceberg), item=item)
        return Node("json", StringType())

    def _merge_all_of(self, s: dict, doc: Any, stack: tuple[str, ...]) -> tuple[dict, Any, tuple[str, ...]]:
        """``allOf``: one schema with the properties of every branch (the first declaration of a
        property wins) and the first branch's type where the schema declares none."""
        merged = {k: v for k, v in s.items() if k != "allOf"}
        props = dict(merged.get("properties") or {})
        for b in s["allOf"]:
            b, _, _, _ = self._deref(b, doc, stack)
            if not isinstance(b, dict):
                continue
            if "allOf" in b:
                b, _, _ = self._merge_all_of(b, doc, stack)
            for k, v in (b.get("properties") or {}).items():
                props.setdefault(k, v)
            for k in (
                "type",
                "items",
                "format",
                "additionalProperties",
                "patternProperties",
                "oneOf",
                "anyOf",
            ):
                if k in b and k not in merged:
                    merged[k] = b[k]
        if props:
            merged["properties"] = props
            merged.setdefault("type", "object")
        return merged, doc, stack

    def _branches(
        self, s: dict, doc: Any, stack: tuple[str, ...]
    ) -> list[tuple[str | None, Any, Any, tuple]] | None:
        """The non-null branches of a union (``oneOf``/``anyOf``, or a ``type`` list) that say
        something about the type, as (name hint, schema, document, stack); None when ``s`` is
        not a union (one such branch: that branch alone, through :meth:`_map`)."""
        raw: list[tuple[str | None, Any, Any, tuple]] = []
        for key in ("oneOf", "anyOf"):
            for b in s.get(key) or ():
                hint = b.get("title") if isinstance(b, dict) else None
                rb, rdoc, rstack, refname = self._deref(b, doc, stack)
                if rb is None:  # recursion
                    raw.append((hint or refname, True, rdoc, rstack))
                    continue
                if not isinstance(rb, dict) or not any(k in rb for k in _TYPING):
                    if rb is True or rb == {}:
                        raw.append((hint or refname, True, rdoc, rstack))
                    continue  # only constrains the value
                if _type_of(rb) == "null" and "oneOf" not in rb and "anyOf" not in rb:
                    continue
                base = {k: v for k, v in s.items() if k not in ("oneOf", "anyOf", "title", "$id")}
                base.update(rb)  # a branch refines the schema it sits in
                raw.append((hint or rb.get("title") or refname, base, rdoc, rstack))
        types = s.get("type")
        if isinstance(types, list) and not raw:
            for t in types:
                if t != "null":
                    raw.append((None, {**s, "type": t}, doc, stack))
        return raw or None

    def _union(self, branches: list[tuple[str | None, Any, Any, tuple]], ids: IdCounter) -> Node:
        members: list[tuple[str, Node]] = []
        taken: set[str] = set()
        for hint, sub, doc, stack in branches:
            node = self._map(sub, doc, ids, stack)
            name = _member_name(hint, sub, node)
            n, base = 2, name
            while name in taken:
                name, n = f"{base}_{n}", n + 1
            taken.add(name)
            members.append((name, node))
        return Node("union", StructType(*[opt(ids, n, m.iceberg) for n, m in members]), members)

    # ------------------------------------------------------------------ values
    def convert(self, value: Any) -> tuple[Any, bool]:
        """A parsed JSON value (:func:`parse`, not None) -> (the Python value Arrow takes for
        :attr:`arrow_type`, whether the row cannot give back the value). Raises
        :class:`Mismatch` when the value does not fit the schema's types."""
        flag = [False]
        if self.wrap:
            return {"value": _convert(self.root.fields[0][1], value, flag, "")}, flag[0]
        if not isinstance(value, dict):
            raise Mismatch(f"the value is a JSON {_jtype(value)}, the schema's an object")
        return _convert(self.root, value, flag, ""), flag[0]

    def to_arrow(self, values: list[Any]) -> tuple[pa.Array, list[bool]]:
        """:meth:`convert` for a list of values (None rows are null) -> (Arrow struct, loss
        flags); raises :class:`Mismatch` for the first value that does not fit."""
        rows, lossy = [], []
        for v in values:
            r, f = (None, False) if v is None else self.convert(v)
            rows.append(r)
            lossy.append(f)
        return pa.array(rows, self.arrow_type), lossy


def _member_name(hint: str | None, sub: Any, node: Node) -> str:
    if hint:
        return re.sub(r"[^A-Za-z0-9_]", "_", str(hint))
    if node.kind in ("date", "time"):
        return node.kind
    if node.kind == "timestamp":
        return "date_time"
    t = _type_of(sub) if isinstance(sub, dict) else None
    return t or "json"


def _pointer(doc: Any, pointer: str, ref: str, where: str) -> Any:
    cur = doc
    for part in [p for p in pointer.split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        try:
            cur = cur[int(part)] if isinstance(cur, list) else cur[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise ValueError(f"{where}: $ref {ref!r} points to nothing") from None
    return cur


def _type_of(s: dict) -> str | None:
    """The JSON type a (non-union) sub-schema describes."""
    t = s.get("type")
    if isinstance(t, list):
        non_null = [x for x in t if x != "null"]
        t = non_null[0] if len(non_null) == 1 else (None if non_null else "null")
    if isinstance(t, str) and t in _JSON_TYPES:
        return t
    if "properties" in s or "additionalProperties" in s or "patternProperties" in s:
        return "object"
    if "items" in s or "prefixItems" in s:
        return "array"
    if "format" in s and s["format"] in ("date", "date-time", "time", "uuid"):
        return "string"
    values = s["enum"] if isinstance(s.get("enum"), list) else [s["const"]] if "const" in s else None
    if values:
        kinds = {_jtype(v) for v in values if v is not None}
        if kinds == {"integer"}:
            return "integer"
        if kinds <= {"integer", "number"} and kinds:
            return "number"
        if len(kinds) == 1:
            return kinds.pop()
    return None


def _jtype(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _same(a: Node, b: Node) -> bool:
    """The same type, field ids aside (the Arrow types carry no ids)."""
    return a.arrow == b.arrow


# ============================================================================ conversion

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")
_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))?\Z"
)
_TIME = re.compile(r"(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))?\Z")


def _fraction(digits: str | None, flag: list[bool]) -> int:
    if not digits:
        return 0
    if len(digits) > 6 and digits[6:].strip("0"):
        flag[0] = True  # digits below the microsecond are cut
    return int(digits[:6].ljust(6, "0"))


def parse_datetime(s: str, flag: list[bool]) -> datetime.datetime:
    """An RFC 3339 ``date-time`` as a UTC instant (µs); ``flag[0]`` set when the text has an
    offset other than UTC or digits below the microsecond. A missing offset reads as UTC."""
    m = _DATETIME.match(s)
    if m is None:
        raise Mismatch(f"{s!r} is not an RFC 3339 date-time")
    y, mo, d, h, mi, sec, frac, z, sign, oh, om = m.groups()
    us = _fraction(frac, flag)
    try:
        dt = datetime.datetime(int(y), int(mo), int(d), int(h), int(mi), min(int(sec), 59), us, datetime.UTC)
    except ValueError as exc:
        raise Mismatch(f"{s!r} is not a valid date-time: {exc}") from None
    if int(sec) == 60:  # a leap second: the instant after :59.999999
        dt += datetime.timedelta(seconds=1)
        flag[0] = True
    if sign is not None:
        off = datetime.timedelta(hours=int(oh), minutes=int(om))
        if off:
            flag[0] = True  # the instant is kept, the writer's offset is not
            dt = dt - off if sign == "+" else dt + off
    return dt


def parse_time(s: str, flag: list[bool]) -> datetime.time:
    """An RFC 3339 ``time`` as the time written (µs); ``flag[0]`` set for an offset other than
    UTC or digits below the microsecond."""
    m = _TIME.match(s)
    if m is None:
        raise Mismatch(f"{s!r} is not an RFC 3339 time")
    h, mi, sec, frac, _, sign, oh, om = m.groups()
    us = _fraction(frac, flag)
    if sign is not None and (int(oh) or int(om)):
        flag[0] = True
    try:
        return datetime.time(int(h), int(mi), int(sec), us)
    except ValueError as exc:
        raise Mismatch(f"{s!r} is not a valid time: {exc}") from None


def _convert(node: Node, v: Any, flag: list[bool], path: str) -> Any:
    """The Python value Arrow takes for ``node``'s type; sets ``flag[0]`` on loss."""
    if v is None:
        return None
    k = node.kind
    if k == "struct":
        if not isinstance(v, dict):
            raise Mismatch(f"{path or 'the value'}: a JSON {_jtype(v)}, not an object")
        if isinstance(v, _Dup):
            flag[0] = True
        out = {}
        known = 0
        for name, sub in node.fields:
            if name in v:
                known += 1
                out[name] = _convert(sub, v[name], flag, f"{path}.{name}" if path else name)
        if known != len(v) and any(x is not None for n, x in v.items() if n not in out):
            flag[0] = True  # a property the schema does not declare
        return out
    if k == "long":
        if isinstance(v, int) and not isinstance(v, bool):
            if -_MAX_LONG <= v < _MAX_LONG:
                return v
            raise Mismatch(f"{path or 'the value'}: {v} does not fit a long")
        if isinstance(v, float) and v.is_integer() and -_MAX_LONG <= v < _MAX_LONG:
            return int(v)
        raise Mismatch(f"{path or 'the value'}: a JSON {_jtype(v)}, not an integer")
    if k == "double":
        if isinstance(v, float):
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            f = float(v)
            if f != v:
                flag[0] = True
            return f
        raise Mismatch(f"{path or 'the value'}: a JSON {_jtype(v)}, not a number")
    if k in ("string", "date", "time", "timestamp"):
        if not isinstance(v, str):
            raise Mismatch(f"{path or 'the value'}: a JSON {_jtype(v)}, not a string")
        if k == "string":
            return v
        if k == "date":
            if not _DATE.match(v):
                raise Mismatch(f"{path or 'the value'}: {v!r} is not a date (YYYY-MM-DD)")
            try:
                return datetime.date.fromisoformat(v)
            except ValueError as exc:
                raise Mismatch(f"{path or 'the value'}: {v!r}: {exc}") from None
        try:
            return parse_datetime(v, flag) if k == "timestamp" else parse_time(v, flag)
        except Mismatch as exc:
            raise Mismatch(f"{path or 'the value'}: {exc}") from None
    if k == "boolean":
        if isinstance(v, bool):
            return v
        raise Mismatch(f"{path or 'the value'}: a JSON {_jtype(v)}, not a boolean")
    if k == "json":
        if isinstance(v, _Dup):
            flag[0] = True
        return _json_text(v)
    if k == "list":
        if not isinstance(v, list):
            raise Mismatch(f"{path or 'the value'}: a JSON {_jtype(v)}, not an array")
        assert node.item is not None
        return [_convert(node.item, x, flag, f"{path}[]") for x in v]
    if k == "map":
        if not isinstance(v, dict):
            raise Mismatch(f"{path or 'the value'}: a JSON {_jtype(v)}, not an object")
        if isinstance(v, _Dup):
            flag[0] = True
        assert node.item is not None
        return [(key, _convert(node.item, x, flag, f"{path}{{}}")) for key, x in v.items()]
    if k == "union":
        fallback = None
        for name, sub in node.fields:
            own = [False]
            try:
                val = _convert(sub, v, own, path)
            except Mismatch:
                continue
            if not own[0]:
                return {name: val}
            if fallback is None:
                fallback = {name: val}
        if fallback is not None:
            flag[0] = True
            return fallback
        raise Mismatch(f"{path or 'the value'}: a JSON {_jtype(v)} fits no member of the union")
    raise AssertionError(k)


class _Dup(dict):
    """An object that had a key twice (JSON keeps the last value; the row keeps ``__raw__``)."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    d = dict(pairs)
    return _Dup(d) if len(d) != len(pairs) else d


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse(data: bytes) -> Any:
    """One JSON text (RFC 8259: UTF-8, no ``NaN``/``Infinity``, nothing after the value)."""
    return json.loads(data, object_pairs_hook=_pairs, parse_constant=_no_constant)


def schema_from_text(text: str | bytes, where: str) -> Any:
    """A JSON Schema document from its text; ValueError naming ``where``."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where}: not a JSON document: {exc}") from None
