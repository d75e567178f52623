"""Amazon S3 (and S3-compatible) object store on boto3.

Uploads go through :class:`~rsm_sidecar.storage.base.UploadHandle`: bytes collect in one part buffer; an object that
fits in one part (``storage.s3.part_size``) is sent with a single PutObject at commit,
anything larger as a multipart upload whose parts are sent by a store-wide thread pool
(``storage.s3.upload_threads``). At most ``storage.s3.max_parts_in_flight`` parts of one
writer are queued or uploading; ``write()`` blocks while that window is full, so one
writer holds at most ``part_size x (max_parts_in_flight + 1)`` bytes of part buffers.

A multipart upload is aborted on any failure, on ``abort()``, on an exception inside the
``with`` block and when an uncommitted writer is garbage-collected. An abort that cannot
reach the service is remembered and retried before the next upload starts, by ``check()``
and by ``close()``, so no incomplete upload is left behind once the service is back (a
bucket lifecycle rule ``AbortIncompleteMultipartUpload`` is the backstop; see
docs/storage.md).

Every HTTP request is counted in ``requests`` as it is sent, botocore's retries included
(PUT, CREATE_MULTIPART, UPLOAD_PART, COMPLETE_MULTIPART, ABORT_MULTIPART, GET, HEAD, LIST,
DELETE, DELETE_OBJECTS, and HEAD_BUCKET for ``check()``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import io
import logging
import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config as BotoConfig

from rsm_sidecar.config import Config, Key
from rsm_sidecar.errors import ConfigError, InvalidArgument, RsmError
from rsm_sidecar.storage.base import (
    InvalidRange,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectWriter,
    StorageError,
    StorageTimeout,
    StorageUnavailable,
    UploadHandle,
)

log = logging.getLogger(__name__)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

MIN_PART_SIZE = 5 * MiB  # S3's minimum for every part but the last
MAX_PART_SIZE = 5 * GiB
MAX_PARTS = 10_000
DELETE_BATCH = 1000  # DeleteObjects limit

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
CRT_CHECKSUMS = ("CRC32C", "CRC64NVME")  # botocore computes these only with awscrt installed

CONFIG_KEYS = [
    Key(
        "storage.s3.bucket",
        "str",
        None,
        "Bucket that holds the objects.",
        required_when=("storage.backend", "s3"),
    ),
    Key(
        "storage.s3.region",
        "str",
        None,
        "AWS region of the bucket. Unset: boto3's resolution (`AWS_REGION`/`AWS_DEFAULT_REGION`, the profile's "
        "`region`), else `us-east-1`.",
    ),
    Key(
        "storage.s3.endpoint_url",
        "str",
        None,
        "Endpoint of an S3-compatible service, e.g. `http://127.0.0.1:8333` (SeaweedFS, MinIO, Ceph). Unset: AWS "
        "(or `AWS_ENDPOINT_URL_S3`/`AWS_ENDPOINT_URL`).",
    ),
    Key(
        "storage.s3.addressing_style",
        "str",
        "auto",
        "`path` puts the bucket in the URL path (most S3-compatible servers need it); `virtual` in the host name; "
        "`auto` lets botocore choose (virtual on AWS).",
        choices=("auto", "path", "virtual"),
    ),
    Key(
        "storage.s3.access_key_id",
        "str",
        None,
        "Static access key id; set together with `storage.s3.secret_access_key`. Unset: boto3's default "
        "credential chain (environment, web identity/IRSA, shared files, container and instance roles).",
        secret=True,
    ),
    Key("storage.s3.secret_access_key", "str", None, "Static secret access key.", secret=True),
    Key(
        "storage.s3.session_token",
        "str",
        None,
        "Session token that goes with temporary static credentials.",
        secret=True,
    ),
    Key(
        "storage.s3.profile",
        "str",
        None,
        "Named profile of the shared AWS config/credentials files (may assume a role, use SSO or "
        "`credential_process`). Exclusive with static keys.",
    ),
    Key(
        "storage.s3.storage_class",
        "str",
        "STANDARD",
        "Storage class of new objects (archive classes that need a restore before a GET are not allowed).",
        choices=STORAGE_CLASSES,
    ),
    Key(
        "storage.s3.sse",
        "str",
        "none",
        "Server-side encryption requested on every write: `AES256` (SSE-S3), `aws:kms` (SSE-KMS), `aws:kms:dsse` "
        "(dual-layer SSE-KMS), or `none` (the bucket's default encryption applies).",
        choices=("none", "AES256", "aws:kms", "aws:kms:dsse"),
    ),
    Key(
        "storage.s3.sse_kms_key_id",
        "str",
        None,
        "KMS key id, alias or ARN for `aws:kms`/`aws:kms:dsse`; unset uses the account's AWS-managed `aws/s3` key.",
    ),
    Key(
        "storage.s3.sse_bucket_key",
        "bool",
        False,
        "Use an S3 Bucket Key with SSE-KMS (far fewer KMS requests, so lower KMS cost).",
    ),
    Key(
        "storage.s3.checksum_algorithm",
        "str",
        "CRC32",
        "Checksum the SDK computes for every PutObject/UploadPart and the service verifies (rejecting corrupted "
        "uploads). `CRC32C` and `CRC64NVME` need the `awscrt` package (`botocore[crt]`); `none` sends checksums "
        "only where an operation requires one (for old S3-compatible servers).",
        choices=CHECKSUMS,
    ),
    Key(
        "storage.s3.validate_response_checksums",
        "bool",
        True,
        "Verify the checksum the service returns with whole-object GETs (ranged GETs carry none).",
    ),
    Key(
        "storage.s3.part_size",
        "size",
        8 * MiB,
        "Multipart part size; objects up to this size are one PutObject. Memory per upload is at most "
        "part_size x (max_parts_in_flight + 1). Largest object: 10,000 parts.",
        min=MIN_PART_SIZE,
        max=MAX_PART_SIZE,
    ),
    Key(
        "storage.s3.max_parts_in_flight",
        "int",
        2,
        "Parts of one upload queued or uploading at once; `write()` blocks while the window is full.",
        min=1,
        max=64,
    ),
    Key(
        "storage.s3.upload_threads",
        "int",
        8,
        "Threads uploading parts, shared by all uploads.",
        min=1,
        max=256,
    ),
    Key("storage.s3.connect_timeout", "seconds", 5.0, "TCP/TLS connect timeout of one attempt.", min=0.1),
    Key(
        "storage.s3.read_timeout",
        "seconds",
        30.0,
        "Longest wait for the service to answer or send more bytes, per attempt.",
        min=0.1,
    ),
    Key(
        "storage.s3.retry_mode",
        "str",
        "standard",
        "botocore retry mode: `standard` (exponential backoff with jitter, retry quota), `adaptive` (standard plus "
        "client-side rate limiting on throttling), `legacy`.",
        choices=("standard", "adaptive", "legacy"),
    ),
    Key(
        "storage.s3.max_attempts",
        "int",
        3,
        "Attempts per request including the first (throttling, 5xx, connection errors and timeouts are retried).",
        min=1,
        max=20,
    ),
    Key(
        "storage.s3.max_pool_connections",
        "int",
        64,
        "HTTP connections kept to the service (upload threads plus concurrent reads should fit).",
        min=1,
        max=1024,
    ),
    Key("storage.s3.verify_tls", "bool", True, "Verify the service's TLS certificate."),
    Key("storage.s3.ca_bundle", "path", None, "PEM CA bundle to verify the service's certificate with."),
    Key(
        "storage.s3.startup_write_check",
        "bool",
        True,
        "At start-up, after HeadBucket, write and delete a 0-byte probe object under `storage.key_prefix` with the "
        "configured storage class and encryption, so missing write permissions or a wrong KMS key stop the "
        "sidecar at once.",
    ),
]

# Error codes, from the S3 API reference.
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_ACCESS = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
    "AccountProblem",
    "InvalidSecurity",
    "403",
    "KMS.AccessDeniedException",
    "KMS.DisabledException",
    "KMS.NotFoundException",
    "InvalidObjectState",
}
_TRANSIENT = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "OperationAborted",
    "PriorRequestNotComplete",
    "BandwidthLimitExceeded",
    "EC2ThrottledException",
    "503",
    "500",
    "502",
    "504",
}

# S3 API operation -> the name counted in ``requests``
_OPERATIONS = {
    "PutObject": "PUT",
    "CreateMultipartUpload": "CREATE_MULTIPART",
    "UploadPart": "UPLOAD_PART",
    "CompleteMultipartUpload": "COMPLETE_MULTIPART",
    "AbortMultipartUpload": "ABORT_MULTIPART",
    "GetObject": "GET",
    "HeadObject": "HEAD",
    "ListObjectsV2": "LIST",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE_OBJECTS",
    "HeadBucket": "HEAD_BUCKET",
    "ListMultipartUploads": "LIST_MULTIPART",
}

_CREDENTIAL_METHODS = {
    "explicit": "static keys from storage.s3.access_key_id/secret_access_key",
    "env": "environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
    "shared-credentials-file": "shared credentials file",
    "config-file": "AWS config file",
    "assume-role": "assume-role from a profile",
    "assume-role-with-web-identity": "web identity token (IRSA: AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE)",
    "sso": "AWS IAM Identity Center (SSO) profile",
    "custom-process": "credential_process of a profile",
    "container-role": "container credentials endpoint (ECS task role / EKS Pod Identity)",
    "iam-role": "EC2 instance metadata (instance profile)",
    "boto-config": "boto2 config file",
}


def _mask(key_id: str | None) -> str:
    if not key_id:
        return ""
    return f", key id …{key_id[-4:]}" if len(key_id) > 8 else ""


class S3ObjectStore(ObjectStore):
    name = "s3"

    def __init__(
        self,
        bucket: str,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        addressing_style: str = "auto",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        profile: str | None = None,
        storage_class: str = "STANDARD",
        sse: str = "none",
        sse_kms_key_id: str | None = None,
        sse_bucket_key: bool = False,
        checksum_algorithm: str = "CRC32",
        validate_response_checksums: bool = True,
        part_size: int = 8 * MiB,
        max_parts_in_flight: int = 2,
        upload_threads: int = 8,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        retry_mode: str = "standard",
        max_attempts: int = 3,
        max_pool_connections: int = 64,
        verify_tls: bool = True,
        ca_bundle: str | None = None,
        startup_write_check: bool = True,
        probe_prefix: str = "",
    ):
        super().__init__()
        if not bucket:
            raise ConfigError("storage.s3.bucket: missing; the bucket that holds the objects")
        if (access_key_id is None) != (secret_access_key is None):
            raise ConfigError(
                "storage.s3.access_key_id and storage.s3.secret_access_key must be set together"
            )
        if session_token and not access_key_id:
            raise ConfigError("storage.s3.session_token needs storage.s3.access_key_id and secret_access_key")
        if profile and access_key_id:
            raise ConfigError(
                "storage.s3.profile and storage.s3.access_key_id are exclusive: choose one credential source"
            )
        if sse_kms_key_id and not sse.startswith("aws:kms"):
            raise ConfigError(
                f"storage.s3.sse_kms_key_id is set but storage.s3.sse is {sse!r}; "
                'set storage.s3.sse = "aws:kms" (or "aws:kms:dsse")'
            )
        if sse_bucket_key and not sse.startswith("aws:kms"):
            raise ConfigError(
                'storage.s3.sse_bucket_key applies to SSE-KMS only; set storage.s3.sse = "aws:kms"'
            )
        if not MIN_PART_SIZE <= part_size <= MAX_PART_SIZE:
            raise ConfigError(
                f"storage.s3.part_size: {part_size} is outside [{MIN_PART_SIZE}, {MAX_PART_SIZE}]"
            )
        if checksum_algorithm not in CHECKSUMS:
            raise ConfigError(
                f"storage.s3.checksum_algorithm: {checksum_algorithm!r} is not one of {', '.join(CHECKSUMS)}"
            )
        if checksum_algorithm in CRT_CHECKSUMS:
            from botocore.compat import HAS_CRT

            if not HAS_CRT:
                raise ConfigError(
                    f"storage.s3.checksum_algorithm = {checksum_algorithm!r} needs the awscrt package "
                    "(pip install 'botocore[crt]'); or use CRC32 or SHA256"
                )
        self.bucket = bucket
        self.region = region
        self.endpoint_url = endpoint_url
        self.storage_class = storage_class
        self.sse = sse
        self.sse_kms_key_id = sse_kms_key_id
        self.sse_bucket_key = sse_bucket_key
        self.checksum_algorithm = None if checksum_algorithm == "none" else checksum_algorithm
        self.part_size = part_size
        self.max_parts_in_flight = max_parts_in_flight
        self.upload_threads = upload_threads
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_attempts = max_attempts
        self.startup_write_check = startup_write_check
        self.probe_prefix = probe_prefix
        self._profile = profile
        self._static = access_key_id is not None

        try:
            self._session = boto3.Session(
                aws_access_key_id=access_key_id,
                aws_secret_access_key=secret_access_key,
                aws_session_token=session_token,
                profile_name=profile,
                region_name=region,
            )
        except botocore.exceptions.ProfileNotFound as e:
            raise ConfigError(f"storage.s3.profile: {e}") from None
        boto_config = BotoConfig(
            s3={"addressing_style": addressing_style},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"mode": retry_mode, "total_max_attempts": max_attempts},
            max_pool_connections=max_pool_connections,
            request_checksum_calculation="when_supported" if self.checksum_algorithm else "when_required",
            response_checksum_validation="when_supported" if validate_response_checksums else "when_required",
            tcp_keepalive=True,
            user_agent_appid="rsm-sidecar",
        )
        verify: bool | str = ca_bundle if ca_bundle else verify_tls
        try:
            self._client = self._session.client(
                "s3", endpoint_url=endpoint_url, config=boto_config, verify=verify
            )
        except (ValueError, botocore.exceptions.BotoCoreError) as e:
            raise ConfigError(
                f"storage.s3: cannot create an S3 client for bucket {bucket!r} "
                f"(endpoint {endpoint_url or 'AWS'}): {e}"
            ) from None
        # Count every HTTP attempt (botocore's retries included) as it goes out.
        self._client.meta.events.register("before-send.s3", self._on_send)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._pending_aborts: list[tuple[str, str]] = []  # (key, upload id) whose abort failed
        self._pending_lock = threading.Lock()
        # bytes held by queued/uploading parts, for metrics and the memory-bound tests
        self._buffered = 0
        self.peak_buffered_bytes = 0
        self._buffered_lock = threading.Lock()

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: Config) -> S3ObjectStore:
        g = cfg.get
        return cls(
            g("storage.s3.bucket"),
            region=g("storage.s3.region"),
            endpoint_url=g("storage.s3.endpoint_url"),
            addressing_style=g("storage.s3.addressing_style"),
            access_key_id=g("storage.s3.access_key_id"),
            secret_access_key=g("storage.s3.secret_access_key"),
            session_token=g("storage.s3.session_token"),
            profile=g("storage.s3.profile"),
            storage_class=g("storage.s3.storage_class"),
            sse=g("storage.s3.sse"),
            sse_kms_key_id=g("storage.s3.sse_kms_key_id"),
            sse_bucket_key=g("storage.s3.sse_bucket_key"),
            checksum_algorithm=g("storage.s3.checksum_algorithm"),
            validate_response_checksums=g("storage.s3.validate_response_checksums"),
            part_size=g("storage.s3.part_size"),
            max_parts_in_flight=g("storage.s3.max_parts_in_flight"),
            upload_threads=g("storage.s3.upload_threads"),
            connect_timeout=g("storage.s3.connect_timeout"),
            read_timeout=g("storage.s3.read_timeout"),
            retry_mode=g("storage.s3.retry_mode"),
            max_attempts=g("storage.s3.max_attempts"),
            max_pool_connections=g("storage.s3.max_pool_connections"),
            verify_tls=g("storage.s3.verify_tls"),
            ca_bundle=g("storage.s3.ca_bundle"),
            startup_write_check=g("storage.s3.startup_write_check"),
            probe_prefix=g("storage.key_prefix"),
        )

    # -- descriptions ---------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return self._client.meta.endpoint_url

    def describe(self) -> str:
        return f"s3 bucket {self.bucket} at {self.endpoint} (region {self._client.meta.region_name})"

    def credential_source(self) -> str:
        """Which credential source boto3 used, for error messages (never the secret)."""
        try:
            creds = self._session.get_credentials()
        except botocore.exceptions.BotoCoreError as e:
            return f"credential resolution failed: {e}"
        if creds is None:
            return (
                "none found by boto3's default chain (environment, web identity, shared credentials/config "
                "files, container and instance metadata)"
            )
        method = getattr(creds, "method", None) or "unknown"
        what = _CREDENTIAL_METHODS.get(method, method)
        if method in ("shared-credentials-file", "config-file", "assume-role", "sso", "custom-process"):
            profile = self._session.profile_name or "default"
            files = (
                os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")
                if method == "shared-credentials-file"
                else os.environ.get("AWS_CONFIG_FILE", "~/.aws/config")
            )
            what += f" {files}, profile {profile!r}"
        elif method == "assume-role-with-web-identity":
            role = os.environ.get("AWS_ROLE_ARN")
            if role:
                what += f", role {role}"
        try:
            key_id = creds.access_key
        except Exception:  # refreshable credentials may fail to refresh here
            key_id = None
        return f"{what}{_mask(key_id)}"

    def _on_send(self, event_name: str = "", **kwargs) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        self._count(_OPERATIONS.get(operation, operation))

    # -- errors ---------------------------------------------------------------------------
    def _translate(
        self, e: Exception, op: str, key: str | None = None, *, start: int | None = None
    ) -> RsmError:
        what = f"{op} s3://{self.bucket}/{key}" if key is not None else f"{op} on bucket {self.bucket}"
        where = f"at {self.endpoint}"
        if isinstance(e, RsmError):
            return e
        if isinstance(e, botocore.exceptions.ClientError):
            err = e.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            msg = err.get("Message") or ""
            detail = f"{code}{': ' + msg if msg else ''}"
            if code == "NoSuchUpload":
                return StorageUnavailable(
                    f"{what}: the multipart upload is gone {where} ({detail}); upload the object again"
                )
            if code == "NoSuchBucket":
                return StorageError(
                    f"{what}: bucket {self.bucket!r} does not exist {where} ({detail}); "
                    f"credentials: {self.credential_source()}"
                )
            if key is not None and (code in _NOT_FOUND or status == 404):
                return ObjectNotFound(key)
            if code == "InvalidRange" or status == 416:
                return InvalidRange(key or "", start if start is not None else -1)
            if code in _ACCESS or status == 403:
                return StorageError(
                    f"{what}: access denied {where} ({detail}); credentials: {self.credential_source()}"
                )
            if code in _TRANSIENT or (status is not None and (status >= 500 or status == 429)):
                return StorageUnavailable(
                    f"{what}: {where} the service is throttling or failing ({detail}, "
                    f"HTTP {status}, after {self.max_attempts} attempts)"
                )
            return StorageError(f"{what}: {where} rejected the request ({detail}, HTTP {status})")
        if isinstance(e, (botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectTimeoutError)):
            kind = "connect" if isinstance(e, botocore.exceptions.ConnectTimeoutError) else "read"
            limit = self.connect_timeout if kind == "connect" else self.read_timeout
            return StorageTimeout(
                f"{what}: no answer {where} within the {kind} timeout of {limit:g}s "
                f"(storage.s3.{kind}_timeout), {self.max_attempts} attempt(s): {e}"
            )
        if isinstance(e, botocore.exceptions.SSLError):
            return StorageError(f"{what}: TLS failure {where} ({e}); check storage.s3.ca_bundle/verify_tls")
        if isinstance(
            e,
            (
                botocore.exceptions.EndpointConnectionError,
                botocore.exceptions.ConnectionError,
                botocore.exceptions.ConnectionClosedError,
                botocore.exceptions.ResponseStreamingError,
                botocore.exceptions.HTTPClientError,
            ),
        ):
            return StorageUnavailable(
                f"{what}: cannot reach {where} after {self.max_attempts} attempt(s): {e}"
            )
        if isinstance(
            e,
            (
                botocore.exceptions.NoCredentialsError,
                botocore.exceptions.PartialCredentialsError,
                botocore.exceptions.CredentialRetrievalError,
            ),
        ):
            return StorageError(
                f"{what}: no usable AWS credentials ({e}); credentials: {self.credential_source()}"
            )
        if isinstance(e, botocore.exceptions.MissingDependencyException):
            return ConfigError(f"{what}: {e}")
        if isinstance(e, botocore.exceptions.BotoCoreError):
            return StorageError(f"{what}: {e}")
        if isinstance(e, OSError):
            return StorageUnavailable(f"{what}: {where}: {e}")
        return StorageError(f"{what}: unexpected {type(e).__name__}: {e}")

    def _call(self, op: str, fn, key: str | None = None, **kwargs):
        """One API call (botocore retries inside; each attempt is counted by ``_on_send``),
        errors translated."""
        try:
            return fn(**kwargs)
        except Exception as e:
            raise self._translate(e, op, key, start=None) from e

    # -- write parameters -----------------------------------------------------------------
    def _write_params(self) -> dict[str, Any]:
        p: dict[str, Any] = {}
        if self.storage_class and self.storage_class != "STANDARD":
            p["StorageClass"] = self.storage_class
        if self.sse != "none":
            p["ServerSideEncryption"] = self.sse
            if self.sse_kms_key_id:
                p["SSEKMSKeyId"] = self.sse_kms_key_id
            if self.sse_bucket_key:
                p["BucketKeyEnabled"] = True
        if self.checksum_algorithm:
            p["ChecksumAlgorithm"] = self.checksum_algorithm
        return p

    # -- thread pool and buffer accounting ------------------------------------------------
    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.upload_threads, thread_name_prefix="s3-part"
                )
            return self._pool

    def _buffer_delta(self, n: int) -> None:
        with self._buffered_lock:
            self._buffered += n
            if self._buffered > self.peak_buffered_bytes:
                self.peak_buffered_bytes = self._buffered

    @property
    def buffered_bytes(self) -> int:
        """Bytes held by parts queued or uploading right now (all writers)."""
        with self._buffered_lock:
            return self._buffered

    # -- incomplete multipart uploads -----------------------------------------------------
    def _abort_upload(self, key: str, upload_id: str) -> bool:
        """Abort one multipart upload; False (and remembered for later) if the service is unreachable."""
        try:
            self._call(
                "ABORT_MULTIPART",
                self._client.abort_multipart_upload,
                key,
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
            )
            return True
        except ObjectNotFound:
            return True
        except StorageError as e:
            log.warning("aborting multipart upload %s of %s failed permanently: %s", upload_id, key, e)
            return True
        except RsmError as e:
            if "NoSuchUpload" in str(e):
                return True
            with self._pending_lock:
                if (key, upload_id) not in self._pending_aborts:
                    self._pending_aborts.append((key, upload_id))
            log.warning("could not abort multipart upload %s of %s (%s); will retry", upload_id, key, e)
            return False

    def retry_pending_aborts(self) -> int:
        """Retry aborts that failed earlier; returns how many are still pending."""
        with self._pending_lock:
            pending, self._pending_aborts = self._pending_aborts, []
        for key, upload_id in pending:
            self._abort_upload(key, upload_id)
        with self._pending_lock:
            return len(self._pending_aborts)

    @property
    def pending_aborts(self) -> list[tuple[str, str]]:
        with self._pending_lock:
            return list(self._pending_aborts)

    # -- the contract ----------------------------------------------------------------------
    def open_writer(self, key: str) -> ObjectWriter:
        if not key:
            raise InvalidArgument("empty object key")
        if self._pending_aborts:
            self.retry_pending_aborts()
        return UploadHandle(_S3Upload(self, key))

    def get(self, key: str) -> bytes:
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=key)
            return resp["Body"].read()
        except Exception as e:
            raise self._translate(e, "GET", key) from e

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise InvalidArgument(f"invalid range [{start}, {end}] for {key}")
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end}")
            body = resp["Body"].read()
        except Exception as e:
            raise self._translate(e, "GET", key, start=start) from e
        if resp["ResponseMetadata"]["HTTPStatusCode"] == 200:
            # The service ignored the Range header and sent the whole object.
            if start >= len(body):
                raise InvalidRange(key, start, len(body))
            return body[start : end + 1]
        if len(body) > end - start + 1:
            raise StorageError(
                f"GET s3://{self.bucket}/{key}: asked for {end - start + 1} bytes "
                f"(bytes={start}-{end}), got {len(body)}"
            )
        return body

    def size(self, key: str) -> int:
        resp = self._call("HEAD", self._client.head_object, key, Bucket=self.bucket, Key=key)
        return int(resp["ContentLength"])

    def delete(self, key: str) -> None:
        self._call("DELETE", self._client.delete_object, key, Bucket=self.bucket, Key=key)

    def delete_many(self, keys: Iterable[str]) -> None:
        """DeleteObjects in batches of 1000; every batch is tried, then per-key failures are
        raised together (``StorageUnavailable`` if all of them are transient)."""
        unique = list(dict.fromkeys(keys))
        failures: list[tuple[str, str, bool]] = []  # key, reason, transient
        for i in range(0, len(unique), DELETE_BATCH):
            batch = unique[i : i + DELETE_BATCH]
            try:
                resp = self._call(
                    "DELETE_OBJECTS",
                    self._client.delete_objects,
                    None,
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
            except RsmError as e:
                failures.extend((k, str(e), e.retriable) for k in batch)
                continue
            for err in resp.get("Errors", []):
                code = err.get("Code", "")
                if code == "NoSuchKey":
                    continue
                failures.append(
                    (
                        err.get("Key", "?"),
                        f"{code}: {err.get('Message', '')}".rstrip(": "),
                        code in _TRANSIENT,
                    )
                )
        if failures:
            shown = "; ".join(f"{k} ({reason})" for k, reason, _ in failures[:20])
            more = f"; and {len(failures) - 20} more" if len(failures) > 20 else ""
            msg = (
                f"could not delete {len(failures)} of {len(unique)} objects from bucket {self.bucket} "
                f"at {self.endpoint}: {shown}{more}"
            )
            exc: RsmError = StorageUnavailable(msg) if all(t for _, _, t in failures) else StorageError(msg)
            exc.failed_keys = [k for k, _, _ in failures]  # type: ignore[attr-defined]
            raise exc

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": 1000}
            if token:
                kwargs["ContinuationToken"] = token
            resp = self._call("LIST", self._client.list_objects_v2, prefix, **kwargs)
            for obj in resp.get("Contents", []):
                modified = obj["LastModified"]
                if modified.tzinfo is None:
                    modified = modified.replace(tzinfo=datetime.UTC)
                yield ObjectInfo(obj["Key"], int(obj["Size"]), modified.astimezone(datetime.UTC))
            if not resp.get("IsTruncated"):
                return
            token = resp.get("NextContinuationToken")
            if not token:
                return

    # -- start-up check -------------------------------------------------------------------
    def check(self) -> None:
        where = f"at {self.endpoint}"
        try:
            self._call("HEAD_BUCKET", self._client.head_bucket, None, Bucket=self.bucket)
        except StorageUnavailable as e:
            raise StorageUnavailable(
                f"storage.s3: cannot reach the S3 service for bucket {self.bucket!r} {where}: "
                f"{e}; credentials: {self.credential_source()}"
            ) from e
        except StorageTimeout as e:
            raise StorageTimeout(
                f"storage.s3: the S3 service for bucket {self.bucket!r} {where} did not answer: {e}"
            ) from e
        except RsmError as e:
            cause = e.__cause__
            status = None
            if isinstance(cause, botocore.exceptions.ClientError):
                status = cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404 or "NoSuchBucket" in str(e):
                raise ConfigError(
                    f"storage.s3.bucket: bucket {self.bucket!r} does not exist {where} "
                    f"(region {self._client.meta.region_name}); "
                    f"credentials: {self.credential_source()}"
                ) from e
            # A 403 HEAD carries no error code; and a policy that scopes s3:ListBucket to
            # the key prefix denies HeadBucket yet allows what the sidecar does. Ask once
            # more with a ListObjectsV2 under the prefix: it either works or says why not.
            denial = self._list_denial()
            if denial is not None:
                code, detail = denial
                if code == "NoSuchBucket":
                    raise ConfigError(
                        f"storage.s3.bucket: bucket {self.bucket!r} does not exist {where}; "
                        f"credentials: {self.credential_source()}"
                    ) from e
                raise ConfigError(
                    f"storage.s3: access to bucket {self.bucket!r} {where} was denied ({detail}); "
                    f"credentials: {self.credential_source()}"
                ) from e
            log.info(
                "HeadBucket on %s was denied but listing under %r is allowed (prefix-scoped policy); "
                "continuing",
                self.bucket,
                self.probe_prefix,
            )
        if self.startup_write_check:
            probe = f"{self.probe_prefix}.rsm-probe/{uuid.uuid4().hex}"
            try:
                self.put(probe, b"")
                self.delete(probe)
            except RsmError as e:
                if e.retriable:
                    raise
                raise ConfigError(
                    f"storage.s3: bucket {self.bucket!r} {where} is readable but writing or deleting "
                    f"the probe object {probe!r} failed ({e}); check write/delete permissions under "
                    f"storage.key_prefix and the storage.s3.sse* settings; "
                    f"credentials: {self.credential_source()}"
                ) from e
        self.retry_pending_aborts()

    def _list_denial(self) -> tuple[str, str] | None:
        """None if a ListObjectsV2 under the prefix works, else (error code, description)."""
        try:
            self._call(
                "LIST",
                self._client.list_objects_v2,
                None,
                Bucket=self.bucket,
                Prefix=self.probe_prefix,
                MaxKeys=1,
            )
        except RsmError as e:
            cause = e.__cause__
            if isinstance(cause, botocore.exceptions.ClientError):
                err = cause.response.get("Error", {})
                return str(err.get("Code")), f"{err.get('Code')}: {err.get('Message')}"
            raise
        return None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.retry_pending_aborts()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._client.close()


class _BufferBody(io.RawIOBase):
    """A seekable, read-only file over a part buffer.

    botocore streams file bodies (checksum, payload hash, send, retry rewind) without
    copying them, whereas a ``bytearray`` body is copied into a ``BytesIO`` by the CRT
    signer botocore switches to when ``awscrt`` is installed: one more part per part in
    flight.
    """

    def __init__(self, buf: bytearray | bytes):
        super().__init__()
        self._mv = memoryview(buf).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = max(0, min(len(b), len(self._mv) - self._pos))
        b[:n] = self._mv[self._pos : self._pos + n]
        self._pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = len(self._mv) - self._pos
        data = self._mv[self._pos : self._pos + size].tobytes()
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._mv)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._mv)


class _S3Upload:
    """A streaming upload: one PutObject up to ``part_size``, multipart above it."""

    def __init__(self, store: S3ObjectStore, key: str):
        self._store = store
        self._key = key
        self._part_size = store.part_size
        self._buf = bytearray()
        self._size = 0
        self._upload_id: str | None = None
        self._parts: dict[int, dict[str, Any]] = {}
        self._futures: list[concurrent.futures.Future] = []
        self._slots = threading.Semaphore(store.max_parts_in_flight)
        self._error: BaseException | None = None
        self._state = "open"  # open -> committed | aborted
        self._lock = threading.Lock()

    # -- helpers ----------------------------------------------------------------------------
    def _ensure_open(self, what: str) -> None:
        if self._state != "open":
            raise StorageError(
                f"{what} after {'commit' if self._state == 'committed' else 'abort'}: "
                f"s3://{self._store.bucket}/{self._key}"
            )

    def _fail(self, e: BaseException) -> RsmError:
        """Abort everything and return the error to raise."""
        err = e if isinstance(e, RsmError) else self._store._translate(e, "upload", self._key)
        self.abort()
        return err

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            err = self._error
            raise self._fail(err) from err

    def _start_multipart(self) -> None:
        s = self._store
        resp = s._call(
            "CREATE_MULTIPART",
            s._client.create_multipart_upload,
            self._key,
            Bucket=s.bucket,
            Key=self._key,
            **s._write_params(),
        )
        self._upload_id = resp["UploadId"]

    def _submit(self, part: bytearray) -> None:
        """Hand a full part to the pool; blocks while ``max_parts_in_flight`` are pending."""
        s = self._store
        number = len(self._futures) + 1
        if number > MAX_PARTS:
            raise StorageError(
                f"s3://{s.bucket}/{self._key}: more than {MAX_PARTS} parts of "
                f"{self._part_size} bytes; raise storage.s3.part_size"
            )
        if self._upload_id is None:
            self._start_multipart()
        self._slots.acquire()
        if self._error is not None:
            self._slots.release()
            self._raise_if_failed()
        s._buffer_delta(len(part))
        fut = s._executor().submit(self._upload_part, number, part)
        fut.add_done_callback(lambda f, n=len(part): self._part_done(f, n))
        self._futures.append(fut)

    def _upload_part(self, number: int, part: bytearray) -> None:
        s = self._store
        if self._state != "open":
            return  # aborted while queued
        params: dict[str, Any] = {}
        if s.checksum_algorithm:
            params["ChecksumAlgorithm"] = s.checksum_algorithm
        resp = s._call(
            "UPLOAD_PART",
            s._client.upload_part,
            self._key,
            Bucket=s.bucket,
            Key=self._key,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=_BufferBody(part),
            **params,
        )
        entry: dict[str, Any] = {"PartNumber": number, "ETag": resp["ETag"]}
        for name in (
            "ChecksumCRC32",
            "ChecksumCRC32C",
            "ChecksumCRC64NVME",
            "ChecksumSHA1",
            "ChecksumSHA256",
        ):
            if resp.get(name):
                entry[name] = resp[name]
        with self._lock:
            self._parts[number] = entry

    def _part_done(self, fut: concurrent.futures.Future, nbytes: int) -> None:
        self._store._buffer_delta(-nbytes)
        if not fut.cancelled() and fut.exception() is not None and self._error is None:
            self._error = fut.exception()
        self._slots.release()

    # -- ObjectWriter ------------------------------------------------------------------------
    def write(self, data) -> None:
        self._ensure_open("write")
        self._raise_if_failed()
        mv = memoryview(data).cast("B")
        nbytes = mv.nbytes
        try:
            while mv:
                if len(self._buf) >= self._part_size:
                    part, self._buf = self._buf, bytearray()
                    self._submit(part)
                n = min(len(mv), self._part_size - len(self._buf))
                self._buf += mv[:n]
                mv = mv[n:]
        except RsmError as e:
            if self._state == "open":
                raise self._fail(e) from e
            raise
        except BaseException as e:
            raise self._fail(e) from e
        self._size += nbytes

    def commit(self) -> int:
        self._ensure_open("commit")
        s = self._store
        try:
            self._raise_if_failed()
            if self._upload_id is None:
                body, self._buf = self._buf, bytearray()
                s._call(
                    "PUT",
                    s._client.put_object,
                    self._key,
                    Bucket=s.bucket,
                    Key=self._key,
                    Body=_BufferBody(body),
                    **s._write_params(),
                )
            else:
                if self._buf:
                    part, self._buf = self._buf, bytearray()
                    self._submit(part)
                concurrent.futures.wait(self._futures)
                self._raise_if_failed()
                parts = [self._parts[n] for n in sorted(self._parts)]
                if len(parts) != len(self._futures):
                    raise StorageError(
                        f"s3://{s.bucket}/{self._key}: {len(self._futures)} parts sent but only "
                        f"{len(parts)} acknowledged"
                    )
                s._call(
                    "COMPLETE_MULTIPART",
                    s._client.complete_multipart_upload,
                    self._key,
                    Bucket=s.bucket,
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": parts},
                )
        except BaseException as e:
            if self._state == "open":
                raise self._fail(e) from e
            raise
        self._state = "committed"
        return self._size

    def abort(self) -> None:
        with self._lock:
            if self._state != "open":
                return
            self._state = "aborted"
        self._buf = bytearray()
        for f in self._futures:
            f.cancel()
        # Parts already on the wire finish (or fail) first: an abort racing an UploadPart
        # could leave that part's storage behind.
        concurrent.futures.wait(self._futures)
        if self._upload_id is not None:
            self._store._abort_upload(self._key, self._upload_id)

    def has_unfinished_upload(self) -> bool:
        return self._state == "open"

    @property
    def url(self) -> str:
        return f"s3://{self._store.bucket}/{self._key}"
