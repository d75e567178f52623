"""The ObjectStore contract on S3 (SeaweedFS), plus what only the S3 backend does:
single PUT vs multipart, the bounded part window, aborts, SSE and checksum headers,
DeleteObjects batching and per-key errors, and faults against real servers."""

from __future__ import annotations

import threading
import time

import pytest

from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage.base import ObjectNotFound, StorageError, StorageUnavailable
from rsm_sidecar.storage.factory import open_store
from rsm_sidecar.storage.s3 import S3ObjectStore
from rsm_sidecar.storage.s3_settings import S3Settings
from tests.storage.conftest import (
    S3,
    S3_ACCESS_KEY,
    S3_BUCKET,
    S3_SECRET_KEY,
    CannedEndpoint,
    make_s3_store,
)
from tests.storage.contract import RemoteStoreContract, blob, request_delta

MiB = 1024 * 1024
PART = 5 * MiB


class TestS3Contract(RemoteStoreContract):
    remote = S3

    def undeletable(self, p):
        # SeaweedFS refuses keys with "." path segments with a per-key InvalidRequest.
        return p + "../escape", "InvalidRequest"

    def upload_requests(self, parts):
        return {"CREATE_MULTIPART": 1, "UPLOAD_PART": parts, "COMPLETE_MULTIPART": 1}

    def test_object_above_the_part_size_is_parts_and_one_commit(self, store, server, p):
        super().test_object_above_the_part_size_is_parts_and_one_commit(store, p)
        assert _open_uploads(server, p) == []

    def bounded_upload(self):
        # the window (2 parts) plus the part being filled, botocore's 1 MiB checksum reads per part
        # in flight, the test's 1 MiB piece and request objects; one more copy of a part adds 5 MiB
        return {"max_parts_in_flight": 2, "upload_threads": 8}, 2 * PART, 3 * PART + 4.5 * MiB, True

    def transport_errors(self):
        import botocore.exceptions as bc

        return {
            "read_timeout": bc.ReadTimeoutError(endpoint_url="u"),
            "connect_timeout": bc.ConnectTimeoutError(endpoint_url="u"),
            "refused": bc.EndpointConnectionError(endpoint_url="u"),
        }

    def small_pages(self, store, monkeypatch, size):
        original = store._client.list_objects_v2
        monkeypatch.setattr(store._client, "list_objects_v2", lambda **kw: original(**dict(kw, MaxKeys=size)))

    def configured(self, server):
        table = {
            "bucket": S3_BUCKET,
            "region": "us-east-1",
            "endpoint_url": server.endpoint_url,
            "addressing_style": "path",
            "access_key_id": S3_ACCESS_KEY,
            "secret_access_key": S3_SECRET_KEY,
            "part_size": "6MiB",
            "max_parts_in_flight": 3,
            "sse": "AES256",
            "checksum_algorithm": "SHA256",
            "read_timeout": 7,
            "max_attempts": 4,
        }
        return table, {"part_size": 6 * MiB, "max_parts_in_flight": 3, "sse": "AES256", "read_timeout": 7.0}

    def check_configured_store(self, store):
        assert store._client.meta.config.read_timeout == 7
        assert store._client.meta.config.retries["total_max_attempts"] == 4

    def test_garbage_collected_writer_cancels_its_upload(self, store, server, p):
        super().test_garbage_collected_writer_cancels_its_upload(store, p)
        assert _open_uploads(server, p) == []


def _open_uploads(server, prefix: str) -> list:
    return server.client().list_multipart_uploads(Bucket=S3_BUCKET, Prefix=prefix).get("Uploads", [])


class HeaderCapture:
    """Records the headers of the real requests a store's client sends (botocore event hook)."""

    def __init__(self, store: S3ObjectStore):
        self.requests: list[tuple[str, str, dict]] = []
        store._client.meta.events.register("before-send.s3.*", self)

    def __call__(self, request, **kwargs):
        op = kwargs.get("event_name", "").rsplit(".", 1)[-1]
        headers = {k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()}
        self.requests.append((op, request.method, headers))

    def of(self, op: str) -> list[dict]:
        return [h for o, _, h in self.requests if o == op]


