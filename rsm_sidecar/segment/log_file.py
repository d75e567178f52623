"""A stored segment's records for readers of Kafka log files.

:class:`StoredLogFile` is a read-only, seekable binary file over the original ``.log``
bytes of a stored segment, so the Kafka log library (``read_batches``) walks a remote
segment as if it were on disk (``inspect dump``/``verify``, the Iceberg job's executors).
Bytes come from ``SegmentReader.read`` (verified and decoded chunk by chunk); at most one
ranged download (``fetch.max_range_bytes``) is held at a time. Sequential reads continue
one download stream; a seek elsewhere starts a new one.

:func:`offset_position` is where to start reading for an offset: the offset index's floor
entry, as a broker fetch does.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rsm_sidecar.errors import DataLoss, NotFound
from rsm_sidecar.kafka import lookup_offset, read_offset_index
from rsm_sidecar.segment.reader import OpenSegment, SegmentReader

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer


def offset_position(reader: SegmentReader, seg: OpenSegment, base_offset: int, offset: int) -> int:
    """The byte position of the offset index's entry for ``offset`` (the last batch start
    at or before it) in the segment whose first offset is ``base_offset``; 0 when the
    offset is at or before the start or the segment has no offset index. A damaged index
    raises ``DataLoss``."""
    if offset <= base_offset:
        return 0
    try:
        data = reader.read_index(seg, "offset")
    except NotFound:
        return 0
    entries = read_offset_index(data, base_offset, name=f"{seg.base} (offset index)")
    return lookup_offset(entries, offset, base_offset).position


class StoredLogFile(io.RawIOBase):
    def __init__(
        self, reader: SegmentReader, seg: OpenSegment, on_bytes: Callable[[int], None] = lambda n: None
    ):
        super().__init__()
        self.reader = reader
        self.seg = seg
        self.size = seg.manifest.original_size
        self.name = seg.key("log")
        self.on_bytes = on_bytes
        self._pos = 0
        self._piece = b""
        self._piece_pos = 0  # original position of _piece[0]
        self._pieces: Iterator[bytes] | None = None
        self._pieces_next = 0  # original position of the next piece

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + pos < 0:
            raise ValueError(f"negative seek position {base + pos}")
        self._pos = base + pos
        return self._pos

    def _fill(self) -> None:
        """Make ``_piece`` hold the byte at ``_pos``."""
        if self._pieces is None or self._pieces_next != self._pos:
            self._close_pieces()
            self._pieces = self.reader.read(self.seg, self._pos, self.size - 1)
            self._pieces_next = self._pos
        piece = next(self._pieces, None)
        if piece is None:
            raise DataLoss(
                f"{self.name}: the reader ended at position {self._pieces_next} of a {self.size}-byte segment"
            )
        self._piece, self._piece_pos = bytes(piece), self._pieces_next
        self._pieces_next += len(piece)
        self.on_bytes(len(piece))

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self._pos
        out: list[bytes] = []
        while n > 0 and self._pos < self.size:
            rel = self._pos - self._piece_pos
            if not 0 <= rel < len(self._piece):
                self._fill()
                continue
            # a whole piece is handed out as it is, without a copy
            take = self._piece if rel == 0 and n >= len(self._piece) else self._piece[rel : rel + n]
            out.append(take)
            self._pos += len(take)
            n -= len(take)
        return out[0] if len(out) == 1 else b"".join(out)

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def _close_pieces(self) -> None:
        if self._pieces is not None:
            close = getattr(self._pieces, "close", None)
            if close is not None:
                close()
            self._pieces = None

    def close(self) -> None:
        self._close_pieces()
        self._piece = b""
        super().close()
