"""The ``[storage.azure]`` keys: declared once, as the fields of ``AzureSettings``.

Light on purpose: every ``Config()`` loads this module, so it imports no Azure SDK (the Azure
backend, :mod:`rsm_sidecar.storage.azure`, is imported only when ``storage.backend = "azure"``).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re

from rsm_sidecar.config import Settings, setting
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage import bucket_settings as remote

KiB = 1024
MiB = 1024 * KiB

MIN_BLOCK_SIZE = 64 * KiB  # not Azure's limit (there is none below 4000 MiB): a sane floor
MAX_BLOCK_SIZE = 4000 * MiB  # Azure's largest block (service version 2019-12-12 and later)
MAX_BLOCKS = 50_000  # committed blocks per blob

# Account names: 3-24 lowercase letters and digits (Azurite's emulator accounts follow the same rule).
_ACCOUNT_NAME = re.compile(r"[a-z0-9]{3,24}")
# Container names: 3-63 of lowercase letters, digits and single hyphens, starting and ending with a
# letter or digit.
_CONTAINER_NAME = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")


@dataclasses.dataclass(frozen=True)
class AzureSettings(Settings):
    """How the Azure Blob Storage backend reaches its container and writes blobs (validated on
    creation). Credentials, in order: ``connection_string``; ``account_key``; ``sas_token``;
    none of them: ``DefaultAzureCredential`` (Entra ID: environment service principal, workload
    identity, managed identity, Azure CLI)."""

    KEY_PREFIX = "storage.azure"

    container: str = setting(
        "str", None, "Container that holds the blobs.", required_when=("storage.backend", "azure")
    )
    account_name: str | None = setting(
        "str",
        None,
        "Storage account name; the endpoint is then `https://<account_name>.blob.core.windows.net` "
        "unless `storage.azure.endpoint_url` says otherwise. Not needed with a connection string.",
    )
    endpoint_url: str | None = setting(
        "str",
        None,
        "Blob service endpoint (the account URL), e.g. `https://myaccount.blob.core.windows.net`, a private "
        "endpoint, or `http://127.0.0.1:10000/devstoreaccount1` for Azurite. Unset: derived from "
        "`storage.azure.account_name` (or taken from the connection string).",
    )
    connection_string: str | None = setting(
        "str",
        None,
        "Connection string of the account (`DefaultEndpointsProtocol=...;AccountName=...;AccountKey=...` "
        "or with `SharedAccessSignature=...`). Exclusive with the other credential keys and `endpoint_url`.",
        secret=True,
    )
    account_key: str | None = setting(
        "str",
        None,
        "Shared key of the account (base64), with `storage.azure.account_name`. Exclusive with `sas_token`.",
        secret=True,
    )
    sas_token: str | None = setting(
        "str",
        None,
        "Shared access signature (account or container SAS, with the read, add, create, write, delete and "
        "list permissions `racwdl`), with or without the leading `?`.",
        secret=True,
    )
    managed_identity_client_id: str | None = setting(
        "str",
        None,
        "Client id of a user-assigned managed identity for `DefaultAzureCredential` (used when no "
        "connection string, account key or SAS is set). Unset: the system-assigned identity, or "
        "`AZURE_CLIENT_ID` (workload identity sets it).",
    )
    block_size: int = setting(
        "size",
        8 * MiB,
        "Block size of uploads; blobs up to this size are one Put Blob request, larger ones are staged "
        "blocks committed with one Put Block List. Memory per upload is at most "
        "block_size x (max_blocks_in_flight + 1). Largest blob: 50,000 blocks.",
        min=MIN_BLOCK_SIZE,
        max=MAX_BLOCK_SIZE,
    )
    max_blocks_in_flight: int = setting(
        "int",
        2,
        "Blocks of one upload queued or uploading at once; `write()` blocks while the window is full.",
        min=1,
        max=64,
    )
    upload_threads: int = setting(
        "int", 8, "Threads uploading blocks, shared by all uploads.", min=1, max=256
    )
    checksum: bool = setting(
        "bool",
        True,
        "Send the MD5 of every Put Blob and Put Block (`Content-MD5`); the service refuses a request whose "
        "bytes do not match.",
    )
    connect_timeout: float = remote.connect_timeout()
    read_timeout: float = remote.read_timeout()
    max_attempts: int = remote.max_attempts(
        "500/503 incl. `ServerBusy` throttling, 408, connection errors and timeouts are retried with "
        "exponential backoff and jitter"
    )
    delete_concurrency: int = remote.delete_concurrency("Delete Blob")
    max_pool_connections: int = remote.max_pool_connections()
    ca_bundle: str | None = setting(
        "path", None, "PEM CA bundle to verify the service's certificate with (a private endpoint's own CA)."
    )
    startup_write_check: bool = setting(
        "bool",
        True,
        "At start-up, after listing the container, write and delete a 0-byte probe blob under "
        "`storage.key_prefix`, so missing write or delete permissions stop the sidecar at once.",
    )

    @property
    def bucket(self) -> str:
        """The container (what the other backends call the bucket)."""
        return self.container

    def __post_init__(self) -> None:
        if not self.container:
            raise ConfigError("storage.azure.container: missing; the container that holds the blobs")
        if not _CONTAINER_NAME.fullmatch(self.container):
            raise ConfigError(
                f"storage.azure.container: {self.container!r} is not a valid container name (3-63 lowercase "
                "letters, digits and single hyphens, starting and ending with a letter or digit)"
            )
        if not MIN_BLOCK_SIZE <= self.block_size <= MAX_BLOCK_SIZE:
            raise ConfigError(
                f"storage.azure.block_size: {self.block_size} is outside [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}]"
            )
        if self.account_name is not None and not _ACCOUNT_NAME.fullmatch(self.account_name):
            raise ConfigError(
                f"storage.azure.account_name: {self.account_name!r} is not a valid storage account name "
                "(3-24 lowercase letters and digits)"
            )
        if self.connection_string is not None:
            for other in ("account_key", "sas_token", "endpoint_url", "account_name"):
                if getattr(self, other) is not None:
                    raise ConfigError(
                        f"storage.azure.connection_string and storage.azure.{other} are exclusive: the "
                        "connection string names the account, its endpoint and its credential"
                    )
            if "=" not in self.connection_string:
                raise ConfigError(
                    "storage.azure.connection_string: not a connection string (expected "
                    "'Name=value;Name=value', e.g. 'DefaultEndpointsProtocol=https;AccountName=...;"
                    "AccountKey=...')"
                )
            return
        if self.endpoint_url is None and self.account_name is None:
            raise ConfigError(
                "storage.azure.account_name: missing; set it (or storage.azure.endpoint_url, or "
                "storage.azure.connection_string) so the sidecar knows which storage account to use"
            )
        if self.endpoint_url is not None and not re.match(r"https?://[^/\s]+", self.endpoint_url):
            raise ConfigError(
                f"storage.azure.endpoint_url: {self.endpoint_url!r} is not an http(s) URL "
                "(e.g. https://myaccount.blob.core.windows.net)"
            )
        if self.account_key is not None:
            if self.sas_token is not None:
                raise ConfigError(
                    "storage.azure.account_key and storage.azure.sas_token are exclusive: choose one "
                    "credential source"
                )
            if self.account_name is None:
                raise ConfigError("storage.azure.account_key needs storage.azure.account_name")
            try:
                base64.b64decode(self.account_key, validate=True)
            except (binascii.Error, ValueError):
                raise ConfigError(
                    "storage.azure.account_key: not valid base64 (copy the key as the portal shows it)"
                ) from None
        if self.sas_token is not None and "sig=" not in self.sas_token:
            raise ConfigError(
                "storage.azure.sas_token: not a shared access signature (no 'sig=' parameter; expected "
                "e.g. 'sv=...&sp=racwdl&se=...&sig=...')"
            )
        if (
            self.account_key is None
            and self.sas_token is None
            and self.endpoint_url is not None
            and self.endpoint_url.startswith("http://")
        ):
            raise ConfigError(
                f"storage.azure.endpoint_url: DefaultAzureCredential sends Entra ID tokens over https only, "
                f"and {self.endpoint_url!r} is http; use an https endpoint, or storage.azure.account_key, "
                "sas_token or connection_string"
            )
        if self.managed_identity_client_id is not None and (self.account_key or self.sas_token):
            raise ConfigError(
                "storage.azure.managed_identity_client_id applies to DefaultAzureCredential only; it is set "
                "together with storage.azure.account_key or sas_token"
            )


CONFIG_KEYS = AzureSettings.keys()
