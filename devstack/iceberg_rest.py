"""A real Iceberg REST catalog for tests: Apache Iceberg's own REST fixture from Maven Central.

``org.apache.iceberg:iceberg-open-api:<v>:test-fixtures`` is the thin jar of
``RESTCatalogServer`` (what the ``apache/iceberg-rest-fixture`` Docker image runs): an HTTP
server (Jetty) in front of ``RESTCatalogAdapter`` over a ``JdbcCatalog``, configured from
``CATALOG_*`` environment variables (``CATALOG_`` + the property with ``.`` -> ``_`` and ``-`` ->
``__``, e.g. ``CATALOG_S3_PATH__STYLE__ACCESS``). Its POM lists no dependencies, so
:func:`ensure_rest_fixture` resolves them with Maven from a generated POM (the fixture,
``iceberg-core`` and its ``tests`` jar, which holds ``RESTCatalogAdapter``/``RESTCatalogServlet``,
``iceberg-aws`` and ``iceberg-aws-bundle`` of the same version for an S3 warehouse, Jetty 12.1
ee10 servlet + compression, slf4j-simple) into ``<cache>/iceberg-rest-fixture-<v>/lib``
(Maven's repository: ``<cache>/m2``; ~70 MB). Hadoop's ``Configuration`` comes from pyspark's
``hadoop-client-api``/``-runtime`` jars, the SQLite driver from the Spark jar cache
(:mod:`rsm_sidecar.iceberg.jars`).

Version: 1.11.0, the newest ``iceberg-open-api`` on Central (1.12.0 has no fixture jar); the
REST protocol is the same for the 1.12.0 clients.

    python -m devstack.iceberg_rest install     # resolve the jars (~70 MB once)
    python -m devstack.iceberg_rest run --warehouse file:///tmp/wh
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from devstack.common import (
    HOST,
    ServerProcess,
    default_cache_dir,
    file_lock,
    launcher_parser,
    serve_until_stopped,
    work_dir,
)
from rsm_sidecar.iceberg.jars import SQLITE_JDBC

FIXTURE_VERSION = "1.11.0"
JETTY_VERSION = "12.1.14"
SLF4J_VERSION = "2.0.17"
HADOOP_VERSION = "3.4.2"  # the hadoop-client-api/-runtime jars of pyspark 4.1.4
_STAMP = ".devstack-complete"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>devstack.local</groupId><artifactId>iceberg-rest-fixture</artifactId><version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.iceberg</groupId><artifactId>iceberg-open-api</artifactId>
      <version>{v}</version><classifier>test-fixtures</classifier></dependency>
    <dependency><groupId>org.apache.iceberg</groupId><artifactId>iceberg-core</artifactId><version>{v}</version></dependency>
    <dependency><groupId>org.apache.iceberg</groupId><artifactId>iceberg-core</artifactId><version>{v}</version>
      <classifier>tests</classifier></dependency>
    <dependency><groupId>org.apache.iceberg</groupId><artifactId>iceberg-aws</artifactId><version>{v}</version></dependency>
    <dependency><groupId>org.apache.iceberg</groupId><artifactId>iceberg-aws-bundle</artifactId><version>{v}</version></dependency>
    <dependency><groupId>org.eclipse.jetty.ee10</groupId><artifactId>jetty-ee10-servlet</artifactId>
      <version>{jetty}</version></dependency>
    <dependency><groupId>org.eclipse.jetty.compression</groupId><artifactId>jetty-compression-gzip</artifactId>
      <version>{jetty}</version></dependency>
    <dependency><groupId>org.eclipse.jetty.compression</groupId><artifactId>jetty-compression-server</artifactId>
      <version>{jetty}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>{slf4j}</version></dependency>{standalone}
  </dependencies>
</project>
"""


#: What the tests take from pyspark and the Spark jar cache (:func:`_extra_jars`), resolved with
#: the fixture instead for a machine without them (the ``iceberg-rest`` image of docker/Dockerfile).
_STANDALONE_DEPENDENCIES = f"""
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-client-api</artifactId>
      <version>{HADOOP_VERSION}</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-client-runtime</artifactId>
      <version>{HADOOP_VERSION}</version></dependency>
    <dependency><groupId>org.xerial</groupId><artifactId>sqlite-jdbc</artifactId>
      <version>{SQLITE_JDBC.version}</version></dependency>"""


class RestFixtureError(RuntimeError):
    pass


def fixture_home(cache: Path | None = None, version: str = FIXTURE_VERSION, standalone: bool = False) -> Path:
    suffix = "-standalone" if standalone else ""
    return Path(cache or default_cache_dir()) / f"iceberg-rest-fixture-{version}{suffix}"


