"""Fixtures for the storage backends: real servers on loopback, started by the tests.

* ``seaweedfs`` (session): SeaweedFS ``weed mini`` enforcing SigV4 for one identity
  (:data:`S3_ACCESS_KEY`/:data:`S3_SECRET_KEY`), with the bucket :data:`S3_BUCKET`.
* ``fake_gcs`` (session): fake-gcs-server with the bucket :data:`GCS_BUCKET`.
* ``s3_store``/``gcs_store`` (function): a fresh store on those servers, closed afterwards.
* ``s3_server_factory``/``gcs_server_factory`` (function): private servers for fault tests
  (stopped, restarted, paused), each stopped at the end of the test.

The servers are installed into ``$RSM_CACHE_DIR`` on first use (devstack.s3server,
devstack.gcsserver). Cloud credentials of the machine never reach the tests: the AWS and
Google variables are cleared and the instance-metadata lookups of both SDKs are disabled,
so nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import os

# Before boto3/google-auth are imported anywhere: never ask a cloud metadata service.
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
os.environ["NO_GCE_CHECK"] = "true"

import pytest

from devstack.gcsserver import FakeGcsServer
from devstack.s3server import SeaweedS3Server

S3_BUCKET = "rsm-test"
S3_ACCESS_KEY = "rsm-test-access-key"
S3_SECRET_KEY = "rsm-test-secret-key-123456"
GCS_BUCKET = "rsm-test"
MiB = 1024 * 1024


@pytest.fixture(scope="package", autouse=True)
def _isolated_cloud_environment(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_EC2_METADATA_DISABLED":
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


# -- S3 ---------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    server = SeaweedS3Server(
        tmp_path_factory.mktemp("seaweedfs"), access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY
    )
    with server:
        server.create_bucket(S3_BUCKET)
        yield server


def make_s3_store(server: SeaweedS3Server, bucket: str = S3_BUCKET, probe_prefix: str = "", **overrides):
    from rsm_sidecar.storage.s3 import S3ObjectStore
    from rsm_sidecar.storage.s3_settings import S3Settings

    kwargs = dict(
        region="us-east-1",
        endpoint_url=server.endpoint_url,
        addressing_style="path",
        access_key_id=S3_ACCESS_KEY,
        secret_access_key=S3_SECRET_KEY,
        part_size=5 * MiB,
        max_parts_in_flight=2,
        upload_threads=4,
        connect_timeout=2.0,
        read_timeout=20.0,
        max_attempts=3,
    )
    kwargs.update(overrides)
    return S3ObjectStore(S3Settings(bucket=bucket, **kwargs), probe_prefix=probe_prefix)


@pytest.fixture
def s3_store(seaweedfs):
    store = make_s3_store(seaweedfs)
    yield store
    store.close()


@pytest.fixture
def s3_server_factory(tmp_path_factory):
    """Start private SeaweedFS servers (bucket created); all stopped after the test."""
    started: list[SeaweedS3Server] = []

    def start(bucket: str = S3_BUCKET, **kwargs) -> SeaweedS3Server:
        kwargs.setdefault("access_key", S3_ACCESS_KEY)
        kwargs.setdefault("secret_key", S3_SECRET_KEY)
        server = SeaweedS3Server(tmp_path_factory.mktemp("seaweedfs-private"), **kwargs)
        started.append(server)
        server.start()
        server.create_bucket(bucket)
        return server

    yield start
    for server in started:
        server.stop()


# -- GCS --------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory):
    server = FakeGcsServer(tmp_path_factory.mktemp("fake-gcs"), backend="memory")  # 7x faster than files
    with server:
        server.create_bucket(GCS_BUCKET)
        yield server


def make_gcs_store(server: FakeGcsServer, bucket: str = GCS_BUCKET, probe_prefix: str = "", **overrides):
    from rsm_sidecar.storage.gcs import GcsObjectStore
    from rsm_sidecar.storage.gcs_settings import GcsSettings

    kwargs = dict(
        endpoint_url=server.endpoint_url,
        credentials="anonymous",
        project="rsm-test",
        chunk_size=1 * MiB,
        connect_timeout=2.0,
        read_timeout=20.0,
        max_attempts=3,
    )
    kwargs.update(overrides)
    return GcsObjectStore(GcsSettings(bucket=bucket, **kwargs), probe_prefix=probe_prefix)


@pytest.fixture
def gcs_store(fake_gcs):
    store = make_gcs_store(fake_gcs)
    yield store
    store.close()


@pytest.fixture
def gcs_server_factory(tmp_path_factory):
    started: list[FakeGcsServer] = []

    def start(bucket: str = GCS_BUCKET, **kwargs) -> FakeGcsServer:
        server = FakeGcsServer(tmp_path_factory.mktemp("fake-gcs-private"), **kwargs)
        started.append(server)
        server.start()
        server.create_bucket(bucket)
        return server

    yield start
    for server in started:
        server.stop()
