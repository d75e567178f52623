"""KIP-917 custom metadata returned to the broker by a copy: a Kafka tagged-fields
struct with Aiven's frozen tags: 0 REMOTE_SIZE (varlong), 1 OBJECT_PREFIX (compact
string), 2 OBJECT_KEY (compact string)."""

from __future__ import annotations

from rsm_sidecar.errors import DataLoss

REMOTE_SIZE, OBJECT_PREFIX, OBJECT_KEY = 0, 1, 2
FIELD_TAGS = {"REMOTE_SIZE": REMOTE_SIZE, "OBJECT_PREFIX": OBJECT_PREFIX, "OBJECT_KEY": OBJECT_KEY}


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise DataLoss("custom metadata: truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _zigzag64(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def encode(fields: dict[int, int | str]) -> bytes:
    """Serialise; an empty dict gives empty bytes (as Aiven does)."""
    if not fields:
        return b""
    out = bytearray(_uvarint(len(fields)))
    for tag in sorted(fields):
        value = fields[tag]
        if tag == REMOTE_SIZE:
            if not isinstance(value, int):
                raise TypeError("REMOTE_SIZE must be an int")
            payload = _uvarint(_zigzag64(value) & 0xFFFFFFFFFFFFFFFF)
        elif tag in (OBJECT_PREFIX, OBJECT_KEY):
            raw = str(value).encode("utf-8")
            payload = _uvarint(len(raw) + 1) + raw
        else:
            raise ValueError(f"unknown custom metadata tag {tag}")
        out += _uvarint(tag) + _uvarint(len(payload)) + payload
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
            v, _ = _read_uvarint(payload, 0)
            out[tag] = _unzigzag(v)
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


def worst_case_size(fields: list[str], prefix: str, hashed_prefix_chars: int) -> int:
    """Upper bound of the encoded size for the configured fields (topic names up to 249
    characters make OBJECT_KEY unbounded in practice; it is bounded here by that limit)."""
    sizes = []
    for name in fields:
        tag = FIELD_TAGS[name]
        if tag == REMOTE_SIZE:
            payload = 10
        elif tag == OBJECT_PREFIX:
            n = len(prefix.encode()) + (hashed_prefix_chars + 1 if hashed_prefix_chars else 0)
            payload = len(_uvarint(n + 1)) + n
        else:
            n = 249 + 1 + 22 + 1 + 10 + 1 + 20 + 1 + 22
            payload = len(_uvarint(n + 1)) + n
        sizes.append(1 + len(_uvarint(payload)) + payload)
    return (1 + sum(sizes)) if sizes else 0
