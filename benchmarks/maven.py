"""Jars a benchmark needs beyond the set-up's, fetched from Maven Central once into the cache."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def maven_jar(cache: Path, artifact: str, name: str) -> Path:
    """``<cache>/<name>/<name>.jar``: the Maven ``artifact`` (``group:id:version[:jar:classifier]``)
    copied there with ``mvn dependency:copy`` (repository ``<cache>/m2``) when missing."""
    out = cache / name
    jar = out / f"{name}.jar"
    if not jar.exists():
        out.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [
                os.environ.get("MVN", "mvn"), "-q", "-B", f"-Dmaven.repo.local={cache / 'm2'}",
                "dependency:copy", f"-Dartifact={artifact}", f"-DoutputDirectory={out}",
            ],
            capture_output=True,
            text=True,
        )  # fmt: skip
        if done.returncode != 0 or not jar.exists():
            raise SystemExit(f"cannot fetch {artifact} from Maven Central:\n{done.stdout}{done.stderr}")
    return jar
