"""The ObjectStore contract on Azure Blob Storage (Azurite), plus what only the Azure backend
does: one Put Blob below the block size, staged blocks and one Put Block List above it, bounded
upload memory, Content-MD5 on uploads, what an abort leaves, the credential sources (shared key,
connection string, SAS) and how their refusals read, and faults against real servers."""

from __future__ import annotations

import base64
import json
import logging
import ssl
import subprocess
import sys
import time

import pytest
from azure.core.exceptions import ResourceNotFoundError

from devstack.azurite import AzuriteServer
from devstack.common import wait_for
from devstack.tls import self_signed
from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage.azure import AzureObjectStore, _operation
from rsm_sidecar.storage.azure_settings import AzureSettings
from rsm_sidecar.storage.base import StorageError, StorageUnavailable
from tests.storage.conftest import (
    AZURE,
    AZURE_ACCOUNT,
    AZURE_CONTAINER,
    AZURE_KEY,
    CannedEndpoint,
    make_azure_store,
)
from tests.storage.contract import RemoteStoreContract, blob, request_delta, traced_upload_peak

MiB = 1024 * 1024
BLOCK = 1 * MiB  # the block size of the test stores


def _blob_client(server, key: str):
    """The emulator's blob ``key`` through an SDK client of the test's own (not the store's)."""
    return server.service_client().get_blob_client(AZURE_CONTAINER, key)


def _block_lists(server, key: str) -> tuple[list[int], list[int]]:
    """Sizes of the committed and the uncommitted blocks of ``key`` (none before its first block
    is staged: the service has no blob of that name yet)."""
    try:
        committed, uncommitted = _blob_client(server, key).get_block_list("all")
    except ResourceNotFoundError:
        return [], []
    return [b.size for b in committed], [b.size for b in uncommitted]


class TestAzureContract(RemoteStoreContract):
    remote = AZURE

    def undeletable(self, p):
        # A ".." path segment would be resolved away by the HTTP client and address another blob:
        # the backend refuses such names before a request is sent.
        return p + "../escape", "invalid Azure blob name"

    def upload_requests(self, parts):
        return {"PUT_BLOCK": parts, "PUT_BLOCK_LIST": 1}

    def test_object_above_the_part_size_is_parts_and_one_commit(self, store, server, p):
        super().test_object_above_the_part_size_is_parts_and_one_commit(store, p)
        assert _block_lists(server, p + "big") == ([BLOCK, BLOCK, BLOCK, 5], [])

    def bounded_upload(self):
        # two blocks in flight, the one being filled, the test's piece and request objects; blocks
        # are streamed and MD5-summed without a copy (one more copy would add 4 MiB)
        return {"block_size": 4 * MiB, "max_blocks_in_flight": 2}, 2 * 4 * MiB, 3 * 4 * MiB + 3 * MiB, False

    def transport_errors(self):
        import azure.core.exceptions as az

        return {
            "read_timeout": az.ServiceResponseTimeoutError("read timed out"),
            "connect_timeout": az.ServiceRequestTimeoutError("connect timed out"),
            "refused": az.ServiceRequestError("refused"),
        }

    def small_pages(self, store, monkeypatch, size):
        original = store._container.list_blobs
        monkeypatch.setattr(
            store._container, "list_blobs", lambda **kw: original(**dict(kw, results_per_page=size))
        )

    def configured(self, server):
        table = {
            "container": AZURE_CONTAINER,
            "connection_string": server.connection_string,
            "block_size": "512KiB",
            "max_blocks_in_flight": 3,
            "read_timeout": 7,
            "max_attempts": 4,
            "checksum": False,
        }
        expected = {
            "block_size": 512 * 1024,
            "max_blocks_in_flight": 3,
            "read_timeout": 7.0,
            "max_attempts": 4,
        }
        return table, expected

    def check_configured_store(self, store):
        assert "connection string from storage.azure.connection_string" in store.credential_source()
        assert f"account {AZURE_ACCOUNT}, shared key" in store.credential_source()
        before = store.requests
        with store.open_writer("configured-store/x") as w:
            w.write(blob(MiB + 1))
            w.commit()
        assert request_delta(before, store.requests) == {
            "PUT_BLOCK": 3,
            "PUT_BLOCK_LIST": 1,
        }  # 512 KiB blocks
        store.delete("configured-store/x")

    def test_garbage_collected_writer_cancels_its_upload(self, store, server, p):
        # Azure has no request that discards staged blocks: the abort sends nothing, and the two
        # staged blocks stay uncommitted (invisible; the service drops them at the next commit of
        # the key or after 7 days). Nothing was published.
        super().test_garbage_collected_writer_cancels_its_upload(store, p)
        assert "PUT_BLOCK_LIST" not in store.requests and store.requests["PUT_BLOCK"] == 2
        assert _block_lists(server, p + "gc") == ([], [BLOCK, BLOCK])
        # the next upload of the key commits only its own blocks
        data = blob(2 * BLOCK + 7, seed=4)
        with store.open_writer(p + "gc") as w:
            w.write(data)
            w.commit()
        assert store.get(p + "gc") == data
        assert _block_lists(server, p + "gc") == ([BLOCK, BLOCK, 7], [])


