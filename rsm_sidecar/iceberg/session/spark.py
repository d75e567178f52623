"""Local Spark sessions with Iceberg, and the embedded default catalog shared with PyIceberg.

The embedded default catalog is Iceberg's ``JdbcCatalog`` on a SQLite file on the Spark side
and PyIceberg's ``SqlCatalog`` on the same file on the Python side, with the same catalog name on
both sides (the catalog name is a column of ``iceberg_tables``: a different name sees no
tables). The SQLite file is put in WAL mode before either side opens it (WAL is persistent in
the file), so a second connection does not fail with ``SQLITE_BUSY``. The warehouse is a local
directory.

Jars come from :mod:`rsm_sidecar.iceberg.jars` (fetched at set-up time, never at run time).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rsm_sidecar.iceberg import jars as _jars

if TYPE_CHECKING:  # pragma: no cover
    from pyiceberg.catalog.sql import SqlCatalog
    from pyspark.sql import SparkSession

    from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
    from rsm_sidecar.iceberg.settings import JobSettings

#: How long opening the embedded catalog waits for a lock another writer holds (seconds).
LOCK_WAIT_S = 30.0
DEFAULT_CATALOG_NAME = "rsm"


@dataclass(frozen=True)
class LocalCatalog:
    """The embedded catalog: a SQLite DB file plus a warehouse directory on local disk."""

    root: Path
    name: str = DEFAULT_CATALOG_NAME
    db_file: Path = field(default=None)  # type: ignore[assignment]
    warehouse: Path = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        root = Path(self.root).resolve()
        object.__setattr__(self, "root", root)
        if self.db_file is None:
            object.__setattr__(self, "db_file", root / "catalog.db")
        if self.warehouse is None:
            object.__setattr__(self, "warehouse", root / "warehouse")

    @property
    def jdbc_uri(self) -> str:
        return f"jdbc:sqlite:{self.db_file}?journal_mode=WAL"

    @property
    def sqlalchemy_uri(self) -> str:
        return f"sqlite:///{self.db_file}"

    @property
    def warehouse_uri(self) -> str:
        return self.warehouse.as_uri()

    def prepare(self) -> LocalCatalog:
        """Create the directories and the SQLite file in WAL mode (idempotent)."""
        self.warehouse.mkdir(parents=True, exist_ok=True)
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        # a writer (a follower's commit) may hold the file for a moment: wait for it, as
        # SQLAlchemy's and Spark's JDBC connections do, instead of failing after sqlite's 5 s
        con = sqlite3.connect(self.db_file, timeout=LOCK_WAIT_S)
        try:
            mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise RuntimeError(f"{self.db_file}: SQLite refused WAL mode (got {mode!r})")
        finally:
            con.close()
        return self

    def spark_conf(self) -> dict[str, str]:
        p = f"spark.sql.catalog.{self.name}"
        return {
            p: "org.apache.iceberg.spark.SparkCatalog",
            f"{p}.type": "jdbc",
            f"{p}.uri": self.jdbc_uri,
            f"{p}.warehouse": self.warehouse_uri,
            # V1 adds iceberg_type (views); PyIceberg 0.12 creates/expects that column too.
            f"{p}.jdbc.schema-version": "V1",
            # PyIceberg commits to the same tables: do not serve stale cached metadata.
            f"{p}.cache-enabled": "false",
            "spark.sql.defaultCatalog": self.name,
        }

    def pyiceberg(self, warehouse: str | None = None, **properties: str) -> SqlCatalog:
        """PyIceberg's ``SqlCatalog`` on the same DB file and warehouse, same catalog name.

        A new catalog file gets its tables from the first ``SqlCatalog``, which checks for them
        and then creates them: two processes doing so at once (a follower starting while
        ``iceberg status`` runs, two jobs on a fresh catalog) make one fail with "table ...
        already exists". That one tries again and finds the tables."""
        from pyiceberg.catalog.sql import SqlCatalog
        from sqlalchemy.exc import OperationalError

        self.prepare()
        for attempt in range(3):
            try:
                where = warehouse or self.warehouse_uri
                catalog = SqlCatalog(self.name, uri=self.sqlalchemy_uri, warehouse=where, **properties)
            except OperationalError as exc:
                if "already exists" not in str(exc) or attempt == 2:
                    raise
            else:
                _write_transactions_wait(catalog.engine)
                return catalog
        raise AssertionError("unreachable")


