"""Kafka records -> Arrow/Iceberg with the Bufstream-style table schema.

Modules:

* :mod:`~rsm_sidecar.iceberg.jars` - Maven Central jars for Spark (set-up time only).
* :mod:`~rsm_sidecar.iceberg.spark` - local SparkSession + the embedded JDBC/SQLite catalog
  shared with PyIceberg's SqlCatalog.
* :mod:`~rsm_sidecar.iceberg.framing` - Confluent wire-format preamble (magic, id, indexes).
* :mod:`~rsm_sidecar.iceberg.schema_registry` - registry client, subject strategies, schema
  resolution (Protobuf with references/WKTs compiled by protoc, Avro via fastavro).
* :mod:`~rsm_sidecar.iceberg.proto_mapping`, :mod:`~rsm_sidecar.iceberg.avro_mapping` - source
  schema -> Iceberg types.
* :mod:`~rsm_sidecar.iceberg.rows` - the row schema and the record -> ``pyarrow.RecordBatch``
  encoder used inside ``mapInArrow``.
* :mod:`~rsm_sidecar.iceberg.evolution` - schema evolution with stable field ids.

See docs/iceberg.md.
"""
