"""Chunk indexes: where each original chunk of a ``.log`` file lies in the stored object.

Two kinds, as in Aiven's format:

* fixed: every transformed chunk has the same size except the last (no compression);
  stored as four numbers.
* variable: transformed sizes differ (compression); stored as a list of sizes encoded
  with ``encode_sizes`` (count, base, bytes-per-value, values minus base, last value in
  full; big-endian), then zstd with the content size in the frame, then base64.

Lookups are O(1) (fixed) and O(log n) (variable: bisect over running sums), not the linear
scans of the original; what a manifest declares is bounded before anything is allocated
(``ChunkIndex``).
"""

from __future__ import annotations

import array
import base64
import binascii
import bisect
import dataclasses
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import zstandard

from rsm_sidecar.errors import DataLoss

MAX_ENCODED_SIZES_BYTES = 10 * 1024 * 1024  # Aiven's reader refuses more
_INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Chunk:
    id: int
    original_position: int
    original_size: int
    transformed_position: int
    transformed_size: int

    @property
    def original_end(self) -> int:
        """Exclusive end in the original file."""
        return self.original_position + self.original_size

    @property
    def transformed_end(self) -> int:
        return self.transformed_position + self.transformed_size


# -- the binary codec of chunk sizes ------------------------------------------------
def _bytes_needed(v: int) -> int:
    if v <= 0xFF:
        return 1
    if v <= 0xFFFF:
        return 2
    if v <= 0xFFFFFF:
        return 3
    return 4


def encode_sizes(values: list[int]) -> bytes:
    """Binary-encode chunk sizes (Aiven's ChunkSizesBinaryCodec layout)."""
    if any(v < 0 or v > _INT32_MAX for v in values):
        raise ValueError("chunk sizes must be in 0..2^31-1")
    count = len(values)
    if count == 0:
        return struct.pack(">i", 0)
    if count == 1:
        return struct.pack(">ii", 1, values[0])
    head = values[:-1]
    base = min(head)
    width = max(_bytes_needed(v - base) for v in head)
    out = bytearray(struct.pack(">iiB", count, base, width))
    for v in head:
        out += (v - base).to_bytes(4, "big")[4 - width :]
    out += struct.pack(">i", values[-1])
    return bytes(out)


def decode_sizes(data: bytes) -> list[int]:
    try:
        (count,) = struct.unpack_from(">i", data, 0)
        if count < 0:
            raise ValueError(f"negative count {count}")
        if count == 0:
            return []
        if count == 1:
            return [struct.unpack_from(">i", data, 4)[0]]
        base, width = struct.unpack_from(">iB", data, 4)
        if not 1 <= width <= 4:
            raise ValueError(f"bytes per value {width}")
        pos = 9
        expected = pos + (count - 1) * width + 4
        if len(data) != expected:
            raise ValueError(f"{len(data)} bytes for {count} values of {width} bytes (expected {expected})")
        values = [
            int.from_bytes(data[pos + i * width : pos + (i + 1) * width], "big") + base
            for i in range(count - 1)
        ]
        values.append(struct.unpack_from(">i", data, expected - 4)[0])
        return values
    except (struct.error, ValueError) as e:
        raise DataLoss(f"corrupt chunk-size list: {e}") from None


def encode_transformed_chunks(values: list[int]) -> str:
    raw = encode_sizes(values)
    if len(raw) > MAX_ENCODED_SIZES_BYTES:
        raise ValueError(f"chunk index too large ({len(raw)} bytes)")
    compressed = zstandard.ZstdCompressor(level=3, write_content_size=True, write_checksum=False).compress(
        raw
    )
    return base64.b64encode(compressed).decode("ascii")


