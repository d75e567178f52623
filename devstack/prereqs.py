"""What `make demo` and `make test` need on the machine, checked before anything is set up:
``python3 -m devstack.prereqs demo|up|test`` names every missing or too old tool in one message,
with what needs it and how to get it, and exits 1, instead of a failure minutes into the set-up.

The requirements are read from where they are declared: Python from ``pyproject.toml``'s
``requires-python``, Java from the shim's ``maven.compiler.release``, Go from the go.mod of the
compose tools (:data:`devstack.compose_tools.MIN_GO`). Standard library only, and it imports
nothing of the project before it has checked the Python it runs on: the Makefile runs it on the
machine's ``python3`` before the virtualenv exists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the commands checked, and what each needs beyond the one before it
COMMANDS = ("demo", "up", "test")


def _requires_python() -> tuple[tuple[int, int], tuple[int, int] | None]:
    text = (REPO / "pyproject.toml").read_text()
    spec = re.search(r'^requires-python\s*=\s*"([^"]+)"', text, flags=re.M).group(1)
    low = re.search(r">=\s*(\d+)\.(\d+)", spec)
    high = re.search(r"<\s*(\d+)\.(\d+)", spec)
    return (int(low.group(1)), int(low.group(2))), (int(high.group(1)), int(high.group(2))) if high else None


def _java_release() -> int:
    pom = (REPO / "java-shim" / "pom.xml").read_text()
    return int(re.search(r"<maven.compiler.release>(\d+)<", pom).group(1))


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (out.stdout + out.stderr).strip()


def check_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> list[str]:
    low, high = _requires_python()
    shown = ".".join(map(str, version))
    problems = []
    if version[:2] < low or (high and version[:2] >= high):
        wanted = f"{low[0]}.{low[1]}" + (f" to {high[0]}.{high[1] - 1}" if high else " or newer")
        problems.append(
            f"Python {wanted} as python3 (found {shown} at {sys.executable}; pyproject.toml's "
            f"requires-python): the virtualenv is made from it. Debian 12: apt-get install python3 "
            f"python3-venv; elsewhere https://www.python.org/downloads/ and then "
            f"make PYTHON=python3.{low[1]} ..."
        )
    else:
        try:
            import ensurepip  # noqa: F401  (Debian splits it out of python3 into python3-venv)
        except ImportError:
            problems.append(
                f"Python's venv module with ensurepip (python3 -m venv fails without it): "
                f"apt-get install python3.{version[1]}-venv"
            )
    return problems


def check_java() -> list[str]:
    from devstack.java import JavaUnavailable, java_major

    release = _java_release()
    problems = []
    java = shutil.which("java")
    try:
        major = java_major(java) if java else None
    except (JavaUnavailable, OSError, subprocess.SubprocessError):
        major = None
    if major is None or major < release:
        found = f"found Java {major} at {java}" if major else "no java on PATH"
        problems.append(
            f"a Java {release} JDK or newer ({found}): builds the shim and runs the broker. Debian 12: "
            f"apt-get install openjdk-{release}-jdk-headless"
        )
    elif not shutil.which("javac"):
        problems.append(
            f"javac (found Java {major} at {java}, a runtime without the compiler): Maven builds the "
            f"shim with it. Debian 12: apt-get install openjdk-{release}-jdk-headless"
        )
    if not shutil.which("mvn"):
        problems.append(
            "Maven (mvn): builds the shim and fetches Kafka's jars from Maven Central. Debian: "
            "apt-get install maven; elsewhere https://maven.apache.org/download.cgi"
        )
    return problems


def check_go() -> list[str]:
    from devstack.compose_tools import MIN_GO

    wanted = ".".join(map(str, MIN_GO))
    go = shutil.which("go")  # the compose tools' build finds it on PATH only
    text = _version([go, "env", "GOVERSION"]) if go else ""
    version = tuple(int(p) for p in re.findall(r"\d+", text)[:3])
    if go and version >= MIN_GO:
        return []
    found = f"found {text or 'an unreadable version'} at {go}" if go else "no go on PATH"
    return [
        f"Go {wanted} or newer ({found}): the tests build docker compose, helm and fake-gcs-server "
        f"from the Go module proxy. https://go.dev/dl/ (Debian's golang package is older)"
    ]


def check_node() -> list[str]:
    missing = [tool for tool in ("node", "npm") if not shutil.which(tool)]
    if not missing:
        return []
    return [
        f"Node.js with npm (no {' and no '.join(missing)} on PATH): the tests install Azurite, the "
        f"Azure Blob Storage emulator, from npm. Debian 12: apt-get install nodejs npm"
    ]


def check_containers(euid: int | None = None) -> list[str]:
    """podman, runc and debootstrap run the compose and topology tests; ``make test`` installs
    them from Debian's apt when it runs as root where apt-get is, so only elsewhere are they a
    prerequisite."""
    missing = [tool for tool in ("podman", "runc", "debootstrap") if not shutil.which(tool)]
    if not missing:
        return []
    if (os.geteuid() if euid is None else euid) == 0 and shutil.which("apt-get"):
        return []
    return [
        f"{', '.join(missing)} (not on PATH; `make test` installs them from apt only as root on "
        f"Debian): the compose and topology tests build and run containers with them. Debian: "
        f"apt-get install podman runc debootstrap"
    ]


def problems(command: str) -> list[str]:
    found = check_python()
    checks = [check_java]
    if command == "test":
        checks += [check_go, check_node, check_containers]
    for check in checks:
        try:
            found += check()
        except (ImportError, SyntaxError, AttributeError):  # the project's modules on too old a Python
            if not found:
                raise
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in COMMANDS:
        print(f"usage: python3 -m devstack.prereqs {{{'|'.join(COMMANDS)}}}", file=sys.stderr)
        return 2
    command = args[0]
    found = problems(command)
    if not found:
        return 0
    print(f"`make {command}` needs, and this machine lacks:", file=sys.stderr)
    for problem in found:
        print(f"  - {problem}", file=sys.stderr)
    print(f'Install them (README.md, "Prerequisites") and run `make {command}` again.', file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
