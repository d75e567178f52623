"""Google Cloud Storage object store on google-cloud-storage.

The client library resolves credentials and the endpoint and gives us its authorized
HTTP session; the JSON API requests themselves are issued here on that session, so each
one is visible: counted in ``requests``, retried with our own policy
(``storage.gcs.max_attempts``), bounded by our timeouts, and never preceded by a hidden
metadata request. Operations and their requests:

* upload up to ``chunk_size``: one ``uploadType=multipart`` POST (PUT).
* larger uploads: a resumable session (CREATE_RESUMABLE), one PUT per chunk
  (UPLOAD_CHUNK, the last one finalizes the object); a chunk uploads in the background
  while the caller fills the next one, so a writer holds at most 2 x ``chunk_size``
  bytes. The object appears only when the final chunk is accepted; ``abort()`` cancels the
  session (CANCEL_RESUMABLE). Uploads carry the CRC32C of the whole object, which GCS
  verifies before it publishes the object.
* ``get``/``get_range``: one media GET each (``Range: bytes=a-b``), GET.
* ``size``: one object metadata GET (HEAD); ``list``: one GET per 1000 keys (LIST);
  ``delete``: DELETE; ``delete_many``: parallel DELETEs (``delete_concurrency``), every key
  tried, failures reported together.
"""

from __future__ import annotations

import base64
import concurrent.futures
import datetime
import json
import logging
import os
import random
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import google.auth
import google.auth.exceptions
import google_crc32c
import requests
import requests.adapters
import urllib3.exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from rsm_sidecar.config import Config, Key
from rsm_sidecar.errors import ConfigError, DataLoss, InvalidArgument, RsmError
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
CHUNK_GRANULARITY = 256 * KiB  # resumable chunks must be multiples of this (but the last)
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}

CONFIG_KEYS = [
    Key(
        "storage.gcs.bucket",
        "str",
        None,
        "Bucket that holds the objects.",
        required_when=("storage.backend", "gcs"),
    ),
    Key("storage.gcs.project", "str", None, "Project id sent with requests (not needed for object access)."),
    Key(
        "storage.gcs.endpoint_url",
        "str",
        None,
        "API endpoint, e.g. `http://127.0.0.1:4443` for fake-gcs-server or a Private Service Connect endpoint. "
        "Unset: `https://storage.googleapis.com` (or `STORAGE_EMULATOR_HOST`).",
    ),
    Key(
        "storage.gcs.credentials",
        "str",
        "default",
        "`default`: application default credentials (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's ADC file, "
        "the GCE/GKE metadata server incl. Workload Identity); `file`: the JSON file in "
        "`storage.gcs.credentials_file`; `anonymous`: no credentials (emulators, public buckets).",
        choices=("default", "file", "anonymous"),
    ),
    Key(
        "storage.gcs.credentials_file",
        "path",
        None,
        "Service-account key (or external-account/Workload Identity Federation) JSON file.",
        required_when=("storage.gcs.credentials", "file"),
    ),
    Key(
        "storage.gcs.chunk_size",
        "size",
        8 * MiB,
        "Resumable-upload chunk size, a multiple of 256 KiB; objects up to this size are one request. "
        "Memory per upload is at most 2 x chunk_size.",
        min=CHUNK_GRANULARITY,
        max=1024 * MiB,
    ),
    Key(
        "storage.gcs.checksum",
        "bool",
        True,
        "Send the CRC32C of every upload (GCS rejects a mismatch) and verify it on whole-object GETs.",
    ),
    Key("storage.gcs.connect_timeout", "seconds", 5.0, "TCP/TLS connect timeout of one attempt.", min=0.1),
    Key(
        "storage.gcs.read_timeout",
        "seconds",
        30.0,
        "Longest wait for the service to answer or send more bytes, per attempt.",
        min=0.1,
    ),
    Key(
        "storage.gcs.max_attempts",
        "int",
        3,
        "Attempts per request including the first (429, 5xx, connection errors and timeouts are retried with "
        "exponential backoff and jitter; resumable chunk uploads are not retried: the writer fails).",
        min=1,
        max=20,
    ),
    Key(
        "storage.gcs.delete_concurrency",
        "int",
        16,
        "Parallel DELETE requests of one `delete_many`.",
        min=1,
        max=128,
    ),
    Key(
        "storage.gcs.max_pool_connections",
        "int",
        64,
        "HTTP connections kept to the service.",
        min=1,
        max=1024,
    ),
    Key(
        "storage.gcs.startup_write_check",
        "bool",
        True,
        "At start-up, after listing the bucket, write and delete a 0-byte probe object under `storage.key_prefix`.",
    ),
]


