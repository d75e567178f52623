"""A container engine for docker-compose.yml on a machine without Docker: podman, prepared here.

What the compose test (tests/compose/test_compose_cluster.py) and ``make compose-demo`` need,
each step idempotent and cheap when already done:

1. :func:`ensure_podman`: podman with runc, netavark and aardvark-dns from Debian's apt (as
   root; otherwise the error names the command to run).
2. :func:`containers_conf`: podman's settings for these machines in ``<cache>/containers/``,
   passed to podman as ``CONTAINERS_CONF`` (the system's own file is not touched): runc
   (crun refuses hybrid cgroups), cgroupfs, a file event log, and container ulimits no higher
   than the hard limits root has here (podman's defaults ask for more and fail).
3. :func:`ensure_base_image`: ``debian:bookworm-slim`` without a registry, when none can be
   pulled: ``debootstrap --variant=minbase bookworm`` from the host's Debian mirror, trimmed
   as the official slim image is (dpkg excludes for docs, man pages and locales, apt's
   clean-up hook), imported and tagged as ``docker.io/library/debian:bookworm-slim``.
4. :func:`build_ca_certificates`: the host's extra CA certificates
   (``/usr/local/share/ca-certificates/*.crt``, e.g. an intercepting proxy's) copied into
   ``docker/build-ca/`` for the images' build stages only.
5. :class:`PodmanService`: ``podman system service`` on a socket in the cache; its
   :meth:`~PodmanService.environment` gives ``DOCKER_HOST`` for the compose CLI. podman
   schedules health checks with systemd timers, and these machines have no systemd: the
   service therefore runs :class:`HealthChecks`, which runs ``podman healthcheck run`` for
   every running container with a health check at that check's interval (what the timers
   would do), so that ``depends_on: condition: service_healthy`` works.

    python -m devstack.containers prepare     # steps 1-4, prints what it did
    python -m devstack.containers serve       # step 5 in the foreground until Ctrl+C

The demo cluster on it (``make compose-demo``, ``make compose-down``) is
:mod:`devstack.compose_demo`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from devstack.common import default_cache_dir, file_lock, terminate_process

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "docker.io/library/debian:bookworm-slim"
DEBIAN_SUITE = "bookworm"
APT_PACKAGES = (
    "podman",
    "runc",
    "netavark",
    "aardvark-dns",
    "containernetworking-plugins",
    "slirp4netns",
    "uidmap",
    "debootstrap",
)
#: What the official slim image adds to a minbase system (its /etc/dpkg/dpkg.cfg.d/docker and
#: /etc/apt/apt.conf.d/docker-clean), so images built on the stand-in are as small.
_SLIM_DPKG_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
"""
_APT_CLEAN = (
    "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"
)
_SLIM_APT_CLEAN = f"""\
DPkg::Post-Invoke {{ "{_APT_CLEAN}"; }};
APT::Update::Post-Invoke {{ "{_APT_CLEAN}"; }};
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
"""
_DEBIAN_SOURCES = """\
Types: deb
URIs: {mirror}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {security}
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


class EngineUnavailable(RuntimeError):
    """The container engine cannot be prepared here; the message says what to do."""


def _run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None, **kw) -> str:
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, env=dict(env) if env else None, **kw
        )
    except subprocess.TimeoutExpired as e:
        raise EngineUnavailable(f"{' '.join(argv)} timed out after {timeout:.0f}s") from e
    if proc.returncode != 0:
        raise EngineUnavailable(
            f"{' '.join(argv)} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return proc.stdout


# -- 1. podman -------------------------------------------------------------------------------------
def ensure_podman() -> str:
    """The podman executable, installed from apt if missing (root only)."""
    found = shutil.which("podman")
    if found and shutil.which("runc"):
        return found
    command = ["apt-get", "install", "-y", "--no-install-recommends", *APT_PACKAGES]
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise EngineUnavailable(f"podman is not installed; as root run: {' '.join(command)}")
    with file_lock(default_cache_dir() / "apt.lock"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        try:
            _run(command, 900, env)
        except EngineUnavailable:  # a stale package index: refresh once
            _run(["apt-get", "update"], 600, env)
            _run(command, 900, env)
    found = shutil.which("podman")
    if not found:
        raise EngineUnavailable(f"{' '.join(command)} finished but podman is not on PATH")
    return found


# -- 2. settings -----------------------------------------------------------------------------------
def containers_conf(cache: Path | None = None) -> Path:
    """podman's settings for this machine, written into the cache (CONTAINERS_CONF)."""
    home = Path(cache or default_cache_dir()) / "containers"
    home.mkdir(parents=True, exist_ok=True)
    nofile = _hard_limit(resource.RLIMIT_NOFILE, 1 << 20)
    nproc = _hard_limit(resource.RLIMIT_NPROC, 32768)
    text = (
        "# written by devstack/containers.py\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )
    path = home / "containers.conf"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _hard_limit(which: int, ceiling: int) -> int:
    hard = resource.getrlimit(which)[1]
    return ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)


