"""A JSON Schema inferred from sample JSON values (``iceberg.<side>.json_infer``).

The rule, value by value, merged with the schema the table recorded by earlier runs (so that a
table's columns only ever grow, as with a registered schema):

* an object gives ``{"type": "object", "properties": ...}``, its properties in the order they
  are first seen; an array ``{"type": "array", "items": ...}`` of its items merged; a string
  ``string`` (no ``format`` is guessed: a JSON Schema file says which strings are dates); a
  boolean ``boolean``; an integer ``integer``; any other number ``number``;
* ``null``, an empty object and an empty array say nothing yet: a property seen only with them
  gets no column until a value with a type comes;
* merging: equal types merge recursively; ``integer`` and ``number`` give ``number``; any other
  pair of types gives ``{}`` (a string column with the JSON text of each value), for good.

A property the table's columns lack when a record is converted (one that first appears after
the sample) keeps that record's bytes in ``__raw__``; the next run's sample adds its column.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_ANY: dict[str, Any] = {}


def shape(v: Any) -> dict[str, Any] | None:
    """The schema of one JSON value (None: nothing known yet)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return {"type": "boolean"}
    if isinstance(v, int):
        return {"type": "integer"}
    if isinstance(v, float):
        return {"type": "number"}
    if isinstance(v, str):
        return {"type": "string"}
    if isinstance(v, list):
        items = None
        for x in v:
            items = merge(items, shape(x))
        return None if items is None else {"type": "array", "items": items}
    if isinstance(v, dict):
        props: dict[str, Any] = {}
        for k, x in v.items():
            s = shape(x)
            if s is not None:
                props[k] = merge(props.get(k), s)
        return {"type": "object", "properties": props} if props else None
    return dict(_ANY)


def merge(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """The schema of values of either schema (both made by :func:`shape` or this)."""
    if a is None:
        return b
    if b is None:
        return a
    ta, tb = a.get("type"), b.get("type")
    if ta is None or tb is None:
        return dict(_ANY)
    if ta == tb == "object":
        props = dict(a["properties"])
        for k, s in b["properties"].items():
            props[k] = merge(props.get(k), s)
        return {"type": "object", "properties": props}
    if ta == tb == "array":
        return {"type": "array", "items": merge(a["items"], b["items"])}
    if ta == tb:
        return a
    if {ta, tb} == {"integer", "number"}:
        return {"type": "number"}
    return dict(_ANY)


def infer(values: Iterable[Any], recorded: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The schema of ``recorded`` (an earlier run's, or None) and every value of ``values``
    (parsed JSON); None when nothing is known."""
    out = recorded
    for v in values:
        out = merge(out, shape(v))
    return out
