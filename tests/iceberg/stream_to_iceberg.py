"""The streaming job of test_source.py (the example of docs/iceberg.md, "The data source"):
``readStream.format("rsm-tiered")`` -> Iceberg ``writeStream``, one segment per micro-batch, in
the sidecar configuration's catalog, until killed.

    python stream_to_iceberg.py <sidecar.toml> <topic> <table> <checkpoint dir>
"""

from __future__ import annotations

import sys

from rsm_sidecar.iceberg.job import load_config
from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
from rsm_sidecar.iceberg.session.spark import open_session
from rsm_sidecar.iceberg.settings import JobSettings
from rsm_sidecar.iceberg.source import register


def main(config: str, topic: str, table: str, checkpoint: str) -> None:
    cfg, _ = load_config(config)
    settings = JobSettings.from_config(cfg)
    catalog = CatalogSpec(settings.catalog)
    spark = open_session(catalog.prepare(), settings.spark, "rsm-tiered-stream")
    register(spark)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog.name}.{settings.namespace}")
    stream = (
        spark.readStream.format("rsm-tiered")
        .option("config", config)
        .option("topic", topic)
        .option("maxSegmentsPerTrigger", "1")
        .load()
    )
    query = (
        stream.writeStream.format("iceberg")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .toTable(f"{catalog.name}.{settings.namespace}.{table}")
    )
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:5])
