"""Per-chunk transforms, in Aiven's order: compress (zstd) then encrypt (AES-256-GCM,
``IV(12) || ciphertext || tag(16)``, the segment's AAD on every chunk); reading undoes
them and verifies every byte: the GCM tag when encrypted, CRC32C when not."""

from __future__ import annotations

import os
import threading

import google_crc32c
import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from rsm_sidecar.errors import DataLoss

IV_BYTES = 12
TAG_BYTES = 16
GCM_OVERHEAD = IV_BYTES + TAG_BYTES


#: a memoryview is checksummed in pieces of this size (google_crc32c takes only bytes)
CRC_PIECE_BYTES = 1024 * 1024


#: what a stored chunk or index arrives as: its own bytes or a view into a downloaded run
Buffer = bytes | bytearray | memoryview


def crc32c(data: Buffer) -> int:
    if not isinstance(data, memoryview):
        return int(google_crc32c.value(data))
    crc = 0
    for i in range(0, len(data), CRC_PIECE_BYTES):
        crc = int(google_crc32c.extend(crc, bytes(data[i : i + CRC_PIECE_BYTES])))
    return crc


class ChunkCodec:
    """Transforms of one segment. Thread-safe: zstd contexts are per thread."""

    def __init__(self, compression: bool, data_key: bytes | None, aad: bytes | None, level: int = 3):
        self.compression = compression
        self.level = level
        self._aes = AESGCM(data_key) if data_key is not None else None
        self.aad = aad
        self._local = threading.local()

    @property
    def encrypted(self) -> bool:
        return self._aes is not None

    def fixed_transformed_size(self, chunk_size: int) -> int | None:
        """Output size of a full chunk if the transform has a constant one."""
        if self.compression:
            return None
        return chunk_size + (GCM_OVERHEAD if self._aes else 0)

    def _compressor(self) -> zstandard.ZstdCompressor:
        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = zstandard.ZstdCompressor(level=self.level, write_content_size=True)
        return c

    def _decompressor(self) -> zstandard.ZstdDecompressor:
        d = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = zstandard.ZstdDecompressor()
        return d

    def encode(self, chunk: bytes) -> bytes:
        data = self._compressor().compress(chunk) if self.compression else chunk
        if self._aes is not None:
            iv = os.urandom(IV_BYTES)
            data = iv + self._aes.encrypt(iv, data, self.aad)
        return data

    def encrypt_only(self, data: bytes) -> bytes:
        """Indexes are encrypted (when encryption is on) but never compressed."""
        if self._aes is None:
            return data
        iv = os.urandom(IV_BYTES)
        return iv + self._aes.encrypt(iv, data, self.aad)

    def decrypt_only(self, stored: Buffer, where: str, crc: int | None = None) -> bytes:
        """Verify and decrypt one stored index (never compressed)."""
        return _own_bytes(self._verify_and_decrypt(stored, where, crc, "index"))

    def decode(self, stored: Buffer, original_size: int, where: str, crc: int | None = None) -> bytes:
        """Verify and undo the transforms of one stored chunk (``bytes`` or a memoryview
        into a downloaded run; the result is always ``bytes`` of its own, never a view that
        would keep the run alive). ``where`` names the object and chunk in errors."""
        data = self._verify_and_decrypt(stored, where, crc, "chunk")
        if self.compression:
            return self.decompress(data, original_size, where)
        if len(data) != original_size:
            raise DataLoss(f"{where}: decoded to {len(data)} bytes, expected {original_size}")
        return _own_bytes(data)

    def decompress(self, frame: Buffer, original_size: int, where: str) -> bytes:
        """The original bytes of a verified chunk's zstd frame; ``DataLoss`` unless it is a frame
        that decompresses to exactly ``original_size`` bytes."""
        try:
            data = self._decompressor().decompress(frame, max_output_size=original_size)
        except zstandard.ZstdError as e:
            raise DataLoss(f"{where}: zstd frame is corrupt: {e}") from None
        if len(data) != original_size:
            raise DataLoss(f"{where}: decoded to {len(data)} bytes, expected {original_size}")
        return _own_bytes(data)

    def _verify_and_decrypt(self, stored: Buffer, where: str, crc: int | None, what: str) -> Buffer:
        """The stored bytes checked against ``crc`` (when given) and, when encrypted, against
        the GCM tag, then decrypted. ``what`` (chunk, index) names the object in errors."""
        if crc is not None and crc32c(stored) != crc:
            raise DataLoss(f"{where}: checksum mismatch (CRC32C) - stored bytes are corrupt")
        if self._aes is None:
            return stored
        if len(stored) < GCM_OVERHEAD:
            raise DataLoss(f"{where}: {len(stored)} bytes is too short for an encrypted {what}")
        try:
            view = memoryview(stored)  # no copy of the ciphertext
            return self._aes.decrypt(view[:IV_BYTES], view[IV_BYTES:], self.aad)
        except InvalidTag:
            raise DataLoss(
                f"{where}: authentication failed (AES-GCM tag mismatch) - corrupt data "
                f"or a data key that does not belong to this segment"
            ) from None


def _own_bytes(data: Buffer) -> bytes:
    return data if isinstance(data, bytes) else bytes(data)
