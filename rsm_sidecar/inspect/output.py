"""Rendering for people (aligned tables, sizes, UTC times) and for scripts (one JSON
document per command, streamed when it can be long)."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO


def human_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def iso_ms(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO-8601 UTC; None for unknown (None or negative)."""
    if ms is None or ms < 0:
        return None
    t = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def ratio(original: int, stored: int) -> float | None:
    """Compression ratio original / stored (2.0 = half the size); None when undefined."""
    return round(original / stored, 3) if stored > 0 else None


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    out: TextIO | None = None,
    right: Iterable[int] = (),
) -> None:
    """An aligned table; ``right`` lists the columns aligned right (numbers)."""
    out = out or sys.stdout
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    right = set(right)

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(row)
        ).rstrip()

    print(line(list(headers)), file=out)
    for row in cells:
        print(line(row), file=out)


def dump_json(doc: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    json.dump(doc, out, indent=2, default=str)
    out.write("\n")


def error_line(where: str, message: str, out: TextIO | None = None) -> None:
    """The line printed for one segment or object that could not be processed."""
    print(f"error: {where}: {message}", file=out or sys.stderr, flush=True)


class JsonStream:
    """Writes one JSON object whose list members are streamed item by item, so a
    document over a whole segment never sits in memory::

        with JsonStream(out) as doc:
            doc.member("segment", {...})
            with doc.list("batches") as items:
                for b in batches: items.append({...})
            doc.member("summary", {...})
    """

    def __init__(self, out: TextIO | None = None):
        self.out = out or sys.stdout
        self._members = 0

    def __enter__(self) -> JsonStream:
        self.out.write("{")
        return self

    def __exit__(self, *exc) -> None:
        self.out.write("\n}\n")
        self.out.flush()

    def _key(self, name: str) -> None:
        self.out.write(("," if self._members else "") + "\n  " + json.dumps(name) + ": ")
        self._members += 1

    def member(self, name: str, value: Any) -> None:
        self._key(name)
        self.out.write(json.dumps(value, default=str))

    def list(self, name: str) -> _JsonList:
        self._key(name)
        return _JsonList(self.out)


class _JsonList:
    def __init__(self, out: TextIO):
        self.out = out
        self.count = 0

    def __enter__(self) -> _JsonList:
        self.out.write("[")
        return self

    def append(self, value: Any) -> None:
        self.out.write(("," if self.count else "") + "\n    " + json.dumps(value, default=str))
        self.count += 1

    def __exit__(self, *exc) -> None:
        self.out.write("\n  ]" if self.count else "]")
