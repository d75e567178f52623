"""`rsm-sidecar --help`: what the command is, its commands, where the configuration and the
guides are; every command line it shows parses."""

from __future__ import annotations

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
