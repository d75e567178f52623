"""`rsm-sidecar iceberg convert|maintain|status`: tiered segments -> Iceberg tables (docs/iceberg.md)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys

from rsm_sidecar.cli.main import command_group
from rsm_sidecar.durations import duration_argument

#: command-line option -> configuration key it overrides
OVERRIDES = {
    "catalog_type": "iceberg.catalog.type",
    "catalog_name": "iceberg.catalog.name",
    "catalog_root": "iceberg.catalog.local.root",
    "catalog_uri": "iceberg.catalog.rest.uri",
    "warehouse": "iceberg.warehouse",
    "namespace": "iceberg.namespace",
    "mode": "iceberg.mode",
    "table": "iceberg.table",
    "partitioning": "iceberg.partitioning",
    "registry_url": "iceberg.registry.url",
    "registry_user_info": "iceberg.registry.basic_auth_user_info",
    "registry_ca": "iceberg.registry.ssl_ca_location",
    "registry_cert": "iceberg.registry.ssl_certificate_location",
    "registry_key": "iceberg.registry.ssl_key_location",
    "key_subject": "iceberg.key.subject",
    "key_message": "iceberg.key.message",
    "key_descriptor_set": "iceberg.key.descriptor_set",
    "key_raw": "iceberg.key.raw",
    "key_unframed": "iceberg.key.unframed",
    "key_json_schema": "iceberg.key.json_schema",
    "key_json_infer": "iceberg.key.json_infer",
    "value_subject": "iceberg.value.subject",
    "value_message": "iceberg.value.message",
    "value_descriptor_set": "iceberg.value.descriptor_set",
    "value_raw": "iceberg.value.raw",
    "value_unframed": "iceberg.value.unframed",
    "value_json_schema": "iceberg.value.json_schema",
    "value_json_infer": "iceberg.value.json_infer",
    "master": "iceberg.spark.master",
    "max_segments": "iceberg.max_segments",
    "interval": "iceberg.follow.interval",
    "metrics_listen": "iceberg.follow.metrics_listen",
    "bootstrap_server": "iceberg.kafka.bootstrap_servers",
}

BOOTSTRAP_HELP = (
    "Kafka bootstrap servers: read the topic's copy lag (KIP-1241) through the admin API "
    "(iceberg.kafka.bootstrap_servers)"
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        "-c",
        required=True,
        help="the sidecar's TOML configuration (storage, key prefix, encryption keys) with its "
        "[iceberg] settings; RSM__ environment variables override the file, and the options below "
        "override both",
    )
    p.add_argument(
        "--topic", required=True, help="the Kafka topic: its tiered segments, and the table named after it"
    )
    g = p.add_argument_group("catalog and table")
    g.add_argument(
        "--catalog-type",
        choices=("local", "rest"),
        help="local: the embedded SQLite catalog in --catalog-root (the default); rest: an Iceberg "
        "REST catalog at --catalog-uri",
    )
    g.add_argument("--catalog-name", help="the catalog's name in Spark and PyIceberg (default rsm)")
    g.add_argument("--catalog-root", help="directory of the embedded catalog")
    g.add_argument("--catalog-uri", help="REST catalog URI")
    g.add_argument("--warehouse", help="file:///..., s3://bucket/prefix or gs://bucket/prefix")
    g.add_argument("--namespace", help="the table's namespace (default kafka)")
    g.add_argument(
        "--mode",
        choices=("append", "upsert"),
        help="append: every committed record (default); upsert: the current state, one row per key "
        "(iceberg.mode)",
    )
    g.add_argument(
        "--table",
        help="default: the topic name with non-alphanumerics as _ (+ _current with --mode upsert)",
    )
    g.add_argument("--master", help="Spark master (default local[2])")
    g.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting (repeatable)",
    )


def _age(p: argparse.ArgumentParser, option: str, default: str, help: str) -> None:
    """An option that takes an age (``1h30m``: :mod:`rsm_sidecar.durations`), in seconds."""
    p.add_argument(option, type=duration_argument, default=default, metavar="DURATION", help=help)


def register(sub) -> None:
    isub = command_group(
        sub,
        "iceberg",
        "convert tiered segments into Iceberg tables (PySpark)",
        "Write a topic's tiered segments to an Apache Iceberg table with PySpark, reading "
        "them straight from object storage with the sidecar's configuration (never through Kafka): "
        "committed records only, exactly once per (partition, offset), in Bufstream's table layout. "
        "`convert` converts what is new (or, with --follow, keeps converting in rounds), `maintain` "
        "expires, compacts and drops what Kafka's retention removed, `status` says what the table "
        "holds. Guide: docs/iceberg.md; the [iceberg] settings: docs/configuration.md.",
        epilog="RSM__ICEBERG__... environment variables set any [iceberg] key, e.g. "
        "RSM__ICEBERG__SPARK__MASTER=spark://master:7077.",
    )

    c = isub.add_parser("convert", help="convert what is new of a topic's tiered segments, exactly once")
    _common(c)
    c.add_argument("--topic-id", help="the Kafka topic id, when storage holds several topics of that name")
    c.add_argument(
        "--partitioning",
        choices=("hour", "day", "month", "none"),
        help="time partitioning of kafka.ingest_timestamp for a new table (default day)",
    )
    c.add_argument("--max-segments", type=int, help="at most this many segments in this run")
    r = c.add_argument_group("schema registry / decoding (key and value independently)")
    r.add_argument(
        "--registry-url", help="Confluent-compatible schema registry that decodes framed keys and values"
    )
    r.add_argument(
        "--registry-user-info",
        help="basic auth user:password (prefer RSM__ICEBERG__REGISTRY__BASIC_AUTH_USER_INFO)",
    )
    r.add_argument("--registry-ca", help="PEM CA bundle of the registry's TLS certificate")
    r.add_argument("--registry-cert", help="PEM client certificate (mTLS)")
    r.add_argument("--registry-key", help="PEM client key (mTLS)")
    for side in ("key", "value"):
        r.add_argument(
            f"--{side}-subject", help=f"explicit subject of the {side}s (default TopicNameStrategy)"
        )
        r.add_argument(f"--{side}-message", help=f"Protobuf message of the {side}s (pkg.Msg)")
        r.add_argument(f"--{side}-descriptor-set", help=f"descriptor-set file for unframed Protobuf {side}s")
        r.add_argument(f"--{side}-raw", action="store_const", const=True, help=f"keep {side}s raw")
        r.add_argument(f"--{side}-json-schema", help=f"JSON Schema file for unframed JSON {side}s")
        r.add_argument(
            f"--{side}-json-infer",
            type=int,
            metavar="N",
            help=f"infer a JSON Schema for unframed JSON {side}s from the first N of each partition",
        )
        r.add_argument(
            f"--{side}-unframed",
            choices=("error", "latest"),
            help=f"a {side} without the registry's framing: a record error (default) or decoded with "
            "the subject's latest schema",
        )
    c.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    f = c.add_argument_group('follow mode (docs/iceberg.md "Follow mode")')
    f.add_argument(
        "--follow",
        action="store_true",
        help="keep converting in rounds until SIGTERM/SIGINT (exactly once across restarts)",
    )
    f.add_argument("--interval", type=float, help="seconds between rounds (iceberg.follow.interval)")
    f.add_argument("--metrics-listen", help="Prometheus metrics host:port (iceberg.follow.metrics_listen)")
    f.add_argument("--bootstrap-server", help=BOOTSTRAP_HELP)
    c.set_defaults(func=_convert)

    m = isub.add_parser(
        "maintain", help="expire snapshots, compact files, remove orphans, drop offsets Kafka no longer has"
    )
    _common(m)
    m.add_argument("--expire", action="store_true", help="expire snapshots (never the marker-tagged one)")
    _age(m, "--expire-older-than", "5d", "age of snapshots to expire (default 5d; e.g. 12h, 1h30m)")
    m.add_argument("--retain-last", type=int, default=1, help="snapshots of main always kept (default 1)")
    m.add_argument(
        "--compact",
        action="store_true",
        help="rewrite small data files (and those of a current-state table with many deleted rows)",
    )
    m.add_argument(
        "--compact-deletes",
        action="store_true",
        help="merge a current-state table's position-delete files (rewrite_position_delete_files)",
    )
    m.add_argument(
        "--min-input-files",
        type=int,
        default=2,
        help="with --compact: rewrite a time partition only when it has at least this many files (default 2)",
    )
    m.add_argument("--remove-orphans", action="store_true", help="delete files no snapshot references")
    _age(
        m,
        "--orphan-older-than",
        "1d",
        "only orphans older than this (default 1d; keep it above a convert run's length)",
    )
    m.add_argument(
        "--drop-deleted-offsets",
        action="store_true",
        help="delete rows whose offsets Kafka retention removed from remote storage",
    )
    m.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    m.set_defaults(func=_maintain)

    s = isub.add_parser(
        "status", help="what the table says has been converted (markers), and the topic's copy lag"
    )
    _common(s)
    s.add_argument("--bootstrap-server", help=BOOTSTRAP_HELP)
    s.set_defaults(func=_status)


def _load(args):
    from rsm_sidecar.iceberg.job import load_config

    overrides = {OVERRIDES[k]: v for k, v in vars(args).items() if k in OVERRIDES and v is not None}
    return load_config(args.config, overrides=overrides)


def _spark_conf(args) -> dict[str, str]:
    out = {}
    for item in args.spark_conf:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"rsm-sidecar: error: --spark-conf {item!r} is not KEY=VALUE")
        out[k.strip()] = v.strip()
    return out


def _result(args, result) -> int:
    """A job's result on stdout as one JSON object, when ``--json`` asks for it."""
    if args.json:
        json.dump(dataclasses.asdict(result), sys.stdout, default=str)
        print()
    return 0