def _decompress_sizes(text: str) -> bytes:
    """The binary size list of ``transformedChunks`` (at most ``MAX_ENCODED_SIZES_BYTES``)."""
    try:
        compressed = base64.b64decode(text, validate=True)
        params = zstandard.get_frame_parameters(compressed)
        size = params.content_size
        if size == zstandard.CONTENTSIZE_UNKNOWN or size < 0 or size > MAX_ENCODED_SIZES_BYTES:
            raise ValueError(f"invalid decompressed size {size}")
        raw: bytes = zstandard.ZstdDecompressor().decompress(compressed, max_output_size=size)
    except (binascii.Error, ValueError, zstandard.ZstdError) as e:
        raise DataLoss(f"corrupt transformedChunks in chunk index: {e}") from None
    return raw


def decode_transformed_chunks(text: str) -> list[int]:
    return decode_sizes(_decompress_sizes(text))


# -- indexes ---------------------------------------------------------------------------
class ChunkSpan(Sequence[Chunk]):
    """Chunks ``first..last`` of an index, made one at a time as they are used (a range of a
    manifest that claims millions of chunks costs nothing until read)."""

    def __init__(self, index: ChunkIndex, ids: range):
        self._index = index
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, i: int) -> Chunk: ...

    @overload
    def __getitem__(self, i: slice) -> ChunkSpan: ...

    def __getitem__(self, i: int | slice) -> Chunk | ChunkSpan:
        if isinstance(i, slice):
            return ChunkSpan(self._index, self._ids[i])
        return self._index.chunk(self._ids[i])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ChunkSpan({self._ids.start}..{self._ids.stop - 1})"


