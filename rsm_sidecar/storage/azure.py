r"""Azure Blob Storage object store on azure-storage-blob (block blobs).

Uploads are :class:`~rsm_sidecar.storage.base.StreamingUpload`\ s: bytes collect in one block
buffer; a blob that fits in one block (``storage.azure.block_size``) is one Put Blob at commit
(PUT), anything larger is staged block by block (PUT_BLOCK) by a store-wide thread pool
(``storage.azure.upload_threads``), at most ``max_blocks_in_flight`` blocks of one writer at a time,
and published atomically by one Put Block List (PUT_BLOCK_LIST) at commit. One writer holds at
most ``block_size x (max_blocks_in_flight + 1)`` bytes of block buffers. Block ids are unique to
the upload (its uuid and the block number, all of the same length), so concurrent writers of one
key never mix their blocks: the first commit wins and drops the other writers' staged blocks (the
service drops every uncommitted block of a blob at a commit), whose commit then fails with
``StorageUnavailable`` (upload again).

Azure has no request that discards staged blocks: an aborted upload (a failure, ``abort()``, an
exception in the ``with`` block, a garbage-collected writer) sends nothing, and its uncommitted
blocks, invisible to every read and listing, are dropped by the service at the next commit of the
same key or after 7 days. Nothing is published without the Put Block List.

Reads: ``get``/``get_range`` are one Get Blob each (GET; a ranged read with ``x-ms-range``; the
SDK adds a second GET only for a whole-blob read of an empty blob); ``size`` is Get Blob
Properties (HEAD); ``list`` one List Blobs per 5000 names (LIST); ``delete`` Delete Blob (DELETE,
snapshots included); ``delete_many`` parallel Delete Blobs (``delete_concurrency``), every key
tried, failures reported together.

Every HTTP request is counted in ``requests`` as it is sent, retries included. Retries follow
``storage.azure.max_attempts`` with exponential backoff and jitter (the SDK's default waits 15 s
and more between attempts).
"""

from __future__ import annotations

import datetime
import logging
import random
import threading
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import azure.core.exceptions as az
import requests
import requests.adapters
import urllib3.util
from azure.core.credentials import AzureSasCredential
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobBlock, BlobServiceClient, ContainerClient, ExponentialRetry

from rsm_sidecar.errors import ConfigError, InvalidArgument, RsmError
from rsm_sidecar.storage import base
from rsm_sidecar.storage.azure_settings import MAX_BLOCKS, AzureSettings

log = logging.getLogger(__name__)
#: the SDK logs every request and response with its headers at INFO: at the sidecar's default
#: level that is several lines per chunk read; its warnings and errors still come through
HTTP_LOGGER = "azure.core.pipeline.policies.http_logging_policy"
logging.getLogger(HTTP_LOGGER).setLevel(logging.WARNING)

#: largest ranged read sent as one Get Blob (the SDK splits larger ones into requests of this size)
MAX_SINGLE_GET = 256 * 1024 * 1024
#: pieces a response body is read in
READ_BLOCK = 256 * 1024
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
_TRANSIENT_CODES = {"ServerBusy", "InternalError", "OperationTimedOut"}
_NOT_FOUND_CODES = {"BlobNotFound", "ResourceNotFound"}


