"""Entry point of the `rsm-sidecar` command. Subcommands live in their own modules and
register themselves through ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rsm-sidecar", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        module.register(sub)
    return parser


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
