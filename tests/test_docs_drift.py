"""The kinds of drift between the guides and the tree that a machine can catch (tests/test_docs.py
checks the commands, metrics and keys they name):

* a table of files that misses files of the directory it describes (FILE_TABLES);
* a relative link, an anchor, or a quoted section reference (`design.md "Fetch"`,
  `operations.md §2.3`, in the guides and in the code's comments) that points nowhere;
* a guide or benchmark that cites an internal issue number a reader cannot resolve;
* a figure stated in two places that disagree: docs/performance.md's table of current figures is
  the reference, and a figure linked to one of its sections must be in that section;
* a broker setting of config/broker-tiered.properties that suits only the demo without a comment
  that says so and gives the production value."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md", REPO / "docker" / "README.md"]
PERFORMANCE = REPO / "docs" / "performance.md"

#: (guide, section heading, directory, glob, prefix): the section's table lists every such file in
#: its first column, as the path relative to the directory after ``prefix`` (one or more per row)
FILE_TABLES = [
    ("docs/iceberg.md", "The package, in the order the data goes", "rsm_sidecar/iceberg", "**/*.py", ""),
    ("docs/iceberg.md", "Tests", "tests/iceberg", "test_*.py", ""),
    ("docs/design.md", "Where segment access lives", "rsm_sidecar/segment", "*.py", "segment/"),
]
#: files of those directories that are no concept of their own
NOT_LISTED = {"__init__.py"}
#: benchmarks/*.py that measure nothing themselves (helpers of the others)
BENCHMARK_HELPERS = {"maven.py", "netns.py", "synthetic.py"}


def _section(text: str, heading: str) -> str:
    """The body of the section whose heading is ``heading`` (any level), up to the next heading
    of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, flags=re.M)
    assert m, f"no section {heading!r}"
    level = len(m.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[m.end() :], flags=re.M)
    return text[m.end() : m.end() + end.start()] if end else text[m.end() :]


@pytest.mark.parametrize("guide,heading,directory,pattern,prefix", FILE_TABLES, ids=lambda v: str(v))
def test_file_tables_list_every_file_of_their_directory(guide, heading, directory, pattern, prefix):
    body = _section((REPO / guide).read_text(), heading)
    first_cells = re.findall(r"^\| ([^|]*`[^|]*) \|", body, flags=re.M)
    listed = {f.removeprefix(prefix) for cell in first_cells for f in re.findall(r"`([^`]+)`", cell)}
    base = REPO / directory
    files = {p.relative_to(base).as_posix() for p in base.glob(pattern) if p.name not in NOT_LISTED}
    assert files, f"nothing matches {directory}/{pattern}"
    missing = sorted(files - listed)
    assert not missing, f'{guide} "{heading}" misses {missing}'
    gone = sorted(f for f in listed - files if f.endswith(".py"))
    assert not gone, f'{guide} "{heading}" lists files that do not exist: {gone}'


def test_file_table_rows_have_their_cells():
    """Every row of those tables has as many cells as its header (a clause once fell outside a
    row of iceberg.md's test table)."""
    for guide, heading, *_ in FILE_TABLES:
        rows = [r for r in _section((REPO / guide).read_text(), heading).splitlines() if r.startswith("|")]
        width = rows[0].count(" | ") + 1
        for row in rows[2:]:
            cells = re.sub(r"`[^`]*`", "x", row).strip().strip("|").split(" | ")
            assert len(cells) == width and row.rstrip().endswith("|"), f"{guide}: {row[:80]}"


def test_performance_md_names_every_benchmark():
    text = PERFORMANCE.read_text()
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        if path.name not in BENCHMARK_HELPERS and path.name != "__init__.py":
            assert f"benchmarks/{path.name}" in text or f"benchmarks.{path.stem}" in text, path.name


# -- links, anchors, section references --------------------------------------------------------------
def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to -."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _prose(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _anchors(doc: Path) -> set[str]:
    out: set[str] = set()
    for heading in re.findall(r"^#+ (.+?)\s*$", _prose(doc.read_text()), flags=re.M):
        slug, n = _slug(heading), 1
        while slug in out:  # GitHub numbers repeated headings
            slug = f"{_slug(heading)}-{n}"
            n += 1
        out.add(slug)
    return out


def _titles(doc: Path) -> list[str]:
    """What a quoted section reference may name: headings (without their number), bold lead-ins of
    paragraphs and list items, and list items' first words (shim.md's "Read-ahead")."""
    text = _prose(doc.read_text())
    heads = [re.sub(r"^\d+[a-z]?(\.\d+)*\.?\s+", "", h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)]
    bold = re.findall(r"^(?:[*-] |\d+\. )?\*\*(.+?)\*\*", text, flags=re.M)
    items = re.findall(r"^\s*[*-] (.{3,80})", text, flags=re.M)
    return [re.sub(r"[`*]", "", t).strip().lower() for t in heads + bold + items]


LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")


def test_relative_links_and_their_anchors_resolve():
    broken = []
    for doc in DOCS:
        for target in LINK.findall(_prose(doc.read_text())):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such section)")
    assert not broken, "\n".join(broken)


#: `file.md "Section"` or `file.md §N` in prose and in code comments
SECTION_REF = re.compile(
    r"\b([a-z][a-z0-9-]*\.md)\b[,:]?\s*\(?(?:\"([^\"\n]{2,90})\"|§\s*(\d+[a-z]?(?:\.\d+)*))"
)
CODE_SUFFIXES = {".py", ".java", ".yaml", ".yml", ".toml", ".properties", ".sh", ".tpl"}
SKIP_DIRS = {".git", ".venv", ".cache", "node_modules", "target", "run", "__pycache__"}