def put_small_and_multipart(store: S3ObjectStore, small: str, big: str) -> HeaderCapture:
    """Write ``small`` (one PutObject) and ``big`` (a multipart upload of two parts), capturing
    the headers of every request."""
    cap = HeaderCapture(store)
    store.put(small, b"secret")
    with store.open_writer(big) as w:
        w.write(blob(PART + 1))
        w.commit()
    return cap


# -- upload paths ---------------------------------------------------------------------------


@pytest.fixture
def one_part_window_store(seaweedfs):
    store = make_s3_store(seaweedfs, max_parts_in_flight=1)
    yield store
    store.close()


def test_write_blocks_while_the_window_is_full(one_part_window_store, p):
    store = one_part_window_store
    # Hold every UploadPart request on its way out until the gate opens: the parts stay
    # "in flight" for as long as the test needs, whatever the server's speed.
    gate = threading.Event()
    store._client.meta.events.register("before-send.s3.UploadPart", lambda **kw: gate.wait(30) and None)
    w = store.open_writer(p + "blocked")
    w.write(blob(PART + 1))  # part 1 is full; the byte past it sends part 1
    done = threading.Event()
    progress = []

    def producer():
        w.write(blob(PART - 1))  # completes part 2 in the buffer
        progress.append("part 2 buffered")
        w.write(b"x")  # must hand part 2 over: the window (1 part) is taken
        progress.append("wrote past part 2")
        done.set()

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    time.sleep(1.0)
    try:
        assert progress == ["part 2 buffered"]
        assert not done.is_set()
        assert store.buffered_bytes == PART  # the window holds exactly part 1
    finally:
        gate.set()
    assert done.wait(30)
    w.commit()
    assert store.size(p + "blocked") == 2 * PART + 1
    assert store.peak_buffered_bytes == PART


# -- aborts ------------------------------------------------------------------------------------
def test_abort_after_parts_were_uploaded_leaves_no_multipart_upload(s3_store, seaweedfs, p):
    w = s3_store.open_writer(p + "ab")
    w.write(blob(3 * PART))  # two parts sent, a third buffered
    assert len(_open_uploads(seaweedfs, p)) == 1
    w.abort()
    assert s3_store.requests.get("ABORT_MULTIPART", 0) == 1
    assert _open_uploads(seaweedfs, p) == []
    assert not s3_store.exists(p + "ab")


def test_exception_in_with_block_aborts_the_multipart_upload(s3_store, seaweedfs, p):
    with pytest.raises(ValueError):
        with s3_store.open_writer(p + "ex") as w:
            w.write(blob(2 * PART + 10))
            raise ValueError("producer failed")
    assert _open_uploads(seaweedfs, p) == []
    assert not s3_store.exists(p + "ex")


