"""Authentication of an encrypted segment as a whole.

AES-GCM authenticates each stored chunk and index blob on its own, but all of them share
the segment's data key and AAD (Aiven's format), so whoever can write the bucket could
rearrange real pieces (swap two chunks, copy one over another, swap equal-length index
blobs) or put another segment's objects under this segment's keys, and every GCM tag
would still verify. The manifest therefore records the GCM tag of every chunk and index
blob by position and the segment's identity, and carries an HMAC-SHA256 over those and
everything else a reader relies on (``SegmentManifest.authenticated_bytes``). The HMAC
key is derived from the data key with HKDF-SHA256, so only a holder of the
key-encryption key can produce it; re-wrapping the data key (key rotation) leaves it
valid. A reader checks the HMAC when it opens the segment and each piece's tag before
decrypting it.
"""

from __future__ import annotations

import hmac

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.format.manifest import SegmentManifest

_INFO = b"rsm-sidecar segment authentication v1"


def _key(data_key: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(data_key)


def authenticator(manifest: SegmentManifest, data_key: bytes) -> str:
    """The hex HMAC to store in ``manifest.auth``."""
    return hmac.new(_key(data_key), manifest.authenticated_bytes(), "sha256").hexdigest()


def verify(manifest: SegmentManifest, data_key: bytes, where: str) -> None:
    """Raise ``DataLoss`` unless ``manifest.auth`` is the authenticator of its contents."""
    if manifest.auth is None:
        raise DataLoss(f"{where}: the manifest carries no authenticator")
    if not hmac.compare_digest(authenticator(manifest, data_key), manifest.auth):
        raise DataLoss(
            f"{where}: manifest authentication failed (HMAC mismatch): the manifest was edited, or "
            f"its chunk tags, indexes or segment identity do not belong to this data key"
        )
