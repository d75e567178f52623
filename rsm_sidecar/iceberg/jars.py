"""The JVM jars Spark needs for Iceberg, fetched from Maven Central at set-up time.

Spark never resolves anything at run time (no ``spark.jars.packages``, no Ivy): set-up
downloads each jar once into ``$RSM_CACHE_DIR/maven/<group path>/<artifact>/<version>/``
(default cache ``<repo>/.cache``), checks it against the SHA-1 Maven Central publishes and
against the SHA-256 pinned below, and :func:`spark_jars` only looks the files up.

Set-up::

    python -m rsm_sidecar.iceberg.jars            # runtime + sqlite-jdbc + aws/gcp bundles
    python -m rsm_sidecar.iceberg.jars --no-cloud # runtime + sqlite-jdbc only

Versions (see docs/iceberg.md "Versions"): pyspark 4.1.x (Scala 2.13) with
``iceberg-spark-runtime-4.1_2.13:1.12.0``. ``iceberg-gcp-bundle`` has no 1.12.0 on Central (the
newest is 1.11.0); the bundle only carries the Google Cloud SDK (``GCSFileIO`` itself is in the
runtime jar), so 1.11.0 is used with the 1.12.0 runtime.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rsm_sidecar.errors import ConfigError, Unavailable
from rsm_sidecar.local_cache import cache_dir, file_lock

MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"

ICEBERG_VERSION = "1.12.0"
SPARK_MINOR = "4.1"
SCALA_BINARY = "2.13"


@dataclass(frozen=True)
class MavenArtifact:
    """One file on Maven Central, with the SHA-256 we expect (None: trust Central's SHA-1 only)."""

    group: str
    artifact: str
    version: str
    sha256: str | None = None
    classifier: str | None = None
    ext: str = "jar"

    @property
    def filename(self) -> str:
        cls = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{cls}.{self.ext}"

    @property
    def relpath(self) -> str:
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.filename}"

    @property
    def coordinate(self) -> str:
        cls = f":{self.classifier}" if self.classifier else ""
        return f"{self.group}:{self.artifact}:{self.version}:{self.ext}{cls}"


ICEBERG_SPARK_RUNTIME = MavenArtifact(
    "org.apache.iceberg",
    f"iceberg-spark-runtime-{SPARK_MINOR}_{SCALA_BINARY}",
    ICEBERG_VERSION,
    "3123c3798af642dd537230923548e013ef41cc28b6626e5225808cf5670a0f82",
)
SQLITE_JDBC = MavenArtifact(
    "org.xerial",
    "sqlite-jdbc",
    "3.54.1.0",
    "f8dce420a6016278497f4f0560f65602b9db858de141b541cf91a4644ebe4639",
)
ICEBERG_AWS_BUNDLE = MavenArtifact(
    "org.apache.iceberg",
    "iceberg-aws-bundle",
    ICEBERG_VERSION,
    "dd7e49ffa4ac9b215bed846581991259e3aec9bb2fa08d6cec029c46cd66d957",
)
ICEBERG_GCP_BUNDLE = MavenArtifact(
    "org.apache.iceberg",
    "iceberg-gcp-bundle",
    "1.11.0",
    "d9248fc76d94d232e153bf760631229cd3b7c6bc3b20f47d4b2caffe011a8a2f",
)

CORE_JARS: tuple[MavenArtifact, ...] = (ICEBERG_SPARK_RUNTIME, SQLITE_JDBC)
CLOUD_JARS: dict[str, MavenArtifact] = {"aws": ICEBERG_AWS_BUNDLE, "gcp": ICEBERG_GCP_BUNDLE}


def maven_repo_url() -> str:
    """``$RSM_MAVEN_REPO`` (a Central mirror) or Maven Central."""
    return os.environ.get("RSM_MAVEN_REPO", "").strip().rstrip("/") or MAVEN_CENTRAL


def artifact_path(artifact: MavenArtifact, cache: Path | None = None) -> Path:
    return cache_dir(cache) / "maven" / artifact.relpath