def test_part_rejected_by_the_server_aborts_the_upload(s3_store, seaweedfs, p):
    # Corrupt the body of the second part after the SDK computed its checksum: SeaweedFS
    # recomputes it and rejects the part (BadDigest), a real server-side failure.
    calls = []

    def corrupt(request, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            body = request.body
            data = body.read() if hasattr(body, "read") else bytes(body)
            request.body = b"X" + data[1:]

    s3_store._client.meta.events.register("before-send.s3.UploadPart", corrupt)
    with pytest.raises(StorageError) as e:
        with s3_store.open_writer(p + "bad") as w:
            w.write(blob(4 * PART))
            w.commit()
    assert "BadDigest" in str(e.value) and p + "bad" in str(e.value)
    assert not e.value.retriable
    assert s3_store.requests.get("ABORT_MULTIPART", 0) == 1
    assert _open_uploads(seaweedfs, p) == []
    assert not s3_store.exists(p + "bad")


# -- encryption, storage class and checksums -----------------------------------------------------
def test_sse_s3_header_is_sent_and_honoured(seaweedfs, p):
    store = make_s3_store(seaweedfs, sse="AES256")
    try:
        cap = put_small_and_multipart(store, p + "small", p + "big")
        assert cap.of("PutObject")[0]["x-amz-server-side-encryption"] == "AES256"
        assert cap.of("CreateMultipartUpload")[0]["x-amz-server-side-encryption"] == "AES256"
        head = seaweedfs.client().head_object(Bucket=S3_BUCKET, Key=p + "small")
        assert head.get("ServerSideEncryption") == "AES256"
        assert store.get(p + "big") == blob(PART + 1)
    finally:
        store.close()


def test_sse_kms_headers_are_sent(seaweedfs, p):
    # SeaweedFS has no KMS configured, so it answers SSE-KMS writes with an InternalError;
    # what matters here is what the client sends, observed on the real request.
    store = make_s3_store(
        seaweedfs, sse="aws:kms", sse_kms_key_id="alias/rsm-test", sse_bucket_key=True, max_attempts=1
    )
    try:
        cap = HeaderCapture(store)
        with pytest.raises((StorageUnavailable, StorageError)) as e:
            store.put(p + "kms", b"secret")
        assert p + "kms" in str(e.value)
        h = cap.of("PutObject")[0]
        assert h["x-amz-server-side-encryption"] == "aws:kms"
        assert h["x-amz-server-side-encryption-aws-kms-key-id"] == "alias/rsm-test"
        assert h["x-amz-server-side-encryption-bucket-key-enabled"] == "true"
    finally:
        store.close()


def test_storage_class_is_applied(seaweedfs, p):
    store = make_s3_store(seaweedfs, storage_class="STANDARD_IA")
    try:
        store.put(p + "ia", b"x")
        assert seaweedfs.client().head_object(Bucket=S3_BUCKET, Key=p + "ia")["StorageClass"] == "STANDARD_IA"
    finally:
        store.close()


@pytest.mark.parametrize(
    "algorithm,header",
    [
        ("CRC32", "x-amz-checksum-crc32"),
        ("CRC32C", "x-amz-checksum-crc32c"),
        ("SHA256", "x-amz-checksum-sha256"),
    ],
)
def test_request_checksums_are_sent_and_stored(seaweedfs, p, algorithm, header):
    store = make_s3_store(seaweedfs, checksum_algorithm=algorithm)
    try:
        cap = put_small_and_multipart(store, p + "c", p + "m")
        assert header in cap.of("PutObject")[0]
        assert all(header in h for h in cap.of("UploadPart"))
        head = seaweedfs.client().head_object(Bucket=S3_BUCKET, Key=p + "c", ChecksumMode="ENABLED")
        assert head.get("Checksum" + algorithm)
    finally:
        store.close()


def test_checksums_can_be_turned_off(seaweedfs, p):
    store = make_s3_store(seaweedfs, checksum_algorithm="none")
    try:
        cap = HeaderCapture(store)
        store.put(p + "plain", b"x")
        assert not [k for k in cap.of("PutObject")[0] if k.startswith("x-amz-checksum-")]
    finally:
        store.close()


def test_crc32c_without_awscrt_is_a_config_error(monkeypatch):
    import botocore.compat

    monkeypatch.setattr(botocore.compat, "HAS_CRT", False)
    with pytest.raises(ConfigError) as e:
        S3ObjectStore(
            S3Settings(bucket="b", checksum_algorithm="CRC32C", access_key_id="a", secret_access_key="b")
        )
    assert "storage.s3.checksum_algorithm" in str(e.value) and "awscrt" in str(e.value)


# -- deletes -----------------------------------------------------------------------------------
def test_delete_objects_batches_of_1000(s3_store, p):
    import concurrent.futures

    keys = [f"{p}{i:05d}" for i in range(1001)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3_store.put(k, b"."), keys))
    before = s3_store.requests
    s3_store.delete_many(keys + [p + "never-existed"])
    assert request_delta(before, s3_store.requests) == {"DELETE_OBJECTS": 2}
    assert list(s3_store.list(p)) == []


# -- faults ------------------------------------------------------------------------------------
def test_abort_that_cannot_reach_the_server_is_retried_before_the_next_upload(s3_server_factory, p):
    server = s3_server_factory()
    # (a long read timeout: a restarted server under load can be slow to answer the next upload)
    store = make_s3_store(server, max_attempts=2, connect_timeout=1.0, read_timeout=30.0)
    key = p + "segment.log"
    try:
        w = store.open_writer(key)
        w.write(blob(2 * PART + 1))  # multipart upload created, parts sent
        assert len(_open_uploads(server, p)) == 1
        server.stop()
        with pytest.raises(StorageUnavailable) as e:
            w.write(blob(2 * PART))
            w.commit()
        assert key in str(e.value) and server.endpoint_url in str(e.value)
        # the abort could not reach the server either: remembered for later
        assert len(store.pending_aborts) == 1
        server.start()
        assert not store.exists(key)  # no partial object
        data = blob(2 * PART + 7, seed=4)
        with store.open_writer(key) as w2:  # retries the pending abort first
            w2.write(data)
            w2.commit()
        assert store.pending_aborts == []
        assert store.get(key) == data
        assert _open_uploads(server, p) == []
    finally:
        store.close()


