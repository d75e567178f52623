"""Offset index (``.index``) and time index (``.timeindex``) files.

* Offset index: 8-byte entries ``relativeOffset int32 | position int32`` (big-endian); entry
  ``(r, p)`` means the batch holding offset ``baseOffset + r`` starts at byte ``p`` of the
  ``.log``. Offsets strictly increase; Kafka never indexes position 0.
* Time index: 12-byte entries ``timestamp int64 | relativeOffset int32``: messages with a
  timestamp above ``timestamp`` come after ``baseOffset + relativeOffset``.

The files of the active segment are preallocated (``segment.index.bytes``) and zero-filled
beyond the last entry; Kafka trims them when the segment rolls. Trailing zeros are handled as
``DumpLogSegments`` does: an entry after the first whose relative offset is 0 ends the index
(it can only be padding, since offsets increase). A file that is all zeros has no entries
(position 0 is never indexed and a zero timestamp at the base offset is indistinguishable from
padding). Any bytes after the end-of-entries marker must be zero as well.

Besides that, the checks of Kafka's ``sanityCheck``: the file length is a multiple of the entry
size, and entries are monotonic (offset index: strictly increasing offsets and positions; time
index: non-decreasing timestamps and offsets). Violations raise :class:`CorruptIndexError`.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from .errors import CorruptIndexError, Where
from .reader import Source, _open

OFFSET_INDEX_ENTRY_SIZE = 8
TIME_INDEX_ENTRY_SIZE = 12
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_READ_ENTRIES = 8192  # entries per read: bounded memory while streaming


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    offset: int
    position: int


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    timestamp: int
    offset: int


def base_offset_from_filename(path: str | os.PathLike[str]) -> int:
    """``.../00000000000000001234.index`` (or ``.log``, ``.timeindex``, ...) -> 1234."""
    name = os.path.basename(os.fspath(path))
    m = re.fullmatch(r"(\d{20})\.[a-z]+(\.[a-z]+)?", name)
    if not m:
        raise ValueError(f"not a Kafka segment file name (20-digit base offset): {name!r}")
    return int(m.group(1))


def _iter_raw_entries(
    source: Source, entry_size: int, name: str | None, kind: str
) -> Iterator[tuple[str, int, bytes]]:
    """Yield ``(slot, entry_bytes)`` for every whole entry; check the length multiple."""
    with _open(source, name) as (f, label):
        slot = 0
        while True:
            chunk = f.read(entry_size * _READ_ENTRIES)
            if not chunk:
                return
            while len(chunk) % entry_size:
                more = f.read(entry_size - len(chunk) % entry_size)
                if not more:
                    raise CorruptIndexError(
                        f"{kind} is {slot * entry_size + len(chunk)} bytes, not a multiple of "
                        f"the {entry_size}-byte entry size",
                        source=label,
                    )
                chunk += more
            for i in range(0, len(chunk), entry_size):
                yield label, slot, chunk[i : i + entry_size]
                slot += 1


def _entries(
    source: Source, entry_size: int, name: str | None, kind: str, rel_offset_of: Callable[[bytes], int]
) -> Iterator[tuple[str, int, bytes]]:
    """Whole entries up to the end-of-entries marker (see module doc), verifying the padding."""
    padding_from = None
    for label, slot, raw in _iter_raw_entries(source, entry_size, name, kind):
        if padding_from is not None:
            if any(raw):
                raise CorruptIndexError(
                    f"{kind} has a non-zero entry in slot {slot} after the zero padding that "
                    f"starts at slot {padding_from}",
                    source=label,
                    position=slot * entry_size,
                )
            continue
        if (slot > 0 and rel_offset_of(raw) == 0) or (slot == 0 and not any(raw)):
            padding_from = slot
            if any(raw):  # relative offset 0 after slot 0 but with a non-zero other field
                raise CorruptIndexError(
                    f"{kind} slot {slot} has relative offset 0 after the first slot but is not zero padding",
                    source=label,
                    position=slot * entry_size,
                )
            continue
        yield label, slot, raw


def iter_offset_index(
    source: Source, base_offset: int, *, name: str | None = None
) -> Iterator[OffsetPosition]:
    """Entries of an offset index, streamed (bounded memory), validated as they come."""
    last: OffsetPosition | None = None
    for label, slot, raw in _entries(
        source, OFFSET_INDEX_ENTRY_SIZE, name, "offset index", lambda raw: _OFFSET_ENTRY.unpack(raw)[0]
    ):
        rel, position = _OFFSET_ENTRY.unpack(raw)
        where = Where(source=label, position=slot * OFFSET_INDEX_ENTRY_SIZE)
        if rel < 0 or position < 0:
            raise CorruptIndexError(
                f"offset index slot {slot} has negative relative offset {rel} or position {position}", **where
            )
        entry = OffsetPosition(base_offset + rel, position)
        if last is not None and (entry.offset <= last.offset or entry.position <= last.position):
            raise CorruptIndexError(
                f"offset index slot {slot} ({entry.offset} @ {entry.position}) does not increase "
                f"over the previous entry ({last.offset} @ {last.position})",
                **where,
            )
        last = entry
        yield entry


def read_offset_index(source: Source, base_offset: int, *, name: str | None = None) -> list[OffsetPosition]:
    """All entries of an offset index (see :func:`iter_offset_index`)."""
    return list(iter_offset_index(source, base_offset, name=name))


def iter_time_index(
    source: Source, base_offset: int, *, name: str | None = None
) -> Iterator[TimestampOffset]:
    """Entries of a time index, streamed and validated."""
    last: TimestampOffset | None = None
    for label, slot, raw in _entries(
        source, TIME_INDEX_ENTRY_SIZE, name, "time index", lambda raw: _TIME_ENTRY.unpack(raw)[1]
    ):
        timestamp, rel = _TIME_ENTRY.unpack(raw)
        where = Where(source=label, position=slot * TIME_INDEX_ENTRY_SIZE)
        if rel < 0:
            raise CorruptIndexError(f"time index slot {slot} has negative relative offset {rel}", **where)
        entry = TimestampOffset(timestamp, base_offset + rel)
        if last is not None and (entry.timestamp < last.timestamp or entry.offset < last.offset):
            raise CorruptIndexError(
                f"time index slot {slot} ({entry.timestamp} -> {entry.offset}) goes back from "
                f"the previous entry ({last.timestamp} -> {last.offset})",
                **where,
            )
        last = entry
        yield entry


def read_time_index(source: Source, base_offset: int, *, name: str | None = None) -> list[TimestampOffset]:
    return list(iter_time_index(source, base_offset, name=name))


def encode_offset_index(entries: Iterable[OffsetPosition], base_offset: int) -> bytes:
    return b"".join(_OFFSET_ENTRY.pack(e.offset - base_offset, e.position) for e in entries)


def encode_time_index(entries: Iterable[TimestampOffset], base_offset: int) -> bytes:
    return b"".join(_TIME_ENTRY.pack(e.timestamp, e.offset - base_offset) for e in entries)


def lookup_offset(entries: list[OffsetPosition], target_offset: int, base_offset: int) -> OffsetPosition:
    """The entry with the largest offset <= ``target_offset``; ``(base_offset, 0)`` if none
    (``OffsetIndex.lookup``). Read the ``.log`` from that position to find the target."""
    i = bisect.bisect_right([e.offset for e in entries], target_offset)
    return entries[i - 1] if i else OffsetPosition(base_offset, 0)


def lookup_timestamp(
    entries: list[TimestampOffset], target_timestamp: int, base_offset: int
) -> TimestampOffset:
    """The entry with the largest timestamp <= ``target_timestamp``; ``(-1, base_offset)`` if
    none (``TimeIndex.lookup``)."""
    i = bisect.bisect_right([e.timestamp for e in entries], target_timestamp)
    return entries[i - 1] if i else TimestampOffset(-1, base_offset)
