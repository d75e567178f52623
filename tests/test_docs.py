"""The guides against the code.

docs/operations.md: every metric, sidecar configuration key, RSM__ variable, shim key and
relative link it names exists, and its metrics table lists every metric of
rsm_sidecar/service/metrics.py with the right type and labels.

The command line (every guide and README.md) against the argparse definitions of
rsm_sidecar/cli: every documented command line names a real command and real options; every
command and option is documented in its guide (GUIDE_OF_COMMAND); docs/inspect.md has a
section per subcommand naming exactly its options, and exit codes that are the CLI's;
docs/iceberg.md names each subcommand's options in its section. No guide points outside the
repository. (docs/configuration.md is checked against the code by tests/test_config.py.)"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import prometheus_client as prom
import pytest

from rsm_sidecar.cli import inspect as inspect_cli
from rsm_sidecar.cli import main as cli_main
from rsm_sidecar.cli.main import build_parser
from rsm_sidecar.config import ENV_PREFIX, Config, all_keys
from rsm_sidecar.service.metrics import Metrics

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "operations.md"
#: names in the doc that start like a sidecar section but are not sidecar keys: Kafka
#: broker/topic/consumer settings and a file name
NOT_SIDECAR_KEYS = {
    "log.retention.check.interval.ms",
    "log.initial.task.delay.ms",
    "log.segment.bytes",
    "fetch.max.wait.ms",
    "segment.bytes",
    "segment.ms",
    "server.properties",
}
SAMPLE_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")


@pytest.fixture(scope="module")
def text() -> str:
    return DOC.read_text()


def _code_spans(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks are checked separately
    return re.findall(r"`([^`\n]+)`", text)


def _tokens(spans: list[str]) -> set[str]:
    out = set()
    for span in spans:
        for tok in re.split(r"[\s,=()/]+", span):
            tok = tok.strip(".:;")
            if re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z0-9_<>*-]+)+", tok):
                out.add(tok)
    return out


def _families() -> dict[str, tuple[str, set[str]]]:
    """name -> (type, label names) of every metric the sidecar exports."""
    m = Metrics()
    for attr in vars(m).values():
        if isinstance(attr, prom.metrics.MetricWrapperBase) and attr._labelnames:
            attr.labels(*["x"] * len(attr._labelnames))

    class Cache:
        size_bytes = 1
        enabled = True

        def __len__(self):
            return 1

    class Store:
        name = "s3"
        requests = {"GET": 1}
        bytes_read = 1

    class Journal:
        def leftovers(self):
            return 0

    m.track_cache("chunk", Cache())
    m.track_disk_cache(Cache())
    m.track_store(Store())
    m.track_journal(Journal())
    out = {}
    for fam in m.registry.collect():
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        out[fam.name] = (fam.type, labels)
    return out


def test_metrics_named_in_the_doc_exist(text):
    families = _families()
    names = set(families) | {f + s for f in families for s in SAMPLE_SUFFIXES}
    mentioned = {m for m in re.findall(r"\brsm_[a-z_]+", text) if not m.startswith("rsm_sidecar")}
    assert mentioned, "no metric mentioned"
    assert mentioned <= names, f"not exported by the sidecar: {sorted(mentioned - names)}"


def test_metrics_table_lists_every_metric_with_its_type_and_labels(text):
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `(rsm_[a-z_]+)` \| (\w+) \| ([^|]*) \|", line)
        if m:
            labels = set(re.findall(r"`([a-z_]+)`", m.group(3)))
            rows[m.group(1)] = (m.group(2), labels)
    families = _families()
    assert set(rows) == set(families), (
        f"missing: {set(families) - set(rows)}, unknown: {set(rows) - set(families)}"
    )
    for name, (typ, labels) in families.items():
        assert rows[name] == (typ, labels), name


def test_sidecar_configuration_keys_named_in_the_doc_exist(text):
    keys = all_keys()
    paths = {k.path for k in keys}
    sections = {p.split(".")[0] for p in paths}
    checked = 0
    # (an error message quoted with a deliberately misspelt key is not a key)
    spans = [s for s in _code_spans(text) if "unknown configuration key" not in s]
    for tok in sorted(_tokens(spans)):
        if tok.split(".")[0] not in sections or tok in NOT_SIDECAR_KEYS or "*" in tok:
            continue
        checked += 1
        assert tok in paths, f"not a sidecar configuration key: {tok}"
    assert checked > 40


def test_rsm_environment_variables_in_the_doc_name_keys(text):
    cfg = Config({"storage": {"local": {"root": "/tmp"}}}, environ={})
    names = set(re.findall(r"\bRSM__[A-Za-z0-9_\-]+", text))
    assert names
    for name in names:
        cfg._find(cfg._env_to_path(name), from_env=True)
        assert name.startswith(ENV_PREFIX)


def test_shim_keys_named_in_the_doc_exist(text):
    """rsm.config.* keys outside the Aiven migration section are the shim's (docs/shim.md)."""
    shim = (REPO / "docs" / "shim.md").read_text()
    shim_keys = set(re.findall(r"^\| `([a-z.]+)` \|", shim, flags=re.M))
    assert "sidecar.target" in shim_keys
    before, _, rest = text.partition("## 7. Migrating")
    _, _, after = rest.partition("## 8. Troubleshooting")
    for tok in _tokens(_code_spans(before + after)):
        if tok.startswith("rsm.config.") and "*" not in tok and "<" not in tok:
            assert tok.removeprefix("rsm.config.") in shim_keys, f"not a shim key: {tok}"


