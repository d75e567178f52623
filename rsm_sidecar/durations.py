"""Durations as people write them, the one parser of the project: ``90`` (seconds), ``90s``,
``500ms``, ``10m``, ``1h``, ``2d``, ``1w`` and sums of these such as ``1h30m``. The command line
(``inspect``, ``iceberg maintain``) and the configuration's ``seconds`` keys all read them here."""

from __future__ import annotations

import argparse
import re

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
ACCEPTED = "a number of seconds or e.g. 90s, 10m, 1h, 2d, 1h30m (also ms and w)"


def parse_duration(text: str) -> float:
    """Seconds. A bare number is seconds. Raises ``ValueError`` naming the text and the
    accepted forms."""
    s = text.strip().lower()
    if _NUMBER.fullmatch(s):
        return float(s)
    pos = 0
    total = 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"invalid duration {text!r}: use {ACCEPTED}")
    return total


def duration_argument(text: str) -> float:
    """``type=`` of an argparse option that takes a duration: its seconds, or a usage error."""
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def format_duration(seconds: float) -> str:
    """A short human form: ``90s``, ``15m``, ``2h05m``, ``3d04h``."""
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600:02d}h"
