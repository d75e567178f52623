"""KIP-917 custom metadata returned to the broker by a copy: a Kafka tagged-fields
struct with Aiven's frozen tags: 0 REMOTE_SIZE (varlong), 1 OBJECT_PREFIX (compact
string), 2 OBJECT_KEY (compact string)."""

from __future__ import annotations

from collections.abc import Sequence

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.format.varint import (
    VarintErrors,
    encode_unsigned_varint,
    encode_varlong,
    read_unsigned_varint,
    read_varlong,
)

REMOTE_SIZE, OBJECT_PREFIX, OBJECT_KEY = 0, 1, 2
FIELD_TAGS = {"REMOTE_SIZE": REMOTE_SIZE, "OBJECT_PREFIX": OBJECT_PREFIX, "OBJECT_KEY": OBJECT_KEY}


def _corrupt(message: str) -> DataLoss:
    return DataLoss(f"custom metadata: {message}")


_ERRORS = VarintErrors(truncated=_corrupt, overlong=_corrupt)


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    return read_unsigned_varint(data, pos, _ERRORS)


def encode(fields: dict[int, int | str]) -> bytes:
    """Serialise; an empty dict gives empty bytes (as Aiven does)."""
    if not fields:
        return b""
    out = bytearray(encode_unsigned_varint(len(fields)))
    for tag in sorted(fields):
        value = fields[tag]
        if tag == REMOTE_SIZE:
            if not isinstance(value, int):
                raise TypeError("REMOTE_SIZE must be an int")
            payload = encode_varlong(value)
        elif tag in (OBJECT_PREFIX, OBJECT_KEY):
            raw = str(value).encode("utf-8")
            payload = encode_unsigned_varint(len(raw) + 1) + raw
        else:
            raise ValueError(f"unknown custom metadata tag {tag}")
        out += encode_unsigned_varint(tag) + encode_unsigned_varint(len(payload)) + payload
    return bytes(out)


def decode(data: bytes | None) -> dict[int, int | str]:
    if not data:
        return {}
    count, pos = _read_uvarint(data, 0)
    out: dict[int, int | str] = {}
    for _ in range(count):
        tag, pos = _read_uvarint(data, pos)
        size, pos = _read_uvarint(data, pos)
        payload = data[pos : pos + size]
        if len(payload) != size:
            raise DataLoss("custom metadata: truncated field")
        pos += size
        if tag == REMOTE_SIZE:
            remote_size, _ = read_varlong(payload, 0, _ERRORS)
            out[tag] = remote_size
        elif tag in (OBJECT_PREFIX, OBJECT_KEY):
            n, p = _read_uvarint(payload, 0)
            if n == 0:
                raise DataLoss("custom metadata: null string")
            try:
                out[tag] = payload[p : p + n - 1].decode("utf-8")
            except UnicodeDecodeError:
                raise DataLoss(f"custom metadata: tag {tag} is not valid UTF-8") from None
        # unknown tags are skipped, as Kafka's tagged fields allow
    if pos != len(data):
        raise DataLoss("custom metadata: trailing bytes")
    return out


def worst_case_size(fields: Sequence[str], prefix: str, hashed_prefix_chars: int) -> int:
    """Upper bound of the encoded size for the configured fields (topic names up to 249
    characters make OBJECT_KEY unbounded in practice; it is bounded here by that limit)."""
    sizes = []
    for name in fields:
        tag = FIELD_TAGS[name]
        if tag == REMOTE_SIZE:
            payload = 10
        elif tag == OBJECT_PREFIX:
            n = len(prefix.encode()) + (hashed_prefix_chars + 1 if hashed_prefix_chars else 0)
            payload = len(encode_unsigned_varint(n + 1)) + n
        else:
            n = 249 + 1 + 22 + 1 + 10 + 1 + 20 + 1 + 22
            payload = len(encode_unsigned_varint(n + 1)) + n
        sizes.append(1 + len(encode_unsigned_varint(payload)) + payload)
    return (1 + sum(sizes)) if sizes else 0
