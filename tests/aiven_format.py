"""Aiven's on-remote format, written and read the way Aiven's tiered-storage plugin does,
for the compatibility tests: segments as a bucket written by Aiven's plugin presents them
(the migration's starting point), and a reader that reads a bucket as Aiven's plugin would
(the way back).

Written from the format's description (docs/format.md and the study of Aiven's plugin at
commit 8fb15816, whose serde tests give the known answers checked in
tests/format/test_aiven_format.py),
and deliberately independent of ``rsm_sidecar``: nothing here imports it, so a test that
reads with one side what the other wrote proves compatibility instead of agreeing with
itself. Only third-party libraries do the primitives (zstandard, cryptography's AES-GCM,
pycryptodome's RSA-OAEP with SHA3-512, which is what BouncyCastle's
``RSA/NONE/OAEPWithSHA3-512AndMGF1Padding`` computes).

What Aiven's plugin does, as reproduced here:

* keys ``<prefix><topic>-<topicId>/<partition>/<start offset, 20 digits>-<segmentId>.<suffix>``;
* the ``.log`` cut into ``chunk.size`` chunks, each zstd-compressed (level 3, content size
  in the frame) when compression is on, then AES-256-GCM encrypted (``IV(12) || ciphertext
  || tag(16)``, the segment's 32-byte AAD) when encryption is on; a fixed chunk index
  without compression, a variable one (binary size list, zstd, base64) with it;
* the index files encrypted one by one (never compressed) and concatenated into
  ``.indexes`` in the order offset, timestamp, producer snapshot, leader epoch, transaction;
* the manifest (Jackson's compact JSON, members in ``SegmentManifestV1``'s order) written
  last, the data key wrapped with RSA-OAEP (SHA3-512, MGF1 SHA3-512) as ``<keyId>:<base64>``.

The reader is as strict as Aiven's Jackson mapping: unknown members are refused, the
required ones must be there, and ``remoteLogSegmentMetadata`` (write-only) is ignored
whatever it holds.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import zstandard
from Crypto.Cipher import PKCS1_OAEP
from Crypto.Hash import SHA3_512
from Crypto.PublicKey import RSA
from Crypto.Signature import pss
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

LOG, INDEXES, MANIFEST = "log", "indexes", "rsm-manifest"
#: Aiven's order of the index files inside ``.indexes`` (and of ``segmentIndexes``)
INDEX_ORDER = ("offset", "timestamp", "producerSnapshot", "leaderEpoch", "transaction")
IV_BYTES, TAG_BYTES = 12, 16
#: Aiven's deserializer refuses a decompressed chunk-size list larger than this
MAX_SIZES_BYTES = 10 * 1024 * 1024
#: segment files of a real broker (tests/fixtures/kafka/README.md)
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kafka"


class AivenFormatError(Exception):
    """What Aiven's reader would throw (a Jackson mapping error, a GCM failure, a short read)."""


# -- keys -----------------------------------------------------------------------------------
def main_path(topic: str, topic_id: str, partition: int, start_offset: int, segment_id: str) -> str:
    return f"{topic}-{topic_id}/{partition}/{start_offset:020d}-{segment_id}"


def object_key(prefix: str, segment: SegmentInfo, suffix: str) -> str:
    s = segment
    return f"{prefix}{main_path(s.topic, s.topic_id, s.partition, s.start_offset, s.segment_id)}.{suffix}"


# -- the key ring: RSA key pairs by id ----------------------------------------------------------
def _oaep(key: RSA.RsaKey) -> Any:
    return PKCS1_OAEP.new(key, hashAlgo=SHA3_512, mgfunc=lambda x, y: pss.MGF1(x, y, SHA3_512))


