"""What the differential tests of the columnar decoders (``test_proto_columnar.py``,
``test_avro_columnar.py``) compare: rows as Python values, decoded two ways."""

from __future__ import annotations


def same(a, b) -> bool:
    """Equality of rows in which NaN equals NaN (floats from random bits) and values of
    different Python types differ (a ``date`` is not a ``datetime``, ``1`` is not ``True``)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b