def _write_transactions_wait(engine) -> None:
    """Make every transaction of ``engine`` on the SQLite file take the write lock when it
    begins (``BEGIN IMMEDIATE``) and wait up to 30 s for it. With SQLite's default, a
    transaction that read first and then writes fails at once with "database is locked" when
    another connection (Spark's JDBC catalog, another job's commit) wrote meanwhile: a follower
    round failed that way in a test. The connections opened while the catalog checked its tables
    are dropped so that every connection gets the settings."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # the driver's own BEGIN off: the one below
        dbapi_connection.execute("PRAGMA busy_timeout = 30000")

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


def default_catalog() -> LocalCatalog:
    """``$RSM_ICEBERG_DIR`` (default ``<repo>/run/iceberg``) as the embedded catalog root."""
    env = os.environ.get("RSM_ICEBERG_DIR", "").strip()
    return LocalCatalog(Path(env) if env else _jars.REPO_ROOT / "run" / "iceberg")


def spark_conf(
    catalog: LocalCatalog | CatalogSpec,
    *,
    master: str = "local[2]",
    jars: Sequence[os.PathLike[str] | str] | None = None,
    cloud: Sequence[str] = (),
    cache_dir: Path | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Every Spark setting :func:`spark_session` uses, for inspection or ``spark-submit``."""
    jar_paths = [str(j) for j in (jars if jars is not None else _jars.spark_jars(cache_dir, cloud))]
    conf = {
        "spark.master": master,
        "spark.jars": ",".join(jar_paths),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "2g",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        # Python workers use the interpreter running this code (the venv), which has pyarrow.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.extraJavaOptions": "-Dderby.system.home=/tmp -XX:+UseParallelGC",
    }
    conf.update(catalog.spark_conf())
    for k, v in (extra or {}).items():
        conf[k] = str(v)
    return conf


def spark_session(
    catalog: LocalCatalog | CatalogSpec | None = None,
    *,
    master: str = "local[2]",
    app_name: str = "rsm-iceberg",
    jars: Sequence[os.PathLike[str] | str] | None = None,
    cloud: Sequence[str] = (),
    cache_dir: Path | None = None,
    extra: Mapping[str, Any] | None = None,
) -> SparkSession:
    """A local SparkSession with Iceberg and the embedded catalog as the default catalog.

    ``jars`` defaults to the cached set-up jars (``cloud`` adds ``"aws"``/``"gcp"`` bundles);
    a missing jar raises :class:`~rsm_sidecar.errors.ConfigError` naming the set-up command.
    Spark reads ``spark.jars`` only when its JVM starts: if a session is already running in
    this process with other jars, stop it first.
    """
    from pyspark.sql import SparkSession

    catalog = (catalog or default_catalog()).prepare()
    conf = spark_conf(catalog, master=master, jars=jars, cloud=cloud, cache_dir=cache_dir, extra=extra)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = SparkSession.builder.appName(app_name)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def under_spark_submit() -> bool:
    """True when this driver was started by ``spark-submit`` (its JVM is already running)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def open_session(
    spec: CatalogSpec, settings: JobSettings, app_name: str, extra: Mapping[str, str] | None = None
):
    """The job's SparkSession. Standalone: a session of its own (``iceberg.spark.master``, jars
    from the local cache, the job's catalog). Under ``spark-submit``: the submitted
    application's session, given only the Iceberg extensions and the job's catalog - master,
    jars, Python and resources are what ``spark-submit`` was told (docs/iceberg.md)."""
    if not under_spark_submit():
        from rsm_sidecar.iceberg.session.spark import spark_session

        return spark_session(spec, master=settings.master, app_name=app_name, cloud=spec.cloud(), extra=extra)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for k, v in {**spec.prepare().spark_conf(), **(extra or {})}.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


# ============================================================================ results