class KeyRing:
    """Aiven's ``encryption.key.pairs``: ``{key id: (public PEM file, private PEM file)}``."""

    def __init__(self, pairs: Mapping[str, tuple[str | os.PathLike, str | os.PathLike]]):
        self.public = {k: RSA.import_key(Path(pub).read_bytes()) for k, (pub, _) in pairs.items()}
        self.private = {k: RSA.import_key(Path(priv).read_bytes()) for k, (_, priv) in pairs.items()}

    def wrap(self, key_id: str, data_key: bytes) -> str:
        return f"{key_id}:" + base64.b64encode(_oaep(self.public[key_id]).encrypt(data_key)).decode()

    def unwrap(self, data_key_field: str) -> bytes:
        key_id, sep, wrapped = data_key_field.rpartition(":")
        if not sep or key_id not in self.private:
            raise AivenFormatError(f"Unknown key {key_id!r}")
        return _oaep(self.private[key_id]).decrypt(base64.b64decode(wrapped, validate=True))


# -- the chunk-size list codec (ChunkSizesBinaryCodec) -------------------------------------------
def encode_chunk_sizes(values: list[int]) -> bytes:
    if not values:
        return struct.pack(">i", 0)
    if len(values) == 1:
        return struct.pack(">ii", 1, values[0])
    head = values[:-1]
    base = min(head)
    span = max(head) - base
    width = 1 if span < 1 << 8 else 2 if span < 1 << 16 else 3 if span < 1 << 24 else 4
    body = b"".join((v - base).to_bytes(width, "big") for v in head)
    return struct.pack(">iiB", len(values), base, width) + body + struct.pack(">i", values[-1])


def decode_chunk_sizes(data: bytes) -> list[int]:
    (count,) = struct.unpack_from(">i", data)
    if count < 0:
        raise AivenFormatError(f"negative chunk count {count}")
    if count == 0:
        return []
    if count == 1:
        return [struct.unpack_from(">i", data, 4)[0]]
    base, width = struct.unpack_from(">iB", data, 4)
    if not 1 <= width <= 4 or len(data) != 9 + (count - 1) * width + 4:
        raise AivenFormatError("corrupt chunk-size list")
    values = [
        base + int.from_bytes(data[9 + i * width : 9 + (i + 1) * width], "big") for i in range(count - 1)
    ]
    return [*values, struct.unpack_from(">i", data, len(data) - 4)[0]]


def encode_transformed_chunks(values: list[int]) -> str:
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(encode_chunk_sizes(values))
    return base64.b64encode(frame).decode()


def decode_transformed_chunks(text: str) -> list[int]:
    frame = base64.b64decode(text, validate=True)
    size = zstandard.get_frame_parameters(frame).content_size
    if size < 0 or size > MAX_SIZES_BYTES:
        raise AivenFormatError(f"decompressed chunk-size list of {size} bytes")
    return decode_chunk_sizes(zstandard.ZstdDecompressor().decompress(frame, max_output_size=size))


# -- Kafka batch headers (for segment metadata and the compression heuristic) -----------------------
def batch_headers(log: bytes) -> list[tuple[int, int, int, int]]:
    """(base offset, last offset, max timestamp, compression codec) of every batch."""
    out = []
    pos = 0
    while pos + 61 <= len(log):
        base_offset, length = struct.unpack_from(">qi", log, pos)
        attributes, last_delta, _first_ts, max_ts = struct.unpack_from(">hiqq", log, pos + 21)
        out.append((base_offset, base_offset + last_delta, max_ts, attributes & 0x7))
        pos += 12 + length
    return out


def kafka_uuid(name: str) -> str:
    """A Kafka ``Uuid`` string (22 characters of URL-safe base64) derived from ``name``."""
    return base64.urlsafe_b64encode(hashlib.sha256(name.encode()).digest()[:16]).decode().rstrip("=")


