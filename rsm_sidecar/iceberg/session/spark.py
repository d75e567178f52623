"""The job's SparkSession: a session of its own with Iceberg (``local[N]`` or a cluster's
master), or, under ``spark-submit``, the submitted application's session; either way with the
job's catalog from :mod:`~rsm_sidecar.iceberg.session.catalogs` (which gives settings and
knows nothing of sessions).

Jars come from :mod:`rsm_sidecar.iceberg.jars` (fetched at set-up time, never at run time).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from rsm_sidecar.iceberg import jars as _jars
from rsm_sidecar.iceberg.session import scratch
from rsm_sidecar.iceberg.session.catalogs import CatalogSpec, LocalCatalog, default_catalog

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from rsm_sidecar.iceberg.settings import SparkSettings


def spark_conf(
    catalog: LocalCatalog | CatalogSpec,
    *,
    master: str = "local[2]",
    jars: Sequence[os.PathLike[str] | str] | None = None,
    cloud: Sequence[str] = (),
    cache_dir: Path | None = None,
    extra: Mapping[str, Any] | None = None,
    scratch: Path | None = None,
) -> dict[str, str]:
    """Every Spark setting :func:`spark_session` uses, for inspection or ``spark-submit``;
    ``scratch``: the driver's directory for temporary files (:mod:`.scratch`), else the JVM's
    default (``/tmp``)."""
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
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={scratch or '/tmp'} -XX:+UseParallelGC",
    }
    if scratch is not None:
        conf["spark.local.dir"] = str(scratch)
        conf["spark.driver.extraJavaOptions"] += f" -Djava.io.tmpdir={scratch}"
    conf.update(catalog.spark_conf())
    for k, v in (extra or {}).items():
        conf[k] = str(v)
    return conf


class ConfOptions(TypedDict, total=False):
    """The options of :func:`spark_conf` that :func:`spark_session` passes on (defaults there)."""

    master: str
    jars: Sequence[os.PathLike[str] | str] | None
    cloud: Sequence[str]
    cache_dir: Path | None
    extra: Mapping[str, Any] | None


def spark_session(
    catalog: LocalCatalog | CatalogSpec | None = None,
    *,
    app_name: str = "rsm-iceberg",
    scratch_dir: Path | None = None,
    **options: Unpack[ConfOptions],
) -> SparkSession:
    """A local SparkSession with Iceberg and the embedded catalog as the default catalog.

    The driver's temporary files go to a directory of this process under ``scratch_dir``
    (:func:`.scratch.claim`: removed at exit, and by the next job if this one is killed).

    ``options`` go to :func:`spark_conf`: ``jars`` defaults to the cached set-up jars (``cloud``
    adds ``"aws"``/``"gcp"`` bundles); a missing jar raises
    :class:`~rsm_sidecar.errors.ConfigError` naming the set-up command.
    Spark reads ``spark.jars`` only when its JVM starts: if a session is already running in
    this process with other jars, stop it first.
    """
    from pyspark.sql import SparkSession

    catalog = (catalog or default_catalog()).prepare()
    conf = spark_conf(catalog, scratch=scratch.claim(scratch_dir), **options)
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
    spec: CatalogSpec, settings: SparkSettings, app_name: str, extra: Mapping[str, str] | None = None
):
    """The job's SparkSession. Standalone: a session of its own (``iceberg.spark.master``, jars
    from the local cache, the job's catalog). Under ``spark-submit``: the submitted
    application's session, given only the Iceberg extensions and the job's catalog - master,
    jars, Python and resources are what ``spark-submit`` was told (docs/iceberg.md)."""
    if not under_spark_submit():
        return spark_session(
            spec,
            master=settings.master,
            app_name=app_name,
            cloud=spec.cloud(),
            extra=extra,
            scratch_dir=settings.scratch_path,
        )
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for k, v in {**spec.prepare().spark_conf(), **(extra or {})}.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()