def _crc_update(crc: google_crc32c.Checksum, data) -> None:
    """Feed ``data`` (any bytes-like) to ``crc`` in 1 MiB copies (the C extension takes only bytes)."""
    mv = memoryview(data).cast("B")
    for i in range(0, len(mv), MiB):
        crc.update(bytes(mv[i : i + MiB]))


def _describe_credentials_file(path: str) -> str:
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return f"credentials file {path}"
    kind = info.get("type", "unknown type")
    who = (
        info.get("client_email")
        or info.get("service_account_impersonation_url", "").rsplit("/", 1)[-1]
        or info.get("audience", "")
    )
    return f"credentials file {path} ({kind}{', ' + who if who else ''})"


def _credentials_from_file(path: str):
    """Credentials of the JSON file's declared type (an operator-provided file)."""
    with open(path) as f:
        info = json.load(f)
    kind = info.get("type") if isinstance(info, dict) else None
    scopes = list(SCOPES)
    if kind == "service_account":
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info(info, scopes=scopes)
    if kind == "authorized_user":
        from google.oauth2 import credentials as user_credentials

        return user_credentials.Credentials.from_authorized_user_info(info, scopes=scopes)
    if kind == "external_account":  # Workload Identity Federation
        source = info.get("credential_source") or {}
        if str(source.get("environment_id", "")).startswith("aws"):
            from google.auth import aws as module
        elif "executable" in source:
            from google.auth import pluggable as module
        else:
            from google.auth import identity_pool as module
        return module.Credentials.from_info(info, scopes=scopes)
    if kind == "external_account_authorized_user":
        from google.auth import external_account_authorized_user as module

        return module.Credentials.from_info(info, scopes=scopes)
    if kind == "impersonated_service_account":
        from google.auth import impersonated_credentials

        return impersonated_credentials.Credentials.from_impersonated_service_account_info(
            info, scopes=scopes
        )
    raise ValueError(
        f"unsupported credentials type {kind!r} (expected service_account, authorized_user, "
        "external_account, external_account_authorized_user or impersonated_service_account)"
    )


def _load_credentials(mode: str, credentials_file: str | None):
    """(credentials, description of the source) for ``storage.gcs.credentials``."""
    if mode == "anonymous":
        return AnonymousCredentials(), "anonymous (storage.gcs.credentials = anonymous)"
    if mode == "file":
        if not credentials_file:
            raise ConfigError("storage.gcs.credentials_file: missing when storage.gcs.credentials = 'file'")
        try:
            creds = _credentials_from_file(credentials_file)
        except (OSError, google.auth.exceptions.GoogleAuthError, ValueError, KeyError) as e:
            raise ConfigError(f"storage.gcs.credentials_file: cannot load {credentials_file}: {e}") from None
        return creds, "storage.gcs.credentials_file: " + _describe_credentials_file(credentials_file)
    if mode != "default":
        raise ConfigError(f"storage.gcs.credentials: {mode!r} is not one of default, file, anonymous")
    try:
        creds, _ = google.auth.default(scopes=list(SCOPES))
    except google.auth.exceptions.DefaultCredentialsError as e:
        raise ConfigError(
            "storage.gcs.credentials = default: no application default credentials found "
            f"(GOOGLE_APPLICATION_CREDENTIALS, gcloud ADC file, metadata server): {e}"
        ) from None
    env_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    module = type(creds).__module__
    if env_file:
        source = (
            "application default credentials from GOOGLE_APPLICATION_CREDENTIALS, "
            + _describe_credentials_file(env_file)
        )
    elif "compute_engine" in module:
        email = getattr(creds, "service_account_email", "default")
        source = f"application default credentials from the GCE/GKE metadata server (service account {email})"
    else:
        source = (
            f"application default credentials ({module}.{type(creds).__name__}, gcloud ADC file or similar)"
        )
    return creds, source