# -- segments ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class SegmentInfo:
    """What Aiven's ``copyLogSegmentData`` receives: the broker's segment metadata and files."""

    topic: str
    topic_id: str
    partition: int
    segment_id: str
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    log: bytes
    #: index file bytes by manifest name; ``transaction`` None when the segment has none
    indexes: dict[str, bytes | None]
    broker_id: int = 0
    event_timestamp_ms: int = 0
    leader_epochs: dict[int, int] = dataclasses.field(default_factory=lambda: {0: 0})

    @classmethod
    def from_files(
        cls,
        directory: Path,
        base_offset: int,
        next_offset: int,
        *,
        topic: str,
        topic_id: str,
        segment_id: str,
        partition: int = 0,
    ) -> SegmentInfo:
        """A segment from a broker's partition directory (tests/fixtures/kafka layout)."""
        log = (directory / f"{base_offset:020d}.log").read_bytes()
        headers = batch_headers(log)
        txn = directory / f"{base_offset:020d}.txnindex"
        checkpoint = (directory / "leader-epoch-checkpoint").read_text().split("\n")
        epochs = {int(line.split()[0]): int(line.split()[1]) for line in checkpoint[2:] if line.strip()}
        return cls(
            topic,
            topic_id,
            partition,
            segment_id,
            base_offset,
            next_offset - 1,
            max(h[2] for h in headers),
            log,
            {
                "offset": (directory / f"{base_offset:020d}.index").read_bytes(),
                "timestamp": (directory / f"{base_offset:020d}.timeindex").read_bytes(),
                "producerSnapshot": (directory / f"{next_offset:020d}.snapshot").read_bytes(),
                "leaderEpoch": (directory / "leader-epoch-checkpoint").read_bytes(),
                "transaction": txn.read_bytes() if txn.exists() else None,
            },
            leader_epochs=epochs,
        )

    def metadata_json(self) -> dict[str, Any]:
        """Aiven's write-only copy of ``RemoteLogSegmentMetadata``."""
        return {
            "remoteLogSegmentId": {
                "topicIdPartition": {
                    "topicId": self.topic_id,
                    "topicPartition": {"topic": self.topic, "partition": self.partition},
                },
                "id": self.segment_id,
            },
            "startOffset": self.start_offset,
            "endOffset": self.end_offset,
            "maxTimestampMs": self.max_timestamp_ms,
            "brokerId": self.broker_id,
            "eventTimestampMs": self.event_timestamp_ms,
            "segmentLeaderEpochs": {str(k): v for k, v in sorted(self.leader_epochs.items())},
        }


@dataclasses.dataclass(frozen=True)
class WriterSettings:
    """Aiven's ``rsm.config.*`` settings that shape what is written."""

    chunk_size: int = 4 * 1024 * 1024
    compression: bool = False
    #: ``compression.heuristic.enabled``: skip zstd when the first batch is producer-compressed
    compression_heuristic: bool = False
    #: ``encryption.key.pair.id`` when ``encryption.enabled``; None: no encryption
    key_id: str | None = None
    key_prefix: str = ""


def _seal(aes: AESGCM, aad: bytes, data: bytes) -> bytes:
    iv = os.urandom(IV_BYTES)
    return iv + aes.encrypt(iv, data, aad)


def manifest_json(
    chunk_index: dict[str, Any],
    index_ranges: dict[str, tuple[int, int] | None],
    compression: bool,
    encryption: dict[str, str] | None,
    segment: dict[str, Any] | None,
) -> bytes:
    """The manifest as Aiven's Jackson mapping serialises it (compact, this member order)."""
    doc: dict[str, Any] = {
        "version": "1",
        "chunkIndex": chunk_index,
        "segmentIndexes": {
            name: None if r is None else {"position": r[0], "size": r[1]} for name, r in index_ranges.items()
        },
        "compression": compression,
    }
    if encryption is not None:
        doc["encryption"] = encryption
    doc["remoteLogSegmentMetadata"] = segment
    return json.dumps(doc, separators=(",", ":")).encode()