# -- upload paths ---------------------------------------------------------------------------


def test_requests_are_not_logged_at_the_sidecars_default_level(azure_store, p, caplog):
    """The SDK's per-request INFO lines (headers included) would flood the sidecar's log."""
    caplog.set_level(logging.INFO)
    azure_store.put(p + "quiet", b"x")
    assert azure_store.get(p + "quiet") == b"x"
    assert not [r for r in caplog.records if r.name.startswith("azure.core")]


def test_concurrent_writers_of_one_key_publish_one_whole_version(azurite, azure_store, p):
    # Block ids are unique per upload, so interleaved writers never commit each other's blocks; the
    # first commit drops the other writer's staged blocks (Azure's rule), whose commit then fails
    # as retriable and leaves the first version whole.
    a, b = blob(2 * BLOCK + 3, seed=1), blob(2 * BLOCK + 9, seed=2)
    wa, wb = azure_store.open_writer(p + "k"), azure_store.open_writer(p + "k")
    wa.write(a[: BLOCK + 1])
    wb.write(b[: BLOCK + 1])
    wa.write(a[BLOCK + 1 :])
    wb.write(b[BLOCK + 1 :])
    # Blocks are staged in the background: B's must be on the server before A commits, or (as
    # once on a loaded CI machine) they arrive after it, survive, and B's commit rightly succeeds.
    wait_for(
        "both writers' full blocks staged",
        lambda: _block_lists(azurite, p + "k") == ([], [BLOCK] * 4),
        30,
        0.05,
    )
    wa.commit()
    assert azure_store.get(p + "k") == a
    with pytest.raises(StorageUnavailable) as e:
        wb.commit()
    assert "another upload of the same key committed first" in str(e.value) and p + "k" in str(e.value)
    assert azure_store.get(p + "k") == a
    with azure_store.open_writer(p + "k") as w:  # the retry
        w.write(b)
        w.commit()
    assert azure_store.get(p + "k") == b


def test_a_sent_block_is_freed_before_its_slot_goes_to_the_next(azurite, p):
    # Seen once on a loaded machine: 16.1 MiB traced against the bound of
    # TestAzureContract.bounded_upload. The pool thread released the block's slot (in the future's
    # done callback) and only then dropped its reference to the block, so while it waited for the
    # GIL the writer filled the next block beside three held ones. Here each pool thread stalls
    # 0.3 s after the release, as a descheduled thread does (no real server can delay a client's
    # thread on demand).
    block = 4 * MiB
    store = make_azure_store(azurite, block_size=block, max_blocks_in_flight=2)
    pool = store._executor()

    class StallAfterRelease:
        def __init__(self, future):
            self._future = future

        def add_done_callback(self, fn):
            self._future.add_done_callback(fn)  # the store's: releases the slot
            self._future.add_done_callback(lambda _: time.sleep(0.3))

        def __getattr__(self, name):
            return getattr(self._future, name)

    class StallingPool:
        def submit(self, fn):
            return StallAfterRelease(pool.submit(fn))

    store._executor = StallingPool  # type: ignore[method-assign]
    try:
        piece = blob(MiB, seed=4)
        peak = traced_upload_peak(store, p + "stalled", piece, 24)
        assert peak < 3 * block + 3 * MiB, f"peak traced memory {peak / MiB:.1f} MiB"
        assert store.get(p + "stalled") == piece * 24
    finally:
        store.close()


