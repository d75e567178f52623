"""Configuration of the Iceberg jobs (``rsm-sidecar iceberg convert|maintain``).

The jobs read the sidecar's own configuration file (storage, key prefix, encryption keys: the
job reads segments exactly as the sidecar wrote them) plus the ``[iceberg]`` keys declared
here. Environment overrides work as for every key (``RSM__ICEBERG__REGISTRY__URL=...``), and the
command line overrides both (see ``rsm-sidecar iceberg convert --help``).

This module must stay importable without pyspark/pyiceberg: ``rsm-sidecar config docs`` and
``Config`` load every key module.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from rsm_sidecar.config import Config, Key
from rsm_sidecar.errors import ConfigError

MiB = 1024 * 1024
PARTITIONINGS = ("hour", "day", "month", "none")

_SIDE_KEYS = []
for _side, _what in (("key", "keys"), ("value", "values")):
    _SIDE_KEYS += [
        Key(
            f"iceberg.{_side}.raw",
            "bool",
            False,
            f"Never decode record {_what}: the `{_side[:3] if _side == 'value' else _side}` struct holds "
            f"only `__raw__`.",
        ),
        Key(
            f"iceberg.{_side}.subject",
            "str",
            None,
            f"Registry subject of the {_what}' schema; unset: TopicNameStrategy (`<topic>-{_side}`). "
            f"An explicit subject must exist; a missing TopicNameStrategy subject means no schema (raw).",
        ),
        Key(
            f"iceberg.{_side}.message",
            "str",
            None,
            f"Protobuf full message name of the {_what} (`pkg.Msg`). Needed when the schema file has "
            f"several top-level messages that neither the table (`rsm.{_side}.message`) nor a record framed "
            f"with the latest schema id names, and with `iceberg.{_side}.descriptor_set`.",
        ),
        Key(
            f"iceberg.{_side}.descriptor_set",
            "path",
            None,
            f"A Protobuf descriptor-set file (`protoc --include_imports --descriptor_set_out`, "
            f"`buf build -o`): decode unframed {_what} with `iceberg.{_side}.message` from it, without "
            f"a registry (the embedded default).",
        ),
        Key(
            f"iceberg.{_side}.json_schema",
            "path",
            None,
            f"A JSON Schema file: decode unframed JSON {_what} with it into columns, without a "
            f'registry (docs/iceberg.md "JSON → Iceberg").',
        ),
        Key(
            f"iceberg.{_side}.json_infer",
            "int",
            0,
            f"Infer a JSON Schema for unframed JSON {_what} from the first this many {_what} of each "
            f"partition's new records in every run, merged with the schema the table recorded "
            f"(`rsm.{_side}.json-schema`), so that columns are added as new properties appear; "
            f'0: off (docs/iceberg.md "Inferred JSON schemas").',
            min=0,
            max=100_000,
        ),
        Key(
            f"iceberg.{_side}.unframed",
            "str",
            "error",
            f"What a record {_side} without the registry's framing "
            f"(magic byte 0x00 + schema id) becomes when the {_side} side has a registry subject: "
            f"`error`, a record-level error (`__err__` + `__raw__`); `latest`, decoded with the "
            f"subject's latest schema (pinned when the run starts), whose id each row records in "
            f'`__schema_id__` (docs/iceberg.md "Values without framing").',
            choices=("error", "latest"),
        ),
    ]

CONFIG_KEYS = [
    # -- catalog and warehouse ------------------------------------------------------------
    Key(
        "iceberg.catalog.type",
        "str",
        "local",
        "`local`: the embedded JDBC catalog on a SQLite file shared with PyIceberg's SqlCatalog; "
        "`rest`: an Iceberg REST catalog.",
        choices=("local", "rest"),
    ),
    Key(
        "iceberg.catalog.name",
        "str",
        "rsm",
        "Catalog name on the Spark and PyIceberg sides (for `local` it is also the `catalog_name` "
        "column of the SQLite tables: both sides must use the same).",
    ),
    Key(
        "iceberg.catalog.local.root",
        "path",
        None,
        "Directory of the embedded catalog (`catalog.db`, default warehouse `warehouse/`). Unset: "
        "`$RSM_ICEBERG_DIR`, else `run/iceberg` in the repository.",
    ),
    Key(
        "iceberg.catalog.rest.uri",
        "str",
        None,
        "REST catalog base URI (`http://host:8181`).",
        required_when=("iceberg.catalog.type", "rest"),
    ),
    Key(
        "iceberg.catalog.rest.credential",
        "str",
        None,
        "OAuth2 client credential `client_id:client_secret` for the REST catalog.",
        secret=True,
    ),
    Key("iceberg.catalog.rest.token", "str", None, "Bearer token for the REST catalog.", secret=True),
    Key(
        "iceberg.warehouse",
        "str",
        None,
        "Warehouse location: `file:///...`, `s3://bucket/prefix` or `gs://bucket/prefix`. Unset: "
        "`<local.root>/warehouse` for `local`; the REST server's default for `rest` (sent as "
        "`warehouse` when set).",
    ),
    Key("iceberg.s3.endpoint", "str", None, "S3 endpoint URL of an `s3://` warehouse (unset: AWS)."),
    Key("iceberg.s3.region", "str", "us-east-1", "S3 region of an `s3://` warehouse."),
    Key(
        "iceberg.s3.access_key_id",
        "str",
        None,
        "S3 access key of an `s3://` warehouse (unset: the AWS default credential chain).",
        secret=True,
    ),
    Key("iceberg.s3.secret_access_key", "str", None, "S3 secret key of an `s3://` warehouse.", secret=True),
    Key(
        "iceberg.s3.path_style_access",
        "bool",
        False,
        "Path-style S3 URLs (`endpoint/bucket/key`), as most S3-compatible servers need.",
    ),
    Key(
        "iceberg.gcs.endpoint",
        "str",
        None,
        "GCS endpoint URL of a `gs://` warehouse (unset: Google; an emulator's URL such as "
        "`http://127.0.0.1:4443`). Credentials come from Application Default Credentials "
        "(`GOOGLE_APPLICATION_CREDENTIALS`, the metadata server) on both the Spark and the PyIceberg side.",
    ),
    Key(
        "iceberg.gcs.project_id",
        "str",
        None,
        "Project id of a `gs://` warehouse (needed by some credentials).",
    ),
    Key(
        "iceberg.gcs.no_auth",
        "bool",
        False,
        "Send no Google credentials (emulators). PyIceberg's GCS file system has no anonymous mode, "
        "so the driver sends the placeholder bearer token `no-auth` instead.",
    ),
    # -- table ----------------------------------------------------------------------------
    Key("iceberg.namespace", "str", "kafka", "Iceberg namespace of the topic tables."),
    Key(
        "iceberg.table",
        "str",
        None,
        "Table name; unset: the topic name with every character other than letters, digits and `_` "
        "replaced by `_`. One table holds one topic.",
    ),
    Key(
        "iceberg.partitioning",
        "str",
        "day",
        "Time partitioning of `kafka.ingest_timestamp` for new tables.",
        choices=PARTITIONINGS,
    ),
    Key("iceberg.target_file_size", "size", 512 * MiB, "Target size of the Parquet data files."),
    Key(
        "iceberg.writer",
        "str",
        "arrow",
        "Who writes the Parquet data files: `arrow` (each executor's Python worker writes them with "
        'PyArrow, the driver commits them; see docs/iceberg.md "Performance") or `spark` '
        "(Spark's Iceberg writer; the rows go back into the JVM).",
        choices=("arrow", "spark"),
    ),
    # -- registry -------------------------------------------------------------------------
    Key(
        "iceberg.registry.url",
        "str",
        None,
        "Confluent-compatible schema registry URL; unset: no registry (keys/values raw unless a "
        "descriptor set is configured).",
    ),
    Key(
        "iceberg.registry.basic_auth_user_info",
        "str",
        None,
        "Registry basic auth `user:password`.",
        secret=True,
    ),
    Key("iceberg.registry.bearer_token", "str", None, "Registry static bearer token.", secret=True),
    Key(
        "iceberg.registry.bearer_logical_cluster",
        "str",
        None,
        "Logical cluster sent with the bearer token (Confluent Cloud; required with a bearer token).",
    ),
    Key("iceberg.registry.bearer_identity_pool", "str", None, "Identity pool id sent with the bearer token."),
    Key(
        "iceberg.registry.ssl_ca_location",
        "path",
        None,
        "PEM CA bundle that signed the registry's TLS certificate.",
    ),
    Key("iceberg.registry.ssl_certificate_location", "path", None, "PEM client certificate (mutual TLS)."),
    Key("iceberg.registry.ssl_key_location", "path", None, "PEM private key of the client certificate."),
    Key("iceberg.registry.timeout", "seconds", 10.0, "Timeout of one registry request.", min=0.1),
    *_SIDE_KEYS,
    Key(
        "iceberg.proto.uint32_as_long",
        "bool",
        False,
        "Map Protobuf uint32/fixed32 to long (lossless) instead of int "
        "(the seed's rule: values >= 2^31 wrap).",
    ),
    Key(
        "iceberg.proto.well_known_types",
        "bool",
        True,
        "Map google.protobuf Timestamp/Duration/wrappers/Struct to timestamptz/long/primitives/JSON "
        "instead of plain structs.",
    ),
    # -- Spark and executors ------------------------------------------------------------------
    Key(
        "iceberg.spark.master",
        "str",
        "local[2]",
        "Spark master of the job when it starts its own session (`spark-submit` overrides it).",
    ),
    Key(
        "iceberg.spark.scratch_dir",
        "str",
        "",
        "Where a job that starts its own Spark session keeps the driver's temporary files "
        "(`spark.local.dir` and the JVM's `java.io.tmpdir`: a copy of the jars, 58 MiB, block and "
        "artifact directories), in a directory of its own that it removes at exit; a job killed with "
        "-9 leaves its directory, and the next job to start removes it. Empty: "
        "`<temp dir>/rsm-iceberg-<uid>`. Created 0700; refused if another user owns it or may write "
        "it. Not used under `spark-submit` (its own `spark.local.dir`).",
    ),
    Key(
        "iceberg.batch_records",
        "int",
        10_000,
        "Records per Arrow batch an executor hands to Spark.",
        min=100,
        max=1_000_000,
    ),
    Key(
        "iceberg.batch_bytes",
        "size",
        16 * MiB,
        "Decompressed record bytes per Arrow batch (whichever of this and `iceberg.batch_records` "
        "comes first).",
        min=64 * 1024,
    ),
    Key(
        "iceberg.read.chunk_cache_bytes",
        "size",
        24 * MiB,
        "Per executor process: decoded segment chunks kept for read-ahead.",
        min=0,
    ),
    Key(
        "iceberg.read.prefetch_bytes",
        "size",
        8 * MiB,
        "Per executor process: how far ahead of the parser segment chunks are downloaded and "
        "decoded in the background (0 disables).",
        min=0,
    ),
    Key(
        "iceberg.max_segments",
        "int",
        0,
        "At most this many segments per run (0: no limit); the next run continues.",
        min=0,
    ),
    Key(
        "iceberg.task_bytes",
        "size",
        128 * MiB,
        "Segments larger than this (bytes of the `.log`) are split into tasks of about this size "
        "at entries of their offset index, so that executors scale with the data, not with the "
        'number of segments (docs/iceberg.md "Flow of a run"); 0: one task per segment.',
        min=0,
    ),
    # -- the Kafka cluster (optional) ---------------------------------------------------------
    Key(
        "iceberg.kafka.bootstrap_servers",
        "str",
        None,
        "Kafka bootstrap servers of the topic's cluster; when set, `iceberg status` and "
        "`convert --follow` read the topic's copy lag (KIP-1241 `remote.copy.lag.ms`/`.bytes`) "
        'through the admin API (docs/iceberg.md "Copy lag"). Nothing else talks to Kafka.',
    ),
    Key(
        "iceberg.kafka.timeout",
        "seconds",
        10.0,
        "How long reading the topic's settings from Kafka may take (a broker that does not answer "
        "is reported, and the follower goes on).",
        min=0.1,
    ),
    Key(
        "iceberg.kafka.client.<name>",
        "str",
        None,
        "A librdkafka setting of that admin client, `_` in the name for `.`: "
        '`[iceberg.kafka.client] security_protocol = "SASL_SSL"`, `sasl_mechanism`, '
        "`sasl_username`, `sasl_password`, `ssl_ca_location`, ...",
        secret=True,
    ),
    # -- convert --follow -------------------------------------------------------------------
    Key(
        "iceberg.follow.interval",
        "seconds",
        10.0,
        "`convert --follow`: pause between two rounds (a round lists the topic's segments and "
        "converts what is new). A round that lost its commit to another writer plans again at once; "
        "a failed round waits twice as long each time, up to 30 times this.",
        min=0.1,
    ),
    Key(
        "iceberg.follow.maintain_interval",
        "seconds",
        3600.0,
        "`convert --follow`: every this many seconds, expire snapshots older than 5 days (the "
        "marker-tagged one is kept), delete files no snapshot references that are older than "
        "1 day (the orphans of killed or out-raced rounds), drop the rows Kafka's retention "
        "deleted (`iceberg.follow.drop_deleted_offsets`) and read the topic's copy lag again "
        "(`iceberg.kafka.bootstrap_servers`); 0: never.",
        min=0,
    ),
    Key(
        "iceberg.follow.drop_deleted_offsets",
        "bool",
        True,
        "`convert --follow`: at each maintenance (`iceberg.follow.maintain_interval`), also delete the "
        "rows whose offsets Kafka's retention removed from remote storage, as `maintain "
        "--drop-deleted-offsets` does, so that the table keeps what the topic keeps; false: the "
        'table keeps every row it got (an archive). docs/iceberg.md "Retention".',
    ),
    Key(
        "iceberg.follow.metrics_listen",
        "str",
        "",
        "`convert --follow`: Prometheus metrics HTTP address `host:port` (path `/metrics`; "
        "`:port` alone listens on 127.0.0.1); empty disables.",
    ),
]

_TABLE_RE = re.compile(r"[^A-Za-z0-9_]")


def default_table_name(topic: str) -> str:
    return _TABLE_RE.sub("_", topic)


@dataclasses.dataclass(frozen=True)
class SideSettings:
    raw: bool = False
    subject: str | None = None
    message: str | None = None
    descriptor_set: str | None = None
    unframed: str = "error"
    json_schema: str | None = None
    json_infer: int = 0


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """The ``[iceberg]`` part of the configuration, validated."""

    catalog_type: str = "local"
    catalog_name: str = "rsm"
    local_root: str | None = None
    rest_uri: str | None = None
    rest_credential: str | None = dataclasses.field(default=None, repr=False)
    rest_token: str | None = dataclasses.field(default=None, repr=False)
    warehouse: str | None = None
    s3: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    gcs: dict[str, Any] = dataclasses.field(default_factory=dict)
    namespace: str = "kafka"
    table: str | None = None
    partitioning: str = "day"
    target_file_size: int = 512 * MiB
    writer: str = "arrow"
    registry: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    key: SideSettings = SideSettings()
    value: SideSettings = SideSettings()
    uint32_as_long: bool = False
    well_known_types: bool = True
    master: str = "local[2]"
    scratch_dir: Path | None = None
    batch_records: int = 10_000
    batch_bytes: int = 16 * MiB
    chunk_cache_bytes: int = 24 * MiB
    prefetch_bytes: int = 8 * MiB
    max_segments: int = 0
    task_bytes: int = 128 * MiB
    follow_interval: float = 10.0
    follow_maintain_interval: float = 3600.0
    follow_drop_deleted_offsets: bool = True
    follow_metrics_listen: str = ""
    kafka_bootstrap: str | None = None
    kafka_timeout: float = 10.0
    kafka_client: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def from_config(cls, cfg: Config) -> JobSettings:
        registry = None
        if cfg["iceberg.registry.url"]:
            registry = {"url": cfg["iceberg.registry.url"], "timeout": cfg["iceberg.registry.timeout"]}
            if cfg["iceberg.registry.basic_auth_user_info"]:
                registry["basic.auth.user.info"] = cfg["iceberg.registry.basic_auth_user_info"]
            if cfg["iceberg.registry.bearer_token"]:
                if not cfg["iceberg.registry.bearer_logical_cluster"]:
                    raise ConfigError(
                        "iceberg.registry.bearer_logical_cluster: required with iceberg.registry.bearer_token"
                    )
                registry.update(
                    {
                        "bearer.auth.credentials.source": "STATIC_TOKEN",
                        "bearer.auth.token": cfg["iceberg.registry.bearer_token"],
                        "bearer.auth.logical.cluster": cfg["iceberg.registry.bearer_logical_cluster"],
                    }
                )
                if cfg["iceberg.registry.bearer_identity_pool"]:
                    registry["bearer.auth.identity.pool.id"] = cfg["iceberg.registry.bearer_identity_pool"]
            for leaf, conf in (
                ("ssl_ca_location", "ssl.ca.location"),
                ("ssl_certificate_location", "ssl.certificate.location"),
                ("ssl_key_location", "ssl.key.location"),
            ):
                if cfg[f"iceberg.registry.{leaf}"]:
                    registry[conf] = cfg[f"iceberg.registry.{leaf}"]
        s3 = {
            k: cfg[f"iceberg.s3.{k}"]
            for k in ("endpoint", "region", "access_key_id", "secret_access_key", "path_style_access")
        }
        gcs = {k: cfg[f"iceberg.gcs.{k}"] for k in ("endpoint", "project_id", "no_auth")}
        sides = {}
        for side in ("key", "value"):
            s = SideSettings(
                cfg[f"iceberg.{side}.raw"],
                cfg[f"iceberg.{side}.subject"],
                cfg[f"iceberg.{side}.message"],
                cfg[f"iceberg.{side}.descriptor_set"],
                cfg[f"iceberg.{side}.unframed"],
                cfg[f"iceberg.{side}.json_schema"],
                cfg[f"iceberg.{side}.json_infer"],
            )
            ways = [
                f"iceberg.{side}.{k}"
                for k, on in (
                    ("raw", s.raw),
                    ("descriptor_set", s.descriptor_set),
                    ("json_schema", s.json_schema),
                    ("json_infer", s.json_infer),
                )
                if on
            ]
            if len(ways) > 1:
                raise ConfigError(f"{' and '.join(ways)} are different ways to decode the {side}s: set one")
            if s.json_schema and not Path(s.json_schema).is_file():
                raise ConfigError(f"iceberg.{side}.json_schema: {s.json_schema} is not a file")
            if s.unframed == "latest" and registry is None:
                raise ConfigError(
                    f"iceberg.{side}.unframed = 'latest' decodes {side}s with the registry subject's "
                    f"latest schema: set iceberg.registry.url"
                )
            if s.unframed == "latest" and ways:
                raise ConfigError(
                    f"iceberg.{side}.unframed = 'latest' decodes {side}s with the registry subject's "
                    f"latest schema: it cannot go with {ways[0]}"
                )
            if s.descriptor_set and not s.message:
                raise ConfigError(
                    f"iceberg.{side}.message: required with iceberg.{side}.descriptor_set "
                    f"(the message of the descriptor set that the {side}s hold)"
                )
            if s.descriptor_set and not Path(s.descriptor_set).is_file():
                raise ConfigError(f"iceberg.{side}.descriptor_set: {s.descriptor_set} is not a file")
            sides[side] = s
        return cls(
            catalog_type=cfg["iceberg.catalog.type"],
            catalog_name=cfg["iceberg.catalog.name"],
            local_root=cfg["iceberg.catalog.local.root"],
            rest_uri=cfg["iceberg.catalog.rest.uri"],
            rest_credential=cfg["iceberg.catalog.rest.credential"],
            rest_token=cfg["iceberg.catalog.rest.token"],
            warehouse=cfg["iceberg.warehouse"],
            s3=s3,
            gcs=gcs,
            namespace=cfg["iceberg.namespace"],
            table=cfg["iceberg.table"],
            partitioning=cfg["iceberg.partitioning"],
            target_file_size=cfg["iceberg.target_file_size"],
            writer=cfg["iceberg.writer"],
            registry=registry,
            key=sides["key"],
            value=sides["value"],
            uint32_as_long=cfg["iceberg.proto.uint32_as_long"],
            well_known_types=cfg["iceberg.proto.well_known_types"],
            master=cfg["iceberg.spark.master"],
            scratch_dir=Path(cfg["iceberg.spark.scratch_dir"]) if cfg["iceberg.spark.scratch_dir"] else None,
            batch_records=cfg["iceberg.batch_records"],
            batch_bytes=cfg["iceberg.batch_bytes"],
            chunk_cache_bytes=cfg["iceberg.read.chunk_cache_bytes"],
            prefetch_bytes=cfg["iceberg.read.prefetch_bytes"],
            max_segments=cfg["iceberg.max_segments"],
            task_bytes=cfg["iceberg.task_bytes"],
            follow_interval=cfg["iceberg.follow.interval"],
            follow_maintain_interval=cfg["iceberg.follow.maintain_interval"],
            follow_drop_deleted_offsets=cfg["iceberg.follow.drop_deleted_offsets"],
            follow_metrics_listen=cfg["iceberg.follow.metrics_listen"],
            kafka_bootstrap=cfg["iceberg.kafka.bootstrap_servers"],
            kafka_timeout=cfg["iceberg.kafka.timeout"],
            kafka_client={k: str(v[""]) for k, v in cfg.family("iceberg.kafka.client").items()},
        )

    def table_name(self, topic: str) -> str:
        return self.table or default_table_name(topic)