def write_segment(
    put: Callable[[str, bytes], None], segment: SegmentInfo, settings: WriterSettings, keyring: KeyRing | None
) -> str:
    """Upload the three objects the way Aiven's ``copyLogSegmentData`` does (manifest last);
    returns the manifest's key."""
    compression = settings.compression
    headers = batch_headers(segment.log)
    if compression and settings.compression_heuristic and headers and headers[0][3] != 0:
        compression = False
    aes = aad = None
    encryption = None
    if settings.key_id is not None:
        assert keyring is not None
        data_key, aad = os.urandom(32), os.urandom(32)
        aes = AESGCM(data_key)
        encryption = {
            "dataKey": keyring.wrap(settings.key_id, data_key),
            "aad": base64.b64encode(aad).decode(),
        }
    size = settings.chunk_size
    stored = []
    for pos in range(0, len(segment.log), size):
        chunk = segment.log[pos : pos + size]
        if compression:
            chunk = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(chunk)
        if aes is not None:
            chunk = _seal(aes, aad, chunk)
        stored.append(chunk)
    sizes = [len(c) for c in stored]
    if compression and sizes:
        chunk_index: dict[str, Any] = {
            "type": "variable",
            "originalChunkSize": size,
            "originalFileSize": len(segment.log),
            "transformedChunks": encode_transformed_chunks(sizes),
        }
    else:
        chunk_index = {
            "type": "fixed",
            "originalChunkSize": size,
            "originalFileSize": len(segment.log),
            "transformedChunkSize": size + (IV_BYTES + TAG_BYTES if aes else 0),
            "finalTransformedChunkSize": sizes[-1] if sizes else 0,
        }
    blobs = bytearray()
    ranges: dict[str, tuple[int, int] | None] = {}
    for name in INDEX_ORDER:
        data = segment.indexes.get(name)
        if data is None:
            ranges[name] = None
            continue
        piece = _seal(aes, aad, data) if aes is not None else data
        ranges[name] = (len(blobs), len(piece))
        blobs += piece
    put(object_key(settings.key_prefix, segment, LOG), b"".join(stored))
    put(object_key(settings.key_prefix, segment, INDEXES), bytes(blobs))
    manifest = manifest_json(chunk_index, ranges, compression, encryption, segment.metadata_json())
    key = object_key(settings.key_prefix, segment, MANIFEST)
    put(key, manifest)
    return key


# -- reading, as Aiven's fetchLogSegment / fetchIndex ----------------------------------------------------
@dataclasses.dataclass
class ReadSegment:
    log: bytes
    indexes: dict[str, bytes | None]
    compression: bool
    key_id: str | None
    chunk_count: int


