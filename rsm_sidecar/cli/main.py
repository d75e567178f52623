"""Entry point of the `rsm-sidecar` command. Subcommands live in their own modules and
register themselves through ``register(subparsers)``; ``DESCRIPTION`` and ``EPILOG`` are what
``rsm-sidecar --help`` tells a user."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from rsm_sidecar import __version__
from rsm_sidecar.errors import RsmError

#: modules contributing subcommands; each has ``register(subparsers)``
COMMAND_MODULES = (
    "rsm_sidecar.cli.serve",
    "rsm_sidecar.cli.admin",
    "rsm_sidecar.cli.inspect",
    "rsm_sidecar.cli.iceberg",
)

EXIT_ERROR = 1
EXIT_USAGE = 2

DESCRIPTION = """\
Kafka tiered storage (KIP-405) in a process next to the broker. The broker loads a small Java
RemoteStorageManager (the shim) that forwards segment copies, fetches and deletes to this
sidecar over gRPC; the sidecar chunks, compresses (zstd) and encrypts (AES-256-GCM) segments and
stores them in S3, Google Cloud Storage, Azure Blob Storage or a local directory, in the
on-remote format of Aiven's tiered-storage plugin."""

EPILOG = f"""\
The commands read the sidecar's TOML configuration (--config FILE; config/sidecar.toml in the
source tree is a commented example); environment variables RSM__<SECTION>__<KEY> override it
(RSM__STORAGE__S3__BUCKET=...).

Start here:
  rsm-sidecar config check --config sidecar.toml   validate it, print the effective values
  rsm-sidecar serve --config sidecar.toml          run it (the broker's shim dials server.listen)
  rsm-sidecar inspect ls --config sidecar.toml     list the stored segments
  rsm-sidecar COMMAND --help                       the options of a command

Guides (docs/ in the source tree): operations.md (deployment, broker settings, sizing,
troubleshooting, migrating from Aiven's plugin), configuration.md (every key), inspect.md,
iceberg.md, shim.md.

rsm-sidecar {__version__}"""


def command_group(
    sub: argparse._SubParsersAction,
    name: str,
    help: str,
    description: str,
    *,
    metavar: str | None = None,
    **options: Any,
) -> argparse._SubParsersAction:
    """Registers ``rsm-sidecar NAME COMMAND``, a command of subcommands (the chosen one in
    ``args.<NAME>_command``; ``metavar``: how its usage line names them): the caller adds them to
    what this returns. ``options``: more of ``add_parser``'s (``epilog``)."""
    p = sub.add_parser(name, help=help, description=description, **options)
    return p.add_subparsers(dest=f"{name}_command", required=True, metavar=metavar)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rsm-sidecar",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        module.register(sub)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """A command registered with only a ``help`` (its line in the list of commands) says the same
    at the top of its own ``--help``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                text = listed.get(name)
                if not sub.description and text:
                    sub.description = text[0].upper() + text[1:].rstrip(".") + "."
                _describe(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except RsmError as e:
        print(f"rsm-sidecar: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