class ChunkIndex:
    """Common behaviour; subclasses say where each stored chunk lies (``_stored``).

    What a manifest declares is bounded as Aiven's reader bounds it (Java ``int`` sizes: a
    segment, a chunk and a stored chunk have at most 2^31-1 bytes; a variable index's size
    list at most ``MAX_ENCODED_SIZES_BYTES``), and a chunk with data is at least one byte
    stored, so an index never claims more chunks than its stored bytes. Nothing is allocated
    per chunk for a fixed index, 8 bytes per chunk for a variable one."""

    kind: str
    original_chunk_size: int
    original_file_size: int

    def __init__(self, original_chunk_size: int, original_file_size: int):
        if not 0 < original_chunk_size <= _INT32_MAX:
            raise DataLoss(f"chunk index: original chunk size must be 1..2^31-1, got {original_chunk_size}")
        if not 0 <= original_file_size <= _INT32_MAX:
            raise DataLoss(
                f"chunk index: original file size must be 0..2^31-1 (a Kafka segment's limit), got "
                f"{original_file_size}"
            )
        self.original_chunk_size = original_chunk_size
        self.original_file_size = original_file_size
        self._count = -(-original_file_size // original_chunk_size)

    @property
    def chunk_count(self) -> int:
        return self._count

    @property
    def transformed_file_size(self) -> int:
        raise NotImplementedError

    def _stored(self, i: int) -> tuple[int, int]:
        """(position, size) of stored chunk ``i``."""
        raise NotImplementedError

    def chunk(self, i: int) -> Chunk:
        if not 0 <= i < self._count:
            raise IndexError(f"chunk {i} out of 0..{self._count - 1}")
        pos = i * self.original_chunk_size
        position, size = self._stored(i)
        return Chunk(i, pos, min(self.original_chunk_size, self.original_file_size - pos), position, size)

    def chunks(self) -> ChunkSpan:
        return ChunkSpan(self, range(self._count))

    def transformed_sizes_iter(self) -> Iterator[int]:
        """The stored size of every chunk, in order."""
        return (self._stored(i)[1] for i in range(self._count))

    def chunk_for_position(self, position: int) -> Chunk:
        if not 0 <= position < self.original_file_size:
            raise IndexError(f"position {position} outside a {self.original_file_size}-byte file")
        return self.chunk(position // self.original_chunk_size)

    def chunks_for_range(self, start: int, end: int) -> ChunkSpan:
        """Chunks covering original bytes [start, end] (inclusive, clamped to the file)."""
        end = min(end, self.original_file_size - 1)
        if start > end or start >= self.original_file_size:
            return ChunkSpan(self, range(0))
        return ChunkSpan(self, range(start // self.original_chunk_size, end // self.original_chunk_size + 1))

    def chunk_for_transformed_position(self, position: int) -> int:
        raise NotImplementedError

    @property
    def memory_bytes(self) -> int:
        """About what the index holds in memory."""
        return 200

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def from_json(obj: Any) -> ChunkIndex:
        if not isinstance(obj, dict):
            raise DataLoss("chunk index is not a JSON object")
        kind = obj.get("type")
        if kind == "fixed":
            return FixedChunkIndex(
                _int(obj, "originalChunkSize"),
                _int(obj, "originalFileSize"),
                _int(obj, "transformedChunkSize"),
                _int(obj, "finalTransformedChunkSize"),
            )
        if kind == "variable":
            text = obj.get("transformedChunks")
            if not isinstance(text, str):
                raise DataLoss("chunk index: transformedChunks missing or not a string")
            return VariableChunkIndex.decode(
                _int(obj, "originalChunkSize"), _int(obj, "originalFileSize"), text
            )
        raise DataLoss(f"chunk index: unknown type {kind!r}")

    def __eq__(self, other: object) -> bool:
        return (
            type(self) is type(other)
            and isinstance(other, ChunkIndex)
            and self.original_chunk_size == other.original_chunk_size
            and self.original_file_size == other.original_file_size
            and self.transformed_file_size == other.transformed_file_size
            and list(self.transformed_sizes_iter()) == list(other.transformed_sizes_iter())
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(chunk={self.original_chunk_size}, file={self.original_file_size}, "
            f"chunks={self.chunk_count}, stored={self.transformed_file_size})"
        )


def _int(obj: dict[str, Any], name: str) -> int:
    v = obj.get(name)
    if not isinstance(v, int) or isinstance(v, bool):
        raise DataLoss(f"chunk index: {name} missing or not an integer")
    return v


class FixedChunkIndex(ChunkIndex):
    """Every stored chunk has ``transformed_chunk_size`` bytes but the last, which has
    ``final_transformed_chunk_size``: positions are arithmetic, nothing is kept per chunk."""

    kind = "fixed"

    def __init__(
        self,
        original_chunk_size: int,
        original_file_size: int,
        transformed_chunk_size: int,
        final_transformed_chunk_size: int,
    ):
        super().__init__(original_chunk_size, original_file_size)
        for name, v in (
            ("transformed chunk size", transformed_chunk_size),
            ("final transformed chunk size", final_transformed_chunk_size),
        ):
            if not 0 <= v <= _INT32_MAX:
                raise DataLoss(f"chunk index: {name} must be 0..2^31-1, got {v}")
        if (self._count > 1 and transformed_chunk_size == 0) or (
            self._count and final_transformed_chunk_size == 0
        ):
            raise DataLoss(
                f"chunk index: {self._count} chunks of original data stored in chunks of "
                f"{transformed_chunk_size} and {final_transformed_chunk_size} bytes (a chunk with data is "
                f"never empty when stored)"
            )
        self.transformed_chunk_size = transformed_chunk_size
        self.final_transformed_chunk_size = final_transformed_chunk_size

    @property
    def transformed_file_size(self) -> int:
        if not self._count:
            return 0
        return (self._count - 1) * self.transformed_chunk_size + self.final_transformed_chunk_size

    def _stored(self, i: int) -> tuple[int, int]:
        size = self.final_transformed_chunk_size if i == self._count - 1 else self.transformed_chunk_size
        return i * self.transformed_chunk_size, size

    def chunk_for_transformed_position(self, position: int) -> int:
        if self._count <= 1:
            return 0
        return min(position // self.transformed_chunk_size, self._count - 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "fixed",
            "originalChunkSize": self.original_chunk_size,
            "originalFileSize": self.original_file_size,
            "transformedChunkSize": self.transformed_chunk_size,
            "finalTransformedChunkSize": self.final_transformed_chunk_size,
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FixedChunkIndex) and self.to_json() == other.to_json()


class VariableChunkIndex(ChunkIndex):
    """Stored chunk sizes listed one by one (compression); kept as their running sums."""

    kind = "variable"

    def __init__(self, original_chunk_size: int, original_file_size: int, transformed_sizes: Iterable[int]):
        super().__init__(original_chunk_size, original_file_size)
        starts = array.array("q", [0])
        least = 1 if original_file_size else 0  # a chunk with data is never empty when stored
        for v in transformed_sizes:
            if not least <= v <= _INT32_MAX:
                raise DataLoss(f"chunk index: stored chunk size {v} is not {least}..2^31-1")
            starts.append(starts[-1] + v)
        listed = len(starts) - 1
        if listed != self._count and not (original_file_size == 0 and listed <= 1):
            raise DataLoss(
                f"chunk index: {listed} chunks listed for a {original_file_size}-byte "
                f"file cut into {original_chunk_size}-byte chunks (expected {self._count})"
            )
        if not listed:
            raise DataLoss("chunk index: a variable index needs at least one chunk")
        self._listed = starts  # running sums of what the manifest lists (one entry for an empty file)
        self._starts = starts if self._count else array.array("q", [0])

    @classmethod
    def decode(cls, original_chunk_size: int, original_file_size: int, text: str) -> VariableChunkIndex:
        """From ``transformedChunks``, checking the listed count against the file before the
        sizes are unpacked."""
        raw = _decompress_sizes(text)
        if len(raw) >= 4 and original_chunk_size > 0 and 0 <= original_file_size <= _INT32_MAX:
            (count,) = struct.unpack_from(">i", raw)
            expected = -(-original_file_size // original_chunk_size)
            if count != expected and not (original_file_size == 0 and count <= 1):
                raise DataLoss(
                    f"chunk index: {count} chunks listed for a {original_file_size}-byte "
                    f"file cut into {original_chunk_size}-byte chunks (expected {expected})"
                )
        return cls(original_chunk_size, original_file_size, decode_sizes(raw))

    @property
    def transformed_file_size(self) -> int:
        return self._starts[-1]

    @property
    def transformed_sizes(self) -> list[int]:
        """The sizes the manifest lists (a single entry for an empty file)."""
        s = self._listed
        return [s[i + 1] - s[i] for i in range(len(s) - 1)]

    def _stored(self, i: int) -> tuple[int, int]:
        return self._starts[i], self._starts[i + 1] - self._starts[i]

    def chunk_for_transformed_position(self, position: int) -> int:
        return bisect.bisect_right(self._starts, position) - 1

    @property
    def memory_bytes(self) -> int:
        return 200 + 8 * len(self._listed)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "variable",
            "originalChunkSize": self.original_chunk_size,
            "originalFileSize": self.original_file_size,
            "transformedChunks": encode_transformed_chunks(self.transformed_sizes),
        }


def build_index(
    original_chunk_size: int,
    original_file_size: int,
    transformed_sizes: list[int],
    fixed_transformed_size: int | None,
) -> ChunkIndex:
    """The index a writer records once all chunks are transformed.

    ``fixed_transformed_size`` is the constant output size of a full chunk when the
    transform has one (no compression: the chunk size, plus 28 bytes when encrypted),
    else None. An empty file always gets a fixed index: Aiven's reader cannot parse a
    variable index with no chunks.
    """
    if fixed_transformed_size is not None or not transformed_sizes:
        nominal = fixed_transformed_size if fixed_transformed_size is not None else original_chunk_size
        if any(s != nominal for s in transformed_sizes[:-1]):
            raise ValueError("fixed chunk index with varying chunk sizes")
        final = transformed_sizes[-1] if transformed_sizes else 0
        return FixedChunkIndex(original_chunk_size, original_file_size, nominal, final)
    return VariableChunkIndex(original_chunk_size, original_file_size, transformed_sizes)