def _members(obj: Any, where: str, required: set[str], optional: set[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise AivenFormatError(f"{where}: not a JSON object")
    unknown = set(obj) - required - optional
    if unknown:
        raise AivenFormatError(f"{where}: Unrecognized field(s) {sorted(unknown)}")
    missing = required - set(obj)
    if missing:
        raise AivenFormatError(f"{where}: Missing required creator property {sorted(missing)}")
    return obj


def _int32(value: Any, where: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= 2**31 - 1:
        raise AivenFormatError(f"{where}: {value!r} is not a Java int >= {minimum}")
    return value


def parse_manifest(raw: bytes) -> dict[str, Any]:
    """The manifest as Aiven's strict mapping accepts it (``SegmentManifestV1``): version "1";
    chunkIndex, segmentIndexes and compression required; encryption optional;
    ``remoteLogSegmentMetadata`` accepted and ignored (a write-only property); anything else
    refused."""
    doc = _members(
        json.loads(raw),
        "manifest",
        {"version", "chunkIndex", "segmentIndexes", "compression"},
        {"encryption", "remoteLogSegmentMetadata"},
    )
    if doc["version"] != "1":
        raise AivenFormatError(f"unknown manifest version {doc['version']!r}")
    index = doc["chunkIndex"]
    kind = index.get("type") if isinstance(index, dict) else None
    chunk, size = "originalChunkSize", "originalFileSize"
    if kind == "fixed":
        _members(
            index, "chunkIndex", {"type", chunk, size, "transformedChunkSize", "finalTransformedChunkSize"}
        )
        count = -(-_int32(index[size], size) // _int32(index[chunk], chunk, 1))
        t, f = _int32(index["transformedChunkSize"], "t"), _int32(index["finalTransformedChunkSize"], "f")
        transformed = [t] * (count - 1) + [f] if count else []
    elif kind == "variable":
        _members(index, "chunkIndex", {"type", chunk, size, "transformedChunks"})
        count = -(-_int32(index[size], size) // _int32(index[chunk], chunk, 1))
        transformed = decode_transformed_chunks(index["transformedChunks"])
        if len(transformed) != count:
            raise AivenFormatError(f"{len(transformed)} chunk sizes for {count} chunks")
    else:
        raise AivenFormatError(f"unknown chunk index type {kind!r}")
    indexes = _members(doc["segmentIndexes"], "segmentIndexes", set(INDEX_ORDER[:4]), {"transaction"})
    ranges: dict[str, tuple[int, int] | None] = {}
    for name in INDEX_ORDER:
        r = indexes.get(name)
        if r is None:
            if name != "transaction":
                raise AivenFormatError(f"segmentIndexes.{name} is null")
            ranges[name] = None
            continue
        _members(r, f"segmentIndexes.{name}", {"position", "size"})
        ranges[name] = (_int32(r["position"], "position"), _int32(r["size"], "size"))
    if not isinstance(doc["compression"], bool):
        raise AivenFormatError("compression is not a boolean")
    encryption = doc.get("encryption")
    if encryption is not None:
        _members(encryption, "encryption", {"dataKey", "aad"})
    return {
        "original_chunk_size": index[chunk],
        "original_file_size": index[size],
        "transformed": transformed,
        "ranges": ranges,
        "compression": doc["compression"],
        "encryption": encryption,
    }


def read_segment(
    get: Callable[[str], bytes], prefix: str, segment: SegmentInfo, keyring: KeyRing | None
) -> ReadSegment:
    """The original ``.log`` bytes and the index files of a stored segment, chunk by chunk as
    Aiven's ``fetchLogSegment`` and ``fetchIndex`` produce them. ``segment`` needs only its
    identity (topic, ids, partition, start offset): the rest comes from the manifest."""
    m = parse_manifest(get(object_key(prefix, segment, MANIFEST)))
    aes = aad = None
    key_id = None
    if m["encryption"] is not None:
        if keyring is None:
            raise AivenFormatError("the segment is encrypted and no key ring is configured")
        aes = AESGCM(keyring.unwrap(m["encryption"]["dataKey"]))
        aad = base64.b64decode(m["encryption"]["aad"], validate=True)
        key_id = m["encryption"]["dataKey"].rpartition(":")[0]

    def detransform(piece: bytes, compressed: bool, original: int | None, where: str) -> bytes:
        if aes is not None:
            piece = aes.decrypt(piece[:IV_BYTES], piece[IV_BYTES:], aad)
        if compressed:
            piece = zstandard.ZstdDecompressor().decompress(piece)
        if original is not None and len(piece) != original:
            raise AivenFormatError(f"{where}: {len(piece)} bytes, expected {original}")
        return piece

    stored = get(object_key(prefix, segment, LOG))
    if len(stored) != sum(m["transformed"]):
        raise AivenFormatError(f".log has {len(stored)} bytes, the chunk index says {sum(m['transformed'])}")
    out = bytearray()
    pos = 0
    size, chunk = m["original_file_size"], m["original_chunk_size"]
    for i, n in enumerate(m["transformed"]):
        original = min(chunk, size - i * chunk)
        out += detransform(stored[pos : pos + n], m["compression"], original, f"chunk {i}")
        pos += n
    blobs = get(object_key(prefix, segment, INDEXES))
    indexes = {
        name: None if r is None else detransform(blobs[r[0] : r[0] + r[1]], False, None, name)
        for name, r in m["ranges"].items()
    }
    return ReadSegment(bytes(out), indexes, m["compression"], key_id, len(m["transformed"]))


def fixture_segments(topic: str, topic_id: str) -> list[SegmentInfo]:
    """Every rolled segment of tests/fixtures/kafka (producer and broker codecs, log-append
    time, transactions with aborts) as segments of ``topic``, partition = the case's number,
    with segment ids derived from the case and offset."""
    out = []
    for partition, case in enumerate(sorted(p for p in FIXTURES.iterdir() if (p / "expected.json").exists())):
        for s in json.loads((case / "expected.json").read_text())["segments"]:
            out.append(
                SegmentInfo.from_files(
                    case,
                    s["base_offset"],
                    s["next_segment_offset"],
                    topic=topic,
                    topic_id=topic_id,
                    segment_id=kafka_uuid(f"{topic}/{case.name}/{s['base_offset']}"),
                    partition=partition,
                )
            )
    return out