def _files_with_references() -> list[Path]:
    out = list(DOCS)
    for path in REPO.rglob("*"):
        if path.name == Path(__file__).name:  # its own examples
            continue
        if path.suffix in CODE_SUFFIXES and not SKIP_DIRS & set(path.relative_to(REPO).parts):
            out.append(path)
    return out


def test_quoted_section_references_name_a_section_that_exists():
    broken = []
    for path in _files_with_references():
        text = path.read_text(errors="replace")
        for m in SECTION_REF.finditer(text):
            name, title, number = m.groups()
            doc = next(
                (d for d in (REPO / "docs" / name, path.parent / name, REPO / name) if d.is_file()), None
            )
            where = f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}"
            if doc is None:
                broken.append(f"{where}: {name} does not exist")
                continue
            if number:
                heads = re.findall(r"^#+ (.+)$", _prose(doc.read_text()), flags=re.M)
                ok = any(re.match(rf"{re.escape(number)}[. ]", h) for h in heads)
            else:
                wanted = (
                    re.sub(r"[`*]|\s+", " ", title).strip().rstrip(".").removesuffix("...").strip().lower()
                )
                wanted = re.sub(r"\s+", " ", wanted)
                ok = any(re.sub(r"\s+", " ", t).startswith(wanted) for t in _titles(doc))
            if not ok:
                broken.append(f"{where}: {m.group(0)!r}")
    assert not broken, "\n".join(broken)


# -- issue numbers ---------------------------------------------------------------------------------
ISSUE = re.compile(r"\b(issues? #?\d+|the issue(?:'s)?\b)", flags=re.I)


def test_no_guide_or_benchmark_cites_an_internal_issue():
    """A reader cannot resolve "issue 30": the guides (and the benchmarks' docstrings, which
    performance.md sends readers to) say the thing itself."""
    found = []
    for path in DOCS + sorted((REPO / "benchmarks").glob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in ISSUE.finditer(line):
                if "github.com" not in line:
                    found.append(f"{path.relative_to(REPO)}:{n}: {m.group(0)}")
    assert not found, "\n".join(found)


# -- figures stated twice ----------------------------------------------------------------------------
def _current_figures() -> dict[str, str]:
    """performance.md's table of current figures: what -> figure."""
    body = _section(PERFORMANCE.read_text(), "Current figures")
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 4 and cells[0] not in ("what", "---"):
            rows[re.sub(r"\s*\(\[.*$", "", cells[0])] = cells[1]
    return rows


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d+(?:[.,]\d+)*", text)


def test_the_readme_states_the_figures_of_the_current_table():
    """The README's `make test` and `make demo` times are those of performance.md's table."""
    figures = _current_figures()
    readme = " ".join(REPO.joinpath("README.md").read_text().split())
    make_test = figures["`make test` on a clean clone"]
    minutes = re.match(r"([\d.]+) min", make_test).group(1)
    stated = re.findall(r"`make test` took \[?([\d.]+) minutes", readme)
    assert stated == [minutes], f"README: `make test` took {stated}, performance.md: {make_test}"
    fresh, again = figures["`make demo` on a fresh clone / again"].split(" / ")
    assert f"[{fresh}]" in readme and f"[{again}]" in readme, (fresh, again)


def test_a_figure_linked_to_performance_md_is_the_one_there():
    """`[35.4 minutes](performance.md#the-test-suite-and-the-demo)`: every number of the link's
    text is in the section it points to."""
    text = PERFORMANCE.read_text()
    sections = {_slug(h): _section(text, h) for h in re.findall(r"^#+ (.+?)\s*$", _prose(text), flags=re.M)}
    checked = 0
    for doc in DOCS:
        for m in re.finditer(
            r"\[([^\]\n]*\d[^\]\n]*)\]\(([^)#\s]*performance\.md)#([^)\s]+)\)", doc.read_text()
        ):
            label, _, anchor = m.groups()
            body = " ".join(sections[anchor].split())
            for number in _numbers(label):
                assert number in _numbers(body), f"{doc.name}: [{label}] is not in performance.md#{anchor}"
            checked += 1
    assert checked >= 3


# -- config/broker-tiered.properties ---------------------------------------------------------------
#: Kafka's defaults (RemoteLogManagerConfig, TopicBasedRemoteLogMetadataManagerConfig; the min ISR
#: default of 2 from Kafka 4.3)
KAFKA_DEFAULTS = {
    "rlmm.config.remote.log.metadata.topic.replication.factor": "3",
    "rlmm.config.remote.log.metadata.topic.min.isr": "2",
    "rlmm.config.remote.log.metadata.topic.num.partitions": "50",
    "remote.log.manager.task.interval.ms": "30000",
    "log.retention.check.interval.ms": "300000",
}


def test_demo_only_broker_settings_say_so_and_give_the_production_value():
    """README step 3 tells users to add config/broker-tiered.properties to their brokers: each
    setting that differs from Kafka's default for the single-broker demo is marked "demo only" in
    the comment above it, with the production value."""
    lines = (REPO / "config" / "broker-tiered.properties").read_text().splitlines()
    seen = set()
    for i, line in enumerate(lines):
        key, sep, value = line.partition("=")
        if not sep or line.startswith("#") or key not in KAFKA_DEFAULTS:
            continue
        seen.add(key)
        if value == KAFKA_DEFAULTS[key]:
            continue
        comment = []
        for above in reversed(lines[:i]):
            if not above.startswith("#"):
                break
            comment.insert(0, above)
        note = " ".join(comment)
        assert "demo only" in note, f"{key}={value}: not marked demo only"
        assert re.search(rf"production: {KAFKA_DEFAULTS[key]}\b", note), f"{key}: no production value"
    assert seen == set(KAFKA_DEFAULTS)