def _convert(args) -> int:
    from rsm_sidecar.iceberg.job import ConvertJob

    cfg, storage = _load(args)
    if args.follow:
        return _follow(args, cfg, storage)
    result = ConvertJob(cfg, storage, args.topic, topic_id=args.topic_id, spark_conf=_spark_conf(args)).run()
    return _result(args, result)


def _follow(args, cfg, storage) -> int:
    import signal
    import threading

    from rsm_sidecar.iceberg.follow import Follower
    from rsm_sidecar.service.metrics_http import serve_metrics

    follower = Follower(cfg, storage, args.topic, topic_id=args.topic_id, spark_conf=_spark_conf(args))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    listen = follower.settings.follow.metrics_listen
    if listen:
        serve_metrics(listen, "iceberg.follow.metrics_listen", follower.metrics.registry)
    every = follower.settings.follow.interval
    follower.log(f"[follow] {args.topic}: converting every {every:g}s until stopped")
    follower.run(stop)
    follower.log(f"[follow] {args.topic}: stopped")
    return 0


def _maintain(args) -> int:
    from rsm_sidecar.iceberg.maintenance import maintain

    cfg, storage = _load(args)
    result = maintain(
        cfg,
        storage,
        args.topic,
        expire=args.expire,
        expire_older_than=dt.timedelta(seconds=args.expire_older_than),
        retain_last=args.retain_last,
        compact=args.compact,
        compact_deletes=args.compact_deletes,
        min_input_files=args.min_input_files,
        remove_orphans=args.remove_orphans,
        orphan_older_than=dt.timedelta(seconds=args.orphan_older_than),
        drop_deleted_offsets=args.drop_deleted_offsets,
    )
    return _result(args, result)


def _status(args) -> int:
    from pyiceberg.exceptions import NoSuchTableError

    from rsm_sidecar.iceberg.committing import markers as mk
    from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
    from rsm_sidecar.iceberg.settings import JobSettings

    cfg, _ = _load(args)
    settings = JobSettings.from_config(cfg)
    spec = CatalogSpec(settings.catalog).prepare()
    ident = (settings.namespace, settings.table_name(args.topic))
    out: dict = {"table": ".".join(ident), "mode": settings.mode}
    try:
        table = spec.pyiceberg().load_table(ident)
    except NoSuchTableError:
        out["exists"] = False
    else:
        out.update(exists=True, **dataclasses.asdict(mk.read_state(table)))
    if settings.kafka.bootstrap_servers:
        from rsm_sidecar.iceberg.copy_lag import CopyLagUnavailable, client_config, read_copy_lag

        conf = client_config(settings.kafka.bootstrap_servers, settings.kafka.client)
        try:
            out["copy_lag"] = read_copy_lag(args.topic, conf, settings.kafka.timeout).as_dict()
        except CopyLagUnavailable as exc:  # the markers are still worth printing
            out["copy_lag"] = {"error": str(exc), "kind": exc.kind}
    print(json.dumps(out, default=str))
    return 0