def test_a_body_that_does_not_match_its_md5_is_refused(azure_store, p, monkeypatch):
    # The bytes and the Content-MD5 the SDK sends with them disagree, as when a body is corrupted
    # on the way: the service checks the MD5 and refuses the blob. (The SDK's MD5 function is
    # replaced: no real server or network corrupts bytes on demand.)
    import azure.storage.blob._shared.policies as policies

    monkeypatch.setattr(policies, "calculate_content_md5", lambda data: b"\0" * 16)
    with pytest.raises(StorageError) as e:
        azure_store.put(p + "tampered", b"payload-bytes")
    assert "Md5Mismatch" in str(e.value) and p + "tampered" in str(e.value)
    with pytest.raises(StorageError) as e:
        with azure_store.open_writer(p + "tampered") as w:
            w.write(blob(BLOCK + 1))
            w.commit()
    assert "Md5Mismatch" in str(e.value)
    assert not azure_store.exists(p + "tampered")


# -- credentials ---------------------------------------------------------------------------


def test_container_sas_token_works_and_names_its_permissions(azurite, p):
    sas = azurite.sas_token(AZURE_CONTAINER, "racwdl")
    store = make_azure_store(azurite, account_key=None, sas_token="?" + sas)
    try:
        store.check()
        store.put(p + "s", b"via sas")
        assert store.get(p + "s") == b"via sas"
        assert [o.key for o in store.list(p)] == [p + "s"]
        store.delete_many([p + "s"])
        assert list(store.list(p)) == []
        assert (
            "SAS token from storage.azure.sas_token (permissions racwdl, expires" in store.credential_source()
        )
        assert "sig=" not in store.credential_source()
    finally:
        store.close()


def test_read_only_sas_fails_the_start_up_write_check(azurite):
    sas = azurite.sas_token(AZURE_CONTAINER, "rl")
    store = make_azure_store(azurite, account_key=None, sas_token=sas)
    try:
        with pytest.raises(ConfigError) as e:
            store.check()
        msg = str(e.value)
        assert "storage.azure" in msg and AZURE_CONTAINER in msg and "probe" in msg
        assert "permissions rl" in msg and "Storage Blob Data Contributor" in msg
        assert "sig=" not in msg
    finally:
        store.close()


def test_wrong_account_key_fails_check_naming_the_credential(azurite):
    wrong = AzureSettings(
        container=AZURE_CONTAINER,
        account_name=AZURE_ACCOUNT,
        account_key="d3Jvbmcta2V5",
        endpoint_url=azurite.endpoint_url,
        max_attempts=1,
    )
    store = AzureObjectStore(wrong)
    try:
        with pytest.raises(ConfigError) as e:
            store.check()
        msg = str(e.value)
        assert "HTTP 403" in msg and AZURE_CONTAINER in msg and azurite.endpoint_url in msg
        assert f"shared key of account {AZURE_ACCOUNT} from storage.azure.account_key" in msg
        assert "d3Jvbmcta2V5" not in msg
    finally:
        store.close()


# -- faults ------------------------------------------------------------------------------------


