"""A read-only, seekable binary file over the original ``.log`` bytes of a stored
segment, so the Kafka log library (``read_batches``) can walk a remote segment as if it
were on disk. Bytes come from ``SegmentReader.read`` (verified and decoded chunk by
chunk); at most one ranged download (``fetch.max_range_bytes``) is held at a time.
Sequential reads continue one download stream; a seek elsewhere starts a new one."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.segment.reader import OpenSegment, SegmentReader


class RemoteSegmentFile(io.RawIOBase):
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
        self._buf = memoryview(b"")
        self._buf_pos = 0  # original position of _buf[0]
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
        """Make ``_buf`` hold the byte at ``_pos``."""
        if self._pieces is None or self._pieces_next != self._pos:
            self._close_pieces()
            self._pieces = self.reader.read(self.seg, self._pos, self.size - 1)
            self._pieces_next = self._pos
        piece = next(self._pieces, None)
        if piece is None:
            raise DataLoss(
                f"{self.name}: the reader ended at position {self._pieces_next} of a {self.size}-byte segment"
            )
        self._buf, self._buf_pos = memoryview(piece), self._pieces_next
        self._pieces_next += len(piece)
        self.on_bytes(len(piece))

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self._pos
        out: list[bytes] = []
        while n > 0 and self._pos < self.size:
            rel = self._pos - self._buf_pos
            if not 0 <= rel < len(self._buf):
                self._fill()
                continue
            take = bytes(self._buf[rel : rel + n])
            out.append(take)
            self._pos += len(take)
            n -= len(take)
        return out[0] if len(out) == 1 else b"".join(out)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def _close_pieces(self) -> None:
        if self._pieces is not None:
            close = getattr(self._pieces, "close", None)
            if close is not None:
                close()
            self._pieces = None

    def close(self) -> None:
        self._close_pieces()
        self._buf = memoryview(b"")
        super().close()