class GcsObjectStore(ObjectStore):
    name = "gcs"

    def __init__(
        self,
        bucket: str,
        *,
        project: str | None = None,
        endpoint_url: str | None = None,
        credentials: str = "default",
        credentials_file: str | None = None,
        chunk_size: int = 8 * MiB,
        checksum: bool = True,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_attempts: int = 3,
        delete_concurrency: int = 16,
        max_pool_connections: int = 64,
        startup_write_check: bool = True,
        probe_prefix: str = "",
    ):
        super().__init__()
        if not bucket:
            raise ConfigError("storage.gcs.bucket: missing; the bucket that holds the objects")
        if chunk_size <= 0 or chunk_size % CHUNK_GRANULARITY:
            raise ConfigError(
                f"storage.gcs.chunk_size: {chunk_size} is not a positive multiple of 256 KiB "
                f"({CHUNK_GRANULARITY} bytes)"
            )
        self.bucket = bucket
        self.chunk_size = chunk_size
        self.checksum = checksum
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_attempts = max_attempts
        self.delete_concurrency = delete_concurrency
        self.startup_write_check = startup_write_check
        self.probe_prefix = probe_prefix
        creds, self._credential_source = _load_credentials(credentials, credentials_file)
        options = {"api_endpoint": endpoint_url.rstrip("/")} if endpoint_url else None
        try:
            self._client = storage.Client(project=project, credentials=creds, client_options=options)
        except (ValueError, google.auth.exceptions.GoogleAuthError) as e:
            raise ConfigError(f"storage.gcs: cannot create a GCS client for bucket {bucket!r}: {e}") from None
        self.base_url = self._client._connection.API_BASE_URL.rstrip("/")
        self._http: requests.Session = self._client._http
        adapter = requests.adapters.HTTPAdapter(
            pool_connections=4, pool_maxsize=max_pool_connections, max_retries=0
        )
        self._http.mount("https://", adapter)
        self._http.mount("http://", adapter)
        self._bucket_path = urllib.parse.quote(bucket, safe="")
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._buffered = 0
        self.peak_buffered_bytes = 0
        self._buffered_lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: Config) -> GcsObjectStore:
        g = cfg.get
        return cls(
            g("storage.gcs.bucket"),
            project=g("storage.gcs.project"),
            endpoint_url=g("storage.gcs.endpoint_url"),
            credentials=g("storage.gcs.credentials"),
            credentials_file=g("storage.gcs.credentials_file"),
            chunk_size=g("storage.gcs.chunk_size"),
            checksum=g("storage.gcs.checksum"),
            connect_timeout=g("storage.gcs.connect_timeout"),
            read_timeout=g("storage.gcs.read_timeout"),
            max_attempts=g("storage.gcs.max_attempts"),
            delete_concurrency=g("storage.gcs.delete_concurrency"),
            max_pool_connections=g("storage.gcs.max_pool_connections"),
            startup_write_check=g("storage.gcs.startup_write_check"),
            probe_prefix=g("storage.key_prefix"),
        )

    # -- descriptions -------------------------------------------------------------------
    def describe(self) -> str:
        return f"gcs bucket {self.bucket} at {self.base_url}"

    def credential_source(self) -> str:
        return self._credential_source

    # -- URLs ---------------------------------------------------------------------------
    @staticmethod
    def _check_name(key: str) -> str:
        """GCS object naming rules, checked before a request is built (a "." key would
        otherwise be normalized out of the URL and address something else)."""
        if (
            not key
            or key in (".", "..")
            or "\r" in key
            or "\n" in key
            or len(key.encode()) > 1024
            or key.startswith(".well-known/acme-challenge/")
        ):
            raise InvalidArgument(
                f"invalid GCS object name {key!r}: 1-1024 bytes of UTF-8, no CR/LF, not '.' or '..'"
            )
        return key

    def _object_url(self, key: str) -> str:
        self._check_name(key)
        return f"{self.base_url}/storage/v1/b/{self._bucket_path}/o/{urllib.parse.quote(key, safe='')}"

    def _media_url(self, key: str) -> str:
        self._check_name(key)
        return f"{self.base_url}/download/storage/v1/b/{self._bucket_path}/o/{urllib.parse.quote(key, safe='')}?alt=media"

    def _upload_url(self, upload_type: str, key: str | None = None) -> str:
        url = f"{self.base_url}/upload/storage/v1/b/{self._bucket_path}/o?uploadType={upload_type}"
        if key is not None:
            url += "&name=" + urllib.parse.quote(self._check_name(key), safe="")
        return url

    # -- requests and errors ------------------------------------------------------------------
    def _translate_status(
        self, resp: requests.Response, op: str, key: str | None, start: int | None = None
    ) -> RsmError:
        what = f"{op} gs://{self.bucket}/{key}" if key is not None else f"{op} on bucket {self.bucket}"
        try:
            detail = resp.json().get("error", {}).get("message", "")
        except ValueError:
            detail = resp.text[:200]
        status = resp.status_code
        detail = f"HTTP {status}{': ' + detail if detail else ''}"
        if status == 404:
            if key is not None and "bucket" not in detail.lower():
                return ObjectNotFound(key)
            return StorageError(
                f"{what}: bucket {self.bucket!r} does not exist at {self.base_url} ({detail}); "
                f"credentials: {self._credential_source}"
            )
        if status == 416:
            return InvalidRange(key or "", start if start is not None else -1)
        if status in (401, 403):
            return StorageError(
                f"{what}: access denied at {self.base_url} ({detail}); credentials: {self._credential_source}"
            )
        if status in _TRANSIENT_STATUS or status >= 500:
            return StorageUnavailable(
                f"{what}: {self.base_url} is throttling or failing ({detail}, {self.max_attempts} attempt(s))"
            )
        return StorageError(f"{what}: {self.base_url} rejected the request ({detail})")

    def _translate_exception(self, e: Exception, op: str, key: str | None) -> RsmError:
        what = f"{op} gs://{self.bucket}/{key}" if key is not None else f"{op} on bucket {self.bucket}"
        if isinstance(e, RsmError):
            return e
        read_timeout = isinstance(e, requests.exceptions.ReadTimeout) or (
            isinstance(e, requests.exceptions.ConnectionError)
            and e.args
            and isinstance(e.args[0], urllib3.exceptions.ReadTimeoutError)
        )
        if read_timeout:
            return StorageTimeout(
                f"{what}: no answer from {self.base_url} within the read timeout of "
                f"{self.read_timeout:g}s (storage.gcs.read_timeout), {self.max_attempts} attempt(s)"
            )
        if isinstance(e, requests.exceptions.ConnectTimeout):
            return StorageTimeout(
                f"{what}: could not connect to {self.base_url} within the connect timeout of "
                f"{self.connect_timeout:g}s (storage.gcs.connect_timeout)"
            )
        if isinstance(e, requests.exceptions.SSLError):
            return StorageError(f"{what}: TLS failure at {self.base_url}: {e}")
        if isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)):
            return StorageUnavailable(
                f"{what}: cannot reach {self.base_url} after {self.max_attempts} attempt(s): {e}"
            )
        if isinstance(e, google.auth.exceptions.RefreshError):
            return StorageError(
                f"{what}: could not obtain an access token ({e}); credentials: {self._credential_source}"
            )
        if isinstance(e, google.auth.exceptions.TransportError):
            return StorageUnavailable(
                f"{what}: could not reach the token endpoint ({e}); credentials: {self._credential_source}"
            )
        if isinstance(e, requests.exceptions.RequestException):
            return StorageError(f"{what}: {e}")
        return StorageError(f"{what}: unexpected {type(e).__name__}: {e}")

    @staticmethod
    def _transient(e: Exception) -> bool:
        if isinstance(e, google.auth.exceptions.RefreshError):
            return False
        return isinstance(
            e,
            (
                requests.exceptions.ConnectionError,
                requests.exceptions.Timeout,
                requests.exceptions.ChunkedEncodingError,
                google.auth.exceptions.TransportError,
            ),
        )

    def _request(
        self,
        op: str,
        method: str,
        url: str,
        *,
        key: str | None = None,
        ok=(200,),
        retry: bool = True,
        start: int | None = None,
        allow_404: bool = False,
        **kwargs,
    ) -> requests.Response:
        """One storage request (each attempt counted), retried on transient failures."""
        attempts = self.max_attempts if retry else 1
        kwargs.setdefault("timeout", (self.connect_timeout, self.read_timeout))
        for attempt in range(1, attempts + 1):
            self._count(op)
            try:
                resp = self._http.request(method, url, **kwargs)
            except Exception as e:
                if attempt < attempts and self._transient(e):
                    self._backoff(attempt)
                    continue
                raise self._translate_exception(e, op, key) from e
            if resp.status_code in ok or (allow_404 and resp.status_code == 404):
                return resp
            if attempt < attempts and (resp.status_code in _TRANSIENT_STATUS or resp.status_code >= 500):
                self._backoff(attempt)
                continue
            raise self._translate_status(resp, op, key, start)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _backoff(attempt: int) -> None:
        time.sleep(random.uniform(0, min(5.0, 0.1 * 2**attempt)))

    # -- pools and buffer accounting ------------------------------------------------------------
    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max(4, self.delete_concurrency), thread_name_prefix="gcs"
                )
            return self._pool

    def _buffer_delta(self, n: int) -> None:
        with self._buffered_lock:
            self._buffered += n
            self.peak_buffered_bytes = max(self.peak_buffered_bytes, self._buffered)

    @property
    def buffered_bytes(self) -> int:
        with self._buffered_lock:
            return self._buffered

    # -- the contract --------------------------------------------------------------------------
    def open_writer(self, key: str) -> ObjectWriter:
        return UploadHandle(_GcsUpload(self, self._check_name(key)))

    def _put_simple(self, key: str, data: bytes | bytearray) -> None:
        """One multipart/related upload: metadata (with CRC32C) and the bytes."""
        meta: dict[str, Any] = {"name": key, "contentType": "application/octet-stream"}
        if self.checksum:
            crc = google_crc32c.Checksum()
            _crc_update(crc, data)
            meta["crc32c"] = base64.b64encode(crc.digest()).decode()
        boundary = "rsm-" + uuid.uuid4().hex
        head = (
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps(meta)}\r\n"
            f"--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
        ).encode()
        body = head + data + f"\r\n--{boundary}--\r\n".encode()
        self._request(
            "PUT",
            "POST",
            self._upload_url("multipart"),
            key=key,
            data=body,
            headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
        )

    def get(self, key: str) -> bytes:
        for attempt in range(1, self.max_attempts + 1):
            resp = self._request(
                "GET", "GET", self._media_url(key), key=key, headers={"Accept-Encoding": "identity"}
            )
            body = resp.content
            if not self.checksum or self._crc_matches(resp, body):
                return body
            log.warning("GET gs://%s/%s: CRC32C mismatch (attempt %d)", self.bucket, key, attempt)
        raise DataLoss(
            f"GET gs://{self.bucket}/{key}: the bytes received do not match the object's CRC32C "
            f"after {self.max_attempts} attempts"
        )

    @staticmethod
    def _crc_matches(resp: requests.Response, body: bytes) -> bool:
        for part in resp.headers.get("X-Goog-Hash", "").split(","):
            name, _, value = part.strip().partition("=")
            if name == "crc32c" and value:
                return base64.b64decode(value) == google_crc32c.Checksum(body).digest()
        return True  # nothing to compare with

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise InvalidArgument(f"invalid range [{start}, {end}] for {key}")
        resp = self._request(
            "GET",
            "GET",
            self._media_url(key),
            key=key,
            ok=(200, 206),
            start=start,
            headers={"Range": f"bytes={start}-{end}", "Accept-Encoding": "identity"},
        )
        body = resp.content
        if resp.status_code == 200:  # Range ignored: the whole object
            if start >= len(body):
                raise InvalidRange(key, start, len(body))
            return body[start : end + 1]
        if len(body) > end - start + 1:
            raise StorageError(
                f"GET gs://{self.bucket}/{key}: asked for {end - start + 1} bytes "
                f"(bytes={start}-{end}), got {len(body)}"
            )
        return body

    def size(self, key: str) -> int:
        resp = self._request("HEAD", "GET", self._object_url(key), key=key, params={"fields": "size"})
        return int(resp.json()["size"])

    def delete(self, key: str) -> None:
        self._request("DELETE", "DELETE", self._object_url(key), key=key, ok=(200, 204), allow_404=True)

    def delete_many(self, keys: Iterable[str]) -> None:
        unique = list(dict.fromkeys(keys))
        failures: list[tuple[str, RsmError]] = []
        lock = threading.Lock()
        sem = threading.Semaphore(self.delete_concurrency)

        def one(key: str) -> None:
            try:
                self.delete(key)
            except RsmError as e:
                with lock:
                    failures.append((key, e))
            finally:
                sem.release()

        futures = []
        pool = self._executor()
        for key in unique:
            sem.acquire()
            futures.append(pool.submit(one, key))
        concurrent.futures.wait(futures)
        if failures:
            failures.sort(key=lambda f: unique.index(f[0]) if len(unique) < 5000 else 0)
            shown = "; ".join(f"{k} ({e})" for k, e in failures[:20])
            more = f"; and {len(failures) - 20} more" if len(failures) > 20 else ""
            msg = (
                f"could not delete {len(failures)} of {len(unique)} objects from bucket {self.bucket} "
                f"at {self.base_url}: {shown}{more}"
            )
            exc: RsmError = (
                StorageUnavailable(msg) if all(e.retriable for _, e in failures) else StorageError(msg)
            )
            exc.failed_keys = [k for k, _ in failures]  # type: ignore[attr-defined]
            raise exc

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        token: str | None = None
        url = f"{self.base_url}/storage/v1/b/{self._bucket_path}/o"
        while True:
            params = {
                "prefix": prefix,
                "maxResults": "1000",
                "fields": "items(name,size,updated),nextPageToken",
            }
            if token:
                params["pageToken"] = token
            page = self._request("LIST", "GET", url, key=None, params=params).json()
            for item in page.get("items", []):
                yield ObjectInfo(item["name"], int(item["size"]), _parse_time(item["updated"]))
            token = page.get("nextPageToken")
            if not token:
                return

    # -- start-up check ---------------------------------------------------------------------------
    def check(self) -> None:
        where = f"at {self.base_url}"
        url = f"{self.base_url}/storage/v1/b/{self._bucket_path}/o"
        try:
            self._request(
                "LIST",
                "GET",
                url,
                key=None,
                params={"prefix": self.probe_prefix, "maxResults": "1", "fields": "nextPageToken"},
            )
        except (StorageUnavailable, StorageTimeout) as e:
            raise type(e)(
                f"storage.gcs: cannot reach GCS for bucket {self.bucket!r} {where}: {e}; "
                f"credentials: {self._credential_source}"
            ) from e
        except RsmError as e:
            if "does not exist" in str(e):
                raise ConfigError(
                    f"storage.gcs.bucket: bucket {self.bucket!r} does not exist {where}; "
                    f"credentials: {self._credential_source}"
                ) from e
            raise ConfigError(f"storage.gcs: bucket {self.bucket!r} {where} is not accessible ({e})") from e
        if self.startup_write_check:
            probe = f"{self.probe_prefix}.rsm-probe/{uuid.uuid4().hex}"
            try:
                self.put(probe, b"")
                self.delete(probe)
            except RsmError as e:
                if e.retriable:
                    raise
                raise ConfigError(
                    f"storage.gcs: bucket {self.bucket!r} {where} is readable but writing or deleting "
                    f"the probe object {probe!r} failed ({e}); credentials: "
                    f"{self._credential_source}"
                ) from e

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self._http.close()


