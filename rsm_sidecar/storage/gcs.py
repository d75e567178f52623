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
import datetime
import json
import logging
import os
import random
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
from google.auth.credentials import AnonymousCredentials, Credentials
from google.cloud import storage

from rsm_sidecar.errors import ConfigError, DataLoss, InvalidArgument, RsmError
from rsm_sidecar.storage import base
from rsm_sidecar.storage.gcs_settings import GcsSettings, MiB

log = logging.getLogger(__name__)

SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


def _crc_update(crc: google_crc32c.Checksum, data: bytes | bytearray | memoryview) -> None:
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


def _credentials_from_file(path: str) -> Any:
    """Credentials (a google-auth class, untyped) of the JSON file's declared type (operator-provided)."""
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
            from google.auth import aws

            return aws.Credentials.from_info(info, scopes=scopes)
        if "executable" in source:
            from google.auth import pluggable

            return pluggable.Credentials.from_info(info, scopes=scopes)
        from google.auth import identity_pool

        return identity_pool.Credentials.from_info(info, scopes=scopes)
    if kind == "external_account_authorized_user":
        from google.auth import external_account_authorized_user

        return external_account_authorized_user.Credentials.from_info(info, scopes=scopes)
    if kind == "impersonated_service_account":
        from google.auth import impersonated_credentials

        return impersonated_credentials.Credentials.from_impersonated_service_account_info(
            info, scopes=scopes
        )
    raise ValueError(
        f"unsupported credentials type {kind!r} (expected service_account, authorized_user, "
        "external_account, external_account_authorized_user or impersonated_service_account)"
    )


def _load_credentials(mode: str, credentials_file: str | None) -> tuple[Credentials, str]:
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