def podman_env(cache: Path | None = None) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(containers_conf(cache))}


# -- 3. the base image -----------------------------------------------------------------------------
def image_exists(name: str, env: Mapping[str, str] | None = None) -> bool:
    proc = subprocess.run(["podman", "image", "exists", name], env=dict(env or podman_env()), timeout=60)
    return proc.returncode == 0


def debian_mirrors() -> tuple[str, str]:
    """The host's Debian mirror and security mirror (its apt sources), with Debian's defaults."""
    mirror, security = "http://deb.debian.org/debian", "http://deb.debian.org/debian-security"
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            texts.append(path.read_text())
        except OSError:
            continue
    for uri in re.findall(r"(?:URIs:|deb)\s+(https?://\S+)", "\n".join(texts)):
        if uri.rstrip("/").endswith("debian-security"):
            security = uri.rstrip("/")
        elif uri.rstrip("/").endswith("/debian"):
            mirror = uri.rstrip("/")
    return mirror, security


def ensure_base_image(cache: Path | None = None, name: str = BASE_IMAGE) -> str:
    """``name`` in podman's storage, made with debootstrap when it is not there yet."""
    env = podman_env(cache)
    if image_exists(name, env):
        return name
    cache = Path(cache or default_cache_dir())
    if not shutil.which("debootstrap"):
        raise EngineUnavailable("debootstrap is missing; as root run: apt-get install -y debootstrap")
    with file_lock(cache / "debian-base.lock"):
        if image_exists(name, env):
            return name
        mirror, security = debian_mirrors()
        with tempfile.TemporaryDirectory(prefix="debootstrap-", dir=cache) as tmp:
            root = Path(tmp) / "rootfs"
            _run(["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(root), mirror], 900)
            (root / "etc/dpkg/dpkg.cfg.d/docker").write_text(_SLIM_DPKG_EXCLUDES)
            (root / "etc/apt/apt.conf.d/docker-clean").write_text(_SLIM_APT_CLEAN)
            (root / "etc/apt/sources.list").unlink(missing_ok=True)
            (root / "etc/apt/sources.list.d/debian.sources").write_text(
                _DEBIAN_SOURCES.format(mirror=mirror, security=security)
            )
            for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for path in (root / leftover).glob("*"):
                    if path.is_file():
                        path.unlink()
            for docs in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"):
                shutil.rmtree(root / docs, ignore_errors=True)
            tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            try:
                _run(["podman", "import", "-", name], 600, env, stdin=tar.stdout)
            finally:
                assert tar.stdout is not None
                tar.stdout.close()
                tar.wait(timeout=60)
    return name


# -- 4. extra CA certificates for the build stages ---------------------------------------------
def build_ca_certificates(source: Path = Path("/usr/local/share/ca-certificates")) -> list[Path]:
    """Copy ``source/*.crt`` into docker/build-ca/ (git-ignored); returns what is there now."""
    target = REPO / "docker" / "build-ca"
    target.mkdir(exist_ok=True)
    wanted = {p.name: p.read_bytes() for p in sorted(source.glob("*.crt"))} if source.is_dir() else {}
    for old in target.glob("*.crt"):
        if old.name not in wanted:
            old.unlink()
    for name, data in wanted.items():
        path = target / name
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
    return sorted(target.glob("*.crt"))


def prepare(cache: Path | None = None) -> dict[str, object]:
    """Steps 1-4; returns what each gave."""
    t0 = time.monotonic()
    podman = ensure_podman()
    conf = containers_conf(cache)
    base = ensure_base_image(cache)
    certs = build_ca_certificates()
    return {
        "podman": podman,
        "containers_conf": str(conf),
        "base_image": base,
        "build_ca": [p.name for p in certs],
        "seconds": round(time.monotonic() - t0, 1),
    }


# -- 5. the API service ----------------------------------------------------------------------------
class HealthChecks:
    """Runs each running container's health check at its interval (podman's systemd timers)."""

    def __init__(self, env: Mapping[str, str], poll: float = 1.0):
        self.env = dict(env)
        self.poll = poll
        self._stop = threading.Event()
        self._next: dict[str, float] = {}  # container id -> when its next check is due
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="podman-healthchecks", daemon=True)

    def start(self) -> HealthChecks:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _podman(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self._tick()
            except (subprocess.SubprocessError, OSError, ValueError):
                continue  # the engine is busy or stopping: try again at the next tick

    def _tick(self) -> None:
        out = self._podman(
            "ps",
            "--filter",
            "health=starting",
            "--filter",
            "health=healthy",
            "--filter",
            "health=unhealthy",
            "--format",
            "{{.ID}}",
        ).stdout
        now = time.monotonic()
        running = set(out.split())
        for cid in running:
            with self._lock:
                if cid in self._busy or self._next.get(cid, 0.0) > now:
                    continue
                self._busy.add(cid)
            threading.Thread(target=self._check, args=(cid,), daemon=True).start()
        with self._lock:
            for gone in set(self._next) - running:
                del self._next[gone]

    def _check(self, cid: str) -> None:
        try:
            spec = self._podman("inspect", cid, "--format", "{{json .Config.Healthcheck}}").stdout
            interval = (json.loads(spec) or {}).get("Interval") or 30_000_000_000
            self._podman("healthcheck", "run", cid, timeout=120)
        except (subprocess.SubprocessError, OSError, ValueError):
            interval = 5_000_000_000
        with self._lock:
            self._busy.discard(cid)
            self._next[cid] = time.monotonic() + interval / 1e9


class PodmanService:
    """``podman system service`` on ``<cache>/podman/podman.sock``: the Docker API for compose."""

    def __init__(self, cache: Path | None = None):
        self.cache = Path(cache or default_cache_dir())
        self.socket = self.cache / "podman" / "podman.sock"
        self.log = self.cache / "podman" / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.health_checks: HealthChecks | None = None

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def environment(self) -> dict[str, str]:
        """The environment for the compose CLI: its engine is this service."""
        return {**podman_env(self.cache), "DOCKER_HOST": self.docker_host}

    def start(self, timeout: float = 60.0) -> PodmanService:
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["podman", "system", "service", "--time=0", self.docker_host],
                env=podman_env(self.cache),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineUnavailable(
                    f"podman system service exited {self.proc.returncode}; see {self.log}"
                )
            if self.socket.exists() and self.answers():
                self.health_checks = HealthChecks(podman_env(self.cache)).start()
                return self
            time.sleep(0.2)
        self.stop()
        raise EngineUnavailable(f"podman system service did not answer on {self.socket}; see {self.log}")

    def answers(self) -> bool:
        proc = subprocess.run(
            ["curl", "-fsS", "--unix-socket", str(self.socket), "http://d/_ping"],
            capture_output=True,
            timeout=10,
        )
        return proc.returncode == 0

    def stop(self) -> None:
        checks, self.health_checks = self.health_checks, None
        if checks is not None:
            checks.stop()
        proc, self.proc = self.proc, None
        if proc is not None:
            terminate_process(proc, timeout=20)

    def __enter__(self) -> PodmanService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ComposeError(RuntimeError):
    """A docker compose command failed; the message has its output."""


class ComposeProject:
    """The compose CLI for ``files`` (docker-compose.yml) as project ``name``, on a podman
    service; ``env`` adds variables the compose files interpolate."""

    def __init__(
        self,
        service: PodmanService,
        name: str,
        files: Sequence[Path] = (REPO / "docker-compose.yml",),
        env: Mapping[str, str] | None = None,
    ):
        from devstack.compose_tools import compose_command

        cli = compose_command()
        flags = [arg for f in files for arg in ("-f", str(f))]
        self.name = name
        self.argv = [*cli, *flags, "-p", name]
        self.env = {**service.environment(), **(env or {})}
        #: the same command for a person in the repository root
        shown = " ".join(
            f"-f {Path(f).relative_to(REPO) if Path(f).is_relative_to(REPO) else f}" for f in files
        )
        self.hint = f"DOCKER_HOST={service.docker_host} {' '.join(cli)} {shown} -p {name}"

    def run(
        self, *args: str, timeout: float = 1800, check: bool = True, capture: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*self.argv, *args], cwd=REPO, env=self.env, capture_output=capture, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise ComposeError(
                f"docker compose {' '.join(args)} failed ({proc.returncode}):\n{(proc.stderr or '')[-4000:]}"
            )
        return proc

    def containers(self) -> dict[str, dict]:
        """Service -> its container as `ps -a --format json` describes it (State, Health, ExitCode...)."""
        out = self.run("ps", "-a", "--format", "json").stdout.strip()
        if out.startswith("["):
            rows = json.loads(out)
        else:  # one JSON object per line
            rows = [json.loads(line) for line in out.splitlines() if line]
        return {row["Service"]: row for row in rows}

    def logs(self, service: str) -> str:
        return self.run("logs", "--no-color", service, check=False).stdout

    def leftovers(self) -> tuple[list[str], list[str]]:
        """The project's containers and volumes that podman still has (after ``down -v``: none)."""
        label = f"label=com.docker.compose.project={self.name}"

        def ids(*what: str) -> list[str]:
            argv = ["podman", *what, "-q", "--filter", label]
            return subprocess.run(argv, env=self.env, capture_output=True, text=True).stdout.split()

        return ids("ps", "-a"), ids("volume", "ls")


def serve(cache: Path | None = None) -> int:
    from devstack.common import wait_for_stop_signal

    with PodmanService(cache) as service:
        wait_for_stop_signal(
            alive=lambda: service.proc is not None and service.proc.poll() is None,
            ready=lambda: print(
                f"podman service on {service.docker_host} (health checks run here)", flush=True
            ),
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devstack.containers", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="install and configure podman, make the base image (idempotent)")
    sub.add_parser("serve", help="the podman API service and its health checks, until Ctrl+C")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "prepare":
            for key, value in prepare().items():
                print(f"{key}: {value}")
            return 0
        return serve()
    except EngineUnavailable as e:
        print(f"devstack.containers: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