def _parse_time(value: str) -> datetime.datetime:
    t = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return t.astimezone(datetime.UTC)


class _GcsUpload:
    """A streaming upload: one request up to ``chunk_size``, a resumable session above it.

    Chunks go out one at a time (a resumable session is sequential) on the store's pool,
    while ``write()`` fills the next chunk; ``write()`` blocks until the previous chunk is
    acknowledged before handing over the next one.
    """

    def __init__(self, store: GcsObjectStore, key: str):
        self._store = store
        self._key = key
        self._chunk = store.chunk_size
        self._buf = bytearray()
        self._size = 0
        self._sent = 0  # bytes handed to chunk uploads so far
        self._session: str | None = None
        self._pending: concurrent.futures.Future | None = None
        self._crc = google_crc32c.Checksum() if store.checksum else None
        self._state = "open"
        self._lock = threading.Lock()

    def _ensure_open(self, what: str) -> None:
        if self._state != "open":
            raise StorageError(
                f"{what} after {'commit' if self._state == 'committed' else 'abort'}: "
                f"gs://{self._store.bucket}/{self._key}"
            )

    def _fail(self, e: BaseException) -> RsmError:
        err = e if isinstance(e, RsmError) else self._store._translate_exception(e, "upload", self._key)
        self.abort()
        return err

    def _wait_pending(self) -> None:
        if self._pending is not None:
            fut, self._pending = self._pending, None
            fut.result()  # raises the chunk's error

    def _start_session(self) -> None:
        s = self._store
        resp = s._request(
            "CREATE_RESUMABLE",
            "POST",
            s._upload_url("resumable", self._key),
            key=self._key,
            json={"name": self._key, "contentType": "application/octet-stream"},
            headers={"X-Upload-Content-Type": "application/octet-stream"},
        )
        location = resp.headers.get("Location")
        if not location:
            raise StorageError(
                f"gs://{s.bucket}/{self._key}: the resumable upload answer has no Location header"
            )
        self._session = location

    def _send_chunk(self, chunk: bytearray, offset: int, total: int | None, crc: str | None) -> None:
        """PUT ``chunk`` at ``offset``; resend what the service did not persist."""
        s = self._store
        pos = 0
        stalls = 0
        while True:
            end = offset + len(chunk) - 1
            size = "*" if total is None else str(total)
            rng = f"bytes {offset + pos}-{end}/{size}" if len(chunk) > pos else f"bytes */{size}"
            headers = {"Content-Range": rng, "Content-Type": "application/octet-stream"}
            if total is not None and crc:
                headers["X-Goog-Hash"] = f"crc32c={crc}"
            resp = s._request(
                "UPLOAD_CHUNK",
                "PUT",
                self._session,
                key=self._key,
                ok=(200, 201, 308),
                retry=False,
                data=memoryview(chunk)[pos:],
                headers=headers,
            )
            if total is not None:
                if resp.status_code in (200, 201):
                    return
                raise StorageError(
                    f"gs://{s.bucket}/{self._key}: the final chunk was not accepted "
                    f"(HTTP {resp.status_code}, Range {resp.headers.get('Range')})"
                )
            if resp.status_code != 308:
                raise StorageError(
                    f"gs://{s.bucket}/{self._key}: the upload was finalized early (HTTP "
                    f"{resp.status_code}) at offset {offset + pos}"
                )
            persisted = resp.headers.get("Range", "")  # "bytes=0-N"
            upto = int(persisted.rpartition("-")[2]) + 1 if persisted else 0
            if upto >= end + 1:
                return
            if upto <= offset + pos:
                stalls += 1
                if stalls >= 3:
                    raise StorageUnavailable(
                        f"gs://{s.bucket}/{self._key}: the service keeps persisting nothing "
                        f"past offset {upto}"
                    )
            pos = max(0, upto - offset)

    def _submit(self, chunk: bytearray) -> None:
        s = self._store
        self._wait_pending()  # one chunk in flight: the session is sequential
        if self._session is None:
            self._start_session()
        offset = self._sent
        self._sent += len(chunk)
        s._buffer_delta(len(chunk))

        def run() -> None:
            try:
                if self._state == "open":
                    self._send_chunk(chunk, offset, None, None)
            finally:
                s._buffer_delta(-len(chunk))

        self._pending = s._executor().submit(run)

    def write(self, data) -> None:
        self._ensure_open("write")
        mv = memoryview(data).cast("B")
        nbytes = mv.nbytes
        try:
            while mv:
                if len(self._buf) >= self._chunk:
                    chunk, self._buf = self._buf, bytearray()
                    self._submit(chunk)
                n = min(len(mv), self._chunk - len(self._buf))
                piece = mv[:n]
                self._buf += piece
                if self._crc is not None:
                    _crc_update(self._crc, piece)
                mv = mv[n:]
        except BaseException as e:
            if self._state == "open":
                raise self._fail(e) from e
            raise
        self._size += nbytes

    def commit(self) -> int:
        self._ensure_open("commit")
        s = self._store
        try:
            if self._session is None:
                body, self._buf = self._buf, bytearray()
                s._put_simple(self._key, body)
            else:
                self._wait_pending()
                crc = base64.b64encode(self._crc.digest()).decode() if self._crc is not None else None
                last, self._buf = self._buf, bytearray()
                self._send_chunk(last, self._sent, self._size, crc)
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
        if self._pending is not None:
            concurrent.futures.wait([self._pending])
            self._pending = None
        if self._session is not None:
            s = self._store
            try:
                # 499 is GCS's answer to a cancelled session; 404/410 mean it is already gone
                s._request(
                    "CANCEL_RESUMABLE",
                    "DELETE",
                    self._session,
                    key=self._key,
                    ok=(499, 200, 204, 404, 410),
                    retry=False,
                )
            except RsmError as e:
                # Nothing is published without the final chunk; GCS drops the session after a week.
                log.warning(
                    "cancelling the resumable upload of gs://%s/%s failed: %s", s.bucket, self._key, e
                )

    def has_unfinished_upload(self) -> bool:
        return self._state == "open"

    @property
    def url(self) -> str:
        return f"gs://{self._store.bucket}/{self._key}"
