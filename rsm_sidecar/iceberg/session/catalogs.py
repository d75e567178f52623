"""The catalogs a job writes to, configured identically on the Spark and PyIceberg sides.

* ``local`` (the embedded default): Iceberg's ``JdbcCatalog`` on a SQLite file (WAL) for Spark
  and PyIceberg's ``SqlCatalog`` on the same file (:class:`~rsm_sidecar.iceberg.session.spark.LocalCatalog`).
* ``rest``: an Iceberg REST catalog (Spark ``type=rest``, PyIceberg ``RestCatalog``).

Either can have an ``s3://`` warehouse; then both sides get ``S3FileIO`` / PyArrow S3 settings
(endpoint, region, credentials, path-style) and Spark needs the ``iceberg-aws-bundle`` jar. A
``gs://`` warehouse gets ``GCSFileIO`` / PyArrow GCS settings (endpoint, project, credentials
from Application Default Credentials or none for emulators) and the ``iceberg-gcp-bundle`` jar.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg.session.spark import LocalCatalog, default_catalog
from rsm_sidecar.iceberg.settings import JobSettings


@dataclasses.dataclass(frozen=True)
class CatalogSpec:
    """Duck-types :class:`LocalCatalog` for :func:`rsm_sidecar.iceberg.session.spark.spark_conf`
    (``name``, ``prepare()``, ``spark_conf()``, ``pyiceberg()``)."""

    type: str
    name: str
    local: LocalCatalog | None = None
    uri: str | None = None
    warehouse: str | None = None
    credential: str | None = dataclasses.field(default=None, repr=False)
    token: str | None = dataclasses.field(default=None, repr=False)
    s3: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    gcs: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_settings(cls, s: JobSettings) -> CatalogSpec:
        if s.catalog_type == "local":
            local = (
                LocalCatalog(Path(s.local_root), name=s.catalog_name)
                if s.local_root
                else LocalCatalog(default_catalog().root, name=s.catalog_name)
            )
            return cls(
                "local", s.catalog_name, local=local, warehouse=s.warehouse, s3=dict(s.s3), gcs=dict(s.gcs)
            )
        if not s.rest_uri:
            raise ConfigError("iceberg.catalog.rest.uri: required when iceberg.catalog.type = 'rest'")
        return cls(
            "rest",
            s.catalog_name,
            uri=s.rest_uri,
            warehouse=s.warehouse,
            credential=s.rest_credential,
            token=s.rest_token,
            s3=dict(s.s3),
            gcs=dict(s.gcs),
        )

    # ------------------------------------------------------------------ shared
    @property
    def warehouse_uri(self) -> str | None:
        if self.warehouse:
            return self.warehouse
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
        where = self.local.db_file if self.local is not None else self.uri
        return (
            f"{self.type} catalog {self.name!r} ({where}, warehouse {self.warehouse_uri or 'server default'})"
        )

    # ------------------------------------------------------------------ Spark
    def spark_conf(self) -> dict[str, str]:
        p = f"spark.sql.catalog.{self.name}"
        if self.local is not None:
            conf = self.local.spark_conf()
            if self.warehouse:
                conf[f"{p}.warehouse"] = self.warehouse
        else:
            assert self.uri is not None, "from_settings requires iceberg.catalog.rest.uri for a REST catalog"
            conf = {
                p: "org.apache.iceberg.spark.SparkCatalog",
                f"{p}.type": "rest",
                f"{p}.uri": self.uri,
                f"{p}.cache-enabled": "false",
            }
            if self.warehouse:
                conf[f"{p}.warehouse"] = self.warehouse
            if self.credential:
                conf[f"{p}.credential"] = self.credential
            if self.token:
                conf[f"{p}.token"] = self.token
        if self.uses_s3:
            conf[f"{p}.io-impl"] = "org.apache.iceberg.aws.s3.S3FileIO"
            conf[f"{p}.client.region"] = self.s3.get("region") or "us-east-1"
            if self.s3.get("endpoint"):
                conf[f"{p}.s3.endpoint"] = self.s3["endpoint"]
            if self.s3.get("path_style_access"):
                conf[f"{p}.s3.path-style-access"] = "true"
            if self.s3.get("access_key_id"):
                conf[f"{p}.s3.access-key-id"] = self.s3["access_key_id"]
                conf[f"{p}.s3.secret-access-key"] = self.s3.get("secret_access_key") or ""
        if self.uses_gcs:
            conf[f"{p}.io-impl"] = "org.apache.iceberg.gcp.gcs.GCSFileIO"
            if self.gcs.get("endpoint"):
                conf[f"{p}.gcs.service.host"] = self.gcs["endpoint"]
            if self.gcs.get("project_id"):
                conf[f"{p}.gcs.project-id"] = self.gcs["project_id"]
            if self.gcs.get("no_auth"):
                conf[f"{p}.gcs.no-auth"] = "true"
        return conf

    # ------------------------------------------------------------------ PyIceberg
    def pyiceberg_properties(self) -> dict[str, str]:
        props: dict[str, str] = {}
        if self.uses_s3:
            props["s3.region"] = self.s3.get("region") or "us-east-1"
            if self.s3.get("endpoint"):
                props["s3.endpoint"] = self.s3["endpoint"]
            if self.s3.get("access_key_id"):
                props["s3.access-key-id"] = self.s3["access_key_id"]
                props["s3.secret-access-key"] = self.s3.get("secret_access_key") or ""
            if self.s3.get("path_style_access"):
                props["s3.force-virtual-addressing"] = "false"
        if self.uses_gcs:
            if self.gcs.get("endpoint"):
                props["gcs.service.host"] = self.gcs["endpoint"]
            if self.gcs.get("project_id"):
                props["gcs.project-id"] = self.gcs["project_id"]
            if self.gcs.get("no_auth"):
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

        if self.warehouse:
            props["warehouse"] = self.warehouse
        if self.credential:
            props["credential"] = self.credential
        if self.token:
            props["token"] = self.token
        return RestCatalog(self.name, uri=self.uri, **props)
