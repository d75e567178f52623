"""Configuration of the Iceberg jobs (``rsm-sidecar iceberg convert|maintain``).

The jobs read the sidecar's own configuration file (storage, key prefix, encryption keys: the
job reads segments exactly as the sidecar wrote them) plus the ``[iceberg]`` keys declared
here, once, as the fields of ``JobSettings`` and its groups (``CatalogSettings``: where the
tables are, one object for the Spark and the PyIceberg side). Environment overrides work as
for every key (``RSM__ICEBERG__REGISTRY__URL=...``), and the command line overrides both (see
``rsm-sidecar iceberg convert --help``).

This module must stay importable without pyspark/pyiceberg: ``rsm-sidecar config docs`` and
``Config`` load every key module.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from rsm_sidecar.config import Settings, family, group, setting
from rsm_sidecar.errors import ConfigError

MiB = 1024 * 1024
PARTITIONINGS = ("hour", "day", "month", "none")


# -- catalog and warehouse ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LocalCatalogSettings(Settings):
    root: str | None = setting(
        "path",
        None,
        "Directory of the embedded catalog (`catalog.db`, default warehouse `warehouse/`). Unset: "
        "`$RSM_ICEBERG_DIR`, else `$XDG_DATA_HOME/rsm-sidecar/iceberg` (`~/.local/share/rsm-sidecar/iceberg` "
        "when `XDG_DATA_HOME` is unset): the user's data directory, wherever rsm-sidecar is installed.",
    )


@dataclasses.dataclass(frozen=True)
class RestCatalogSettings(Settings):
    uri: str | None = setting(
        "str",
        None,
        "REST catalog base URI (`http://host:8181`).",
        required_when=("iceberg.catalog.type", "rest"),
    )
    credential: str | None = setting(
        "str", None, "OAuth2 client credential `client_id:client_secret` for the REST catalog.", secret=True
    )
    token: str | None = setting("str", None, "Bearer token for the REST catalog.", secret=True)


@dataclasses.dataclass(frozen=True)
class WarehouseS3Settings(Settings):
    endpoint: str | None = setting("str", None, "S3 endpoint URL of an `s3://` warehouse (unset: AWS).")
    region: str = setting("str", "us-east-1", "S3 region of an `s3://` warehouse.")
    access_key_id: str | None = setting(
        "str",
        None,
        "S3 access key of an `s3://` warehouse (unset: the AWS default credential chain).",
        secret=True,
    )
    secret_access_key: str | None = setting(
        "str", None, "S3 secret key of an `s3://` warehouse.", secret=True
    )
    path_style_access: bool = setting(
        "bool", False, "Path-style S3 URLs (`endpoint/bucket/key`), as most S3-compatible servers need."
    )


@dataclasses.dataclass(frozen=True)
class WarehouseGcsSettings(Settings):
    endpoint: str | None = setting(
        "str",
        None,
        "GCS endpoint URL of a `gs://` warehouse (unset: Google; an emulator's URL such as "
        "`http://127.0.0.1:4443`). Credentials come from Application Default Credentials "
        "(`GOOGLE_APPLICATION_CREDENTIALS`, the metadata server) on both the Spark and the PyIceberg side.",
    )
    project_id: str | None = setting(
        "str", None, "Project id of a `gs://` warehouse (needed by some credentials)."
    )
    no_auth: bool = setting(
        "bool",
        False,
        "Send no Google credentials (emulators). PyIceberg's GCS file system has no anonymous mode, "
        "so the driver sends the placeholder bearer token `no-auth` instead.",
    )


@dataclasses.dataclass(frozen=True)
class CatalogSettings(Settings):
    """Where a job's tables are: the catalog (``iceberg.catalog.*``) and its warehouse
    (``iceberg.warehouse``, ``iceberg.s3.*``, ``iceberg.gcs.*``). The Spark and the PyIceberg
    side are both configured from this one object (:mod:`rsm_sidecar.iceberg.session.catalogs`)."""

    KEY_PREFIX = "iceberg"

    type: str = setting(
        "str",
        "local",
        "`local`: the embedded JDBC catalog on a SQLite file shared with PyIceberg's SqlCatalog; "
        "`rest`: an Iceberg REST catalog.",
        key="catalog.type",
        choices=("local", "rest"),
    )
    name: str = setting(
        "str",
        "rsm",
        "Catalog name on the Spark and PyIceberg sides (for `local` it is also the `catalog_name` "
        "column of the SQLite tables: both sides must use the same).",
        key="catalog.name",
    )
    local: LocalCatalogSettings = group(LocalCatalogSettings, key="catalog.local")
    rest: RestCatalogSettings = group(RestCatalogSettings, key="catalog.rest")
    warehouse: str | None = setting(
        "str",
        None,
        "Warehouse location: `file:///...`, `s3://bucket/prefix` or `gs://bucket/prefix`. Unset: "
        "`<local.root>/warehouse` for `local`; the REST server's default for `rest` (sent as "
        "`warehouse` when set).",
    )
    s3: WarehouseS3Settings = group(WarehouseS3Settings)
    gcs: WarehouseGcsSettings = group(WarehouseGcsSettings)


# -- decoding ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RegistrySettings(Settings):
    KEY_PREFIX = "iceberg.registry"

    url: str | None = setting(
        "str",
        None,
        "Confluent-compatible schema registry URL; unset: no registry (keys/values raw unless a "
        "descriptor set is configured).",
    )
    basic_auth_user_info: str | None = setting(
        "str", None, "Registry basic auth `user:password`.", secret=True
    )
    bearer_token: str | None = setting("str", None, "Registry static bearer token.", secret=True)
    bearer_logical_cluster: str | None = setting(
        "str",
        None,
        "Logical cluster sent with the bearer token (Confluent Cloud; required with a bearer token).",
    )
    bearer_identity_pool: str | None = setting("str", None, "Identity pool id sent with the bearer token.")
    ssl_ca_location: str | None = setting(
        "path", None, "PEM CA bundle that signed the registry's TLS certificate."
    )
    ssl_certificate_location: str | None = setting("path", None, "PEM client certificate (mutual TLS).")
    ssl_key_location: str | None = setting("path", None, "PEM private key of the client certificate.")
    timeout: float = setting("seconds", 10.0, "Timeout of one registry request.", min=0.1)

    def __post_init__(self) -> None:
        if self.bearer_token and not self.bearer_logical_cluster:
            raise ConfigError(
                "iceberg.registry.bearer_logical_cluster: required with iceberg.registry.bearer_token"
            )

    def client_config(self) -> dict[str, Any] | None:
        """The registry client's configuration (confluent-kafka's names); None: no registry."""
        if not self.url:
            return None
        conf: dict[str, Any] = {"url": self.url, "timeout": self.timeout}
        if self.basic_auth_user_info:
            conf["basic.auth.user.info"] = self.basic_auth_user_info
        if self.bearer_token:
            conf["bearer.auth.credentials.source"] = "STATIC_TOKEN"
            conf["bearer.auth.token"] = self.bearer_token
            conf["bearer.auth.logical.cluster"] = self.bearer_logical_cluster
            if self.bearer_identity_pool:
                conf["bearer.auth.identity.pool.id"] = self.bearer_identity_pool
        for name, value in (
            ("ssl.ca.location", self.ssl_ca_location),
            ("ssl.certificate.location", self.ssl_certificate_location),
            ("ssl.key.location", self.ssl_key_location),
        ):
            if value:
                conf[name] = value
        return conf


@dataclasses.dataclass(frozen=True)
class SideSettings(Settings):
    """How the keys or the values of the records are decoded (``iceberg.key.*``,
    ``iceberg.value.*``); the docs say which (``{side}``, ``{column}``)."""

    raw: bool = setting(
        "bool", False, "Never decode record {side}s: the `{column}` struct holds only `__raw__`."
    )
    subject: str | None = setting(
        "str",
        None,
        "Registry subject of the {side}s' schema; unset: TopicNameStrategy (`<topic>-{side}`). "
        "An explicit subject must exist; a missing TopicNameStrategy subject means no schema (raw).",
    )
    message: str | None = setting(
        "str",
        None,
        "Protobuf full message name of the {side}s (`pkg.Msg`). Needed when the schema file has "
        "several top-level messages that neither the table (`rsm.{side}.message`) nor a record framed "
        "with the latest schema id names, and with `{prefix}.descriptor_set`.",
    )
    descriptor_set: str | None = setting(
        "path",
        None,
        "A Protobuf descriptor-set file (`protoc --include_imports --descriptor_set_out`, "
        "`buf build -o`): decode unframed {side}s with `{prefix}.message` from it, without "
        "a registry (the embedded default).",
    )
    json_schema: str | None = setting(
        "path",
        None,
        "A JSON Schema file: decode unframed JSON {side}s with it into columns, without a "
        'registry (docs/iceberg.md "JSON → Iceberg").',
    )
    json_infer: int = setting(
        "int",
        0,
        "Infer a JSON Schema for unframed JSON {side}s from the first this many {side}s of each "
        "partition's new records in every run, merged with the schema the table recorded "
        "(`rsm.{side}.json-schema`), so that columns are added as new properties appear; "
        '0: off (docs/iceberg.md "Inferred JSON schemas").',
        min=0,
        max=100_000,
    )
    unframed: str = setting(
        "str",
        "error",
        "What a record {side} without the registry's framing "
        "(magic byte 0x00 + schema id) becomes when the {side} side has a registry subject: "
        "`error`, a record-level error (`__err__` + `__raw__`); `latest`, decoded with the "
        "subject's latest schema (pinned when the run starts), whose id each row records in "
        '`__schema_id__` (docs/iceberg.md "Values without framing").',
        choices=("error", "latest"),
    )


@dataclasses.dataclass(frozen=True)
class ProtoSettings(Settings):
    uint32_as_long: bool = setting(
        "bool",
        False,
        "Map Protobuf uint32/fixed32 to long (lossless) instead of int "
        "(the seed's rule: values >= 2^31 wrap).",
    )
    well_known_types: bool = setting(
        "bool",
        True,
        "Map google.protobuf Timestamp/Duration/wrappers/Struct to timestamptz/long/primitives/JSON "
        "instead of plain structs.",
    )


# -- Spark and executors ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SparkSettings(Settings):
    master: str = setting(
        "str",
        "local[2]",
        "Spark master of the job when it starts its own session (`spark-submit` overrides it).",
    )
    scratch_dir: str = setting(
        "str",
        "",
        "Where a job that starts its own Spark session keeps the driver's temporary files "
        "(`spark.local.dir` and the JVM's `java.io.tmpdir`: a copy of the jars, 58 MiB, block and "
        "artifact directories), in a directory of its own that it removes at exit; a job killed with "
        "-9 leaves its directory, and the next job to start removes it. Empty: "
        "`<temp dir>/rsm-iceberg-<uid>`. Created 0700; refused if another user owns it or may write "
        "it. Not used under `spark-submit` (its own `spark.local.dir`).",
    )

    @property
    def scratch_path(self) -> Path | None:
        return Path(self.scratch_dir) if self.scratch_dir else None


@dataclasses.dataclass(frozen=True)
class ReadSettings(Settings):
    chunk_cache_bytes: int = setting(
        "size", 24 * MiB, "Per executor process: decoded segment chunks kept for read-ahead.", min=0
    )
    prefetch_bytes: int = setting(
        "size",
        8 * MiB,
        "Per executor process: how far ahead of the parser segment chunks are downloaded and "
        "decoded in the background (0 disables).",
        min=0,
    )


# -- the Kafka cluster (optional) -------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class KafkaSettings(Settings):
    bootstrap_servers: str | None = setting(
        "str",
        None,
        "Kafka bootstrap servers of the topic's cluster; when set, `iceberg status` and "
        "`convert --follow` read the topic's copy lag (KIP-1241 `remote.copy.lag.ms`/`.bytes`) "
        'through the admin API (docs/iceberg.md "Copy lag"). Nothing else talks to Kafka.',
    )
    timeout: float = setting(
        "seconds",
        10.0,
        "How long reading the topic's settings from Kafka may take (a broker that does not answer "
        "is reported, and the follower goes on).",
        min=0.1,
    )
    client: dict[str, str] = family(
        "str",
        "A librdkafka setting of that admin client, `_` in the name for `.`: "
        '`[iceberg.kafka.client] security_protocol = "SASL_SSL"`, `sasl_mechanism`, '
        "`sasl_username`, `sasl_password`, `ssl_ca_location`, ...",
        secret=True,
    )


# -- convert --follow -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FollowSettings(Settings):
    interval: float = setting(
        "seconds",
        10.0,
        "`convert --follow`: pause between two rounds (a round lists the topic's segments and "
        "converts what is new). A round that lost its commit to another writer plans again at once; "
        "a failed round waits twice as long each time, up to 30 times this.",
        min=0.1,
    )
    maintain_interval: float = setting(
        "seconds",
        3600.0,
        "`convert --follow`: every this many seconds, expire snapshots older than 5 days (the "
        "marker-tagged one is kept), delete files no snapshot references that are older than "
        "1 day (the orphans of killed or out-raced rounds), drop the rows Kafka's retention "
        "deleted (`iceberg.follow.drop_deleted_offsets`) and read the topic's copy lag again "
        "(`iceberg.kafka.bootstrap_servers`); 0: never.",
        min=0,
    )
    drop_deleted_offsets: bool = setting(
        "bool",
        True,
        "`convert --follow`: at each maintenance (`iceberg.follow.maintain_interval`), also delete the "
        "rows whose offsets Kafka's retention removed from remote storage, as `maintain "
        "--drop-deleted-offsets` does, so that the table keeps what the topic keeps; false: the "
        'table keeps every row it got (an archive). docs/iceberg.md "Retention".',
    )
    metrics_listen: str = setting(
        "str",
        "",
        "`convert --follow`: Prometheus metrics HTTP address `host:port` (path `/metrics`; "
        "`:port` alone listens on 127.0.0.1); empty disables.",
    )


_TABLE_RE = re.compile(r"[^A-Za-z0-9_]")


def default_table_name(topic: str) -> str:
    return _TABLE_RE.sub("_", topic)


@dataclasses.dataclass(frozen=True)
class JobSettings(Settings):
    """The ``[iceberg]`` part of the configuration, validated."""

    KEY_PREFIX = "iceberg"

    catalog: CatalogSettings = group(CatalogSettings, key="")
    # -- table
    namespace: str = setting("str", "kafka", "Iceberg namespace of the topic tables.")
    table: str | None = setting(
        "str",
        None,
        "Table name; unset: the topic name with every character other than letters, digits and `_` "
        "replaced by `_`. One table holds one topic.",
    )
    partitioning: str = setting(
        "str", "day", "Time partitioning of `kafka.ingest_timestamp` for new tables.", choices=PARTITIONINGS
    )
    target_file_size: int = setting("size", 512 * MiB, "Target size of the Parquet data files.")
    writer: str = setting(
        "str",
        "arrow",
        "Who writes the Parquet data files: `arrow` (each executor's Python worker writes them with "
        'PyArrow, the driver commits them; see docs/iceberg.md "Performance") or `spark` '
        "(Spark's Iceberg writer; the rows go back into the JVM).",
        choices=("arrow", "spark"),
    )
    # -- decoding
    registry: RegistrySettings = group(RegistrySettings)
    key: SideSettings = group(SideSettings, side="key", column="key")
    value: SideSettings = group(SideSettings, side="value", column="val")
    proto: ProtoSettings = group(ProtoSettings)
    # -- Spark and executors
    spark: SparkSettings = group(SparkSettings)
    batch_records: int = setting(
        "int", 10_000, "Records per Arrow batch an executor hands to Spark.", min=100, max=1_000_000
    )
    batch_bytes: int = setting(
        "size",
        16 * MiB,
        "Decompressed record bytes per Arrow batch (whichever of this and `iceberg.batch_records` "
        "comes first).",
        min=64 * 1024,
    )
    read: ReadSettings = group(ReadSettings)
    max_segments: int = setting(
        "int", 0, "At most this many segments per run (0: no limit); the next run continues.", min=0
    )
    task_bytes: int = setting(
        "size",
        128 * MiB,
        "Segments larger than this (bytes of the `.log`) are split into tasks of about this size "
        "at entries of their offset index, so that executors scale with the data, not with the "
        'number of segments (docs/iceberg.md "Flow of a run"); 0: one task per segment.',
        min=0,
    )
    kafka: KafkaSettings = group(KafkaSettings)
    follow: FollowSettings = group(FollowSettings)

    def __post_init__(self) -> None:
        for name, side in (("key", self.key), ("value", self.value)):
            ways = [
                f"iceberg.{name}.{k}"
                for k, on in (
                    ("raw", side.raw),
                    ("descriptor_set", side.descriptor_set),
                    ("json_schema", side.json_schema),
                    ("json_infer", side.json_infer),
                )
                if on
            ]
            if len(ways) > 1:
                raise ConfigError(f"{' and '.join(ways)} are different ways to decode the {name}s: set one")
            if side.json_schema and not Path(side.json_schema).is_file():
                raise ConfigError(f"iceberg.{name}.json_schema: {side.json_schema} is not a file")
            if side.unframed == "latest" and not self.registry.url:
                raise ConfigError(
                    f"iceberg.{name}.unframed = 'latest' decodes {name}s with the registry subject's "
                    f"latest schema: set iceberg.registry.url"
                )
            if side.unframed == "latest" and ways:
                raise ConfigError(
                    f"iceberg.{name}.unframed = 'latest' decodes {name}s with the registry subject's "
                    f"latest schema: it cannot go with {ways[0]}"
                )
            if side.descriptor_set and not side.message:
                raise ConfigError(
                    f"iceberg.{name}.message: required with iceberg.{name}.descriptor_set "
                    f"(the message of the descriptor set that the {name}s hold)"
                )
            if side.descriptor_set and not Path(side.descriptor_set).is_file():
                raise ConfigError(f"iceberg.{name}.descriptor_set: {side.descriptor_set} is not a file")

    def table_name(self, topic: str) -> str:
        return self.table or default_table_name(topic)


CONFIG_KEYS = JobSettings.keys()
