"""The two Go tools the compose tests run, built on first use into the cache (no Docker
engine is needed for either):

* ``docker compose`` itself, to validate and normalize docker-compose.yml exactly as
  ``docker compose config`` does (the compose-spec schema, interpolation, merge keys,
  ``depends_on`` targets): an installed ``docker compose`` plugin or ``docker-compose``
  (v2+) if there is one, else github.com/docker/compose/v5 at :data:`COMPOSE_VERSION`
  built from the Go module proxy into ``$RSM_CACHE_DIR/docker-compose-<version>/``;
* ``dockerfilecheck`` (tests/compose/tools/): BuildKit's Dockerfile parser and the lint
  rules of ``docker build --check``, plus the build context as the Dockerfile's ignore file
  shapes it.

Both builds use ``$RSM_CACHE_DIR/go`` as module and build cache and need Go >= 1.26.3.
From a cold cache both took 2 minutes on the shared 2-core machine and left about 1 GB of
module and build cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from devstack.common import default_cache_dir, made_once, run_checked

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tests" / "compose" / "tools"
COMPOSE_VERSION = "v5.5.1"
#: the oldest Go that builds it (its go.mod's ``go`` line, below); devstack/prereqs.py checks it
MIN_GO = (1, 26, 3)
# Copied from github.com/docker/compose/v5's go.mod: a build outside that module must
# repeat them (go install of the module itself refuses modules with exclude directives).
COMPOSE_GO_MOD = f"""module rsm-sidecar/compose-cli

go {".".join(map(str, MIN_GO))}

require github.com/docker/compose/v5 {COMPOSE_VERSION}

exclude (
\tgithub.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc
\tgithub.com/pmezard/go-difflib v1.0.1-0.20181226105442-5d4384ee4fb2
)
"""


class ToolUnavailable(RuntimeError):
    """Go is missing or too old: the tests that need the tool skip with this message."""


def cache_dir() -> Path:
    path = default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _go_env() -> dict[str, str]:
    go = shutil.which("go")
    if not go:
        raise ToolUnavailable("Go is not installed (needed to build the compose tools)")
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60).stdout.strip()
    version = tuple(int(p) for p in out.removeprefix("go").split(".")[:3] if p.isdigit())
    if version < MIN_GO:
        wanted = ".".join(map(str, MIN_GO))
        raise ToolUnavailable(f"Go {out} is older than {wanted} (needed by docker compose {COMPOSE_VERSION})")
    gocache = cache_dir() / "go"
    env = dict(os.environ)
    env.update(
        {
            "GOPATH": str(gocache),
            "GOMODCACHE": str(gocache / "pkg" / "mod"),
            "GOCACHE": str(gocache / "build"),
            "GOTOOLCHAIN": "local",
            "GOFLAGS": "-buildvcs=false",
        }
    )
    return env


def _go_build(workdir: Path, package: str, output: Path, env: dict[str, str], mod: str) -> None:
    tmp = output.with_name(output.name + ".tmp")
    run_checked(
        ["go", "build", f"-mod={mod}", "-o", str(tmp), package],
        f"go build {package}",
        timeout=1500,
        cwd=workdir,
        env=env,
    )
    tmp.replace(output)


def compose_command() -> list[str]:
    """The argv prefix that runs docker compose (``[..., "config", ...]`` follows)."""
    for cand in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cand[0]):
            proc = subprocess.run([*cand, "version", "--short"], capture_output=True, text=True, timeout=60)
            major = proc.stdout.strip().lstrip("v").split(".")[0]
            if proc.returncode == 0 and major.isdigit() and int(major) >= 2:
                return cand
    return [str(ensure_compose_cli())]


def ensure_compose_cli() -> Path:
    """docker compose at :data:`COMPOSE_VERSION`, built once into the cache."""
    home = cache_dir() / f"docker-compose-{COMPOSE_VERSION}"
    binary = home / "docker-compose"

    def build() -> Path:
        env = _go_env()
        build = home / "module"
        build.mkdir(parents=True, exist_ok=True)
        (build / "go.mod").write_text(COMPOSE_GO_MOD)
        run_checked(
            ["go", "get", f"github.com/docker/compose/v5/cmd@{COMPOSE_VERSION}"],
            f"go get docker compose {COMPOSE_VERSION}",
            timeout=1500,
            cwd=build,
            env=env,
        )
        _go_build(build, "github.com/docker/compose/v5/cmd", binary, env, mod="readonly")
        return binary

    return made_once(home.with_suffix(".lock"), lambda: binary if binary.exists() else None, build)


def ensure_dockerfilecheck() -> Path:
    """tests/compose/tools/dockerfilecheck, rebuilt when its sources change."""
    home = cache_dir() / "compose-tools"
    binary = home / "dockerfilecheck"
    sources = [TOOLS / "go.mod", TOOLS / "go.sum", *sorted((TOOLS / "dockerfilecheck").glob("*.go"))]
    newest = max(p.stat().st_mtime for p in sources)

    def built() -> Path | None:
        return binary if binary.exists() and binary.stat().st_mtime >= newest else None

    def build() -> Path:
        _go_build(TOOLS, "./dockerfilecheck", binary, _go_env(), mod="readonly")
        return binary

    return made_once(home / "dockerfilecheck.lock", built, build)
