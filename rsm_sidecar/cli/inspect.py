"""`rsm-sidecar inspect ...`: the segment inspection, verification and re-keying CLI.

Every subcommand reads the sidecar's own configuration (``--config``; ``RSM__...``
environment overrides apply), so it sees the same storage, key prefix and keyring.
Tables go to stdout, ``--json`` prints one JSON document instead, progress and
per-segment error lines go to stderr. Exit codes: 0 ok, 1 problems found or errors,
2 usage (see docs/inspect.md). The logic is in :mod:`rsm_sidecar.inspect`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from rsm_sidecar.cli.main import command_group
from rsm_sidecar.durations import duration_argument
from rsm_sidecar.errors import RsmError

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2


def _int_min(minimum: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{v} is below the minimum {minimum}")
        return v

    return parse


def register(sub) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        "-c",
        required=True,
        help="the sidecar's TOML configuration (RSM__... environment variables override it)",
    )
    common.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    common.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")

    isub = command_group(
        sub,
        "inspect",
        "list, show, dump, cat, verify, re-key and seal stored segments",
        "Look at, verify, re-key and seal the segments rsm-sidecar stored, with the sidecar's own "
        "configuration (docs/inspect.md).",
        epilog="exit codes: 0 ok, 1 problems found or errors, 2 usage",
        metavar="COMMAND",
    )
    seg_help = "segment UUID, object key (.log/.indexes/.rsm-manifest) or topic/partition/offset"

    c = isub.add_parser("ls", parents=[common], help="list segments")
    c.add_argument("--topic", help="only this topic")
    c.add_argument("--partition", type=_int_min(0), help="only this partition")
    c.set_defaults(func=_wrap(_ls))

    c = isub.add_parser("show", parents=[common], help="a segment's manifest and chunk-index statistics")
    c.add_argument("segment", metavar="SEGMENT", help=seg_help)
    c.set_defaults(func=_wrap(_show))

    c = isub.add_parser("dump", parents=[common], help="decoded batches and records of a segment")
    c.add_argument("segment", metavar="SEGMENT", help=seg_help)
    c.add_argument("--from-offset", type=_int_min(0), help="start at this offset (via the offset index)")
    c.add_argument("--limit", type=_int_min(0), help="at most this many records (control records included)")
    c.add_argument(
        "--max-bytes",
        type=_int_min(0),
        default=256,
        help="show at most this many bytes of each key, value and header value (0: all; default 256)",
    )
    reg = c.add_mutually_exclusive_group()
    reg.add_argument(
        "--schema-registry",
        metavar="URL",
        help="decode Confluent-framed keys/values through this schema registry (default: "
        "iceberg.registry.url of the configuration, if set; needs rsm_sidecar.iceberg)",
    )
    reg.add_argument("--plain", action="store_true", help="no schema-registry decoding: UTF-8 or hex only")
    c.set_defaults(func=_wrap(_dump))

    c = isub.add_parser("cat", parents=[common], help="the original .log bytes, as the broker receives them")
    c.add_argument("segment", metavar="SEGMENT", help=seg_help)
    c.add_argument("--start", type=_int_min(0), help="first byte (default 0)")
    c.add_argument("--end", type=_int_min(0), help="last byte, inclusive (default: the end of the segment)")
    c.add_argument("--output", "-o", metavar="FILE", help="write to FILE (atomically) instead of stdout")
    c.set_defaults(func=_wrap(_cat))

    c = isub.add_parser("verify", parents=[common], help="download and check every chunk, batch and index")
    c.add_argument("segment", metavar="SEGMENT", nargs="?", help=seg_help + " (default: all segments)")
    c.add_argument("--topic", help="only this topic")
    c.add_argument("--partition", type=_int_min(0), help="only this partition")
    c.add_argument("--deep", action="store_true", help="also decode every record of every batch")
    c.add_argument(
        "--sample",
        type=_int_min(1),
        metavar="N",
        help="verify N segments chosen at random among those selected (a spot check of a large bucket)",
    )
    c.set_defaults(func=_wrap(_verify))

    for name, func, what, dry_run in (
        ("rekey", _rekey, "re-wrap data keys under the active key id", "report what would change"),
        (
            "seal",
            _seal,
            "verify segments without an authenticator (Aiven's, rsm-sidecar 0.1) and add one",
            "verify and report",
        ),
    ):
        c = isub.add_parser(name, parents=[common], help=what)
        which = c.add_mutually_exclusive_group(required=True)
        which.add_argument("--topic", help="the segments of this topic")
        which.add_argument("--all", action="store_true", help="every segment under the key prefix")
        c.add_argument("--dry-run", action="store_true", help=f"{dry_run}, write nothing")
        c.add_argument(
            "--parallel", type=_int_min(1), default=4, help="segments processed at once (default 4)"
        )
        c.set_defaults(func=_wrap(func))

    c = isub.add_parser("du", parents=[common], help="bytes stored per topic and partition")
    c.add_argument("--topic", help="only this topic")
    c.set_defaults(func=_wrap(_du))

    c = isub.add_parser(
        "orphans", parents=[common], help="objects without a manifest (failed or killed uploads)"
    )
    c.add_argument(
        "--older-than",
        type=duration_argument,
        default=3600.0,
        metavar="DURATION",
        help="age guard: only objects older than this are deleted (default 1h; e.g. 30m, 2d, 0)",
    )
    c.add_argument("--delete", action="store_true", help="delete the orphans older than the age guard")
    c.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT",
        help="also check the stored segments against the cluster's __remote_log_metadata "
        "(segments Kafka does not list, segments it lists that storage lacks); needs confluent-kafka",
    )
    c.add_argument(
        "--command-config",
        metavar="FILE",
        help="Kafka client properties for --bootstrap-server (librdkafka names: security.protocol, "
        "sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, ...)",
    )
    c.set_defaults(func=_wrap(_orphans))


def _wrap(handler):
    def run(args) -> int:
        from rsm_sidecar.inspect.context import InspectContext, UsageError

        ctx = InspectContext.load(args.config)  # a ConfigError is an error (exit 1), reported by main
        try:
            return handler(ctx, args)
        except UsageError as e:
            return _usage(e)
        finally:
            ctx.close()

    return run


def _usage(e: Exception) -> int:
    print(f"rsm-sidecar inspect: error: {e}", file=sys.stderr)
    return EXIT_USAGE


def _progress(args, label: str, total: int | None = None, unit: str = "segments"):
    from rsm_sidecar.inspect.progress import Progress

    return Progress(f"inspect {label}", total, unit, enabled=not args.quiet)


def _errors(errors: list[dict[str, str]]) -> None:
    from rsm_sidecar.inspect.output import error_line

    for e in errors:
        error_line(e.get("segment") or e.get("object", "?"), e["error"])


# -- commands ------------------------------------------------------------------------
def _ls(ctx, args) -> int:
    from rsm_sidecar.inspect import ls
    from rsm_sidecar.inspect.output import dump_json

    result = ls.run(ctx, args.topic, args.partition, _progress(args, "ls"))
    if args.json:
        dump_json(result.to_json())
    else:
        _errors(result.errors)
        ls.print_table(result)
    return EXIT_PROBLEMS if result.errors else EXIT_OK


def _show(ctx, args) -> int:
    from rsm_sidecar.inspect import show
    from rsm_sidecar.inspect.locate import locate
    from rsm_sidecar.inspect.output import dump_json

    doc = show.run(ctx, locate(ctx, args.segment))
    if args.json:
        dump_json(doc)
    else:
        show.print_text(doc)
    return EXIT_OK


def _dump(ctx, args) -> int:
    from rsm_sidecar.inspect import decoders, dump
    from rsm_sidecar.inspect.locate import locate
    from rsm_sidecar.inspect.output import JsonStream, error_line

    seg = locate(ctx, args.segment)
    try:
        registry = None if args.plain else (args.schema_registry or decoders.configured_registry(ctx.cfg))
        decoder = decoders.build(registry, args.max_bytes)
    except decoders.DecoderUnavailable as e:
        print(f"rsm-sidecar inspect: warning: {e}; keys and values are shown as UTF-8/hex", file=sys.stderr)
        decoder = decoders.PlainDecoder(args.max_bytes)
    stats = dump.DumpStats()
    batches = dump.run(
        ctx,
        seg,
        decoder,
        from_offset=args.from_offset,
        limit=args.limit,
        max_bytes=args.max_bytes,
        stats=stats,
    )
    failure = None
    if args.json:
        with JsonStream(sys.stdout) as doc:
            doc.member(
                "segment",
                {
                    "base": seg.base,
                    "topic": seg.topic,
                    "partition": seg.partition,
                    "segment_id": seg.segment_id,
                    "start_offset": seg.start_offset,
                },
            )
            with doc.list("batches") as items:
                try:
                    for b in batches:
                        items.append(b)
                except RsmError as e:
                    failure = str(e)
            doc.member(
                "summary",
                {
                    "batches": stats.batches,
                    "records": stats.records,
                    "start_position": stats.start_position,
                    "limited": stats.limited,
                    "error": failure,
                },
            )
    else:
        try:
            for b in batches:
                dump.print_batch(b, sys.stdout)
        except RsmError as e:
            failure = str(e)
        print(
            f"{stats.batches} batches, {stats.records} records"
            + (" (--limit reached)" if stats.limited else "")
        )
    if failure:
        error_line(seg.describe, failure)
        return EXIT_PROBLEMS
    return EXIT_OK


def _cat(ctx, args) -> int:
    from rsm_sidecar.inspect import cat
    from rsm_sidecar.inspect.context import UsageError
    from rsm_sidecar.inspect.locate import locate
    from rsm_sidecar.inspect.output import dump_json

    if args.output is None:
        if args.json:
            raise UsageError("--json needs --output FILE (stdout carries the segment bytes)")
        if sys.stdout.isatty():
            raise UsageError(
                "refusing to write binary segment data to a terminal: use --output FILE or a pipe"
            )
    seg = locate(ctx, args.segment)
    progress = _progress(args, "cat", unit="")
    if args.output is None:
        result = cat.run(ctx, seg, sys.stdout.buffer, args.start, args.end, progress)
    else:
        directory = os.path.dirname(os.path.abspath(args.output))
        fd, tmp = tempfile.mkstemp(prefix=".inspect-cat-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                result = cat.run(ctx, seg, f, args.start, args.end, progress)
            os.replace(tmp, args.output)
        except BaseException:
            os.unlink(tmp)
            raise
        result["output"] = args.output
        if args.json:
            dump_json(result)
        else:
            print(f"{result['bytes']} bytes of {seg.describe} written to {args.output}", file=sys.stderr)
    return EXIT_OK


def _verify(ctx, args) -> int:
    from rsm_sidecar.inspect import runner, verify
    from rsm_sidecar.inspect.context import UsageError
    from rsm_sidecar.inspect.locate import locate
    from rsm_sidecar.segment import listing

    if args.segment and (args.topic or args.partition is not None or args.sample):
        raise UsageError("give either SEGMENT or --topic/--partition/--sample, not both")
    if args.segment:
        segs = [locate(ctx, args.segment)]
    elif args.sample:
        segs = verify.sample_segments(
            listing.segments(ctx.store, ctx.layout, args.topic, args.partition), args.sample
        )
    else:
        segs = list(listing.segments(ctx.store, ctx.layout, args.topic, args.partition))
        segs.sort(key=lambda s: s.sort_key)
    progress = _progress(args, "verify", len(segs))
    summary = runner.report(args.json, lambda out: verify.run(ctx, segs, out, args.deep, progress))
    return EXIT_PROBLEMS if summary.has_problems else EXIT_OK


def _rekey(ctx, args) -> int:
    from rsm_sidecar.inspect import rekey

    return _rewrite_all(ctx, args, "rekey", rekey.run)


def _seal(ctx, args) -> int:
    from rsm_sidecar.inspect import seal

    return _rewrite_all(ctx, args, "seal", seal.run)


def _rewrite_all(ctx, args, name: str, run) -> int:
    """``rekey`` and ``seal``: every segment of the topic (or of every topic), ``--parallel``
    at a time, ``--dry-run`` or not."""
    from rsm_sidecar.inspect import runner
    from rsm_sidecar.segment import listing

    segs = listing.segments(ctx.store, ctx.layout, None if args.all else args.topic)
    progress = _progress(args, name)
    summary = runner.report(args.json, lambda out: run(ctx, segs, out, args.dry_run, args.parallel, progress))
    return EXIT_PROBLEMS if summary.has_problems else EXIT_OK


def _du(ctx, args) -> int:
    from rsm_sidecar.inspect import du
    from rsm_sidecar.inspect.output import dump_json

    result = du.run(ctx, args.topic, _progress(args, "du"))
    if args.json:
        dump_json(result.to_json())
    else:
        du.print_table(result)
    return EXIT_OK


def _orphans(ctx, args) -> int:
    from rsm_sidecar.inspect import kafka_metadata, orphans
    from rsm_sidecar.inspect.context import UsageError
    from rsm_sidecar.inspect.output import dump_json

    if args.command_config and not args.bootstrap_server:
        raise UsageError("--command-config needs --bootstrap-server")
    client_config = kafka_metadata.load_client_config(args.command_config)
    stored: list[orphans.CompleteSegment] | None = [] if args.bootstrap_server else None
    found, errors = orphans.run(
        ctx,
        args.older_than,
        args.delete,
        progress=_progress(args, "orphans", unit="items"),
        stored=stored,
    )
    check = None
    if args.bootstrap_server:
        assert stored is not None
        # read after the listing: a segment stored by then has its COPY_SEGMENT_STARTED record
        kafka = kafka_metadata.read(args.bootstrap_server, client_config)
        check = orphans.cross_check(ctx, stored, kafka, args.older_than, args.delete)
        errors += check.errors
    if args.json:
        doc = {
            "orphans": [o.to_json() for o in found],
            "errors": errors,
            "summary": {
                "orphans": len(found),
                "bytes": sum(o.size for o in found),
                "deleted": sum(1 for o in found if o.action == "deleted"),
                "older_than_seconds": args.older_than,
                "delete": args.delete,
            },
        }
        if check is not None:
            doc["segments"] = [f.to_json() for f in check.findings]
            doc["kafka"] = check.summary()
        dump_json(doc)
    else:
        _errors(errors)
        orphans.print_table(found, args.older_than, args.delete)
        if check is not None:
            orphans.print_cross_check(check, args.older_than, args.delete)
    remaining = sum(1 for o in found if o.action != "deleted")
    if check is not None:
        remaining += sum(1 for f in check.findings if f.action != "deleted")
    return EXIT_PROBLEMS if remaining or errors else EXIT_OK
