"""An Azure Blob Storage emulator for development and tests: Azurite, from npm.

* :func:`ensure_azurite` installs the pinned npm package ``azurite`` with the machine's ``npm``
  into ``<cache_dir>/azurite-<version>`` (``npm install --prefix``, install scripts off) and
  returns the path of its ``azurite-blob`` command. A stamp file makes it idempotent, a lock file
  safe for concurrent processes. ``RSM_AZURITE_BIN`` points at another ``azurite-blob`` instead.
* :class:`AzuriteServer` runs the Blob service alone on 127.0.0.1 (port: :mod:`devstack.ports`), with
  ``--skipApiVersionCheck`` (the SDK speaks a newer service version than the emulator knows),
  ``--loose`` (unknown headers are ignored, not refused) and telemetry off. It serves one account
  of its own, named :data:`ACCOUNT` with a random key made per server unless one is given
  (``AZURITE_ACCOUNTS``), so no well-known key is used; the endpoint is
  ``http://127.0.0.1:<port>/<account>``. Blobs live in a directory of your choice (a restart keeps
  them: fault tests), or in memory (``in_memory=True``: faster, lost when the process ends). With
  ``tls`` (a certificate and key) it serves https, and with ``oauth`` it also accepts Entra ID
  bearer tokens (``--oauth basic``: audience, issuer and expiry are checked, not the signature).

Command line (``make demo STORAGE=azure`` and friends)::

    python -m devstack.azurite install            # prints the azurite-blob path
    python -m devstack.azurite run --container rsm  # runs until Ctrl+C, prints the endpoint
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devstack.common import (
    HOST,
    BucketServer,
    http_answers,
    install_atomically,
    installed_tool,
)

#: The pinned Azurite (its package.json asks for Node >= 22; the Blob service runs on Node 20 too).
AZURITE_VERSION = "3.37.0"
#: The storage account the emulator serves (3-24 lowercase letters and digits, as on Azure).
ACCOUNT = "rsmdev"


def ensure_azurite(cache_dir: Path | None = None, version: str = AZURITE_VERSION) -> Path:
    """The path of ``azurite-blob`` of ``version``, installing the npm package into the cache once."""
    return installed_tool(
        "azurite",
        version,
        "node_modules/.bin/azurite-blob",
        lambda target: install_atomically(target, lambda tmp: _npm_install(tmp, version)),
        override_env="RSM_AZURITE_BIN",
        cache_dir=cache_dir,
    )


def _npm_install(prefix: Path, version: str) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "npm is not installed: Azurite (the Azure Blob Storage emulator) is an npm package; install "
            "Node.js and npm (Debian: apt-get install nodejs npm)"
        )
    subprocess.run(
        [
            npm,
            "install",
            "--prefix",
            str(prefix),
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",  # the Blob service needs no build step
            "--no-package-lock",
            "--loglevel=error",
            f"azurite@{version}",
        ],
        check=True,
        timeout=900,
        stdout=subprocess.DEVNULL,
    )


class AzuriteServer(BucketServer):
    """Azurite's Blob service on loopback: the account's endpoint is :attr:`endpoint_url`.

    The port and key are chosen once, so :meth:`restart` comes back at the same endpoint (with
    the same blobs unless ``in_memory``)."""

    name = "azurite"
    kind = "Azure Blob"
    bucket_word = "container"
    install_help = "install the pinned Azurite into the cache and print the azurite-blob path"
    run_help = "run Azurite's Blob service until interrupted"
    ensure = staticmethod(ensure_azurite)
    port_names = ("port",)
    port: int

    def __init__(
        self,
        workdir: Path,
        in_memory: bool = False,
        binary: Path | None = None,
        cache_dir: Path | None = None,
        port: int | None = None,
        account: str = ACCOUNT,
        account_key: str | None = None,
        tls: tuple[Path, Path] | None = None,
        oauth: bool = False,
    ):
        super().__init__(workdir)
        self.binary = Path(binary) if binary else ensure_azurite(cache_dir)
        self.in_memory = in_memory
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.choose_ports(port=port)
        self.account = account
        self.account_key = account_key or base64.b64encode(os.urandom(64)).decode()
        self.tls = tls  # (certificate, key) PEM files: serve https
        self.oauth = oauth  # accept Entra ID bearer tokens (Azurite checks audience, issuer, expiry)
        if oauth and not tls:
            raise ValueError("Azurite accepts OAuth tokens over https only: give tls=(certificate, key)")

    @property
    def endpoint_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{HOST}:{self.port}/{self.account}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol={'https' if self.tls else 'http'};"
            f"AccountName={self.account};AccountKey={self.account_key};"
            f"BlobEndpoint={self.endpoint_url};"
        )

    def banner(self) -> str:
        return (
            f"{self.kind} endpoint {self.endpoint_url} (account {self.account}, data "
            f"{'in memory' if self.in_memory else self.data_dir}, log {self.log_file})\n"
            f"connection string: {self.connection_string}"
        )

    def command(self) -> list[str]:
        cmd = [
            str(self.binary),
            "--blobHost",
            HOST,
            "--blobPort",
            str(self.port),
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",  # never phone home
            "--disableProductStyleUrl",  # the account is the first path segment, whatever the host
        ]
        if self.tls:
            cmd += ["--cert", str(self.tls[0]), "--key", str(self.tls[1])]
        if self.oauth:
            cmd += ["--oauth", "basic"]
        # (Azurite refuses --location together with --inMemoryPersistence)
        cmd += ["--inMemoryPersistence"] if self.in_memory else ["--location", str(self.data_dir)]
        return cmd

    def environment(self) -> Mapping[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE")}
        env["AZURITE_ACCOUNTS"] = f"{self.account}:{self.account_key}"
        return env

    def is_ready(self) -> bool:
        if self.tls:
            context = ssl.create_default_context(cafile=str(self.tls[0]))
            try:
                with socket.create_connection((HOST, self.port), timeout=0.5) as sock:
                    with context.wrap_socket(sock, server_hostname=HOST):
                        return True
            except OSError:
                return False
        return http_answers(f"http://{HOST}:{self.port}/", timeout=0.5)

    @classmethod
    def add_run_options(cls, run: argparse.ArgumentParser) -> None:
        super().add_run_options(run)
        run.add_argument("--in-memory", action="store_true", help="keep blobs in memory, not in --dir")

    @classmethod
    def from_args(cls, args: argparse.Namespace, workdir: Path) -> AzuriteServer:
        return cls(workdir, in_memory=args.in_memory, port=args.port)

    def service_client(self, **options: Any) -> Any:
        """An SDK client with the account key, for set-up and assertions (not the code under test)."""
        from azure.storage.blob import BlobServiceClient

        if self.tls:
            options.setdefault("connection_verify", str(self.tls[0]))
        return BlobServiceClient(
            self.endpoint_url,
            credential={"account_name": self.account, "account_key": self.account_key},
            **options,
        )

    def create_bucket(self, bucket: str) -> None:
        """Create the container ``bucket`` (fine if it exists)."""
        from azure.core.exceptions import ResourceExistsError, ServiceRequestError, ServiceResponseError

        deadline = time.monotonic() + 20
        with self.service_client() as client:
            while True:
                try:
                    client.create_container(bucket)
                    return
                except ResourceExistsError:
                    return
                except (ServiceRequestError, ServiceResponseError):  # not up yet; a refusal is final
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.2)

    def sas_token(self, container: str, permission: str = "racwdl", hours: float = 1.0) -> str:
        """A container SAS signed with the account key."""
        import datetime

        from azure.storage.blob import ContainerSasPermissions, generate_container_sas

        return str(
            generate_container_sas(
                self.account,
                container,
                account_key=self.account_key,
                permission=ContainerSasPermissions.from_string(permission),
                expiry=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=hours),
            )
        )


def _main(argv: Sequence[str] | None = None) -> int:
    return AzuriteServer.launcher_main("devstack.azurite", __doc__, argv)


if __name__ == "__main__":
    sys.exit(_main())