def test_wrong_secret_fails_check_naming_bucket_endpoint_and_static_credentials(seaweedfs):
    store = make_s3_store(seaweedfs, secret_access_key="not-the-secret")
    try:
        with pytest.raises(ConfigError) as e:
            store.check()
        msg = str(e.value)
        assert S3_BUCKET in msg and seaweedfs.endpoint_url in msg
        assert "SignatureDoesNotMatch" in msg
        assert "static keys from storage.s3.access_key_id" in msg
        assert "not-the-secret" not in msg and S3_ACCESS_KEY not in msg
    finally:
        store.close()


def test_unknown_key_from_environment_names_the_environment(seaweedfs, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "whatever-secret")
    store = make_s3_store(seaweedfs, access_key_id=None, secret_access_key=None)
    try:
        with pytest.raises(ConfigError) as e:
            store.check()
        msg = str(e.value)
        assert "InvalidAccessKeyId" in msg and "environment variables AWS_ACCESS_KEY_ID" in msg
        assert "…0001" in msg and "AKIAUNKNOWNKEY0001" not in msg and "whatever-secret" not in msg
    finally:
        store.close()


def test_profile_from_shared_credentials_file(seaweedfs, tmp_path, monkeypatch, p):
    creds = tmp_path / "credentials"
    creds.write_text(
        f"[rsm]\naws_access_key_id = {S3_ACCESS_KEY}\naws_secret_access_key = {S3_SECRET_KEY}\n"
        "[broken]\naws_access_key_id = AKIABROKEN\naws_secret_access_key = nope\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    good = make_s3_store(seaweedfs, access_key_id=None, secret_access_key=None, profile="rsm")
    bad = make_s3_store(seaweedfs, access_key_id=None, secret_access_key=None, profile="broken")
    try:
        good.check()
        good.put(p + "via-profile", b"ok")
        with pytest.raises(ConfigError) as e:
            bad.check()
        assert "shared credentials file" in str(e.value) and "'broken'" in str(e.value)
    finally:
        good.close()
        bad.close()


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "s3,needle",
    [
        ({"access_key_id": "a"}, "must be set together"),
        ({"sse_kms_key_id": "k"}, "storage.s3.sse"),
        ({"part_size": "1MiB"}, "storage.s3.part_size"),
        ({"profile": "x", "access_key_id": "a", "secret_access_key": "b"}, "exclusive"),
    ],
)
def test_invalid_configuration_names_the_key(s3, needle):
    with pytest.raises(ConfigError) as e:
        open_store(Config({"storage": {"backend": "s3", "s3": {"bucket": "b", **s3}}}, environ={}))
    assert needle in str(e.value)


def test_bucket_is_required_for_the_s3_backend():
    with pytest.raises(ConfigError) as e:
        Config({"storage": {"backend": "s3"}}, environ={})
    assert "storage.s3.bucket" in str(e.value)


def test_head_bucket_denied_but_listing_under_the_prefix_allowed_passes_check(seaweedfs, p):
    # A policy that scopes s3:ListBucket to the key prefix denies HeadBucket. SeaweedFS has
    # no such policies, so the 403 of HeadBucket is injected (a botocore hook answers in
    # place of the server); the ListObjectsV2, PUT and DELETE that follow are real.
    from botocore.awsrequest import AWSResponse

    class EmptyBody:
        def stream(self, **kwargs):
            return iter([b""])

    store = make_s3_store(seaweedfs, probe_prefix=p)
    store._client.meta.events.register(
        "before-send.s3.HeadBucket", lambda request, **kw: AWSResponse(request.url, 403, {}, EmptyBody())
    )
    try:
        before = store.requests
        store.check()
        assert request_delta(before, store.requests) == {"HEAD_BUCKET": 1, "LIST": 1, "PUT": 1, "DELETE": 1}
    finally:
        store.close()


