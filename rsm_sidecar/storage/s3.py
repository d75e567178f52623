r"""Amazon S3 (and S3-compatible) object store on boto3.

Uploads are :class:`~rsm_sidecar.storage.base.StreamingUpload`\ s: bytes collect in one part buffer; an
object that fits in one part (``storage.s3.part_size``) is sent with a single PutObject at commit,
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

import contextlib
import datetime
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config as BotoConfig

from rsm_sidecar.errors import ConfigError, InvalidArgument, RsmError
from rsm_sidecar.storage import base
from rsm_sidecar.storage.s3_settings import S3Settings

log = logging.getLogger(__name__)

MAX_PARTS = 10_000
DELETE_BATCH = 1000  # DeleteObjects limit
CRT_CHECKSUMS = ("CRC32C", "CRC64NVME")  # botocore computes these only with awscrt installed

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

# botocore's errors for a service it cannot reach, and for credentials it cannot find
_UNREACHABLE = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectionError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.HTTPClientError,
)
_NO_CREDENTIALS = (
    botocore.exceptions.NoCredentialsError,
    botocore.exceptions.PartialCredentialsError,
    botocore.exceptions.CredentialRetrievalError,
)

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


class S3ObjectStore(base.RemoteObjectStore):
    name = "s3"
    scheme = "s3"
    settings_type = S3Settings

    def __init__(self, settings: S3Settings, *, probe_prefix: str = "") -> None:
        super().__init__(settings.bucket, settings.upload_threads, probe_prefix)
        self.settings = settings
        if settings.checksum_algorithm in CRT_CHECKSUMS:
            from botocore.compat import HAS_CRT

            if not HAS_CRT:
                raise ConfigError(
                    f"storage.s3.checksum_algorithm = {settings.checksum_algorithm!r} needs the awscrt "
                    f"package "
                    "(pip install 'botocore[crt]'); or use CRC32 or SHA256"
                )
        c = settings
        self.checksum_algorithm = None if c.checksum_algorithm == "none" else c.checksum_algorithm
        try:
            self._session = boto3.Session(
                aws_access_key_id=c.access_key_id,
                aws_secret_access_key=c.secret_access_key,
                aws_session_token=c.session_token,
                profile_name=c.profile,
                region_name=c.region,
            )
        except botocore.exceptions.ProfileNotFound as e:
            raise ConfigError(f"storage.s3.profile: {e}") from None
        boto_config = BotoConfig(
            s3={"addressing_style": c.addressing_style},
            connect_timeout=c.connect_timeout,
            read_timeout=c.read_timeout,
            retries={"mode": c.retry_mode, "total_max_attempts": c.max_attempts},
            max_pool_connections=c.max_pool_connections,
            request_checksum_calculation="when_supported" if self.checksum_algorithm else "when_required",
            response_checksum_validation="when_supported"
            if c.validate_response_checksums
            else "when_required",
            tcp_keepalive=True,
            user_agent_appid="rsm-sidecar",
        )
        verify: bool | str = c.ca_bundle if c.ca_bundle else c.verify_tls
        try:
            self._client = self._session.client(
                "s3", endpoint_url=c.endpoint_url, config=boto_config, verify=verify
            )
        except (ValueError, botocore.exceptions.BotoCoreError) as e:
            raise ConfigError(
                f"storage.s3: cannot create an S3 client for bucket {c.bucket!r} "
                f"(endpoint {c.endpoint_url or 'AWS'}): {e}"
            ) from None
        # Count every HTTP attempt (botocore's retries included) as it goes out.
        self._client.meta.events.register("before-send.s3", self._on_send)
        self._pending_aborts: list[tuple[str, str]] = []  # (key, upload id) whose abort failed
        self._pending_lock = threading.Lock()

    # -- descriptions ---------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return str(self._client.meta.endpoint_url)

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

    def _on_send(self, event_name: str = "", **kwargs: Any) -> None:
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
                return base.StorageUnavailable(
                    f"{what}: the multipart upload is gone {where} ({detail}); upload the object again"
                )
            if code == "NoSuchBucket":
                return base.StorageError(
                    f"{what}: bucket {self.bucket!r} does not exist {where} ({detail}); "
                    f"credentials: {self.credential_source()}"
                )
            if key is not None and (code in _NOT_FOUND or status == 404):
                return base.ObjectNotFound(key)
            if code == "InvalidRange" or status == 416:
                return base.InvalidRange(key or "", start if start is not None else -1)
            if code in _ACCESS or status == 403:
                return base.StorageError(
                    f"{what}: access denied {where} ({detail}); credentials: {self.credential_source()}"
                )
            if code in _TRANSIENT or (status is not None and (status >= 500 or status == 429)):
                return base.StorageUnavailable(
                    f"{what}: {where} the service is throttling or failing ({detail}, "
                    f"HTTP {status}, after {self.settings.max_attempts} attempts)"
                )
            return base.StorageError(f"{what}: {where} rejected the request ({detail}, HTTP {status})")
        if isinstance(e, (botocore.exceptions.ReadTimeoutError, botocore.exceptions.ConnectTimeoutError)):
            kind = "connect" if isinstance(e, botocore.exceptions.ConnectTimeoutError) else "read"
            limit = self.settings.connect_timeout if kind == "connect" else self.settings.read_timeout
            return base.StorageTimeout(
                f"{what}: no answer {where} within the {kind} timeout of {limit:g}s "
                f"(storage.s3.{kind}_timeout), {self.settings.max_attempts} attempt(s): {e}"
            )
        if isinstance(e, botocore.exceptions.SSLError):
            return base.StorageError(
                f"{what}: TLS failure {where} ({e}); check storage.s3.ca_bundle/verify_tls"
            )
        if isinstance(e, _UNREACHABLE):
            return base.StorageUnavailable(
                f"{what}: cannot reach {where} after {self.settings.max_attempts} attempt(s): {e}"
            )
        if isinstance(e, _NO_CREDENTIALS):
            return base.StorageError(
                f"{what}: no usable AWS credentials ({e}); credentials: {self.credential_source()}"
            )
        if isinstance(e, botocore.exceptions.MissingDependencyException):
            return ConfigError(f"{what}: {e}")
        if isinstance(e, botocore.exceptions.BotoCoreError):
            return base.StorageError(f"{what}: {e}")
        if isinstance(e, OSError):
            return base.StorageUnavailable(f"{what}: {where}: {e}")
        return base.StorageError(f"{what}: unexpected {type(e).__name__}: {e}")

    def _call(self, op: str, fn: Callable[..., Any], key: str | None = None, **kwargs: Any) -> Any:
        """One API call (botocore retries inside; each attempt is counted by ``_on_send``),
        errors translated."""
        try:
            return fn(**kwargs)
        except Exception as e:
            raise self._translate(e, op, key, start=None) from e

    def _object_call(self, op: str, fn: Callable[..., Any], key: str, **kwargs: Any) -> Any:
        """``_call`` on the object ``key`` of the bucket."""
        return self._call(op, fn, key, Bucket=self.bucket, Key=key, **kwargs)

    # -- write parameters -----------------------------------------------------------------
    def _write_params(self) -> dict[str, Any]:
        p: dict[str, Any] = {}
        if self.settings.storage_class and self.settings.storage_class != "STANDARD":
            p["StorageClass"] = self.settings.storage_class
        if self.settings.sse != "none":
            p["ServerSideEncryption"] = self.settings.sse
            if self.settings.sse_kms_key_id:
                p["SSEKMSKeyId"] = self.settings.sse_kms_key_id
            if self.settings.sse_bucket_key:
                p["BucketKeyEnabled"] = True
        if self.checksum_algorithm:
            p["ChecksumAlgorithm"] = self.checksum_algorithm
        return p

    # -- incomplete multipart uploads -----------------------------------------------------
    def _abort_upload(self, key: str, upload_id: str) -> bool:
        """Abort one multipart upload; False (and remembered for later) if the service is unreachable."""
        try:
            self._object_call(
                "ABORT_MULTIPART",
                self._client.abort_multipart_upload,
                key,
                UploadId=upload_id,
            )
            return True
        except base.ObjectNotFound:
            return True
        except base.StorageError as e:
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
    def _new_upload(self, key: str) -> base.StreamingUpload:
        if not key:
            raise InvalidArgument("empty object key")
        if self._pending_aborts:
            self.retry_pending_aborts()
        return _S3Upload(self, key)

    def get(self, key: str) -> bytes:
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=key)
            body: bytes = resp["Body"].read()
            return self._received(body)
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
        return self._ranged_body(
            key, start, end, resp["ResponseMetadata"]["HTTPStatusCode"], self._received(body)
        )

    def size(self, key: str) -> int:
        resp = self._object_call("HEAD", self._client.head_object, key)
        return int(resp["ContentLength"])

    def delete(self, key: str) -> None:
        self._object_call("DELETE", self._client.delete_object, key)

    def delete_many(self, keys: Iterable[str]) -> None:
        """DeleteObjects in batches of 1000; every batch is tried, then per-key failures are
        raised together (``base.StorageUnavailable`` if all of them are transient)."""
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
        self._raise_delete_failures(failures, len(unique))

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[base.ObjectInfo]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": 1000}
            if token:
                kwargs["ContinuationToken"] = token
            elif start_after is not None:
                kwargs["StartAfter"] = start_after
            resp = self._call("LIST", self._client.list_objects_v2, prefix, **kwargs)
            for obj in resp.get("Contents", []):
                modified = obj["LastModified"]
                if modified.tzinfo is None:
                    modified = modified.replace(tzinfo=datetime.UTC)
                yield base.ObjectInfo(obj["Key"], int(obj["Size"]), modified.astimezone(datetime.UTC))
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
        except base.StorageUnavailable as e:
            raise base.StorageUnavailable(
                f"storage.s3: cannot reach the S3 service for bucket {self.bucket!r} {where}: "
                f"{e}; credentials: {self.credential_source()}"
            ) from e
        except base.StorageTimeout as e:
            raise base.StorageTimeout(
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
        if self.settings.startup_write_check:
            self._write_probe(
                "check write/delete permissions under storage.key_prefix and the storage.s3.sse* settings; "
                f"credentials: {self.credential_source()}"
            )
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
        self._shutdown_pool()
        self._client.close()


class _S3Upload(base.StreamingUpload):
    """One PutObject up to ``part_size``, a multipart upload above it."""

    def __init__(self, store: S3ObjectStore, key: str):
        super().__init__(
            store,
            key,
            part_size=store.settings.part_size,
            window=store.settings.max_parts_in_flight,
            max_parts=MAX_PARTS,
            part_size_key="storage.s3.part_size",
        )
        self._s3 = store
        self._upload_id: str | None = None
        self._parts: dict[int, dict[str, Any]] = {}
        self._parts_lock = threading.Lock()

    def _translate(self, e: Exception) -> RsmError:
        return self._s3._translate(e, "upload", self._key)

    def _put_whole(self, body: bytearray) -> None:
        s = self._s3
        s._object_call(
            "PUT",
            s._client.put_object,
            self._key,
            Body=base.BufferBody(body),
            **s._write_params(),
        )

    def _start(self) -> None:
        s = self._s3
        resp = s._object_call(
            "CREATE_MULTIPART",
            s._client.create_multipart_upload,
            self._key,
            **s._write_params(),
        )
        self._upload_id = resp["UploadId"]

    def _send_part(self, number: int, offset: int, part: bytearray) -> None:
        s = self._s3
        params: dict[str, Any] = {}
        if s.checksum_algorithm:
            params["ChecksumAlgorithm"] = s.checksum_algorithm
        resp = s._object_call(
            "UPLOAD_PART",
            s._client.upload_part,
            self._key,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=base.BufferBody(part),
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
        with self._parts_lock:
            self._parts[number] = entry

    def _finish(self, number: int, offset: int, last: bytearray) -> None:
        s = self._s3
        parts = self._send_last(number, offset, last, self._parts, "parts")
        s._object_call(
            "COMPLETE_MULTIPART",
            s._client.complete_multipart_upload,
            self._key,
            UploadId=self._upload_id,
            MultipartUpload={"Parts": parts},
        )

    def _cancel(self) -> None:
        if self._upload_id is not None:
            self._s3._abort_upload(self._key, self._upload_id)
