"""Walking the batches of a log segment (``.log`` file) without loading the whole segment.

A source is ``bytes``/``bytearray``/``memoryview``, a binary file object (``read``, and
``seek``/``tell`` when available), or a path. At most one batch is held in memory at a time, and
a batch's length field is checked against ``max_batch_size`` *before* its bytes are read, so a
corrupt length cannot make the reader allocate gigabytes.

* :func:`read_batches` yields :class:`RecordBatch` objects (header + raw bytes, CRC verified by
  default); a segment that ends inside a batch raises :class:`TruncatedError`.
* :func:`scan_batch_headers` reads only the 61-byte headers and skips the bodies (seeking when
  it can), for cheap statistics over the first few MiB of a segment; a batch cut off by the end
  of the data (or by ``limit``) is reported in :attr:`ScanResult.partial_tail`, not raised.
* :func:`read_records` flattens batches into records.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from rsm_sidecar.format.varint import Buffer

from .batch import (
    BATCH_HEADER_SIZE,
    DEFAULT_MAX_BATCH_SIZE,
    HEADER_SIZE_UP_TO_MAGIC,
    BatchHeader,
    Compression,
    parse_batch_header,
    read_length_and_magic,
    verify_batch_crc,
)
from .compression import DEFAULT_MAX_DECOMPRESSED_SIZE, decompress
from .control import ControlRecord, parse_control_record
from .errors import CorruptRecordError, KafkaLogError, TruncatedError
from .records import Record, parse_records

# A segment in memory, a binary file object (an io.RawIOBase too) or a path.
Source = bytes | bytearray | memoryview | BinaryIO | io.RawIOBase | str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """One batch: its parsed header and its complete bytes (``header.size_in_bytes`` long)."""

    header: BatchHeader
    data: bytes
    source: str | None = None

    def verify_crc(self) -> None:
        """Raise :class:`CrcMismatchError` naming this batch if the stored CRC is wrong."""
        verify_batch_crc(self.header, self.data, source=self.source)

    @property
    def raw_records_section(self) -> memoryview:
        """The bytes after the 61-byte header (compressed if the batch is)."""
        return memoryview(self.data)[BATCH_HEADER_SIZE:]

    def records_section(self, max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE) -> bytes:
        """The records section, decompressed (at most ``max_decompressed_size`` bytes)."""
        h = self.header
        return decompress(
            h.compression,
            self.raw_records_section,
            max_size=max_decompressed_size,
            where=h.where(self.source),
        )

    def records(self, max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE) -> Iterator[Record]:
        """The batch's records (decompressing first if needed)."""
        if self.header.record_count == 0:
            return iter(())
        return parse_records(self.records_section(max_decompressed_size), self.header, source=self.source)

    def control_records(self) -> list[ControlRecord]:
        """The parsed records of a control batch (transaction markers and KRaft records)."""
        h = self.header
        if not h.is_control:
            raise ValueError(f"not a control batch: {h.describe()}")
        out = []
        for record in self.records():
            try:
                out.append(parse_control_record(record))
            except KafkaLogError as exc:
                raise CorruptRecordError(
                    f"in control {h.describe()}: {exc.detail}",
                    source=self.source,
                    position=h.position,
                    offset=record.offset,
                ) from exc
        return out


@dataclass(frozen=True, slots=True)
class PartialBatch:
    """A batch cut off by the end of the data: where it starts, how many of its bytes are
    present and, when the length field was complete, how many it declares."""

    position: int
    available: int
    declared_size: int | None
    base_offset: int | None


@dataclass
class ScanResult:
    """Headers of the complete batches seen by :func:`scan_batch_headers`."""

    headers: list[BatchHeader] = field(default_factory=list)
    start_position: int = 0
    end_position: int = 0  #: position just after the last complete batch
    partial_tail: PartialBatch | None = None

    @property
    def batch_count(self) -> int:
        return len(self.headers)

    @property
    def record_count(self) -> int:
        return sum(h.record_count for h in self.headers)

    @property
    def bytes_scanned(self) -> int:
        return self.end_position - self.start_position

    def bytes_by_compression(self) -> dict[Compression, int]:
        """Batch bytes per codec (control batches included)."""
        out: dict[Compression, int] = {}
        for h in self.headers:
            out[h.compression] = out.get(h.compression, 0) + h.size_in_bytes
        return out

    @property
    def first_offset(self) -> int | None:
        return self.headers[0].base_offset if self.headers else None

    @property
    def last_offset(self) -> int | None:
        return self.headers[-1].last_offset if self.headers else None


