"""Chunk indexes: where each original chunk of a ``.log`` file lies in the stored object.

Two kinds, as in Aiven's format:

* fixed: every transformed chunk has the same size except the last (no compression);
  stored as four numbers.
* variable: transformed sizes differ (compression); stored as a list of sizes encoded
  with ``encode_sizes`` (count, base, bytes-per-value, values minus base, last value in
  full; big-endian), then zstd with the content size in the frame, then base64.

Lookups are O(log n) (bisect over prefix sums), not the linear scans of the original.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import dataclasses
import struct
from typing import Any

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


def decode_transformed_chunks(text: str) -> list[int]:
    try:
        compressed = base64.b64decode(text, validate=True)
        params = zstandard.get_frame_parameters(compressed)
        size = params.content_size
        if size == zstandard.CONTENTSIZE_UNKNOWN or size < 0 or size > MAX_ENCODED_SIZES_BYTES:
            raise ValueError(f"invalid decompressed size {size}")
        raw = zstandard.ZstdDecompressor().decompress(compressed, max_output_size=size)
    except (binascii.Error, ValueError, zstandard.ZstdError) as e:
        raise DataLoss(f"corrupt transformedChunks in chunk index: {e}") from None
    return decode_sizes(raw)


# -- indexes ---------------------------------------------------------------------------
class ChunkIndex:
    """Common behaviour; subclasses provide ``transformed_sizes``."""

    kind: str
    original_chunk_size: int
    original_file_size: int

    def __init__(self, original_chunk_size: int, original_file_size: int, transformed_sizes: list[int]):
        if original_chunk_size <= 0:
            raise DataLoss(f"chunk index: original chunk size must be positive, got {original_chunk_size}")
        if original_file_size < 0:
            raise DataLoss(f"chunk index: original file size must be non-negative, got {original_file_size}")
        expected = -(-original_file_size // original_chunk_size)
        if len(transformed_sizes) != expected and not (
            original_file_size == 0 and len(transformed_sizes) <= 1
        ):
            raise DataLoss(
                f"chunk index: {len(transformed_sizes)} chunks listed for a {original_file_size}-byte "
                f"file cut into {original_chunk_size}-byte chunks (expected {expected})"
            )
        self.original_chunk_size = original_chunk_size
        self.original_file_size = original_file_size
        self._sizes = transformed_sizes if original_file_size > 0 else []
        starts = [0]
        for s in self._sizes:
            starts.append(starts[-1] + s)
        self._transformed_starts = starts

    @property
    def chunk_count(self) -> int:
        return len(self._sizes)

    @property
    def transformed_file_size(self) -> int:
        return self._transformed_starts[-1]

    def chunk(self, i: int) -> Chunk:
        if not 0 <= i < self.chunk_count:
            raise IndexError(f"chunk {i} out of 0..{self.chunk_count - 1}")
        pos = i * self.original_chunk_size
        return Chunk(
            i,
            pos,
            min(self.original_chunk_size, self.original_file_size - pos),
            self._transformed_starts[i],
            self._sizes[i],
        )

    def chunks(self) -> list[Chunk]:
        return [self.chunk(i) for i in range(self.chunk_count)]

    def chunk_for_position(self, position: int) -> Chunk:
        if not 0 <= position < self.original_file_size:
            raise IndexError(f"position {position} outside a {self.original_file_size}-byte file")
        return self.chunk(position // self.original_chunk_size)

    def chunks_for_range(self, start: int, end: int) -> list[Chunk]:
        """Chunks covering original bytes [start, end] (inclusive, clamped to the file)."""
        end = min(end, self.original_file_size - 1)
        if start > end or start >= self.original_file_size:
            return []
        first = start // self.original_chunk_size
        last = end // self.original_chunk_size
        return [self.chunk(i) for i in range(first, last + 1)]

    def chunk_for_transformed_position(self, position: int) -> int:
        return bisect.bisect_right(self._transformed_starts, position) - 1

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def from_json(obj: Any) -> ChunkIndex:
        if not isinstance(obj, dict):
            raise DataLoss("chunk index is not a JSON object")
        kind = obj.get("type")
        try:
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
                return VariableChunkIndex(
                    _int(obj, "originalChunkSize"),
                    _int(obj, "originalFileSize"),
                    decode_transformed_chunks(text),
                )
        except DataLoss:
            raise
        raise DataLoss(f"chunk index: unknown type {kind!r}")

    def __eq__(self, other: object) -> bool:
        return (
            type(self) is type(other)
            and self.original_chunk_size == other.original_chunk_size
            and self.original_file_size == other.original_file_size
            and self._sizes == other._sizes
        )

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
    kind = "fixed"

    def __init__(
        self,
        original_chunk_size: int,
        original_file_size: int,
        transformed_chunk_size: int,
        final_transformed_chunk_size: int,
    ):
        if transformed_chunk_size < 0 or final_transformed_chunk_size < 0:
            raise DataLoss("chunk index: negative transformed chunk size")
        count = -(-original_file_size // original_chunk_size) if original_chunk_size > 0 else 0
        sizes = [transformed_chunk_size] * max(count - 1, 0) + (
            [final_transformed_chunk_size] if count else []
        )
        super().__init__(original_chunk_size, original_file_size, sizes)
        self.transformed_chunk_size = transformed_chunk_size
        self.final_transformed_chunk_size = final_transformed_chunk_size

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "fixed",
            "originalChunkSize": self.original_chunk_size,
            "originalFileSize": self.original_file_size,
            "transformedChunkSize": self.transformed_chunk_size,
            "finalTransformedChunkSize": self.final_transformed_chunk_size,
        }

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FixedChunkIndex)
            and super().__eq__(other)
            and self.transformed_chunk_size == other.transformed_chunk_size
        )

    __hash__ = None  # type: ignore[assignment]


class VariableChunkIndex(ChunkIndex):
    kind = "variable"

    def __init__(self, original_chunk_size: int, original_file_size: int, transformed_sizes: list[int]):
        if not transformed_sizes:
            raise DataLoss("chunk index: a variable index needs at least one chunk")
        super().__init__(original_chunk_size, original_file_size, list(transformed_sizes))
        self._listed = list(transformed_sizes)

    @property
    def transformed_sizes(self) -> list[int]:
        return list(self._listed)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "variable",
            "originalChunkSize": self.original_chunk_size,
            "originalFileSize": self.original_file_size,
            "transformedChunks": encode_transformed_chunks(self._listed),
        }

    __hash__ = None  # type: ignore[assignment]


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
