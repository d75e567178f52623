"""The catalogs a job writes to, configured identically on the Spark and PyIceberg sides.

* ``local`` (the embedded default, :class:`LocalCatalog`): Iceberg's ``JdbcCatalog`` on a SQLite
  file for Spark and PyIceberg's ``SqlCatalog`` on the same file, with the same catalog name on
  both sides (the catalog name is a column of ``iceberg_tables``: a different name sees no
  tables). The SQLite file is put in WAL mode before either side opens it (WAL is persistent in
  the file), so a second connection does not fail with ``SQLITE_BUSY``. The warehouse is a local
  directory.
* ``rest``: an Iceberg REST catalog (Spark ``type=rest``, PyIceberg ``RestCatalog``).

Either can have an ``s3://`` warehouse; then both sides get ``S3FileIO`` / PyArrow S3 settings
(endpoint, region, credentials, path-style) and Spark needs the ``iceberg-aws-bundle`` jar. A
``gs://`` warehouse gets ``GCSFileIO`` / PyArrow GCS settings (endpoint, project, credentials
from Application Default Credentials or none for emulators) and the ``iceberg-gcp-bundle`` jar.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rsm_sidecar.iceberg.settings import CatalogSettings

if TYPE_CHECKING:  # pragma: no cover
    from pyiceberg.catalog.sql import SqlCatalog

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
        # SQLAlchemy's and Spark's JDBC connections do, instead of failing after sqlite's 5 s.
        # SQLite's busy timeout does not cover every lock: connections switching a new file
        # (rollback journal) to WAL at the same time deadlock on the lock upgrade, and SQLite
        # answers "database is locked" at once (seen in CI: a test's catalog read racing the
        # follower's; tests/iceberg/test_local_catalog.py). So the mode is read first (set only
        # on a new file) and a busy answer is tried again until the wait is over.
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            con = sqlite3.connect(self.db_file, timeout=LOCK_WAIT_S)
            try:
                mode = con.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() != "wal":
                    mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise RuntimeError(f"{self.db_file}: SQLite refused WAL mode (got {mode!r})")
                return self
            except sqlite3.OperationalError as e:
                if ("locked" not in str(e) and "busy" not in str(e)) or time.monotonic() > deadline:
                    raise
            finally:
                con.close()
            time.sleep(0.05)

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


def default_catalog_root() -> Path:
    """Where the embedded catalog is when ``iceberg.catalog.local.root`` does not say:
    ``$RSM_ICEBERG_DIR``, else the user's data directory (XDG: ``$XDG_DATA_HOME/rsm-sidecar/iceberg``,
    ``~/.local/share/rsm-sidecar/iceberg`` without it), wherever rsm-sidecar is installed or run
    from."""
    env = os.environ.get("RSM_ICEBERG_DIR", "").strip()
    if env:
        return Path(env)
    data = os.environ.get("XDG_DATA_HOME", "").strip()
    base = Path(data) if os.path.isabs(data) else Path.home() / ".local" / "share"  # XDG: absolute only
    return base / "rsm-sidecar" / "iceberg"


def default_catalog() -> LocalCatalog:
    """The embedded catalog at :func:`default_catalog_root`."""
    return LocalCatalog(default_catalog_root())


@dataclasses.dataclass(frozen=True)
class CatalogSpec:
    """The job's catalog, from its :class:`CatalogSettings` (``iceberg.catalog.*``,
    ``iceberg.warehouse``, ``iceberg.s3.*``, ``iceberg.gcs.*``); duck-types
    :class:`LocalCatalog` (``name``, ``prepare()``, ``spark_conf()``, ``pyiceberg()``)."""

    settings: CatalogSettings
    #: the embedded catalog (``local``), its root resolved; None for ``rest``
    local: LocalCatalog | None = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        s = self.settings
        local = None
        if s.type == "local":
            root = Path(s.local.root) if s.local.root else default_catalog_root()
            local = LocalCatalog(root, name=s.name)
        object.__setattr__(self, "local", local)

    @property
    def name(self) -> str:
        return self.settings.name

    # ------------------------------------------------------------------ shared
    @property
    def warehouse_uri(self) -> str | None:
        if self.settings.warehouse:
            return self.settings.warehouse
        if self.local is not None:
            return self.local.warehouse_uri
        return None

    @property
    def uses_s3(self) -> bool:
        return bool(self.warehouse_uri and self.warehouse_uri.startswith(("s3://", "s3a://")))

    @property
    def uses_gcs(self) -> bool:
        return bool(self.warehouse_uri and self.warehouse_uri.startswith("gs://"))

    def cloud(self) -> tuple[str, ...]:
        """Spark jar bundles this catalog needs."""
        return ("aws",) if self.uses_s3 else ("gcp",) if self.uses_gcs else ()

    def prepare(self) -> CatalogSpec:
        if self.local is not None:
            self.local.prepare()
        return self

    def describe(self) -> str:
        where = self.local.db_file if self.local is not None else self.settings.rest.uri
        warehouse = self.warehouse_uri or "server default"
        return f"{self.settings.type} catalog {self.name!r} ({where}, warehouse {warehouse})"

    # ------------------------------------------------------------------ Spark
    def spark_conf(self) -> dict[str, str]:
        p = f"spark.sql.catalog.{self.name}"
        if self.local is not None:
            conf = self.local.spark_conf()
            if self.settings.warehouse:
                conf[f"{p}.warehouse"] = self.settings.warehouse
        else:
            rest = self.settings.rest
            conf = {
                p: "org.apache.iceberg.spark.SparkCatalog",
                f"{p}.type": "rest",
                f"{p}.uri": str(rest.uri),
                f"{p}.cache-enabled": "false",
            }
            if self.settings.warehouse:
                conf[f"{p}.warehouse"] = self.settings.warehouse
            if rest.credential:
                conf[f"{p}.credential"] = rest.credential
            if rest.token:
                conf[f"{p}.token"] = rest.token
        s3, gcs = self.settings.s3, self.settings.gcs
        if self.uses_s3:
            conf[f"{p}.io-impl"] = "org.apache.iceberg.aws.s3.S3FileIO"
            conf[f"{p}.client.region"] = s3.region or "us-east-1"
            if s3.endpoint:
                conf[f"{p}.s3.endpoint"] = s3.endpoint
            if s3.path_style_access:
                conf[f"{p}.s3.path-style-access"] = "true"
            if s3.access_key_id:
                conf[f"{p}.s3.access-key-id"] = s3.access_key_id
                conf[f"{p}.s3.secret-access-key"] = s3.secret_access_key or ""
        if self.uses_gcs:
            conf[f"{p}.io-impl"] = "org.apache.iceberg.gcp.gcs.GCSFileIO"
            if gcs.endpoint:
                conf[f"{p}.gcs.service.host"] = gcs.endpoint
            if gcs.project_id:
                conf[f"{p}.gcs.project-id"] = gcs.project_id
            if gcs.no_auth:
                conf[f"{p}.gcs.no-auth"] = "true"
        return conf

    # ------------------------------------------------------------------ PyIceberg
    def pyiceberg_properties(self) -> dict[str, str]:
        props: dict[str, str] = {}
        s3, gcs = self.settings.s3, self.settings.gcs
        if self.uses_s3:
            props["s3.region"] = s3.region or "us-east-1"
            if s3.endpoint:
                props["s3.endpoint"] = s3.endpoint
            if s3.access_key_id:
                props["s3.access-key-id"] = s3.access_key_id
                props["s3.secret-access-key"] = s3.secret_access_key or ""
            if s3.path_style_access:
                props["s3.force-virtual-addressing"] = "false"
        if self.uses_gcs:
            if gcs.endpoint:
                props["gcs.service.host"] = gcs.endpoint
            if gcs.project_id:
                props["gcs.project-id"] = gcs.project_id
            if gcs.no_auth:
                # PyArrow's GCS file system has no anonymous mode through PyIceberg: a placeholder
                # token that never expires (2100-01-01), which emulators ignore.
                props["gcs.oauth2.token"] = "no-auth"
                props["gcs.oauth2.token-expires-at"] = "4102444800000"
        return props

    def pyiceberg(self):
        props = self.pyiceberg_properties()
        if self.local is not None:
            return self.local.pyiceberg(warehouse=self.warehouse_uri, **props)
        from pyiceberg.catalog.rest import RestCatalog

        rest = self.settings.rest
        if self.settings.warehouse:
            props["warehouse"] = self.settings.warehouse
        if rest.credential:
            props["credential"] = rest.credential
        if rest.token:
            props["token"] = rest.token
        return RestCatalog(self.name, uri=rest.uri, **props)
