"""`make demo` and `make test` check the machine first (devstack/prereqs.py): every missing or too
old tool is named, with what needs it, before anything is downloaded or built.

A machine that lacks Java, Maven, Go or npm cannot be made by uninstalling them from the test
machine, so these tests run the check on a PATH of stand-ins: tiny scripts that answer the version
questions as an old or missing tool would (the only fault here no real tool can produce)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devstack import prereqs
from devstack.compose_tools import MIN_GO

REPO = Path(__file__).resolve().parents[1]
GO_WANTED = ".".join(map(str, MIN_GO))


def _tool(bindir: Path, name: str, script: str = "exit 0") -> None:
    path = bindir / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


def _java(bindir: Path, major: int, jdk: bool = True) -> None:
    _tool(bindir, "java", f"echo 'openjdk version \"{major}.0.2\" 2026-01-20' >&2")
    if jdk:
        _tool(bindir, "javac")


def _machine(tmp_path: Path, **missing: bool) -> Path:
    """A PATH with every prerequisite of `make test`, minus those named in ``missing``."""
    bindir = tmp_path / "bin"
    bindir.mkdir(parents=True)
    if not missing.get("java"):
        _java(bindir, 17)
    if not missing.get("mvn"):
        _tool(bindir, "mvn")
    if not missing.get("go"):
        _tool(bindir, "go", f"echo go{GO_WANTED}")
    if not missing.get("npm"):
        _tool(bindir, "node")
        _tool(bindir, "npm")
    for tool in ("podman", "runc", "debootstrap"):
        if not missing.get("containers"):
            _tool(bindir, tool)
    return bindir


def _check(command: str, bindir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devstack.prereqs", command],
        cwd=REPO,
        env={"PATH": str(bindir), "HOME": str(bindir.parent)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_machine_with_everything_passes_silently(tmp_path):
    run = _check("test", _machine(tmp_path))
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


def test_make_test_names_every_missing_or_old_tool_with_what_needs_it(tmp_path):
    bindir = _machine(tmp_path, mvn=True, npm=True, containers=True, java=True)
    _java(bindir, 11)
    _tool(bindir, "go", "echo go1.22.5")
    run = _check("test", bindir)
    assert run.returncode == 1, run.stderr
    err = run.stderr
    assert err.startswith("`make test` needs, and this machine lacks:\n"), err
    lines = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(lines) == 5, err
    assert "a Java 17 JDK or newer (found Java 11 at " in err
    assert "Maven (mvn)" in err
    assert f"Go {GO_WANTED} or newer (found go1.22.5 at " in err
    assert "Node.js with npm (no node and no npm on PATH)" in err
    assert "podman, runc, debootstrap (not on PATH;" in err
    assert err.rstrip().endswith("run `make test` again.")


def test_a_java_runtime_without_the_compiler_is_named(tmp_path):
    bindir = _machine(tmp_path, java=True)
    _java(bindir, 21, jdk=False)
    run = _check("demo", bindir)
    assert run.returncode == 1
    assert "javac (found Java 21 at " in run.stderr, run.stderr


def test_make_demo_needs_only_what_the_demo_uses(tmp_path):
    """The demo needs Python, a JDK and Maven; Go, npm and podman are the tests' own."""
    run = _check("demo", _machine(tmp_path, go=True, npm=True, containers=True))
    assert (run.returncode, run.stderr) == (0, "")
    run = _check("demo", _machine(tmp_path / "x", mvn=True))
    assert run.returncode == 1 and "`make demo` needs" in run.stderr and "Maven (mvn)" in run.stderr


def test_python_outside_requires_python_is_named():
    """pyproject.toml says >=3.11,<3.13: the check reads it from there."""
    assert 'requires-python = ">=3.11,<3.13"' in (REPO / "pyproject.toml").read_text()
    (problem,) = prereqs.check_python((3, 9, 2))
    assert problem.startswith("Python 3.11 to 3.12 as python3 (found 3.9.2 at "), problem
    (problem,) = prereqs.check_python((3, 13, 0))
    assert "found 3.13.0" in problem
    assert prereqs.check_python((3, 11, 7)) == []


def test_root_on_debian_needs_no_podman_of_its_own(tmp_path, monkeypatch):
    """`make test` installs podman, runc and debootstrap from apt when it runs as root where apt-get
    is (devstack/containers.py), so only elsewhere are they a prerequisite."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    for euid in (0, 1000):
        (problem,) = prereqs.check_containers(euid=euid)
        assert problem.startswith("podman, runc, debootstrap (not on PATH;"), problem
    _tool(bindir, "apt-get")
    assert prereqs.check_containers(euid=0) == []
    assert prereqs.check_containers(euid=1000) != []


def test_the_makefile_checks_before_anything_else():
    text = (REPO / "Makefile").read_text()
    test_recipe = text.split("\ntest:\n", 1)[1].splitlines()
    assert test_recipe[0].strip() == "$(PYTHON) -m devstack.prereqs test"
    for target in ("demo", "up"):
        line = next(line for line in text.splitlines() if line.startswith(f"{target}:"))
        assert line.split(":", 1)[1].split()[0] == "prereqs-demo", line


def test_the_readme_names_every_prerequisite_before_anything_else():
    """A newcomer reads the prerequisites of both commands at the top of the README: every tool
    the check looks for, at the versions it wants."""
    readme = (REPO / "README.md").read_text()
    top = readme.split("## What it is")[0]
    (low, high) = prereqs._requires_python()
    wanted = [
        f"Python {low[0]}.{low[1]} or {high[0]}.{high[1] - 1}",
        f"Java {prereqs._java_release()} JDK",
        "javac",
        "Maven",
        f"Go {GO_WANTED} or newer",
        "Node.js with npm",
        "podman",
        "runc",
        "debootstrap",
        "python3 -m devstack.prereqs",
    ]
    missing = [w for w in wanted if w not in top]
    assert not missing, f"README.md's prerequisites do not name {missing}"
