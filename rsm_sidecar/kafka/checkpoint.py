"""Leader-epoch checkpoint text files (``leader-epoch-checkpoint``; also the ``leaderEpochIndex``
buffer handed to a RemoteStorageManager), as written by Kafka's ``CheckpointFile``::

    0                 <- version
    2                 <- number of entries
    0 0               <- "epoch startOffset", one per line
    3 1234

Parsing follows ``CheckpointReadBuffer``: an empty input (or one with only the version line)
means no entries, the version must be 0, entry lines split on whitespace into exactly two
integers, and the count must match. This module also checks that epochs and start offsets are
non-negative and that epochs strictly increase with non-decreasing start offsets (what
``LeaderEpochFileCache`` maintains). Errors are :class:`CorruptIndexError` naming the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import CorruptIndexError, UnsupportedFormatError

CHECKPOINT_VERSION = 0
_INT = re.compile(r"[+-]?[0-9]+")
_LINE_END = re.compile(r"\r\n|\r|\n")  # what Java's BufferedReader.readLine accepts
_MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True, order=True)
class EpochEntry:
    epoch: int
    start_offset: int


def parse_leader_epoch_checkpoint(
    data: bytes | str, *, name: str = "leader-epoch-checkpoint"
) -> list[EpochEntry]:
    """Parse the checkpoint text (``bytes`` are decoded as UTF-8)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        if len(data) > _MAX_CHECKPOINT_BYTES:
            raise CorruptIndexError(f"checkpoint of {len(data)} bytes is implausibly large", source=name)
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptIndexError(f"checkpoint is not UTF-8 text: {exc}", source=name) from exc
    else:
        text = data
    lines = _LINE_END.split(text)
    if lines and lines[-1] == "":
        lines.pop()  # the final line end does not start another line
    if not lines:
        return []

    def integer(line_no: int, token: str, what: str) -> int:
        if not _INT.fullmatch(token):
            raise CorruptIndexError(f"malformed {what} on line {line_no}: {token!r}", source=name)
        return int(token)

    version = integer(1, lines[0].strip(), "version")
    if version != CHECKPOINT_VERSION:
        raise UnsupportedFormatError(
            f"unrecognised checkpoint version {version}, expected {CHECKPOINT_VERSION}", source=name
        )
    if len(lines) == 1:
        return []
    expected = integer(2, lines[1].strip(), "entry count")
    entries: list[EpochEntry] = []
    for line_no, line in enumerate(lines[2:], start=3):
        parts = line.split()
        if len(parts) != 2:
            raise CorruptIndexError(
                f"malformed line {line_no}: {line!r} (expected 'epoch offset')", source=name
            )
        entry = EpochEntry(integer(line_no, parts[0], "epoch"), integer(line_no, parts[1], "start offset"))
        if entry.epoch < 0 or entry.start_offset < 0:
            raise CorruptIndexError(f"negative epoch or offset on line {line_no}: {line!r}", source=name)
        if entries and (entry.epoch <= entries[-1].epoch or entry.start_offset < entries[-1].start_offset):
            raise CorruptIndexError(
                f"line {line_no} ({entry.epoch} {entry.start_offset}) does not follow "
                f"({entries[-1].epoch} {entries[-1].start_offset}): epochs must increase and "
                "start offsets must not decrease",
                source=name,
            )
        entries.append(entry)
    if len(entries) != expected:
        raise CorruptIndexError(f"expected {expected} entries, found {len(entries)}", source=name)
    return entries


def format_leader_epoch_checkpoint(entries: Iterable[EpochEntry]) -> str:
    """The checkpoint text Kafka writes for ``entries`` (``\\n`` line ends)."""
    entries = list(entries)
    lines = [str(CHECKPOINT_VERSION), str(len(entries))]
    lines += [f"{e.epoch} {e.start_offset}" for e in entries]
    return "\n".join(lines) + "\n"


def epoch_for_offset(entries: list[EpochEntry], offset: int) -> int | None:
    """The leader epoch in force at ``offset`` (last entry with start offset <= offset)."""
    result = None
    for e in entries:
        if e.start_offset <= offset:
            result = e.epoch
        else:
            break
    return result