def test_a_body_that_broke_three_times_is_unavailable():
    """The SDK wraps it in an HttpResponseError without a status."""
    import azure.core.exceptions as az
    from azure.core.pipeline.transport import HttpRequest

    store = AZURE.make_store(None)
    try:
        broken = az.ServiceResponseError("connection reset")
        t = store._translate(az.HttpResponseError(broken, error=broken), "GET", "k")
        assert isinstance(t, StorageUnavailable) and "connection reset" in str(t)
        assert _operation("PUT", HttpRequest("PUT", "http://h/a/c/k?comp=block&blockid=x").url) == "PUT_BLOCK"
    finally:
        store.close()


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "table, message",
    [
        ({"account_name": "acct"}, "storage.azure.container: missing when storage.backend = 'azure'"),
        (
            {"container": "Bad_Name", "account_name": "acct"},
            "storage.azure.container: 'Bad_Name' is not a valid container name",
        ),
        ({"container": "c01"}, "storage.azure.account_name: missing; set it (or storage.azure.endpoint_url"),
        (
            {"container": "c01", "account_name": "acct", "account_key": "a2V5", "sas_token": "sv=1&sig=x"},
            "storage.azure.account_key and storage.azure.sas_token are exclusive",
        ),
        (
            {"container": "c01", "endpoint_url": "https://acct.blob.core.windows.net", "account_key": "a2V5"},
            "storage.azure.account_key needs storage.azure.account_name",
        ),
        (
            {"container": "c01", "account_name": "acct", "account_key": "not base64!"},
            "storage.azure.account_key: not valid base64",
        ),
        (
            {
                "container": "c01",
                "connection_string": "AccountName=a;AccountKey=a2V5",
                "account_name": "acct",
            },
            "storage.azure.connection_string and storage.azure.account_name are exclusive",
        ),
        ({"container": "c01", "account_name": "acct", "sas_token": "sp=r"}, "storage.azure.sas_token: not a"),
        ({"container": "c01", "endpoint_url": "blob.example"}, "storage.azure.endpoint_url: 'blob.example'"),
        (
            {"container": "c01", "endpoint_url": "http://127.0.0.1:10000/devstoreaccount1"},
            "storage.azure.endpoint_url: DefaultAzureCredential sends Entra ID tokens over https only",
        ),
        (
            {"container": "c01", "account_name": "acct", "block_size": "1KiB"},
            "storage.azure.block_size: 1024 is below the minimum 65536",
        ),
        ({"container": "c01", "account_name": "Acct!"}, "storage.azure.account_name: 'Acct!' is not a valid"),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(table, message):
    from rsm_sidecar.storage.factory import open_store

    with pytest.raises(ConfigError) as e:
        open_store(Config({"storage": {"backend": "azure", "azure": table}}, environ={}))
    assert message in str(e.value) and "\n" not in str(e.value)
    for secret in ("a2V5", "sig=x"):
        assert secret not in str(e.value)


def test_default_azure_credential_is_used_when_no_secret_is_configured():
    store = AzureObjectStore(
        AzureSettings(container="c01", account_name="acct", managed_identity_client_id="id-1")
    )
    try:
        assert type(store._token_credential).__name__ == "DefaultAzureCredential"
        assert store.endpoint == "https://acct.blob.core.windows.net"
        assert (
            "DefaultAzureCredential" in store.credential_source()
            and "client id id-1" in store.credential_source()
        )
    finally:
        store.close()


def test_default_azure_credential_without_azure_identity_names_the_extra():
    """azure-identity's absence is simulated in a fresh interpreter (a meta-path finder refuses
    to import it); a shared key needs only azure-storage-blob."""
    code = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "azure.identity" or name.startswith("azure.identity."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage.factory import open_store
out = {}
for name, table in [("identity", {}), ("key", {"account_key": "a2V5"})]:
    azure = {"container": "c01", "account_name": "acct", **table}
    cfg = Config({"storage": {"backend": "azure", "azure": azure}}, environ={})
    try:
        open_store(cfg).close()
        out[name] = None
    except ConfigError as e:
        out[name] = str(e)
print(json.dumps(out))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["key"] is None
    assert (
        "DefaultAzureCredential" in got["identity"] and "pip install 'rsm-sidecar[azure]'" in got["identity"]
    )
    assert "no module 'azure.identity'" in got["identity"]


def test_secrets_stay_out_of_the_settings_repr():
    s = AzureSettings(container="c01", account_name="acct", account_key=AZURE_KEY)
    assert AZURE_KEY not in repr(s)


# -- Entra ID tokens: DefaultAzureCredential with a managed identity ---------------------------


def _managed_identity(status: int, body: dict) -> CannedEndpoint:
    """A local stand-in for the managed identity token endpoint of App Service and Container Apps
    (``IDENTITY_ENDPOINT``/``IDENTITY_HEADER``), which exists only inside Azure."""
    return CannedEndpoint(status, "application/json", json.dumps(body).encode(), path="/msi/token")


def _entra_token(tenant: str = "72f988bf-86f1-41af-91ab-2d7cd011db47") -> str:
    """A token shaped as Entra ID issues them for Azure Storage (audience, issuer, validity).
    Azurite's ``--oauth basic`` checks those claims, not the signature, which only Entra ID
    could make."""

    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {
        "aud": "https://storage.azure.com",
        "iss": f"https://sts.windows.net/{tenant}/",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": now + 3600,
        "oid": "00000000-0000-0000-0000-00000000cafe",
        "tid": tenant,
    }
    return f"{part({'typ': 'JWT', 'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


@pytest.fixture(scope="module")
def azurite_oauth(tmp_path_factory):
    """Azurite over https (a self-signed certificate for 127.0.0.1) accepting bearer tokens."""
    workdir = tmp_path_factory.mktemp("azurite-oauth")
    cert_file, key_file = self_signed("127.0.0.1", ips=["127.0.0.1"]).write(workdir, "cert")
    server = AzuriteServer(
        workdir, in_memory=True, account=AZURE_ACCOUNT, tls=(cert_file, key_file), oauth=True
    )
    with server:
        server.create_bucket(AZURE_CONTAINER)
        yield server


def _managed_identity_store(server, monkeypatch, endpoint: CannedEndpoint, **overrides):
    monkeypatch.setenv("IDENTITY_ENDPOINT", endpoint.url)
    monkeypatch.setenv("IDENTITY_HEADER", "local-identity-header")
    settings = AzureSettings(
        container=AZURE_CONTAINER,
        account_name=AZURE_ACCOUNT,
        endpoint_url=server.endpoint_url,
        ca_bundle=str(server.tls[0]),
        **overrides,
    )
    return AzureObjectStore(settings)


def test_default_azure_credential_uses_the_managed_identity(azurite_oauth, monkeypatch, p):
    token = _entra_token()
    identity = _managed_identity(
        200,
        {
            "access_token": token,
            "expires_on": str(int(time.time()) + 3600),
            "resource": "https://storage.azure.com",
            "token_type": "Bearer",
        },
    )
    store = _managed_identity_store(azurite_oauth, monkeypatch, identity)
    try:
        store.check()
        data = blob(2 * BLOCK + 1)
        with store.open_writer(p + "mi") as w:
            w.write(data)
            w.commit()
        assert store.get_range(p + "mi", BLOCK, BLOCK + 9) == data[BLOCK : BLOCK + 10]
        assert [o.key for o in store.list(p)] == [p + "mi"]
        store.delete(p + "mi")
        assert "DefaultAzureCredential" in store.credential_source()
        assert "ManagedIdentityCredential" in store.credential_source()
        # one token for every request: asked once, for Azure Storage, with the identity header
        assert len(identity.calls) == 1
        call = identity.calls[0]
        assert call.method == "GET" and call.query["resource"] == ["https://storage.azure.com"]
        assert call.headers.get("X-IDENTITY-HEADER") == "local-identity-header"
    finally:
        store.close()
        identity.close()


def test_a_refused_managed_identity_fails_check_naming_the_credential(azurite_oauth, monkeypatch):
    identity = _managed_identity(
        400, {"error": "invalid_request", "error_description": "Identity not found for this resource"}
    )
    store = _managed_identity_store(azurite_oauth, monkeypatch, identity, max_attempts=1)
    try:
        with pytest.raises(ConfigError) as e:
            store.check()
        msg = str(e.value)
        assert "could not obtain an access token" in msg and AZURE_CONTAINER in msg
        assert "ManagedIdentityCredential: App Service managed identity" in msg  # what it tried
        assert "credentials: DefaultAzureCredential" in msg and "\n" not in msg
    finally:
        store.close()
        identity.close()


def test_default_azure_credential_uses_aks_workload_identity(azurite_oauth, monkeypatch, tmp_path, p):
    # What the AKS workload identity webhook gives a pod: a client id, a tenant and a projected
    # service account token, which Entra ID exchanges for an access token. The Entra ID token
    # endpoint is a local https stand-in (AZURE_AUTHORITY_HOST; the test CA is trusted through
    # REQUESTS_CA_BUNDLE).
    cert, key = azurite_oauth.tls
    tenant = "72f988bf-86f1-41af-91ab-2d7cd011db47"
    answer = {"token_type": "Bearer", "expires_in": 3600, "access_token": _entra_token(tenant)}
    entra = CannedEndpoint(200, "application/json", json.dumps(answer).encode())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    entra.server.socket = context.wrap_socket(entra.server.socket, server_side=True)
    sa_token = tmp_path / "azure-identity-token"
    sa_token.write_text("projected-service-account-token")
    for name, value in {
        "AZURE_CLIENT_ID": "5a5e1c2d-0000-4000-8000-00000000c0de",
        "AZURE_TENANT_ID": tenant,
        "AZURE_FEDERATED_TOKEN_FILE": str(sa_token),
        "AZURE_AUTHORITY_HOST": entra.url.replace("http://", "https://"),
        "REQUESTS_CA_BUNDLE": str(cert),
    }.items():
        monkeypatch.setenv(name, value)
    store = AzureObjectStore(
        AzureSettings(
            container=AZURE_CONTAINER,
            account_name=AZURE_ACCOUNT,
            endpoint_url=azurite_oauth.endpoint_url,
            ca_bundle=str(cert),
        )
    )
    try:
        store.check()
        store.put(p + "wi", b"via workload identity")
        assert store.get(p + "wi") == b"via workload identity"
        assert "token from WorkloadIdentityCredential" in store.credential_source()
        assert len(entra.calls) == 1
        form = entra.calls[0].form
        assert form["client_assertion"] == ["projected-service-account-token"]
        assert form["client_id"] == ["5a5e1c2d-0000-4000-8000-00000000c0de"]
        assert form["scope"] == ["https://storage.azure.com/.default"]
        assert form["grant_type"] == ["client_credentials"]
    finally:
        store.close()
        entra.close()
