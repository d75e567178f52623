"""`rsm-sidecar --help`: what the command is, its commands, where the configuration and the
guides are; every command line it shows parses."""

from __future__ import annotations

import argparse
import re

import pytest

from rsm_sidecar.cli.main import build_parser, main
from tests.helpers import REPO


def test_help_says_what_the_command_is_and_where_to_go_next(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    usage, description, *rest = out.split("\n\n")
    # the description is whole sentences (not a docstring cut at its first line)
    assert description.rstrip().endswith(".") and "Kafka tiered storage" in description
    assert "Subcommands live" not in out
    commands = re.search(r"^commands:\n(.*?)\n\n", out, flags=re.M | re.S).group(1)
    for name in next(a for a in build_parser()._actions if a.dest == "command").choices:
        assert re.search(rf"^\s+{name}\s+\S", commands, flags=re.M), f"{name} is not listed with its help"
    assert "--config" in out and "RSM__" in out
    for guide in re.findall(r"\b([a-z]+\.md)\b", out):
        assert (REPO / "docs" / guide).exists(), guide
    assert (REPO / "config" / "sidecar.toml").exists()
    shown = [line.strip().split("  ")[0] for line in out.splitlines() if line.startswith("  rsm-sidecar ")]
    assert len(shown) >= 3
    for line in shown:
        argv = line.split()[1:]
        if "COMMAND" in argv:
            continue
        build_parser().parse_args(argv)  # exits 2 on a command line that does not parse


def _parsers(parser=None, path=()):
    """Every command of `rsm-sidecar` by path, with the line the command list shows for it."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, listed.get(name)
                yield from _parsers(sub, (*path, name))


def test_every_command_and_option_says_what_it_does():
    """Each command is listed with a line of help and starts its own `--help` with a description;
    every option has a help text (a newcomer's `rsm-sidecar iceberg --help` once had neither)."""
    missing = []
    for path, parser, listed in _parsers():
        name = " ".join(path)
        if not listed:
            missing.append(f"{name}: no line in its parent's list of commands")
        if not (parser.description or "").strip():
            missing.append(f"{name}: no description in its --help")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or action.option_strings == ["-h", "--help"]:
                continue
            if not (action.help or "").strip():
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, "\n".join(missing)


def test_every_command_group_points_at_its_guide():
    """`rsm-sidecar <command> --help` names the guide that documents it (tests/test_docs.py's
    GUIDE_OF_COMMAND), so the help leads to the manual."""
    from tests.test_docs import GUIDE_OF_COMMAND

    parsers = {path: parser for path, parser, _ in _parsers()}
    for path, guide in GUIDE_OF_COMMAND.items():
        parser = parsers[path[:1]]
        text = f"{parser.description} {parser.epilog or ''}"
        assert f"docs/{guide}" in text, f"rsm-sidecar {path[0]} --help does not name docs/{guide}"