def ensure_rest_fixture(
    cache: Path | None = None,
    version: str = FIXTURE_VERSION,
    mvn: str | None = None,
    timeout: float = 600,
    standalone: bool = False,
) -> Path:
    """The fixture's ``lib`` directory, resolved once with Maven (idempotent, locked).
    ``standalone`` adds Hadoop's client jars and sqlite-jdbc, so that ``lib`` alone runs the
    server (the tests take those two from pyspark and the Spark jar cache instead)."""
    cache = Path(cache or default_cache_dir())
    home = fixture_home(cache, version, standalone)
    lib = home / "lib"
    if (home / _STAMP).exists():
        return lib
    with file_lock(cache / f"iceberg-rest-fixture-{version}.lock"):
        if (home / _STAMP).exists():
            return lib
        mvn = mvn or os.environ.get("MVN") or "mvn"
        if shutil.which(mvn) is None:
            raise RestFixtureError(f"Maven executable {mvn!r} not found on PATH (set $MVN)")
        home.mkdir(parents=True, exist_ok=True)
        pom = home / "pom.xml"
        pom.write_text(
            _POM.format(
                v=version,
                jetty=JETTY_VERSION,
                slf4j=SLF4J_VERSION,
                standalone=_STANDALONE_DEPENDENCIES if standalone else "",
            )
        )
        staging = home / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            f"-Dmaven.repo.local={cache / 'm2'}",
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RestFixtureError(
                f"resolving the Iceberg REST fixture failed ({' '.join(cmd)}):\n"
                f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
            )
        if not list(staging.glob(f"iceberg-open-api-{version}-test-fixtures.jar")):
            raise RestFixtureError(f"Maven finished but {staging} has no fixture jar")
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
        (home / _STAMP).write_text(json.dumps(sorted(p.name for p in lib.glob("*.jar"))))
    return lib


def _extra_jars() -> list[str]:
    """Hadoop (pyspark's shaded client jars) and sqlite-jdbc (the Spark jar cache)."""
    import pyspark

    from rsm_sidecar.iceberg import jars

    spark_jars = Path(pyspark.__file__).parent / "jars"
    hadoop = sorted(glob.glob(str(spark_jars / "hadoop-client-api-*.jar"))) + sorted(
        glob.glob(str(spark_jars / "hadoop-client-runtime-*.jar"))
    )
    if len(hadoop) < 2:
        raise RestFixtureError(f"no hadoop-client-api/runtime jars in {spark_jars}")
    sqlite = jars.artifact_path(jars.SQLITE_JDBC)
    if not sqlite.is_file():
        raise RestFixtureError(f"{sqlite} is missing: run python -m rsm_sidecar.iceberg.jars")
    return hadoop + [str(sqlite)]


class IcebergRestServer(ServerProcess):
    """``RESTCatalogServer`` on a port of :mod:`devstack.ports` unless given: a JDBC catalog on a
    SQLite file in ``workdir`` and the given warehouse (``file://`` or ``s3://`` with ``s3``
    settings)."""

    name = "iceberg-rest"
    startup_timeout = 90.0
    port_names = ("port",)
    port: int

    def __init__(
        self,
        workdir: Path,
        warehouse: str,
        *,
        s3: Mapping[str, str] | None = None,
        port: int | None = None,
        cache: Path | None = None,
    ):
        super().__init__(workdir)
        self.lib = ensure_rest_fixture(cache)
        self.warehouse = warehouse
        self.s3 = dict(s3 or {})
        self.choose_ports(port=port)
        self.db = self.workdir / "rest-catalog.db"

    @property
    def uri(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        cp = os.pathsep.join([str(self.lib / "*"), *_extra_jars()])
        return [
            "java",
            "-Xmx384m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            cp,
            "org.apache.iceberg.rest.RESTCatalogServer",
        ]

    def environment(self) -> Mapping[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CATALOG_", "AWS_"))}
        env.update(
            {
                "CATALOG_URI": f"jdbc:sqlite:{self.db}",
                "CATALOG_WAREHOUSE": self.warehouse,
                "CATALOG_REST_PORT": str(self.port),
                "CATALOG_JDBC_SCHEMA__VERSION": "V1",
            }
        )
        if self.s3:
            env.update(
                {
                    "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
                    "CATALOG_CLIENT_REGION": self.s3.get("region", "us-east-1"),
                    "CATALOG_S3_PATH__STYLE__ACCESS": "true",
                }
            )
            if self.s3.get("endpoint"):
                env["CATALOG_S3_ENDPOINT"] = self.s3["endpoint"]
            if self.s3.get("access_key_id"):
                env["CATALOG_S3_ACCESS__KEY__ID"] = self.s3["access_key_id"]
                env["CATALOG_S3_SECRET__ACCESS__KEY"] = self.s3.get("secret_access_key", "")
        return env

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False


def _main(argv: Sequence[str] | None = None) -> int:
    ap, run = launcher_parser(
        "devstack.iceberg_rest",
        __doc__,
        install_help="resolve the fixture's jars into the cache",
        run_help="run a REST catalog until interrupted",
        install_options=lambda p: p.add_argument(
            "--standalone", action="store_true", help="add Hadoop and sqlite-jdbc (lib alone runs the server)"
        ),
    )
    run.add_argument("--warehouse", default=None, help="default: file:// of a temp dir")
    args = ap.parse_args(argv)
    if args.cmd == "install":
        print(ensure_rest_fixture(standalone=args.standalone))
        return 0
    workdir = work_dir(args.dir, "iceberg-rest-")
    warehouse = args.warehouse or (workdir / "warehouse").as_uri()
    server = IcebergRestServer(workdir, warehouse)
    return serve_until_stopped(
        server, lambda: f"Iceberg REST catalog at {server.uri} (warehouse {warehouse}, log {server.log_file})"
    )


if __name__ == "__main__":
    sys.exit(_main())