def test_relative_links_resolve(text):
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (DOC.parent / target).exists(), target


def test_config_examples_in_the_doc_are_the_shipped_ones(text):
    """The broker block quoted in §2.1 is config/broker-tiered.properties (placeholders filled)."""
    block = re.search(r"```properties\n(.*?)```", text, flags=re.S).group(1)
    quoted = dict(line.split("=", 1) for line in block.splitlines() if line and not line.startswith("#"))
    shipped = {}
    for line in (REPO / "config" / "broker-tiered.properties").read_text().splitlines():
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            shipped[k] = v
    assert quoted.keys() == shipped.keys()
    for k, v in shipped.items():
        if "${" not in v:
            assert quoted[k] == v, k


# -- the command line: every guide against the argparse definitions of rsm_sidecar/cli ----------------
#: the guide that documents each command and every one of its options
GUIDE_OF_COMMAND = {
    ("serve",): "configuration.md",
    ("config", "check"): "configuration.md",
    ("config", "docs"): "configuration.md",
    ("keys", "generate"): "operations-keys.md",
    ("inspect",): "inspect.md",
    ("iceberg",): "iceberg.md",
}
#: how a command line starts in the docs -> the command path it stands for (the spark-submit main
#: file takes the arguments of `rsm-sidecar iceberg`)
COMMAND_STARTS = {"rsm-sidecar": (), "rsm_sidecar/iceberg/submit/rsm_iceberg_job.py": ("iceberg",)}
#: text in code spans that starts like a command line but is a log line of the sidecar
NOT_COMMAND_LINES = ("rsm-sidecar serving on",)
FLAG = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")
ALL_DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]