class GcsObjectStore(base.RemoteObjectStore):
    name = "gcs"
    scheme = "gs"
    settings_type = GcsSettings

    def __init__(self, settings: GcsSettings, *, probe_prefix: str = "") -> None:
        super().__init__(settings.bucket, max(4, settings.delete_concurrency), probe_prefix)
        self.settings = settings
        creds, source = _load_credentials(settings.credentials, settings.credentials_file)
        self._credential_source = source
        endpoint_url = settings.endpoint_url
        options = {"api_endpoint": endpoint_url.rstrip("/")} if endpoint_url else None
        try:
            self._client = storage.Client(project=settings.project, credentials=creds, client_options=options)
        except (ValueError, google.auth.exceptions.GoogleAuthError) as e:
            raise ConfigError(
                f"storage.gcs: cannot create a GCS client for bucket {settings.bucket!r}: {e}"
            ) from None
        self.base_url: str = self._client._connection.API_BASE_URL.rstrip("/")
        self._http: requests.Session = self._client._http
        adapter = requests.adapters.HTTPAdapter(
            pool_connections=4, pool_maxsize=settings.max_pool_connections, max_retries=0
        )
        self._http.mount("https://", adapter)
        self._http.mount("http://", adapter)
        self._bucket_path = urllib.parse.quote(settings.bucket, safe="")

    @property
    def endpoint(self) -> str:
        return self.base_url

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
        name = urllib.parse.quote(key, safe="")
        return f"{self.base_url}/download/storage/v1/b/{self._bucket_path}/o/{name}?alt=media"

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
                return base.ObjectNotFound(key)
            return base.StorageError(
                f"{what}: bucket {self.bucket!r} does not exist at {self.base_url} ({detail}); "
                f"credentials: {self._credential_source}"
            )
        if status == 416:
            return base.InvalidRange(key or "", start if start is not None else -1)
        if status in (401, 403):
            return base.StorageError(
                f"{what}: access denied at {self.base_url} ({detail}); credentials: {self._credential_source}"
            )
        if status in _TRANSIENT_STATUS or status >= 500:
            return base.StorageUnavailable(
                f"{what}: {self.base_url} is throttling or failing ({detail}, {self.settings.max_attempts} "
                f"attempt(s))"
            )
        return base.StorageError(f"{what}: {self.base_url} rejected the request ({detail})")

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
            return base.StorageTimeout(
                f"{what}: no answer from {self.base_url} within the read timeout of "
                f"{self.settings.read_timeout:g}s (storage.gcs.read_timeout), {self.settings.max_attempts} "
                f"attempt(s)"
            )
        if isinstance(e, requests.exceptions.ConnectTimeout):
            return base.StorageTimeout(
                f"{what}: could not connect to {self.base_url} within the connect timeout of "
                f"{self.settings.connect_timeout:g}s (storage.gcs.connect_timeout)"
            )
        if isinstance(e, requests.exceptions.SSLError):
            return base.StorageError(f"{what}: TLS failure at {self.base_url}: {e}")
        if isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError)):
            return base.StorageUnavailable(
                f"{what}: cannot reach {self.base_url} after {self.settings.max_attempts} attempt(s): {e}"
            )
        if isinstance(e, google.auth.exceptions.RefreshError):
            return base.StorageError(
                f"{what}: could not obtain an access token ({e}); credentials: {self._credential_source}"
            )
        if isinstance(e, google.auth.exceptions.TransportError):
            return base.StorageUnavailable(
                f"{what}: could not reach the token endpoint ({e}); credentials: {self._credential_source}"
            )
        if isinstance(e, requests.exceptions.RequestException):
            return base.StorageError(f"{what}: {e}")
        return base.StorageError(f"{what}: unexpected {type(e).__name__}: {e}")

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
        ok: tuple[int, ...] = (200,),
        retry: bool = True,
        start: int | None = None,
        allow_404: bool = False,
        **kwargs: Any,
    ) -> requests.Response:
        """One storage request (each attempt counted), retried on transient failures."""
        attempts = self.settings.max_attempts if retry else 1
        kwargs.setdefault("timeout", (self.settings.connect_timeout, self.settings.read_timeout))
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

    # -- the contract --------------------------------------------------------------------------
    def _new_upload(self, key: str) -> base.StreamingUpload:
        return _GcsUpload(self, self._check_name(key))

    def _put_simple(self, key: str, data: bytes | bytearray) -> None:
        """One multipart/related upload: metadata (with CRC32C) and the bytes."""
        meta: dict[str, Any] = {"name": key, "contentType": "application/octet-stream"}
        if self.settings.checksum:
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
        for attempt in range(1, self.settings.max_attempts + 1):
            resp = self._request(
                "GET", "GET", self._media_url(key), key=key, headers={"Accept-Encoding": "identity"}
            )
            body = self._received(resp.content)
            if not self.settings.checksum or self._crc_matches(resp, body):
                return body
            log.warning("GET gs://%s/%s: CRC32C mismatch (attempt %d)", self.bucket, key, attempt)
        raise DataLoss(
            f"GET gs://{self.bucket}/{key}: the bytes received do not match the object's CRC32C "
            f"after {self.settings.max_attempts} attempts"
        )

    @staticmethod
    def _crc_matches(resp: requests.Response, body: bytes) -> bool:
        for part in resp.headers.get("X-Goog-Hash", "").split(","):
            name, _, value = part.strip().partition("=")
            if name == "crc32c" and value:
                return bool(base64.b64decode(value) == google_crc32c.Checksum(body).digest())
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
        return self._ranged_body(key, start, end, resp.status_code, self._received(resp.content))

    def size(self, key: str) -> int:
        resp = self._request("HEAD", "GET", self._object_url(key), key=key, params={"fields": "size"})
        return int(resp.json()["size"])

    def delete(self, key: str) -> None:
        self._request("DELETE", "DELETE", self._object_url(key), key=key, ok=(200, 204), allow_404=True)

    def delete_many(self, keys: Iterable[str]) -> None:
        self._delete_each(keys, self.settings.delete_concurrency)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[base.ObjectInfo]:
        token: str | None = None
        url = f"{self.base_url}/storage/v1/b/{self._bucket_path}/o"
        while True:
            params = {
                "prefix": prefix,
                "maxResults": "1000",
                "fields": "items(name,size,updated),nextPageToken",
            }
            if start_after is not None:
                params["startOffset"] = start_after  # inclusive: the key itself is skipped below
            if token:
                params["pageToken"] = token
            page = self._request("LIST", "GET", url, key=None, params=params).json()
            for item in page.get("items", []):
                if start_after is not None and item["name"] <= start_after:
                    continue
                yield base.ObjectInfo(item["name"], int(item["size"]), _parse_time(item["updated"]))
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
        except (base.StorageUnavailable, base.StorageTimeout) as e:
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
        if self.settings.startup_write_check:
            self._write_probe(f"credentials: {self._credential_source}")

    def close(self) -> None:
        self._shutdown_pool()
        self._http.close()


