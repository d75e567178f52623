"""Decompression of a batch's records section, with a cap on the decompressed size.

Codecs as Kafka writes them for magic 2:

* gzip: a gzip stream (several concatenated members are accepted, as Java's ``GZIPInputStream``).
* snappy: either xerial ``snappy-java`` framing (what the Java producer writes: the 8-byte magic
  ``\\x82SNAPPY\\x00``, two big-endian int32s version and minimum compatible version, then blocks
  of int32 length + raw snappy) or one plain raw snappy block (what librdkafka writes, and what
  ``SnappyInputStream`` falls back to when the magic is absent).
* lz4: the LZ4 frame format.
* zstd: one or more zstd frames.

The codecs themselves come from ``zlib``, ``cramjam`` and ``zstandard``. The cap
(``max_size``) is checked before or while decompressing, never after materialising an
unbounded result: exceeding it raises :class:`LimitExceededError`; bad bytes raise
:class:`DecompressionError`.
"""

from __future__ import annotations

import struct
import zlib
from typing import NoReturn

import cramjam
import zstandard

from rsm_sidecar.format.varint import Buffer

from .batch import Compression
from .errors import DecompressionError, LimitExceededError, UnsupportedFormatError, Where

#: Default cap on one batch's decompressed records section.
DEFAULT_MAX_DECOMPRESSED_SIZE = 64 * 1024 * 1024

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16  # magic + version int32 + compatible version int32
#: LZ4 cannot expand data by more than ~255x; output is bounded by this factor of the input.
_LZ4_MAX_RATIO = 255
_CHUNK = 1 << 20
#: zstd RLE blocks turn 4 input bytes into up to 128 KiB: a bound on the expansion of any input.
_ZSTD_MAX_RATIO = 32 * 1024


def decompress(
    codec: Compression | int,
    data: Buffer,
    *,
    max_size: int = DEFAULT_MAX_DECOMPRESSED_SIZE,
    where: Where | None = None,
) -> bytes:
    """Decompress a records section compressed with ``codec``; at most ``max_size`` bytes out.

    ``where`` (``source``/``position``/``offset``) is attached to errors.
    """
    where = where or {}
    codec = Compression(codec)
    if codec is Compression.NONE:
        return bytes(data)
    try:
        if codec is Compression.GZIP:
            out = _gunzip(data, max_size, where)
        elif codec is Compression.SNAPPY:
            out = _unsnappy(data, max_size, where)
        elif codec is Compression.LZ4:
            out = _unlz4(data, max_size, where)
        elif codec is Compression.ZSTD:
            out = _unzstd(data, max_size, where)
        else:  # pragma: no cover - the enum has no other members
            raise UnsupportedFormatError(f"unsupported codec {codec!r}", **where)
    except (LimitExceededError, DecompressionError, UnsupportedFormatError):
        raise
    except (
        zlib.error,
        EOFError,
        OSError,
        ValueError,
        zstandard.ZstdError,
        cramjam.DecompressionError,
    ) as exc:
        raise DecompressionError(
            f"{codec.name.lower()} payload of {len(data)} bytes does not decompress: {exc}", **where
        ) from exc
    if len(out) > max_size:
        _too_big(codec, len(out), max_size, where)
    return out


def _too_big(codec: Compression, size: int | str, max_size: int, where: Where) -> NoReturn:
    raise LimitExceededError(
        f"{codec.name.lower()} batch decompresses to {size} bytes, more than the cap of "
        f"{max_size} bytes (max_decompressed_size)",
        **where,
    )


def _gunzip(data: Buffer, max_size: int, where: Where) -> bytes:
    out = bytearray()
    remaining = bytes(data)
    while True:
        d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        buf = remaining
        while buf:
            chunk = d.decompress(buf, max(1, min(_CHUNK, max_size + 1 - len(out))))
            out += chunk
            if len(out) > max_size:
                _too_big(Compression.GZIP, f"more than {max_size}", max_size, where)
            buf = d.unconsumed_tail
            if d.eof:
                break
        if not d.eof:
            raise DecompressionError(
                f"gzip payload of {len(data)} bytes is truncated (no end-of-stream marker)", **where
            )
        remaining = d.unused_data
        if not remaining:
            return bytes(out)
        if not remaining.startswith(b"\x1f\x8b"):
            raise DecompressionError(f"gzip payload has {len(remaining)} bytes of trailing garbage", **where)