def _fake_sts(access_key: str, secret_key: str) -> CannedEndpoint:
    """A local stand-in for STS's AssumeRoleWithWebIdentity (the real one is on the internet):
    it records the web identity token it is given and returns these credentials."""
    body = f"""<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <Credentials><AccessKeyId>{access_key}</AccessKeyId><SecretAccessKey>{secret_key}</SecretAccessKey>
      <SessionToken>session-token-from-sts</SessionToken><Expiration>2099-01-01T00:00:00Z</Expiration></Credentials>
    <AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/rsm/pod</Arn><AssumedRoleId>AROA1:pod</AssumedRoleId></AssumedRoleUser>
  </AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"""
    return CannedEndpoint(200, "text/xml", body.encode())


def test_web_identity_irsa_credentials_are_resolved_and_named(seaweedfs, tmp_path, monkeypatch, p):
    # boto3's own web-identity provider runs for real: it reads the projected token file and
    # calls AssumeRoleWithWebIdentity (on a local stand-in for STS), then signs with the
    # temporary credentials. SeaweedFS does not accept session credentials it did not issue
    # (InvalidAccessKeyId), so the request is refused - and the error must say the
    # credentials came from the web identity token and which role.
    sts = _fake_sts("ASIATEMPORARYKEY0042", "temporary-secret")
    token = tmp_path / "token"
    token.write_text("eyJ.projected-service-account-token.sig")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/rsm")
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts.url)
    store = make_s3_store(seaweedfs, access_key_id=None, secret_access_key=None, probe_prefix=p)
    try:
        with pytest.raises(ConfigError) as e:
            store.check()
        msg = str(e.value)
        assert "InvalidAccessKeyId" in msg and S3_BUCKET in msg and seaweedfs.endpoint_url in msg
        assert "web identity token (IRSA" in msg and "role arn:aws:iam::123456789012:role/rsm" in msg
        assert "…0042" in msg and "ASIATEMPORARYKEY0042" not in msg and "temporary-secret" not in msg
        assert len(sts.calls) == 1 and sts.calls[0].form["Action"] == ["AssumeRoleWithWebIdentity"]
        assert sts.calls[0].form["WebIdentityToken"] == ["eyJ.projected-service-account-token.sig"]
        assert sts.calls[0].form["RoleArn"] == ["arn:aws:iam::123456789012:role/rsm"]
    finally:
        store.close()
        sts.close()


# -- error translation (what botocore raises -> the contract's errors) --------------------------
@pytest.mark.parametrize(
    "code,status,expected",
    [
        ("SlowDown", 503, StorageUnavailable),
        ("ServiceUnavailable", 503, StorageUnavailable),
        ("InternalError", 500, StorageUnavailable),
        ("", 502, StorageUnavailable),
        ("ThrottlingException", 400, StorageUnavailable),
        ("RequestTimeout", 400, StorageUnavailable),
        ("AccessDenied", 403, StorageError),
        ("InvalidAccessKeyId", 403, StorageError),
        ("SignatureDoesNotMatch", 403, StorageError),
        ("NoSuchBucket", 404, StorageError),
        ("NoSuchKey", 404, ObjectNotFound),
        ("InvalidRange", 416, "InvalidRange"),
        ("InvalidArgument", 400, StorageError),
        ("NoSuchUpload", 404, StorageUnavailable),
    ],
)
def test_client_errors_are_translated(code, status, expected):
    import botocore.exceptions

    from rsm_sidecar.storage.base import InvalidRange

    expected = InvalidRange if expected == "InvalidRange" else expected
    store = S3.make_store(
        None, bucket="bkt", access_key_id="AKIAEXAMPLE0001", secret_access_key="secret-value"
    )
    try:
        e = botocore.exceptions.ClientError(
            {"Error": {"Code": code, "Message": "msg"}, "ResponseMetadata": {"HTTPStatusCode": status}},
            "GetObject",
        )
        err = store._translate(e, "GET", "some/key")
        assert type(err) is expected
        if expected is StorageError and status == 403:
            assert "static keys" in str(err) and "…0001" in str(err) and "secret-value" not in str(err)
        if expected is not ObjectNotFound and expected is not InvalidRange:
            assert "bkt" in str(err) and "http://127.0.0.1:9" in str(err)
    finally:
        store.close()


def test_missing_credentials_are_a_storage_error_naming_them():
    import botocore.exceptions

    store = S3.make_store(None, bucket="bkt")
    try:
        c = store._translate(botocore.exceptions.NoCredentialsError(), "GET", "k")
        assert type(c) is StorageError and "credentials" in str(c)
    finally:
        store.close()