# --------------------------------------------------------------------------------------------


class _ByteStream(Protocol):
    """What the readers need of a source: a binary file, or :class:`_BufferReader`."""

    def read(self, n: int = -1, /) -> bytes: ...

    def seek(self, pos: int, whence: int = io.SEEK_SET, /) -> int: ...

    def tell(self) -> int: ...

    def seekable(self) -> bool: ...


class _BufferReader:
    """A minimal read/seek/tell view of an in-memory buffer that never copies it whole."""

    def __init__(self, buf: Buffer) -> None:
        self._view = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
        self._pos = 0
        self.name = "<bytes>"

    def read(self, n: int = -1, /) -> bytes:
        end = len(self._view) if n < 0 else min(len(self._view), self._pos + n)
        out = bytes(self._view[self._pos : end])
        self._pos = max(self._pos, end)
        return out

    def seek(self, pos: int, whence: int = io.SEEK_SET, /) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = base + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True


@contextlib.contextmanager
def _open(source: Source, name: str | None) -> Iterator[tuple[_ByteStream, str]]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield _BufferReader(source), name or "<bytes>"
    elif isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            yield f, name or os.fspath(source)
    else:
        yield source, name or str(getattr(source, "name", "<stream>"))


def _read_exact(f: _ByteStream, n: int) -> bytes:
    chunks = []
    remaining = n
    while remaining > 0:
        chunk = f.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _seekable(f: _ByteStream) -> bool:
    try:
        return bool(f.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _skip(f: _ByteStream, n: int, seekable: bool, size: int | None) -> int:
    """Skip ``n`` bytes; return how many were actually there."""
    if seekable and size is not None:
        here = f.tell()
        skipped = max(0, min(n, size - here))
        f.seek(here + skipped)
        return skipped
    skipped = 0
    while skipped < n:
        chunk = f.read(min(1 << 20, n - skipped))
        if not chunk:
            break
        skipped += len(chunk)
    return skipped


def _walk(
    source: Source,
    name: str | None,
    start_position: int,
    end_position: int | None,
    max_batch_size: int,
    *,
    verify_crc: bool,
    scan: ScanResult | None = None,
) -> Iterator[tuple[BatchHeader, bytes | None, str]]:
    """Yield ``(header, data_or_None, source label)`` for each complete batch of ``source`` from
    ``start_position``. Without a ``scan`` every batch's data is read and a batch cut off by the
    end is a :class:`TruncatedError`; with one, a batch's body is read only to ``verify_crc`` (else
    skipped: data None) and a batch cut off by the end is recorded there as its partial tail."""
    with _open(source, name) as (f, label):
        yield from _walk_stream(f, label, start_position, end_position, max_batch_size, verify_crc, scan)


def _walk_stream(
    f: _ByteStream,
    name: str,
    start_position: int,
    end_position: int | None,
    max_batch_size: int,
    verify_crc: bool,
    scan: ScanResult | None,
) -> Iterator[tuple[BatchHeader, bytes | None, str]]:
    read_bodies = scan is None or verify_crc
    seekable = _seekable(f)
    size = None
    if seekable:
        here = f.tell()
        size = f.seek(0, io.SEEK_END)
        f.seek(here)
    if seekable:
        f.seek(start_position)
    elif start_position:
        if _skip(f, start_position, False, None) < start_position:
            raise TruncatedError(f"data ends before start position {start_position}", source=name)
    if end_position is not None and size is not None:
        size = min(size, end_position)
    elif end_position is not None:
        size = end_position
    pos = start_position

    def partial(available: int, declared: int | None, base_offset: int | None, what: str) -> None:
        if scan is not None:
            scan.partial_tail = PartialBatch(pos, available, declared, base_offset)
            return
        raise TruncatedError(what, source=name, position=pos, offset=base_offset)

    while True:
        want = BATCH_HEADER_SIZE if size is None else min(BATCH_HEADER_SIZE, size - pos)
        head = _read_exact(f, want) if want > 0 else b""
        if not head:
            return
        if len(head) < HEADER_SIZE_UP_TO_MAGIC:
            partial(len(head), None, None, f"data ends {len(head)} bytes into a batch header")
            return
        base_offset, length, _ = read_length_and_magic(head, pos, source=name, max_batch_size=max_batch_size)
        declared = 12 + length
        if len(head) < BATCH_HEADER_SIZE:
            partial(
                len(head),
                declared,
                base_offset,
                f"data ends {len(head)} bytes into the {declared}-byte batch at base offset {base_offset}",
            )
            return
        header = parse_batch_header(head, pos, source=name, max_batch_size=max_batch_size)
        body_len = declared - BATCH_HEADER_SIZE
        if read_bodies:
            body = (
                _read_exact(f, body_len)
                if size is None
                else _read_exact(f, min(body_len, size - pos - BATCH_HEADER_SIZE))
            )
            got = len(body)
        else:
            body = None
            got = _skip(f, body_len, seekable, size)
        if got < body_len:
            partial(
                BATCH_HEADER_SIZE + got,
                declared,
                base_offset,
                f"data ends {BATCH_HEADER_SIZE + got} bytes into {header.describe()}",
            )
            return
        data = None
        if body is not None:
            data = head + body
            if verify_crc:
                verify_batch_crc(header, data, source=name)
        if scan is not None:
            scan.end_position = pos + declared  # before yielding: the caller may stop here
        yield header, data, name
        pos += declared


def read_batches(
    source: Source,
    *,
    verify_crc: bool = True,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    start_position: int = 0,
    end_position: int | None = None,
    name: str | None = None,
) -> Iterator[RecordBatch]:
    """Yield the batches of a segment one at a time, from ``start_position`` (a batch boundary,
    e.g. from the offset index) up to ``end_position`` or the end of the data.

    Raises :class:`CrcMismatchError` (when ``verify_crc``), :class:`BatchSizeError`,
    :class:`CorruptRecordError`, :class:`UnsupportedFormatError` for v0/v1 batches, and
    :class:`TruncatedError` if the data ends inside a batch. ``name`` overrides the source
    name used in errors.
    """
    for header, data, label in _walk(
        source, name, start_position, end_position, max_batch_size, verify_crc=verify_crc
    ):
        assert data is not None  # no scan: every body is read
        yield RecordBatch(header, data, label)


def scan_batch_headers(
    source: Source,
    *,
    limit: int | None = None,
    start_position: int = 0,
    verify_crc: bool = False,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_batches: int | None = None,
    name: str | None = None,
) -> ScanResult:
    """Parse only the batch headers from ``start_position`` up to ``start_position + limit``
    bytes (or the end), never decompressing. Without ``verify_crc`` the batch bodies are
    skipped (seeked over when the source allows).

    A batch cut off by the end of the data or by ``limit`` is reported as
    :attr:`ScanResult.partial_tail` instead of raising; corrupt headers still raise.
    """
    result = ScanResult(start_position=start_position, end_position=start_position)
    end = None if limit is None else start_position + limit
    for header, _, _ in _walk(
        source, name, start_position, end, max_batch_size, verify_crc=verify_crc, scan=result
    ):
        result.headers.append(header)
        if max_batches is not None and len(result.headers) >= max_batches:
            break
    return result


def read_records(
    source: Source,
    *,
    include_control: bool = False,
    verify_crc: bool = True,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_decompressed_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE,
    name: str | None = None,
) -> Iterator[Record]:
    """Every record of every batch, in offset order; control batches' records are skipped
    unless ``include_control``. No transaction filtering: see :mod:`.transactions`."""
    for batch in read_batches(source, verify_crc=verify_crc, max_batch_size=max_batch_size, name=name):
        if batch.header.is_control and not include_control:
            continue
        yield from batch.records(max_decompressed_size)