def _operation(method: str, url: str) -> str:
    """The name ``requests`` counts a Blob service request under."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    comp = query.get("comp", [""])[0]
    container = query.get("restype", [""])[0] == "container"
    if method == "PUT":
        if comp == "block":
            return "PUT_BLOCK"
        if comp == "blocklist":
            return "PUT_BLOCK_LIST"
        if container and not comp:
            return "CREATE_CONTAINER"
        return f"PUT_{comp.upper()}" if comp else "PUT"
    if method == "GET":
        if comp == "list":
            return "LIST"
        if comp == "blocklist":
            return "GET_BLOCK_LIST"
        if container:
            return "GET_CONTAINER"
        return f"GET_{comp.upper()}" if comp else "GET"
    if method == "DELETE":
        return "DELETE_CONTAINER" if container else "DELETE"
    return method


class _Backoff(ExponentialRetry):
    """The SDK's retry policy (which attempts are retried: connection errors, timeouts, 408, 5xx but
    501/505) with ``max_attempts`` attempts and a short exponential backoff with full jitter."""

    def __init__(self, attempts: int) -> None:
        n = attempts - 1
        super().__init__(
            initial_backoff=0,
            increment_base=2,
            retry_total=n,
            retry_connect=n,
            retry_read=n,
            retry_status=n,
            random_jitter_range=0,
        )

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        return random.uniform(0, min(5.0, 0.1 * 2 ** (int(settings["count"]) + 1)))


def _sas_summary(token: str) -> str:
    """Permissions and expiry of a SAS token, for messages (never the signature)."""
    q = urllib.parse.parse_qs(token.lstrip("?"))
    parts = []
    if "sp" in q:
        parts.append(f"permissions {q['sp'][0]}")
    if "se" in q:
        parts.append(f"expires {q['se'][0]}")
    if "sr" in q:
        parts.append(f"resource {q['sr'][0]}")
    return f" ({', '.join(parts)})" if parts else ""


def _connection_string_fields(cs: str) -> dict[str, str]:
    fields = {}
    for part in cs.split(";"):
        name, sep, value = part.partition("=")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return fields


class AzureObjectStore(base.RemoteObjectStore):
    name = "azure"
    scheme = "azure"
    settings_type = AzureSettings

    def __init__(self, settings: AzureSettings, *, probe_prefix: str = "") -> None:
        super().__init__(settings.container, settings.upload_threads, probe_prefix)
        self.settings = settings
        c = settings
        session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(
            pool_connections=4,
            pool_maxsize=c.max_pool_connections,
            max_retries=urllib3.util.Retry(total=False, redirect=False, raise_on_status=False),
        )
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        transport = RequestsTransport(
            session=session,
            session_owner=True,
            connection_timeout=c.connect_timeout,
            read_timeout=c.read_timeout,
            connection_verify=c.ca_bundle if c.ca_bundle is not None else True,
            # bodies are read in pieces of this size (the SDK's 4 KiB took 4.6 ms of CPU per MiB read)
            connection_data_block_size=READ_BLOCK,
        )
        options: dict[str, Any] = {
            "transport": transport,
            "retry_policy": _Backoff(c.max_attempts),
            "max_single_put_size": c.block_size,
            "max_block_size": c.block_size,
            "max_single_get_size": MAX_SINGLE_GET,
            "max_chunk_get_size": MAX_SINGLE_GET,
            "raw_request_hook": self._on_request,
            "user_agent": "rsm-sidecar",
        }
        self._token_credential: Any = None
        try:
            if c.connection_string is not None:
                self._service = BlobServiceClient.from_connection_string(c.connection_string, **options)
                fields = _connection_string_fields(c.connection_string)
                kind = (
                    "shared key"
                    if "accountkey" in fields
                    else "SAS" + _sas_summary(fields.get("sharedaccesssignature", ""))
                    if "sharedaccesssignature" in fields
                    else "no credential"
                )
                account = fields.get("accountname") or self._service.account_name or "?"
                self._credential_source = (
                    f"connection string from storage.azure.connection_string (account {account}, {kind})"
                )
            else:
                url = c.endpoint_url or f"https://{c.account_name}.blob.core.windows.net"
                credential: Any
                if c.account_key is not None:
                    credential = {"account_name": c.account_name, "account_key": c.account_key}
                    self._credential_source = (
                        f"shared key of account {c.account_name} from storage.azure.account_key"
                    )
                elif c.sas_token is not None:
                    credential = AzureSasCredential(c.sas_token.lstrip("?"))
                    self._credential_source = "SAS token from storage.azure.sas_token" + _sas_summary(
                        c.sas_token
                    )
                else:
                    try:
                        from azure.identity import DefaultAzureCredential
                    except ImportError as e:
                        raise ConfigError(
                            "storage.azure: no connection_string, account_key or sas_token is set, so "
                            "DefaultAzureCredential signs the requests, and it needs azure-identity, which "
                            f"is not installed (no module {e.name!r}): pip install 'rsm-sidecar[azure]'"
                        ) from None

                    identity: dict[str, Any] = {}
                    if c.managed_identity_client_id:
                        identity["managed_identity_client_id"] = c.managed_identity_client_id
                    credential = DefaultAzureCredential(**identity)
                    self._token_credential = credential
                    mi = (
                        f", managed identity client id {c.managed_identity_client_id}"
                        if c.managed_identity_client_id
                        else ""
                    )
                    self._credential_source = (
                        "DefaultAzureCredential (Entra ID: environment service principal, workload identity, "
                        f"managed identity{mi}, Azure CLI)"
                    )
                self._service = BlobServiceClient(url.rstrip("/"), credential=credential, **options)
        except ConfigError:
            transport.close()
            raise
        except (ValueError, TypeError, az.AzureError) as e:
            transport.close()
            raise ConfigError(
                f"storage.azure: cannot create a Blob service client for container {c.container!r}: {e}"
            ) from None
        self._endpoint = self._service.url.split("?", 1)[0].rstrip("/")
        self._container: ContainerClient = self._service.get_container_client(c.container)

    # -- descriptions -------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return self._endpoint

    def url(self, key: str) -> str:
        return f"{self._endpoint}/{self.bucket}/{key}"

    def describe(self) -> str:
        return f"azure container {self.bucket} at {self._endpoint}"

    def credential_source(self) -> str:
        """Which credential the store uses, for error messages (never the secret)."""
        source = self._credential_source
        used = getattr(self._token_credential, "_successful_credential", None)
        if used is not None:
            source += f"; token from {type(used).__name__}"
        return source

    def _on_request(self, request: Any) -> None:
        http = request.http_request
        self._count(_operation(http.method, http.url))

    # -- names and errors -----------------------------------------------------------------
    @staticmethod
    def _check_name(key: str) -> str:
        """Blob names the service and URLs carry unchanged: 1-1024 characters, no control
        characters, and no "." or ".." path segment (HTTP clients resolve those, so the request
        would address another blob)."""
        segments = key.split("/")
        if (
            not key
            or len(key) > 1024
            or any(s in (".", "..") for s in segments)
            or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key)
        ):
            raise InvalidArgument(
                f"invalid Azure blob name {key!r}: 1-1024 characters, no control characters, no '.' or '..' "
                "path segment"
            )
        return key

    def _blob(self, key: str) -> Any:
        return self._container.get_blob_client(self._check_name(key))

    def _from_service(self, e: az.HttpResponseError) -> bool:
        """Whether ``e`` is the Blob service's answer (not a token endpoint's)."""
        request = getattr(e.response, "request", None)
        return request is not None and str(getattr(request, "url", "")).startswith(self._endpoint)

    def _translate(
        self, e: Exception, op: str, key: str | None = None, *, start: int | None = None
    ) -> RsmError:
        what = f"{op} {self.url(key)}" if key is not None else f"{op} on container {self.bucket}"
        where = f"at {self._endpoint}"
        attempts = f"{self.settings.max_attempts} attempt(s)"
        if isinstance(e, RsmError):
            return e
        inner = getattr(e, "inner_exception", None)
        if (
            isinstance(e, az.HttpResponseError)
            and e.status_code is None
            and isinstance(inner, Exception)
            and inner is not e
        ):
            return self._translate(inner, op, key, start=start)  # the SDK's wrapper of a broken read
        if isinstance(e, az.ClientAuthenticationError) and not self._from_service(e):
            return base.StorageError(
                f"{what}: could not obtain an access token ({' '.join(str(e).split())[:1000]}); "
                f"credentials: {self.credential_source()}"
            )
        if isinstance(e, az.HttpResponseError) and e.status_code is not None:
            status = e.status_code
            raw_code = getattr(e, "error_code", None) or ""
            code = str(getattr(raw_code, "value", raw_code))  # the SDK's StorageErrorCode enum or a str
            message = (str(getattr(e, "reason", "") or "") if not code else str(e).splitlines()[0]).strip()
            detail = f"HTTP {status}{' ' + code if code else ''}{': ' + message if message else ''}"
            if status == 404 or code in _NOT_FOUND_CODES or code == "ContainerNotFound":
                if code == "ContainerNotFound" or key is None:
                    return base.StorageError(
                        f"{what}: container {self.bucket!r} does not exist {where} ({detail}); "
                        f"credentials: {self.credential_source()}"
                    )
                return base.ObjectNotFound(key)
            if status == 416 or code == "InvalidRange":
                return base.InvalidRange(key or "", start if start is not None else -1)
            if code == "InvalidBlockList" and op == "PUT_BLOCK_LIST":
                return base.StorageUnavailable(
                    f"{what}: the staged blocks are gone {where} ({detail}): another upload of the same key "
                    "committed first (a commit drops every other uncommitted block of the blob); upload the "
                    "object again"
                )
            if status in (401, 403):
                return base.StorageError(
                    f"{what}: access denied {where} ({detail}); the identity needs the role Storage Blob "
                    f"Data Contributor on the container (or a SAS with permissions racwdl); "
                    f"credentials: {self.credential_source()}"
                )
            if status in _TRANSIENT_STATUS or status >= 500 or code in _TRANSIENT_CODES:
                return base.StorageUnavailable(
                    f"{what}: {where} the service is throttling or failing ({detail}, {attempts})"
                )
            return base.StorageError(f"{what}: {where} rejected the request ({detail})")
        if isinstance(e, az.ServiceResponseTimeoutError):
            return base.StorageTimeout(
                f"{what}: no answer {where} within the read timeout of {self.settings.read_timeout:g}s "
                f"(storage.azure.read_timeout), {attempts}"
            )
        if isinstance(e, az.ServiceRequestTimeoutError):
            return base.StorageTimeout(
                f"{what}: could not connect {where} within the connect timeout of "
                f"{self.settings.connect_timeout:g}s (storage.azure.connect_timeout), {attempts}"
            )
        if isinstance(e, az.ServiceRequestError):
            text = str(e)
            if "SSL" in text or "CERTIFICATE" in text.upper():
                return base.StorageError(f"{what}: TLS failure {where}: {text}")
            return base.StorageUnavailable(f"{what}: cannot reach {where} after {attempts}: {text}")
        if isinstance(e, (az.ServiceResponseError, az.IncompleteReadError, az.DecodeError)):
            return base.StorageUnavailable(
                f"{what}: the connection {where} broke while the answer arrived, after {attempts}: {e}"
            )
        if isinstance(e, az.AzureError):
            return base.StorageError(f"{what}: {where}: {type(e).__name__}: {e}")
        return base.StorageError(f"{what}: unexpected {type(e).__name__}: {e}")

    # -- the contract ----------------------------------------------------------------------
    def _new_upload(self, key: str) -> base.StreamingUpload:
        return _AzureUpload(self, self._check_name(key))

    def get(self, key: str) -> bytes:
        blob = self._blob(key)
        try:
            data: bytes = blob.download_blob(max_concurrency=1).readall()
        except Exception as e:
            raise self._translate(e, "GET", key) from e
        return self._received(data)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise InvalidArgument(f"invalid range [{start}, {end}] for {key}")
        blob = self._blob(key)
        try:
            download = blob.download_blob(offset=start, length=end - start + 1, max_concurrency=1)
            data: bytes = self._received(download.readall())
        except Exception as e:
            raise self._translate(e, "GET", key, start=start) from e
        content_range = str(download.properties.content_range or "")  # "bytes a-b/total"
        total = int(content_range.rpartition("/")[2]) if "/" in content_range else start + len(data)
        if start >= total:  # Azure answers 416; Azurite a 206 "bytes 100-99/100" when start == size
            raise base.InvalidRange(key, start, total)
        if len(data) > end - start + 1:
            raise base.StorageError(
                f"GET {self.url(key)}: asked for {end - start + 1} bytes (bytes={start}-{end}), "
                f"got {len(data)}"
            )
        return data

    def size(self, key: str) -> int:
        blob = self._blob(key)
        try:
            return int(blob.get_blob_properties().size)
        except Exception as e:
            raise self._translate(e, "HEAD", key) from e

    def delete(self, key: str) -> None:
        blob = self._blob(key)
        try:
            blob.delete_blob(delete_snapshots="include")
        except Exception as e:
            err = self._translate(e, "DELETE", key)
            if isinstance(err, base.ObjectNotFound):
                return
            raise err from e

    def delete_many(self, keys: Iterable[str]) -> None:
        self._delete_each(keys, self.settings.delete_concurrency)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[base.ObjectInfo]:
        pages = self._container.list_blobs(name_starts_with=prefix or None, results_per_page=5000).by_page()
        while True:
            try:
                page = next(pages, None)
                if page is None:
                    return
                items = list(page)
            except Exception as e:
                raise self._translate(e, "LIST", None) from e
            for item in items:
                if start_after is not None and item.name <= start_after:
                    continue  # the List Blobs API has no start key: filtered here
                modified = item.last_modified
                if modified.tzinfo is None:
                    modified = modified.replace(tzinfo=datetime.UTC)
                yield base.ObjectInfo(item.name, int(item.size), modified.astimezone(datetime.UTC))

    # -- start-up check ---------------------------------------------------------------------
    def check(self) -> None:
        where = f"at {self._endpoint}"
        try:
            pages = self._container.list_blobs(
                name_starts_with=self.probe_prefix or None, results_per_page=1
            ).by_page()
            list(next(pages, []))
        except Exception as e:
            err = self._translate(e, "LIST", None)
            if isinstance(err, (base.StorageUnavailable, base.StorageTimeout)):
                raise type(err)(
                    f"storage.azure: cannot reach the Blob service for container {self.bucket!r} {where}: "
                    f"{err}; credentials: {self.credential_source()}"
                ) from e
            if "does not exist" in str(err):
                raise ConfigError(
                    f"storage.azure.container: container {self.bucket!r} does not exist {where}; "
                    f"credentials: {self.credential_source()}"
                ) from e
            raise ConfigError(
                f"storage.azure: container {self.bucket!r} {where} is not accessible ({err})"
            ) from e
        if self.settings.startup_write_check:
            self._write_probe(
                "the identity needs the role Storage Blob Data Contributor (or a SAS with permissions "
                f"racwdl); credentials: {self.credential_source()}"
            )

    def close(self) -> None:
        self._shutdown_pool()
        self._service.close()
        if self._token_credential is not None:
            self._token_credential.close()


class _AzureUpload(base.StreamingUpload):
    """One Put Blob up to ``block_size``; above it, staged blocks and one Put Block List."""

    def __init__(self, store: AzureObjectStore, key: str):
        super().__init__(
            store,
            key,
            part_size=store.settings.block_size,
            window=store.settings.max_blocks_in_flight,
            max_parts=MAX_BLOCKS,
            part_size_key="storage.azure.block_size",
        )
        self._az = store
        self._blob = store._blob(key)
        self._upload_id = uuid.uuid4().hex
        self._blocks: dict[int, str] = {}
        self._blocks_lock = threading.Lock()

    def _translate(self, e: Exception) -> RsmError:
        return self._az._translate(e, "upload", self._key)

    def _call(self, op: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise self._az._translate(e, op, self._key) from e

    def _put_whole(self, body: bytearray) -> None:
        self._call(
            "PUT",
            self._blob.upload_blob,
            bytes(body),  # the SDK takes bytes or a stream (which it reads into bytes): one copy
            length=len(body),
            overwrite=True,
            max_concurrency=1,
            validate_content=self._az.settings.checksum,
        )

    def _start(self) -> None:
        pass  # blocks are staged under the blob's name: there is no session to open

    def _block_id(self, number: int) -> str:
        # the same length for every block of every upload (Azure requires it per blob); the SDK
        # sends it base64-encoded
        return f"{self._upload_id}-{number:05d}"

    def _send_part(self, number: int, offset: int, part: bytearray) -> None:
        block_id = self._block_id(number)
        self._call(
            "PUT_BLOCK",
            self._blob.stage_block,
            block_id,
            base.BufferBody(part),  # streamed and MD5-summed without a copy
            length=len(part),
            validate_content=self._az.settings.checksum,
        )
        with self._blocks_lock:
            self._blocks[number] = block_id

    def _finish(self, number: int, offset: int, last: bytearray) -> None:
        blocks = self._send_last(number, offset, last, self._blocks, "blocks")
        self._call("PUT_BLOCK_LIST", self._blob.commit_block_list, [BlobBlock(block_id=b) for b in blocks])

    def _cancel(self) -> None:
        # Azure has no request that discards staged blocks; see the module docstring.
        log.debug(
            "upload of %s aborted: %d staged block(s) stay uncommitted until the service drops them",
            self.url,
            len(self._blocks),
        )
