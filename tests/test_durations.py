"""Durations (rsm_sidecar/durations.py), the one parser behind `inspect`, `iceberg maintain`
and the configuration's ``seconds`` keys: the same text means the same time everywhere."""

from __future__ import annotations

import pytest

from rsm_sidecar.cli.main import build_parser
from rsm_sidecar.config import Config
from rsm_sidecar.durations import format_duration, parse_duration
from rsm_sidecar.errors import ConfigError


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("0", 0),
        ("90", 90),
        ("90s", 90),
        ("10m", 600),
        ("1h", 3600),
        ("2d", 172800),
        ("1w", 604800),
        ("1h30m", 5400),
        ("1d2h3m4s", 93784),
        ("1.5h", 5400),
        ("250ms", 0.25),
        (" 1H30M ", 5400),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "1x", "h", "-1h", "1h 30m", "1h30", "m30"])
def test_bad_durations_name_the_text_and_what_is_accepted(text):
    with pytest.raises(ValueError, match=r"invalid duration '.*': use a number of seconds or e\.g\. 90s"):
        parse_duration(text)


def test_format_duration():
    assert [format_duration(s) for s in (59.6, 5400, 7500, 3 * 86400 + 4 * 3600)] == [
        "60s",
        "90m",
        "2h05m",
        "3d04h",
    ]


@pytest.mark.parametrize(
    "argv, dest",
    [
        (
            ["iceberg", "maintain", "-c", "x.toml", "--topic", "t", "--expire-older-than", "1h30m"],
            "expire_older_than",
        ),
        (
            ["iceberg", "maintain", "-c", "x.toml", "--topic", "t", "--orphan-older-than", "1h30m"],
            "orphan_older_than",
        ),
        (["inspect", "orphans", "-c", "x.toml", "--older-than", "1h30m"], "older_than"),
    ],
)
def test_every_command_line_duration_takes_1h30m(argv, dest):
    assert getattr(build_parser().parse_args(argv), dest) == 5400


def test_maintain_defaults_are_durations_too():
    args = build_parser().parse_args(["iceberg", "maintain", "-c", "x.toml", "--topic", "t"])
    assert (args.expire_older_than, args.orphan_older_than) == (5 * 86400, 86400)


def test_a_bad_command_line_duration_is_a_usage_error_naming_it(capsys):
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(
            ["iceberg", "maintain", "-c", "x.toml", "--topic", "t", "--expire-older-than", "5 days"]
        )
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "--expire-older-than: invalid duration '5 days': use a number of seconds or e.g. 90s" in err


STORE = {"storage": {"local": {"root": "/tmp/unused"}}}


def test_configuration_seconds_take_durations_from_the_file_and_the_environment():
    cfg = Config(
        {**STORE, "fetch": {"idle_timeout_seconds": "1h30m"}},
        environ={"RSM__COPY__IDLE_TIMEOUT_SECONDS": "2m"},
    )
    assert cfg.get("fetch.idle_timeout_seconds") == 5400
    assert cfg.get("copy.idle_timeout_seconds") == 120
    assert (
        Config({**STORE, "fetch": {"idle_timeout_seconds": 90}}, environ={}).get("fetch.idle_timeout_seconds")
        == 90
    )


def test_a_bad_configuration_duration_names_the_key():
    with pytest.raises(
        ConfigError, match=r"fetch\.idle_timeout_seconds: expected a duration: a number of seconds"
    ):
        Config({**STORE, "fetch": {"idle_timeout_seconds": "an hour"}}, environ={})
