"""The package layers of docs/design.md ("Layers, and where new code goes"), held by a test:
a package of ``rsm_sidecar`` imports only packages below it (lazy imports inside functions
included), so the storage core never grows a dependency on a tool built on top of it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "rsm_sidecar"

#: lowest first; a package may import only the ones before it
LAYERS = (
    "local_cache",
    "private_dir",
    "errors",
    "durations",
    "config",
    "format",
    "kafka",
    "storage",
    "transform",
    "segment",
    "service",
    "iceberg",
    "inspect",
    "cli",
)

#: entry points that sit above every layer (the spark-submit script runs the CLI)
ENTRY_POINTS = {Path("iceberg/submit/rsm_iceberg_job.py")}


def _imported_packages(path: Path) -> set[str]:
    """The ``rsm_sidecar`` top-level packages that a module imports."""
    module = ("rsm_sidecar", *path.relative_to(PACKAGE).with_suffix("").parts)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = module if path.name == "__init__.py" else module[:-1]
                base = here[: len(here) - (node.level - 1)]
                names = [".".join((*base, node.module) if node.module else base)]
            else:
                names = [node.module or ""]
        for name in names:
            parts = name.split(".")
            if parts[0] == "rsm_sidecar" and len(parts) > 1 and parts[1] != "_proto":
                found.add(parts[1])
    return found


def _layer_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def test_every_package_is_in_a_layer():
    packages = {
        _layer_of(p) for p in PACKAGE.glob("*") if p.name not in ("__init__.py", "_proto", "__pycache__")
    }
    packages = {p for p in packages if not p.startswith(".")}
    assert packages == set(LAYERS), "add the new package to LAYERS and to docs/design.md"


def test_packages_import_only_lower_layers():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if (
            rel.parts[0] == "_proto"
            or rel in ENTRY_POINTS
            or rel.name == "__init__.py"
            and len(rel.parts) == 1
        ):
            continue
        me = _layer_of(path)
        for other in _imported_packages(path):
            if other != me and LAYERS.index(other) > LAYERS.index(me):
                wrong.append(f"{rel} ({me}) imports {other}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_design_doc_lists_the_layers_in_this_order():
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("## Layers, and where new code goes", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(?:rsm_sidecar/)?([a-z_]+)(?:\.py|/)?` \|", section, flags=re.M)
    assert tuple(listed) == LAYERS


#: inside ``rsm_sidecar/iceberg`` (docs/iceberg.md "The package, in the order the data goes"): what
#: each sub-package may import of its siblings; job.py, stages.py and maintenance.py tie them together
ICEBERG = PACKAGE / "iceberg"
ICEBERG_ALLOWED = {
    "planning": set(),
    "reading": {"planning", "columnar_bytes"},
    "decoding": {"types", "columnar_bytes"},
    "mapping": {"decoding", "types"},
    "committing": set(),
    "session": {"jars", "settings"},
}


def _iceberg_siblings(path: Path) -> set[str]:
    """The ``rsm_sidecar.iceberg`` modules and sub-packages that a module imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            parts = node.module.split(".")
            if parts[:2] == ["rsm_sidecar", "iceberg"]:
                found.add(parts[2] if len(parts) > 2 else node.names[0].name)
    return found


#: the packages whose modules must not import each other in a circle
ACYCLIC = (PACKAGE, REPO / "devstack")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ``ACYCLIC`` it imports, anywhere in it (inside functions and
    ``TYPE_CHECKING`` blocks included: each is a dependency of one concept on another)."""
    paths = {_module_name(p): p for pkg in ACYCLIC for p in pkg.rglob("*.py") if "_proto" not in p.parts}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in paths else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in paths and d != name}
    return graph


#: Import cycles still to untie, each named by its modules (none left: add one only with an issue
#: that unties it).
KNOWN_CYCLES: set[frozenset[str]] = set()


def test_no_two_modules_depend_on_each_other():
    """Each concept depends one way: no cycle of imports between modules (a cycle is a strongly
    connected component of the import graph, found with Tarjan's algorithm)."""
    graph = _import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                cycles.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    new = [sorted(c) for c in cycles - KNOWN_CYCLES]
    assert not new, f"modules that import each other: {new}"
    untied = [sorted(c) for c in KNOWN_CYCLES - cycles]
    assert not untied, f"untied: remove from KNOWN_CYCLES: {untied}"


def test_iceberg_sub_packages_import_one_way():
    wrong = []
    for sub, allowed in ICEBERG_ALLOWED.items():
        for path in sorted((ICEBERG / sub).glob("*.py")):
            extra = _iceberg_siblings(path) - allowed - {sub}
            if extra:
                wrong.append(f"{path.relative_to(REPO)} imports {sorted(extra)}")
    assert not wrong, "\n".join(wrong)
    assert {p.name for p in ICEBERG.iterdir() if (p / "__init__.py").exists()} - {"submit"} == set(
        ICEBERG_ALLOWED
    )
