"""Tiered segments -> Iceberg tables with the Bufstream-style schema (docs/iceberg.md).

One concept per module, grouped by the step of a run it serves, in the order the data goes:

* :mod:`.settings` - the ``[iceberg]`` configuration keys.
* :mod:`.job` - one run of ``iceberg convert`` top to bottom (markers, plan, schema, the Spark
  stage, commit).
* :mod:`.planning` (driver) - which segments, or pieces of them, a run converts: ``listing``,
  ``chains``, ``transactions``, ``splitting``; ``tasks`` is what an executor is handed;
  ``pruning`` narrows the tasks to what a filtered read needs.
* :mod:`.stages` - the run's Spark stage as executors run it, and its errors on the driver.
* :mod:`.reading` (executors) - a task's segment from storage into raw record batches.
* :mod:`.decoding` - key/value bytes -> columns: framing, registry, Protobuf and Avro mapping,
  and the ``sides`` that choose between them.
* :mod:`.mapping` - the table: its row schema, its evolution, raw records -> rows of it.
* :mod:`.committing` - data files written by executors; markers and the conditional commit.
* :mod:`.maintenance` - ``iceberg maintain``; :mod:`.follow` - ``convert --follow``.
* :mod:`.source` - the ``rsm-tiered`` Spark data source (batch and streaming reads, no table).
* :mod:`.session` - the catalog (``catalogs``) and the SparkSession on it (``spark``).
* :mod:`.types` (type helpers), :mod:`.jars` (set-up time only).
"""