def _raw_snappy(block: bytes, max_size: int, where: Where, budget_used: int = 0) -> bytes:
    declared = cramjam.snappy.decompress_raw_len(block)
    if budget_used + declared > max_size:
        _too_big(Compression.SNAPPY, f"at least {budget_used + declared}", max_size, where)
    return bytes(cramjam.snappy.decompress_raw(block))


def _unsnappy(data: Buffer, max_size: int, where: Where) -> bytes:
    data = bytes(data)
    if not data.startswith(XERIAL_MAGIC):
        return _raw_snappy(data, max_size, where)
    if len(data) < _XERIAL_HEADER_SIZE:
        raise DecompressionError("xerial snappy header is truncated", **where)
    version, compatible = struct.unpack_from(">ii", data, len(XERIAL_MAGIC))
    if version < 1:
        # snappy-java's SnappyInputStream refuses versions below MINIMUM_COMPATIBLE_VERSION (1).
        raise DecompressionError(
            f"xerial snappy stream version {version} (compatible {compatible}) unsupported", **where
        )
    out = bytearray()
    pos = _XERIAL_HEADER_SIZE
    while pos < len(data):
        if pos + 4 > len(data):
            raise DecompressionError(f"xerial snappy block length at {pos} is truncated", **where)
        (block_len,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if block_len < 0 or pos + block_len > len(data):
            raise DecompressionError(
                f"xerial snappy block at {pos - 4} declares {block_len} bytes but {len(data) - pos} remain",
                **where,
            )
        out += _raw_snappy(data[pos : pos + block_len], max_size, where, len(out))
        pos += block_len
    return bytes(out)


def _unlz4(data: Buffer, max_size: int, where: Where) -> bytes:
    data = bytes(data)
    if len(data) * _LZ4_MAX_RATIO + 65536 <= max_size:
        return bytes(cramjam.lz4.decompress(data))
    # Could exceed the cap: decompress into a buffer one byte larger than the cap.
    out = bytearray(max_size + 1)
    try:
        n = cramjam.lz4.decompress_into(data, out)
    except cramjam.DecompressionError as exc:
        if "failed to write whole buffer" in str(exc):
            _too_big(Compression.LZ4, f"more than {max_size}", max_size, where)
        raise
    if n > max_size:
        _too_big(Compression.LZ4, f"more than {max_size}", max_size, where)
    return bytes(memoryview(out)[:n])


def _unzstd(data: Buffer, max_size: int, where: Where) -> bytes:
    """Frame by frame, feeding input in steps small enough that even the most compressible
    input (RLE blocks: ~32768x) cannot overshoot the cap by more than a few MiB, and checking
    that every frame ends (a truncated frame is an error, not a short result)."""
    data = bytes(data)
    out = bytearray()
    pos = 0
    while pos < len(data):
        dobj = zstandard.ZstdDecompressor().decompressobj()
        while not dobj.eof:
            if pos >= len(data):
                raise DecompressionError(
                    f"zstd payload of {len(data)} bytes is truncated (incomplete frame)", **where
                )
            budget = max_size + 1 - len(out)
            step = max(64, min(_CHUNK, budget // _ZSTD_MAX_RATIO))
            out += dobj.decompress(data[pos : pos + step])
            pos += step
            if len(out) > max_size:
                _too_big(Compression.ZSTD, f"more than {max_size}", max_size, where)
        pos = min(pos, len(data)) - len(dobj.unused_data)  # the next frame starts there
    return bytes(out)


def compress(codec: Compression | int, data: bytes, *, xerial: bool = False) -> bytes:
    """Compress a records section (for building test batches; brokers do the real work).

    ``xerial=True`` frames snappy output the way snappy-java does (one block per 32 KiB).
    """
    codec = Compression(codec)
    if codec is Compression.NONE:
        return bytes(data)
    if codec is Compression.GZIP:
        c = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
        return c.compress(data) + c.flush()
    if codec is Compression.SNAPPY:
        if not xerial:
            return bytes(cramjam.snappy.compress_raw(data))
        out = bytearray(XERIAL_MAGIC + struct.pack(">ii", 1, 1))
        for i in range(0, len(data), 32 * 1024):
            block = bytes(cramjam.snappy.compress_raw(data[i : i + 32 * 1024]))
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec is Compression.LZ4:
        return bytes(cramjam.lz4.compress(data))
    return zstandard.ZstdCompressor().compress(data)