def _fetch(url: str, timeout: float) -> bytes:
    last: Exception | None = None
    for attempt in range(3):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise ConfigError(f"{url} does not exist (404): check the version") from exc
            last = exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            last = exc
        time.sleep(1 + attempt * 2)
    raise Unavailable(f"cannot download {url}: {last}")


def download_verified(url: str, dest: Path, *, sha256: str | None, timeout: float = 300.0) -> Path:
    """Download ``url`` to ``dest`` (atomically), checking Central's ``.sha1`` and ``sha256``.

    A file already at ``dest`` whose SHA-256 matches (or, without a pin, whose SHA-1 matches the
    published one) is kept. A mismatch raises :class:`~rsm_sidecar.errors.ConfigError` naming
    both digests; nothing is written to ``dest`` then. Network failures after 3 tries raise
    :class:`~rsm_sidecar.errors.Unavailable`.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(dest.with_name(dest.name + ".lock")):
        if dest.exists() and sha256 and _sha(dest.read_bytes(), "sha256") == sha256:
            return dest
        expected_sha1 = _fetch(url + ".sha1", 60).decode().split()[0].strip().lower()
        if dest.exists() and not sha256 and _sha(dest.read_bytes(), "sha1") == expected_sha1:
            return dest
        data = _fetch(url, timeout)
        got1 = _sha(data, "sha1")
        if got1 != expected_sha1:
            raise ConfigError(f"{url}: SHA-1 {got1} does not match the published {expected_sha1}")
        if sha256:
            got256 = _sha(data, "sha256")
            if got256 != sha256:
                raise ConfigError(f"{url}: SHA-256 {got256} does not match the pinned {sha256}")
        tmp = dest.with_name(dest.name + f".part{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return dest


def _sha(data: bytes, algo: str) -> str:
    return hashlib.new(algo, data).hexdigest()


def ensure_artifact(artifact: MavenArtifact, cache: Path | None = None) -> Path:
    """Download one artifact into the cache if missing; return its path."""
    url = f"{maven_repo_url()}/{artifact.relpath}"
    return download_verified(url, artifact_path(artifact, cache), sha256=artifact.sha256)


def _selected(cloud: Iterable[str]) -> list[MavenArtifact]:
    out = list(CORE_JARS)
    for name in cloud:
        if name not in CLOUD_JARS:
            raise ConfigError(f"unknown cloud bundle {name!r}; allowed: {sorted(CLOUD_JARS)}")
        out.append(CLOUD_JARS[name])
    return out


def ensure_spark_jars(cache: Path | None = None, cloud: Sequence[str] = ("aws", "gcp")) -> list[Path]:
    """Set-up step: fetch the Iceberg runtime, sqlite-jdbc and the chosen cloud bundles."""
    return [ensure_artifact(a, cache) for a in _selected(cloud)]


def spark_jars(cache: Path | None = None, cloud: Sequence[str] = ()) -> list[Path]:
    """The local jar paths for ``spark.jars``; never downloads.

    Raises :class:`ConfigError` naming the set-up command when a jar is missing.
    """
    paths = []
    for a in _selected(cloud):
        p = artifact_path(a, cache)
        if not p.is_file():
            raise ConfigError(
                f"{a.coordinate} is not in the cache ({p}); run set-up first: "
                f"python -m rsm_sidecar.iceberg.jars{'' if cloud else ' --no-cloud'}"
            )
        paths.append(p)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fetch the Iceberg Spark jars into the cache.")
    ap.add_argument("--cache-dir", default=None, help="default: $RSM_CACHE_DIR or <repo>/.cache")
    ap.add_argument("--no-cloud", action="store_true", help="skip iceberg-aws/gcp-bundle")
    args = ap.parse_args(argv)
    cache = cache_dir(args.cache_dir)
    t0 = time.monotonic()
    for p in ensure_spark_jars(cache, () if args.no_cloud else ("aws", "gcp")):
        print(f"{p} ({p.stat().st_size / 1e6:.1f} MB)")
    print(f"done in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
