"""Segment manifests: the JSON object ``<key>.rsm-manifest`` written last for each segment.

Top-level members are exactly Aiven's ``SegmentManifestV1`` (version, chunkIndex,
segmentIndexes, compression, encryption, remoteLogSegmentMetadata), so either plugin
reads what the other wrote. Aiven's strict JSON reader ignores the write-only
``remoteLogSegmentMetadata`` object as a whole; our extension lives inside it under
``rsmSidecar``: the writer, the copy attempt that wrote the segment, CRC32C of every
stored chunk and index when they are not encrypted, the GCM tag of every stored chunk
and index when they are, an authenticator (HMAC keyed from the segment's data key, see
``transform/authentication.py``) over everything a reader relies on, and the manifest's
own SHA-256 (computed over the file with the digest's 64 hex digits replaced by
zeros). See docs/format.md.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import re
import struct
from typing import TYPE_CHECKING, Any

from rsm_sidecar import __version__
from rsm_sidecar.errors import DataLoss
from rsm_sidecar.format.chunk_index import ChunkIndex

if TYPE_CHECKING:
    from rsm_sidecar.format.keys import SegmentMetadata

VERSION = "1"
#: order of the indexes inside the ``.indexes`` object (Aiven's order)
INDEX_NAMES = ("offset", "timestamp", "producerSnapshot", "leaderEpoch", "transaction")
_DIGEST_RE = re.compile(rb'"manifestSha256":"([0-9a-f]{64})"')
_ZERO_DIGEST = b"0" * 64
EXTENSION = "rsmSidecar"
#: version of ``authenticated_bytes``
AUTH_VERSION = 1
#: bytes of an AES-GCM tag
TAG_BYTES = 16
_ATTEMPT_RE = re.compile(r"[0-9a-f]{32}")
_INT32_MAX = 2**31 - 1
_AUTH_RE = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True)
class IndexRange:
    position: int
    size: int


@dataclasses.dataclass(frozen=True)
class EncryptionInfo:
    key_id: str
    wrapped_key: bytes  # the data key, RSA-OAEP wrapped under key_id
    aad: bytes

    def __repr__(self) -> str:  # never print key material
        return (
            f"EncryptionInfo(key_id={self.key_id!r}, wrapped_key=<{len(self.wrapped_key)} bytes>, "
            f"aad=<{len(self.aad)} bytes>)"
        )


@dataclasses.dataclass
class SegmentManifest:
    chunk_index: ChunkIndex
    indexes: dict[str, IndexRange | None]
    compression: bool
    encryption: EncryptionInfo | None
    #: Aiven's write-only copy of RemoteLogSegmentMetadata (topic, offsets, times, epochs)
    segment: dict[str, Any] | None = None
    #: CRC32C of each stored (transformed) chunk; None when encrypted or unknown
    chunk_crcs: list[int] | None = None
    #: CRC32C of each stored index by name; None when encrypted or unknown
    index_crcs: dict[str, int] | None = None
    writer: str | None = None
    #: whether the manifest carried our digest and it verified
    verified_digest: bool = False
    #: the copy attempt that wrote this manifest (32 hex digits); None in manifests of
    #: other writers and of rsm-sidecar before 0.2
    attempt: str | None = None
    #: GCM tag (16 bytes) of each stored chunk, in chunk order; encrypted segments only
    chunk_tags: list[bytes] | None = None
    #: GCM tag of each stored index by name; encrypted segments only
    index_tags: dict[str, bytes] | None = None
    #: HMAC-SHA256 (hex) over ``authenticated_bytes()``, keyed from the data key
    auth: str | None = None

    # -- convenience -------------------------------------------------------------
    @property
    def topic_name(self) -> str | None:
        """The topic name in :attr:`segment`, if it holds one."""
        try:
            topic = (self.segment or {})["remoteLogSegmentId"]["topicIdPartition"]["topicPartition"]["topic"]
        except (KeyError, TypeError):
            return None
        return topic if isinstance(topic, str) else None

    @property
    def original_size(self) -> int:
        return self.chunk_index.original_file_size

    @property
    def stored_log_size(self) -> int:
        return self.chunk_index.transformed_file_size

    @property
    def stored_indexes_size(self) -> int:
        return sum(r.size for r in self.indexes.values() if r is not None)

    @property
    def key_id(self) -> str | None:
        return self.encryption.key_id if self.encryption else None

    @property
    def has_extension(self) -> bool:
        """Written by rsm-sidecar (the ``rsmSidecar`` block is present and verified)."""
        return self.verified_digest

    def authenticated_bytes(self) -> bytes:
        """What the authenticator covers, canonically encoded: the segment's identity and
        metadata copy, the chunk index, the index ranges, compression, the AAD, the tag of
        every stored chunk and index by position, and the copy attempt. Everything a
        reader relies on to turn stored bytes into the segment's bytes, except the
        wrapped data key, which the authenticator's key is derived from."""
        return json.dumps(
            {
                "v": AUTH_VERSION,
                "segment": self.segment or {},
                "chunkIndex": [
                    self.chunk_index.original_chunk_size,
                    self.chunk_index.original_file_size,
                    list(self.chunk_index.transformed_sizes_iter()),
                ],
                "segmentIndexes": {
                    n: (None if r is None else [r.position, r.size]) for n, r in self.indexes.items()
                },
                "compression": self.compression,
                "aad": base64.b64encode(self.encryption.aad).decode() if self.encryption else None,
                "chunkTags": base64.b64encode(b"".join(self.chunk_tags or [])).decode(),
                "indexTags": {
                    n: base64.b64encode(t).decode() for n, t in sorted((self.index_tags or {}).items())
                },
                "attempt": self.attempt,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    # -- serialisation -------------------------------------------------------------
    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "version": VERSION,
            "chunkIndex": self.chunk_index.to_json(),
            "segmentIndexes": {
                name: (None if r is None else {"position": r.position, "size": r.size})
                for name, r in ((n, self.indexes.get(n)) for n in INDEX_NAMES)
            },
            "compression": self.compression,
        }
        if self.encryption is not None:
            doc["encryption"] = {
                "dataKey": f"{self.encryption.key_id}:"
                + base64.b64encode(self.encryption.wrapped_key).decode(),
                "aad": base64.b64encode(self.encryption.aad).decode(),
            }
        segment = dict(self.segment or {})
        ext: dict[str, Any] = {"writer": self.writer or f"rsm-sidecar {__version__}"}
        if self.attempt is not None:
            ext["attempt"] = self.attempt
        if self.chunk_crcs is not None:
            ext["chunkCrc32c"] = base64.b64encode(
                struct.pack(f">{len(self.chunk_crcs)}I", *self.chunk_crcs)
            ).decode()
        if self.index_crcs is not None:
            ext["indexCrc32c"] = {n: self.index_crcs[n] for n in INDEX_NAMES if n in self.index_crcs}
        if self.chunk_tags is not None:
            ext["chunkTags"] = base64.b64encode(b"".join(self.chunk_tags)).decode()
        if self.index_tags is not None:
            ext["indexTags"] = {
                n: base64.b64encode(self.index_tags[n]).decode() for n in INDEX_NAMES if n in self.index_tags
            }
        if self.auth is not None:
            ext["auth"] = self.auth
        ext["manifestSha256"] = _ZERO_DIGEST.decode()
        segment[EXTENSION] = ext
        doc["remoteLogSegmentMetadata"] = segment
        body = json.dumps(doc, separators=(",", ":")).encode()
        digest = hashlib.sha256(body).hexdigest().encode()
        return body.replace(
            b'"manifestSha256":"' + _ZERO_DIGEST + b'"', b'"manifestSha256":"' + digest + b'"', 1
        )

    @staticmethod
    def from_bytes(data: bytes, where: str = "manifest") -> SegmentManifest:
        """Parse and verify. ``where`` names the object in error messages."""
        found = _DIGEST_RE.findall(data)
        verified = False
        if len(found) > 1:
            raise DataLoss(f"{where}: corrupt manifest (several digests)")
        if found:
            zeroed = _DIGEST_RE.sub(b'"manifestSha256":"' + _ZERO_DIGEST + b'"', data, count=1)
            if hashlib.sha256(zeroed).hexdigest().encode() != found[0]:
                raise DataLoss(f"{where}: manifest checksum mismatch (corrupt or truncated manifest)")
            verified = True
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DataLoss(f"{where}: manifest is not valid JSON (corrupt or truncated): {e}") from None
        if not isinstance(doc, dict):
            raise DataLoss(f"{where}: manifest is not a JSON object")
        if doc.get("version") != VERSION:
            raise DataLoss(
                f"{where}: unsupported manifest version {doc.get('version')!r} (this build reads {VERSION!r})"
            )
        segment = doc.get("remoteLogSegmentMetadata")
        ext = segment.get(EXTENSION) if isinstance(segment, dict) else None
        if ext is not None and not verified:
            raise DataLoss(f"{where}: manifest digest missing or damaged (corrupt manifest)")
        try:
            chunk_index = ChunkIndex.from_json(doc.get("chunkIndex"))
            indexes = _parse_indexes(doc.get("segmentIndexes"))
            compression = doc.get("compression")
            if not isinstance(compression, bool):
                raise DataLoss("compression missing or not a boolean")
            encryption = _parse_encryption(doc.get("encryption"))
            chunk_crcs = index_crcs = chunk_tags = index_tags = None
            writer = attempt = auth = None
            if ext is not None and not isinstance(ext, dict):
                raise DataLoss("rsmSidecar is not an object")
            if isinstance(ext, dict):
                writer = ext.get("writer")
                attempt = _optional_str(ext, "attempt", _ATTEMPT_RE)
                auth = _optional_str(ext, "auth", _AUTH_RE)
                if "chunkTags" in ext:
                    raw = base64.b64decode(ext["chunkTags"], validate=True)
                    if len(raw) != TAG_BYTES * chunk_index.chunk_count:
                        raise DataLoss(
                            f"{len(raw) // TAG_BYTES} chunk tags for {chunk_index.chunk_count} chunks"
                        )
                    chunk_tags = [raw[i : i + TAG_BYTES] for i in range(0, len(raw), TAG_BYTES)]
                if "indexTags" in ext:
                    index_tags = {
                        str(k): base64.b64decode(v, validate=True) for k, v in ext["indexTags"].items()
                    }
                    if any(len(t) != TAG_BYTES for t in index_tags.values()):
                        raise DataLoss("an index tag is not 16 bytes")
                if "chunkCrc32c" in ext:
                    raw = base64.b64decode(ext["chunkCrc32c"], validate=True)
                    if len(raw) != 4 * chunk_index.chunk_count:
                        raise DataLoss(
                            f"{len(raw) // 4} chunk checksums for {chunk_index.chunk_count} chunks"
                        )
                    chunk_crcs = list(struct.unpack(f">{chunk_index.chunk_count}I", raw))
                if "indexCrc32c" in ext:
                    index_crcs = {str(k): int(v) for k, v in ext["indexCrc32c"].items()}
        except DataLoss as e:
            raise DataLoss(f"{where}: {e}") from None
        except (binascii.Error, TypeError, ValueError, AttributeError) as e:
            raise DataLoss(f"{where}: corrupt manifest: {e}") from None
        if isinstance(segment, dict):
            segment = {k: v for k, v in segment.items() if k != EXTENSION}
        return SegmentManifest(
            chunk_index,
            indexes,
            compression,
            encryption,
            segment if isinstance(segment, dict) else None,
            chunk_crcs,
            index_crcs,
            writer,
            verified,
            attempt,
            chunk_tags,
            index_tags,
            auth,
        )


def _optional_str(ext: dict[str, Any], name: str, pattern: re.Pattern[str]) -> str | None:
    value = ext.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise DataLoss(f"rsmSidecar.{name} is malformed")
    return value


def _parse_indexes(obj: Any) -> dict[str, IndexRange | None]:
    if not isinstance(obj, dict):
        raise DataLoss("segmentIndexes missing or not an object")
    out: dict[str, IndexRange | None] = {}
    for name in INDEX_NAMES:
        if name not in obj:
            raise DataLoss(f"segmentIndexes.{name} missing")
        r = obj[name]
        if r is None:
            if name != "transaction":
                raise DataLoss(f"segmentIndexes.{name} is null")
            out[name] = None
            continue
        if not isinstance(r, dict) or not all(
            isinstance(v := r.get(k), int) and not isinstance(v, bool) and 0 <= v <= _INT32_MAX
            for k in ("position", "size")
        ):
            raise DataLoss(
                f"segmentIndexes.{name} is not {{position, size}} of 0..2^31-1 (Java ints, as Aiven's)"
            )
        out[name] = IndexRange(r["position"], r["size"])
    return out


def _parse_encryption(obj: Any) -> EncryptionInfo | None:
    if obj is None:
        return None
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("dataKey"), str)
        or not isinstance(obj.get("aad"), str)
    ):
        raise DataLoss("encryption must have dataKey and aad strings")
    key_id, sep, wrapped = obj["dataKey"].rpartition(":")
    if not sep or not key_id:
        raise DataLoss("encryption.dataKey is not '<keyId>:<base64>'")
    return EncryptionInfo(
        key_id, base64.b64decode(wrapped, validate=True), base64.b64decode(obj["aad"], validate=True)
    )