def _commands() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every command of `rsm-sidecar`, by path (("inspect", "ls"), ("serve",), ...), leaves and groups."""
    out: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        out[path] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk((*path, name), sub)

    walk((), build_parser())
    return out


def _is_leaf(parser: argparse.ArgumentParser) -> bool:
    return not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}


def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for o in _options(parser) if o.startswith("--")}


def _command_lines(text: str) -> list[str]:
    """Command lines of the docs: code-block lines (continuations joined) and inline code spans
    that start with one of COMMAND_STARTS."""
    starts = "|".join(re.escape(s) for s in COMMAND_STARTS)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    found = [re.match(rf"(?:\$ )?({starts})(\s.*|$)", span) for span in spans]
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if not line.lstrip().startswith("#"):
                found.append(re.search(rf"(?:^|\s)({starts})(\s.*|$)", line))
    return [
        m.group(1) + m.group(2).split(" #")[0].split("|")[0]
        for m in found
        if m and not m.group(0).lstrip("$ ").startswith(NOT_COMMAND_LINES)
    ]


def _resolve(line: str, commands) -> tuple[tuple[str, ...], list[str]]:
    """(command path, the rest of the tokens) of a documented command line; a word where a
    subcommand must stand that names none fails."""
    start, *tokens = line.split()
    path = COMMAND_STARTS[start]
    while tokens and not _is_leaf(commands[path]):
        word = tokens[0].strip("[]()")
        if (*path, word) in commands:
            path = (*path, word)
            tokens.pop(0)
        elif re.fullmatch(r"[a-z][a-z-]*", word):
            raise AssertionError(f"`{line}`: {word!r} is not a command of rsm-sidecar {' '.join(path)}")
        else:
            break
    return path, tokens


@pytest.fixture(scope="module")
def commands() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    return _commands()


def test_every_documented_command_line_runs_a_real_command_with_real_options(commands):
    checked = 0
    for doc in ALL_DOCS:
        for line in _command_lines(doc.read_text()):
            path, tokens = _resolve(line, commands)
            options = _options(commands[path])
            for tok in tokens:
                m = FLAG.fullmatch(tok.strip("[](),|").split("=")[0])
                if m and path and _is_leaf(commands[path]):
                    assert m.group(1) in options, f"{doc.name}: `{line}`: no option {m.group(1)}"
                    checked += 1
    assert checked > 30


def test_every_command_and_option_is_documented_in_its_guide(commands):
    """Each leaf command is shown as a command line in its guide, and every option of it is named
    in that guide (inspect.md and iceberg.md: in the command's own section, below)."""
    for path, parser in commands.items():
        if not path or not _is_leaf(parser):
            continue
        guide_key = next(k for k in GUIDE_OF_COMMAND if path[: len(k)] == k)
        text = (REPO / "docs" / GUIDE_OF_COMMAND[guide_key]).read_text()
        shown = [_resolve(line, commands) for line in _command_lines(text)]
        assert any(p == path for p, _ in shown), (
            f"{GUIDE_OF_COMMAND[guide_key]}: no `rsm-sidecar {' '.join(path)}`"
        )
        named = set(FLAG.findall(text))
        missing = _long_options(parser) - named
        assert not missing, (
            f"{GUIDE_OF_COMMAND[guide_key]} does not name {sorted(missing)} of {' '.join(path)}"
        )


def _sections(text: str) -> dict[str, str]:
    """Level-2 sections of a guide: heading -> heading line and body."""
    parts = re.split(r"^(?=## )", text, flags=re.M)
    return {p.splitlines()[0][3:]: p for p in parts if p.startswith("## ")}


def _flags(text: str) -> set[str]:
    return {f for f in FLAG.findall(text) if f.startswith("--")}


def _section_flags(body: str, path: tuple[str, ...], commands) -> set[str]:
    """The options a section names for the command ``path``: in its prose, in its command lines
    of that command, and in the output shown by example blocks; not in command lines of other
    commands or other tools (shell blocks)."""
    prose = re.sub(r"```.*?```", "", body, flags=re.S)
    out = _flags(prose)
    for lang, block in re.findall(r"```([a-z]*)\n(.*?)```", body, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            commands_here = _command_lines(f"```\n{line}\n```")
            if commands_here:
                if _resolve(commands_here[0], commands)[0] == path:
                    out |= _flags(commands_here[0])
            elif lang not in ("sh", "bash"):
                out |= _flags(line)
    return out


def test_inspect_guide_has_a_section_per_subcommand_naming_exactly_its_options(commands):
    text = (REPO / "docs" / "inspect.md").read_text()
    verbs = {p[1]: commands[p] for p in commands if len(p) == 2 and p[0] == "inspect"}
    common_line = re.search(r"^Common options: (.*?)\n\n", text, flags=re.M | re.S).group(1)
    common = _flags(common_line)
    # the common options are the options of every subcommand, with their short forms
    assert common == set.intersection(*(_long_options(p) for p in verbs.values()))
    for long, short in re.findall(r"`(--[a-z-]+)/(-[a-z])", common_line):
        parser = next(iter(verbs.values()))
        action = next(a for a in parser._actions if long in a.option_strings)
        assert short in action.option_strings, f"{short} is not short for {long}"
    sections = {m.group(1): body for h, body in _sections(text).items() if (m := re.match(r"`(\w+)", h))}
    assert set(sections) == set(verbs), "sections `verb ...` and subcommands differ"
    for verb, parser in verbs.items():
        body = sections[verb]
        own = _long_options(parser) - common
        named = _section_flags(body, ("inspect", verb), commands) - common
        assert named == own, f"inspect {verb}: missing {own - named}, not options: {named - own}"
        heading = body.splitlines()[0]
        positionals = {a.metavar: a.nargs for a in parser._actions if not a.option_strings}
        assert ("SEGMENT" in heading) == ("SEGMENT" in positionals), heading
        for name, nargs in positionals.items():
            assert (f"[{name}" in heading) == (nargs == "?"), f"{heading}: {name} optional is {nargs == '?'}"


def test_inspect_exit_codes_in_the_guide_are_the_codes_of_the_cli(commands, capsys):
    text = (REPO / "docs" / "inspect.md").read_text()
    table = dict(re.findall(r"^\| (\d+) \| (.+) \|$", text, flags=re.M))
    assert {int(c) for c in table} == {inspect_cli.EXIT_OK, inspect_cli.EXIT_PROBLEMS, inspect_cli.EXIT_USAGE}
    assert "nothing wrong" in table[str(inspect_cli.EXIT_OK)]
    assert "problems found" in table[str(inspect_cli.EXIT_PROBLEMS)]
    assert "error" in table[str(cli_main.EXIT_ERROR)]  # what `rsm-sidecar` exits with on an RsmError
    assert "usage" in table[str(inspect_cli.EXIT_USAGE)] and cli_main.EXIT_USAGE == inspect_cli.EXIT_USAGE
    # argparse's own usage errors exit with the documented usage code too
    with pytest.raises(SystemExit) as exit_:
        cli_main.main(["inspect", "ls"])  # --config missing
    assert exit_.value.code == inspect_cli.EXIT_USAGE
    assert "--config" in capsys.readouterr().err
    # the help text's summary, and every "Exit N" of a section, use the same codes
    epilog = commands[("inspect",)].epilog
    assert {int(c) for c in re.findall(r"(\d+) \w", epilog)} == {int(c) for c in table}
    for code in re.findall(r"\bExit (\d+)", text):
        assert code in table, f"inspect.md says exit {code}, which its table does not list"


def test_iceberg_guide_names_each_subcommands_options_in_its_section(commands):
    """`convert` in "The convert job" (which also documents the options all three share),
    `maintain` in "Maintenance", `status` by its command line (its one option of its own,
    shared with `convert --follow`, in "Copy lag")."""
    sections = _sections((REPO / "docs" / "iceberg.md").read_text())
    convert_doc = sections["The convert job (`rsm-sidecar iceberg convert`)"]
    maintain_doc = sections["Maintenance (`rsm-sidecar iceberg maintain`)"]
    verbs = {p[1]: _long_options(commands[p]) for p in commands if len(p) == 2 and p[0] == "iceberg"}
    assert set(verbs) == {"convert", "maintain", "status"}
    shared = set.intersection(*verbs.values())
    assert verbs["status"] - shared == {"--bootstrap-server"} <= verbs["convert"]
    assert (
        "iceberg status --bootstrap-server"
        in sections["Follow mode (`rsm-sidecar iceberg convert --follow`)"]
    )
    named = _section_flags(convert_doc, ("iceberg", "convert"), commands)
    assert named == verbs["convert"], (
        f"convert: missing {verbs['convert'] - named}, not options: {named - verbs['convert']}"
    )
    own = verbs["maintain"] - shared
    named = _section_flags(maintain_doc, ("iceberg", "maintain"), commands)
    assert named == own, f"maintain: missing {own - named}, not options: {named - own}"


def test_docs_stand_on_their_own():
    """No guide points at a file outside the repository (docs/design.md once pointed at a file
    next to the checkout), and every relative link resolves."""
    for doc in ALL_DOCS:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) + re.findall(r"`(\.\./[^`]+)`", text):
            if "://" in target:
                continue
            path = (doc.parent / target).resolve()
            assert path.is_relative_to(REPO), f"{doc.name} points outside the repository: {target}"
            assert path.exists(), f"{doc.name}: {target} does not exist"