def _parse_time(value: str) -> datetime.datetime:
    t = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return t.astimezone(datetime.UTC)


class _GcsUpload(base.StreamingUpload):
    """One request up to ``chunk_size``, a resumable session above it: its chunks go out one at
    a time (a session is sequential: a window of one) while ``write()`` fills the next one."""

    def __init__(self, store: GcsObjectStore, key: str):
        self._crc = google_crc32c.Checksum() if store.settings.checksum else None
        crc = self._crc
        super().__init__(
            store,
            key,
            part_size=store.settings.chunk_size,
            window=1,
            digest=None if crc is None else lambda piece: _crc_update(crc, piece),
        )
        self._gcs = store
        self._session: str | None = None

    def _translate(self, e: Exception) -> RsmError:
        return self._gcs._translate_exception(e, "upload", self._key)

    def _put_whole(self, body: bytearray) -> None:
        self._gcs._put_simple(self._key, body)

    def _start(self) -> None:
        s = self._gcs
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
            raise base.StorageError(f"{self.url}: the resumable upload answer has no Location header")
        self._session = location

    def _send_part(self, number: int, offset: int, part: bytearray) -> None:
        self._send_chunk(part, offset, None, None)

    def _finish(self, number: int, offset: int, last: bytearray) -> None:
        crc = base64.b64encode(self._crc.digest()).decode() if self._crc is not None else None
        self._send_chunk(last, offset, self._size, crc)

    def _send_chunk(self, chunk: bytearray, offset: int, total: int | None, crc: str | None) -> None:
        """PUT ``chunk`` at ``offset``; resend what the service did not persist."""
        s = self._gcs
        session = self._session
        assert session is not None, "a chunk is sent after _start"
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
                session,
                key=self._key,
                ok=(200, 201, 308),
                retry=False,
                data=memoryview(chunk)[pos:],
                headers=headers,
            )
            if total is not None:
                if resp.status_code in (200, 201):
                    return
                raise base.StorageError(
                    f"{self.url}: the final chunk was not accepted "
                    f"(HTTP {resp.status_code}, Range {resp.headers.get('Range')})"
                )
            if resp.status_code != 308:
                raise base.StorageError(
                    f"{self.url}: the upload was finalized early (HTTP "
                    f"{resp.status_code}) at offset {offset + pos}"
                )
            persisted = resp.headers.get("Range", "")  # "bytes=0-N"
            upto = int(persisted.rpartition("-")[2]) + 1 if persisted else 0
            if upto >= end + 1:
                return
            if upto <= offset + pos:
                stalls += 1
                if stalls >= 3:
                    raise base.StorageUnavailable(
                        f"{self.url}: the service keeps persisting nothing past offset {upto}"
                    )
            pos = max(0, upto - offset)

    def _cancel(self) -> None:
        s = self._gcs
        if self._session is None:
            return
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
            log.warning("cancelling the resumable upload of %s failed: %s", self.url, e)