@dataclasses.dataclass(frozen=True)
class SegmentIdentity:
    """Which segment a manifest says it holds, or a request or key names. ``None``
    members are unknown and not compared."""

    topic_id: str | None
    partition: int | None
    segment_id: str | None
    start_offset: int | None
    end_offset: int | None = None

    @classmethod
    def of_manifest(cls, manifest: SegmentManifest) -> SegmentIdentity | None:
        seg = manifest.segment
        if seg is None:
            return None
        try:
            rid = seg["remoteLogSegmentId"]
            tip = rid["topicIdPartition"]
            return cls(
                tip["topicId"],
                tip["topicPartition"]["partition"],
                rid["id"],
                seg["startOffset"],
                seg["endOffset"],
            )
        except (KeyError, TypeError):
            return None

    @classmethod
    def of_metadata(cls, md: SegmentMetadata) -> SegmentIdentity:
        """What a request's segment metadata (``format.keys.SegmentMetadata``) names."""
        return cls(md.topic_id, md.partition, md.segment_id, md.start_offset, md.end_offset)

    def differences(self, other: SegmentIdentity) -> list[str]:
        """Members known on both sides that differ, as ``name a != b``."""
        out = []
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a is not None and b is not None and a != b:
                out.append(f"{f.name} {a!r} != {b!r}")
        return out


def segment_debug_copy(md: SegmentMetadata) -> dict[str, Any]:
    """Aiven's ``remoteLogSegmentMetadata`` JSON from our SegmentMetadata (format.keys)."""
    return {
        "remoteLogSegmentId": {
            "topicIdPartition": {
                "topicId": md.topic_id,
                "topicPartition": {"topic": md.topic_name, "partition": md.partition},
            },
            "id": md.segment_id,
        },
        "startOffset": md.start_offset,
        "endOffset": md.end_offset,
        "maxTimestampMs": md.max_timestamp_ms,
        "brokerId": md.broker_id,
        "eventTimestampMs": md.event_timestamp_ms,
        "segmentLeaderEpochs": {str(k): v for k, v in sorted(md.leader_epochs.items())},
    }
