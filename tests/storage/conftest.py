"""Fixtures for the storage backends: real servers on loopback, started by the tests.

* ``seaweedfs`` (session): SeaweedFS ``weed mini`` enforcing SigV4 for one identity
  (:data:`S3_ACCESS_KEY`/:data:`S3_SECRET_KEY`), with the bucket :data:`S3_BUCKET`.
* ``fake_gcs`` (session): fake-gcs-server with the bucket :data:`GCS_BUCKET`.
* ``azurite`` (session): Azurite's Blob service (blobs in memory) serving the account
  :data:`AZURE_ACCOUNT` with the key :data:`AZURE_KEY` (random per test run), with the
  container :data:`AZURE_CONTAINER`.
* ``s3_store``/``gcs_store``/``azure_store`` (function): a fresh store on those servers, closed
  afterwards.
* ``s3_server_factory``/``gcs_server_factory``/``azure_server_factory`` (function): private
  servers for fault tests (stopped, restarted, paused; Azurite's keep their blobs on disk), each
  stopped at the end of the test.

The servers are installed into ``$RSM_CACHE_DIR`` on first use (devstack.s3server,
devstack.gcsserver, devstack.azurite). Cloud credentials of the machine never reach the tests:
the AWS, Google and Azure variables are cleared and the instance-metadata lookups of the AWS and
Google SDKs are disabled, so nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import base64
import dataclasses
import http.server
import importlib
import os
import threading
import urllib.parse
import uuid
from typing import Any

# Before boto3/google-auth are imported anywhere: never ask a cloud metadata service.
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ["NO_GCE_CHECK"] = "true"

import pytest

from devstack.azurite import AzuriteServer
from devstack.gcsserver import FakeGcsServer
from devstack.s3server import SeaweedS3Server
from rsm_sidecar.storage.factory import backend_module

S3_BUCKET = "rsm-test"
S3_ACCESS_KEY = "rsm-test-access-key"
S3_SECRET_KEY = "rsm-test-secret-key-123456"
GCS_BUCKET = "rsm-test"
AZURE_CONTAINER = "rsm-test"
AZURE_ACCOUNT = "rsmtest"
AZURE_KEY = base64.b64encode(os.urandom(64)).decode()  # the emulator's account key, made per test run
MiB = 1024 * 1024


@pytest.fixture(scope="package", autouse=True)
def _isolated_cloud_environment(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_EC2_METADATA_DISABLED":
            mp.delenv(name)
    for name in list(os.environ):
        if name.startswith(("AZURE_", "IDENTITY_", "MSI_", "AZURITE_")):
            mp.delenv(name)
    for name in (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "STORAGE_EMULATOR_HOST",
        "GOOGLE_CLOUD_PROJECT",
        "CLOUDSDK_CONFIG",
        "API_ENDPOINT_OVERRIDE",
    ):
        mp.delenv(name, raising=False)
    home = tmp_path_factory.mktemp("cloud-home")
    mp.setenv("AWS_CONFIG_FILE", str(home / "aws-config"))
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "aws-credentials"))
    mp.setenv("CLOUDSDK_CONFIG", str(home / "gcloud"))
    yield
    mp.undo()


@pytest.fixture
def p() -> str:
    """A unique key prefix for one test (backends share their buckets)."""
    return f"t-{uuid.uuid4().hex[:12]}/"


@dataclasses.dataclass(frozen=True)
class Call:
    """One request a :class:`CannedEndpoint` answered."""

    method: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    form: dict[str, list[str]]  # of a POST


class CannedEndpoint:
    """A local HTTP endpoint standing in for a cloud token service that exists only on the
    internet or inside the cloud (AWS STS, Google OAuth, Azure's managed identity endpoint): it
    records every GET and POST in ``calls`` and answers each with ``status``, ``content_type``
    and ``body``."""

    def __init__(self, status: int, content_type: str, body: bytes, path: str = ""):
        calls: list[Call] = []
        self.calls = calls

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, form: str = "") -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                calls.append(Call(self.command, query, dict(self.headers), urllib.parse.parse_qs(form)))
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._answer()

            def do_POST(self):
                self._answer(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- servers and stores ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RemoteBackend:
    """How the tests start one remote backend's server and open stores on it."""

    name: str  # storage.backend
    server_fixture: str  # the session's shared server
    store_class: str  # in the backend's module
    settings_class: str  # in rsm_sidecar.storage.<name>_settings
    server_class: type
    bucket: str
    server_options: dict[str, Any]
    store_options: dict[str, Any]  # besides the endpoint
    part_setting: str  # the setting that sizes upload parts
    # the request that cancels an upload session; None: the service has none (Azure drops staged
    # blocks by itself), the backend's test checks what an abort leaves instead
    cancel_request: str | None
    check_requests: dict[str, int]  # what check() sends with the start-up write check
    credentials: str  # how errors name the credentials of the test stores
    bucket_setting: str = "bucket"  # the setting that names the bucket (Azure: container)
    delete_request: str = "DELETE"  # what delete_many sends
    delete_batch: int = 1  # keys per such request

    def delete_requests(self, keys: int) -> dict[str, int]:
        """The requests ``delete_many`` of ``keys`` keys sends."""
        return {self.delete_request: -(-keys // self.delete_batch)}

    @property
    def part_size(self) -> int:
        """The part size of the test stores."""
        return int(self.store_options[self.part_setting])

    def server(self, directory, **options):
        return self.server_class(directory, **{**self.server_options, **options})

    def settings_type(self) -> Any:
        module = importlib.import_module(f"rsm_sidecar.storage.{self.name}_settings")
        return getattr(module, self.settings_class)

    def make_store(self, server, bucket: str | None = None, probe_prefix: str = "", **overrides):
        store_type = getattr(backend_module(self.name), self.store_class)
        """A store on ``server``; ``None``: on an endpoint where nothing listens (no request is
        meant to succeed)."""
        endpoint = server.endpoint_url if server is not None else "http://127.0.0.1:9"  # discard port
        options = {**self.store_options, "endpoint_url": endpoint, **overrides}
        settings = self.settings_type()(**{self.bucket_setting: bucket or self.bucket}, **options)
        return store_type(settings, probe_prefix=probe_prefix)


S3 = RemoteBackend(
    "s3",
    "seaweedfs",
    "S3ObjectStore",
    "S3Settings",
    SeaweedS3Server,
    S3_BUCKET,
    {"access_key": S3_ACCESS_KEY, "secret_key": S3_SECRET_KEY},
    {
        "region": "us-east-1",
        "addressing_style": "path",
        "access_key_id": S3_ACCESS_KEY,
        "secret_access_key": S3_SECRET_KEY,
        "part_size": 5 * MiB,
        "max_parts_in_flight": 2,
        "upload_threads": 4,
        "connect_timeout": 2.0,
        "read_timeout": 20.0,
        "max_attempts": 3,
    },
    "part_size",
    "ABORT_MULTIPART",
    {"HEAD_BUCKET": 1, "PUT": 1, "DELETE": 1},
    "static keys from storage.s3.access_key_id",
    delete_request="DELETE_OBJECTS",
    delete_batch=1000,
)
GCS = RemoteBackend(
    "gcs",
    "fake_gcs",
    "GcsObjectStore",
    "GcsSettings",
    FakeGcsServer,
    GCS_BUCKET,
    {},
    {
        "credentials": "anonymous",
        "project": "rsm-test",
        "chunk_size": 1 * MiB,
        "connect_timeout": 2.0,
        "read_timeout": 20.0,
        "max_attempts": 3,
    },
    "chunk_size",
    "CANCEL_RESUMABLE",
    {"LIST": 1, "PUT": 1, "DELETE": 1},
    "anonymous",
)

AZURE = RemoteBackend(
    "azure",
    "azurite",
    "AzureObjectStore",
    "AzureSettings",
    AzuriteServer,
    AZURE_CONTAINER,
    {"account": AZURE_ACCOUNT, "account_key": AZURE_KEY},
    {
        "account_name": AZURE_ACCOUNT,
        "account_key": AZURE_KEY,
        "block_size": 1 * MiB,
        "max_blocks_in_flight": 2,
        "upload_threads": 4,
        "connect_timeout": 2.0,
        "read_timeout": 20.0,
        "max_attempts": 3,
    },
    "block_size",
    None,
    {"LIST": 1, "PUT": 1, "DELETE": 1},
    f"shared key of account {AZURE_ACCOUNT}",
    bucket_setting="container",
)


def make_s3_store(server: SeaweedS3Server, bucket: str = S3_BUCKET, **overrides):
    return S3.make_store(server, bucket, **overrides)


def make_gcs_store(server: FakeGcsServer, bucket: str = GCS_BUCKET, **overrides):
    return GCS.make_store(server, bucket, **overrides)


def make_azure_store(server: AzuriteServer, container: str = AZURE_CONTAINER, **overrides):
    return AZURE.make_store(server, container, **overrides)


def _fixtures(remote: RemoteBackend, **shared_options: Any) -> tuple[Any, Any, Any]:
    """A backend's three fixtures: the session's shared server (``remote.server_fixture``, its
    bucket created; ``shared_options`` for its server), ``<name>_server_factory`` (private servers
    for fault tests, each stopped after the test) and ``<name>_store`` (a fresh store on the shared
    server, closed after the test)."""

    @pytest.fixture(scope="session", name=remote.server_fixture)
    def server(tmp_path_factory):
        srv = remote.server(tmp_path_factory.mktemp(remote.server_fixture), **shared_options)
        with srv:
            srv.create_bucket(remote.bucket)
            yield srv

    @pytest.fixture(name=f"{remote.name}_server_factory")
    def server_factory(tmp_path_factory):
        started = []

        def start(bucket: str | None = None, **options):
            srv = remote.server(tmp_path_factory.mktemp(f"{remote.name}-private"), **options)
            started.append(srv)
            srv.start()
            srv.create_bucket(bucket or remote.bucket)
            return srv

        yield start
        for srv in started:
            srv.stop()

    @pytest.fixture(name=f"{remote.name}_store")
    def store(request):
        opened = remote.make_store(request.getfixturevalue(remote.server_fixture))
        yield opened
        opened.close()

    return server, server_factory, store


seaweedfs, s3_server_factory, s3_store = _fixtures(S3)
fake_gcs, gcs_server_factory, gcs_store = _fixtures(GCS, backend="memory")  # 7x faster than files
# blobs in memory: faster; the private servers of the fault tests keep theirs on disk
azurite, azure_server_factory, azure_store = _fixtures(AZURE, in_memory=True)
