"""The ``[storage.s3]`` keys: declared once, as the fields of ``S3Settings``.

Light on purpose: every ``Config()`` loads this module, so it imports no boto3 (the S3
backend, :mod:`rsm_sidecar.storage.s3`, is imported only when ``storage.backend = "s3"``).
"""

from __future__ import annotations

import dataclasses

from rsm_sidecar.config import setting
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage import bucket_settings as remote
from rsm_sidecar.storage.bucket_settings import BucketSettings

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

MIN_PART_SIZE = 5 * MiB  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 * GiB

STORAGE_CLASSES = (
    "STANDARD",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER_IR",
    "REDUCED_REDUNDANCY",
    "EXPRESS_ONEZONE",
)
CHECKSUMS = ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256", "none")


@dataclasses.dataclass(frozen=True)
class S3Settings(BucketSettings):
    """How the S3 backend reaches its bucket and writes objects (validated on creation)."""

    KEY_PREFIX = "storage.s3"

    region: str | None = setting(
        "str",
        None,
        "AWS region of the bucket. Unset: boto3's resolution (`AWS_REGION`/`AWS_DEFAULT_REGION`, the "
        "profile's `region`), else `us-east-1`.",
    )
    endpoint_url: str | None = setting(
        "str",
        None,
        "Endpoint of an S3-compatible service, e.g. `http://127.0.0.1:8333` (SeaweedFS, MinIO, Ceph). "
        "Unset: AWS (or `AWS_ENDPOINT_URL_S3`/`AWS_ENDPOINT_URL`).",
    )
    addressing_style: str = setting(
        "str",
        "auto",
        "`path` puts the bucket in the URL path (most S3-compatible servers need it); `virtual` in the host "
        "name; `auto` lets botocore choose (virtual on AWS).",
        choices=("auto", "path", "virtual"),
    )
    access_key_id: str | None = setting(
        "str",
        None,
        "Static access key id; set together with `storage.s3.secret_access_key`. Unset: boto3's default "
        "credential chain (environment, web identity/IRSA, shared files, container and instance roles).",
        secret=True,
    )
    secret_access_key: str | None = setting("str", None, "Static secret access key.", secret=True)
    session_token: str | None = setting(
        "str", None, "Session token that goes with temporary static credentials.", secret=True
    )
    profile: str | None = setting(
        "str",
        None,
        "Named profile of the shared AWS config/credentials files (may assume a role, use SSO or "
        "`credential_process`). Exclusive with static keys.",
    )
    storage_class: str = setting(
        "str",
        "STANDARD",
        "Storage class of new objects (archive classes that need a restore before a GET are not allowed).",
        choices=STORAGE_CLASSES,
    )
    sse: str = setting(
        "str",
        "none",
        "Server-side encryption requested on every write: `AES256` (SSE-S3), `aws:kms` (SSE-KMS), "
        "`aws:kms:dsse` (dual-layer SSE-KMS), or `none` (the bucket's default encryption applies).",
        choices=("none", "AES256", "aws:kms", "aws:kms:dsse"),
    )
    sse_kms_key_id: str | None = setting(
        "str",
        None,
        "KMS key id, alias or ARN for `aws:kms`/`aws:kms:dsse`; unset uses the account's AWS-managed "
        "`aws/s3` key.",
    )
    sse_bucket_key: bool = setting(
        "bool", False, "Use an S3 Bucket Key with SSE-KMS (far fewer KMS requests, so lower KMS cost)."
    )
    checksum_algorithm: str = setting(
        "str",
        "CRC32",
        "Checksum the SDK computes for every PutObject/UploadPart and the service verifies (rejecting "
        "corrupted uploads). `CRC32C` and `CRC64NVME` need the `awscrt` package (`botocore[crt]`); `none` "
        "sends checksums only where an operation requires one (for old S3-compatible servers).",
        choices=CHECKSUMS,
    )
    validate_response_checksums: bool = setting(
        "bool",
        True,
        "Verify the checksum the service returns with whole-object GETs (ranged GETs carry none).",
    )
    part_size: int = setting(
        "size",
        8 * MiB,
        "Multipart part size; objects up to this size are one PutObject. Memory per upload is at most "
        "part_size x (max_parts_in_flight + 1). Largest object: 10,000 parts.",
        min=MIN_PART_SIZE,
        max=MAX_PART_SIZE,
    )
    max_parts_in_flight: int = setting(
        "int",
        2,
        "Parts of one upload queued or uploading at once; `write()` blocks while the window is full.",
        min=1,
        max=64,
    )
    upload_threads: int = setting("int", 8, "Threads uploading parts, shared by all uploads.", min=1, max=256)
    connect_timeout: float = remote.connect_timeout()
    read_timeout: float = remote.read_timeout()
    retry_mode: str = setting(
        "str",
        "standard",
        "botocore retry mode: `standard` (exponential backoff with jitter, retry quota), `adaptive` "
        "(standard plus client-side rate limiting on throttling), `legacy`.",
        choices=("standard", "adaptive", "legacy"),
    )
    max_attempts: int = remote.max_attempts("throttling, 5xx, connection errors and timeouts are retried")
    max_pool_connections: int = remote.max_pool_connections()
    verify_tls: bool = setting("bool", True, "Verify the service's TLS certificate.")
    ca_bundle: str | None = setting("path", None, "PEM CA bundle to verify the service's certificate with.")
    startup_write_check: bool = setting(
        "bool",
        True,
        "At start-up, after HeadBucket, write and delete a 0-byte probe object under `storage.key_prefix` "
        "with the configured storage class and encryption, so missing write permissions or a wrong KMS key "
        "stop the sidecar at once.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ConfigError(
                "storage.s3.access_key_id and storage.s3.secret_access_key must be set together"
            )
        if self.session_token and not self.access_key_id:
            raise ConfigError("storage.s3.session_token needs storage.s3.access_key_id and secret_access_key")
        if self.profile and self.access_key_id:
            raise ConfigError(
                "storage.s3.profile and storage.s3.access_key_id are exclusive: choose one credential source"
            )
        if self.sse_kms_key_id and not self.sse.startswith("aws:kms"):
            raise ConfigError(
                f"storage.s3.sse_kms_key_id is set but storage.s3.sse is {self.sse!r}; "
                'set storage.s3.sse = "aws:kms" (or "aws:kms:dsse")'
            )
        if self.sse_bucket_key and not self.sse.startswith("aws:kms"):
            raise ConfigError(
                'storage.s3.sse_bucket_key applies to SSE-KMS only; set storage.s3.sse = "aws:kms"'
            )
        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise ConfigError(
                f"storage.s3.part_size: {self.part_size} is outside [{MIN_PART_SIZE}, {MAX_PART_SIZE}]"
            )
        if self.checksum_algorithm not in CHECKSUMS:
            raise ConfigError(
                f"storage.s3.checksum_algorithm: {self.checksum_algorithm!r} is not one of "
                + ", ".join(CHECKSUMS)
            )


CONFIG_KEYS = S3Settings.keys()
