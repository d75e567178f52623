"""Helpers every devstack launcher uses: where downloads go, a cross-process lock for
set-up steps (both shared with the Iceberg jar resolver), loopback ports for servers (from
:mod:`devstack.ports`), wheels installed into the cache, the server process we start
(:class:`ServerProcess`), stopping a process (:func:`terminate_process`,
:func:`kill_process`) and the ``run`` command of a launcher (:func:`launcher_parser`,
:func:`serve_until_stopped`, :func:`wait_for_stop_signal`)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from devstack.ports import free_port, free_ports, port_pair, start_retrying
from rsm_sidecar.local_cache import cache_dir, file_lock

__all__ = [
    "HOST",
    "install_atomically",
    "installed_tool",
    "made_once",
    "REPO_ROOT",
    "BucketServer",
    "ServerProcess",
    "default_cache_dir",
    "file_lock",
    "user_maven_lock",
    "free_port",
    "free_ports",
    "http_answers",
    "kill_process",
    "launcher_parser",
    "pip_install_target",
    "run_checked",
    "port_pair",
    "serve_until_stopped",
    "terminate_process",
    "wait_for_stop_signal",
    "work_dir",
]

HOST = "127.0.0.1"
REPO_ROOT = Path(__file__).resolve().parent.parent
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
T = TypeVar("T")


def default_cache_dir() -> Path:
    """``$RSM_CACHE_DIR`` if set, else ``.cache`` at the repository root."""
    return cache_dir()


def made_once(lock: Path, made: Callable[[], T | None], make: Callable[[], T]) -> T:
    """What ``made()`` finds, else what ``make()`` makes, under the cross-process ``lock`` and
    looked for again once the lock is held (another process may have made it meanwhile): a
    set-up step that several test processes may start at once runs once."""
    found = made()
    if found:
        return found
    lock.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock):
        return made() or make()


def run_checked(argv: Sequence[str], what: str, timeout: float = 1800, **kw: Any) -> str:
    """``argv``'s standard output; RuntimeError naming ``what`` with the exit status and the
    end of its output when it fails."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return proc.stdout


def install_atomically(target: Path, fill: Callable[[Path], object]) -> None:
    """``fill`` a new temporary directory beside ``target``, then rename it to ``target``
    (replacing an older one): an install stopped half way leaves no partial ``target``."""
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        fill(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def installed_tool(
    name: str,
    version: str,
    executable: str,
    install: Callable[[Path], object],
    override_env: str,
    cache_dir: Path | None = None,
) -> Path:
    """The path of ``executable`` (relative to ``<cache>/<name>-<version>``), after
    ``install(that directory)`` once (:func:`made_once`; a stamp file written last marks a
    complete install). ``$<override_env>``, when set, is the path to use instead."""
    override = os.environ.get(override_env, "").strip()
    if override:
        return Path(override)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    target = cache / f"{name}-{version}"
    binary = target / executable
    stamp = target / ".installed"

    def made() -> Path | None:
        return binary if stamp.exists() and binary.exists() else None

    def make() -> Path:
        install(target)
        if not binary.exists():
            raise RuntimeError(f"installing {name} {version} into {target} did not give {executable}")
        binary.chmod(binary.stat().st_mode | 0o111)
        stamp.write_text(version + "\n")
        return binary

    return made_once(cache / f"{name}-{version}.lock", made, make)


def pip_install_target(requirement: str, target: Path, timeout: float = 600) -> None:
    """``pip install --no-deps --target`` into a temp dir, then rename into place."""
    install_atomically(
        target,
        lambda tmp: subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--root-user-action=ignore",  # a --target install touches no system package
                "--no-deps",
                "--target",
                str(tmp),
                requirement,
            ],
            check=True,
            timeout=timeout,
        ),
    )


class ServerProcess:
    """One server process we started: log file, readiness wait, stop/kill, pause/resume.

    Subclasses provide :meth:`command`, :meth:`environment` and :meth:`is_ready`, and name
    the attributes that hold their ports in :attr:`port_names`, set by :meth:`choose_ports`
    (ports given, or leased: :mod:`devstack.ports`). The first start tries again on new ports
    when the server finds one taken, unless a port was given (:func:`~devstack.ports.start_retrying`,
    noted in the log); later starts (:meth:`restart`) keep the ports. The process runs in its
    own session so a Ctrl+C of the test run does not reach it first; it is stopped at
    interpreter exit if the owner forgot.
    """

    name = "server"
    startup_timeout = 30.0
    #: seconds :meth:`stop` waits after SIGTERM before SIGKILL
    stop_timeout = 15.0
    #: the attributes that hold the ports the server listens on (:meth:`choose_ports`)
    port_names: tuple[str, ...] = ()

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_file = self.workdir / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self._ports_given = False
        self._started_once = False
        atexit.register(self._atexit)

    # to override
    def command(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def environment(self) -> Mapping[str, str]:
        return dict(os.environ)

    def is_ready(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    # ports
    def choose_ports(self, **given: int | None) -> None:
        """Set each attribute of :attr:`port_names`: to the port ``given`` for it, else to a
        leased one. With any port given, a start that finds a port taken is not retried."""
        self._ports_given = any(given.values())
        leased = iter(free_ports(sum(1 for name in self.port_names if not given.get(name))))
        for name in self.port_names:
            setattr(self, name, given.get(name) or next(leased))

    def ports(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.port_names}

    # lifecycle
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self):
        if self.is_running():
            return self
        start_retrying(
            self._start_once,
            what=self.name,
            log_file=self.log_file,
            ports=self.ports,
            choose_new_ports=None if self._ports_given or self._started_once else self.choose_ports,
        )
        self._started_once = True
        return self

    def _start_once(self) -> None:
        t0 = time.monotonic()
        log = open(self.log_file, "ab")
        # A stop signal must not interrupt Popen between the child's exec and the assignment:
        # the server would run on with nobody holding its pid. Blocked here, the signal is
        # delivered once ``self.proc`` is set (the child gets the usual mask back before exec).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env=dict(self.environment()),
                start_new_session=True,
                preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, mask),
            )
        finally:
            log.close()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        deadline = t0 + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with status {self.proc.returncode} during start-up; "
                    f"log {self.log_file}:\n{self.log_tail()}"
                )
            if self.is_ready():
                break
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(
                    f"{self.name} did not become ready within {self.startup_timeout:.0f}s; "
                    f"log {self.log_file}:\n{self.log_tail()}"
                )
            time.sleep(0.05)
        self.startup_seconds = time.monotonic() - t0

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` (default :attr:`stop_timeout`); waits for
        the process to be gone."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.resume()  # a stopped process cannot handle SIGTERM
        terminate_process(self.proc, self.stop_timeout if timeout is None else timeout)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            kill_process(self.proc)
        self.proc = None

    def restart(self):
        self.stop()
        return self.start()

    def pause(self, timeout: float = 5.0) -> None:
        """SIGSTOP, and wait until every thread has stopped: the kernel still accepts
        connections, but nothing answers."""
        if not self.is_running():
            return
        os.kill(self.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while self._thread_states() - {"T", "t"}:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name} (pid {self.pid}) did not stop: thread states "
                    f"{sorted(self._thread_states())}"
                )
            time.sleep(0.01)

    def _thread_states(self) -> set[str]:
        states = set()
        try:
            for tid in os.listdir(f"/proc/{self.pid}/task"):
                with contextlib.suppress(OSError, IndexError):
                    with open(f"/proc/{self.pid}/task/{tid}/stat") as f:
                        states.add(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, TypeError):
            pass
        return states

    def state(self) -> str | None:
        """The process state letter from /proc (``T`` while paused), or None when gone."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, TypeError, IndexError):
            return None

    def resume(self) -> None:
        if self.is_running():
            os.kill(self.proc.pid, signal.SIGCONT)

    def rss_bytes(self) -> int | None:
        try:
            with open(f"/proc/{self.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except (OSError, TypeError):
            return None
        return None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _atexit(self) -> None:
        with contextlib.suppress(Exception):
            self.stop(timeout=5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class BucketServer(ServerProcess):
    """An object-storage server (S3, GCS, Azure Blob): an endpoint, a data directory, buckets by
    name; and the command line of its launcher (:meth:`launcher_main`)."""

    kind = "object storage"  #: what the launcher's banner calls it
    data_dir: Path
    #: what the launcher's option that creates one is called: ``--bucket``, ``--container``
    bucket_word = "bucket"
    #: the help of the launcher's ``install`` and ``run``
    install_help = ""
    run_help = ""

    @property
    def endpoint_url(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def banner(self) -> str:
        return f"{self.kind} endpoint {self.endpoint_url} (data {self.data_dir}, log {self.log_file})"

    def create_bucket(self, bucket: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def create_buckets(self, buckets: Iterable[str]) -> None:
        for bucket in buckets:
            self.create_bucket(bucket)

    # the launcher
    @classmethod
    def ensure(cls) -> Path:  # pragma: no cover - abstract
        """Install the pinned server into the cache (once) and return its command's path."""
        raise NotImplementedError

    @classmethod
    def add_run_options(cls, run: argparse.ArgumentParser) -> None:
        """The launcher's ``run`` options of this server besides ``--dir`` and the buckets:
        ``--port`` for a server that listens on one port."""
        if cls.port_names == ("port",):
            run.add_argument("--port", type=int, default=None)

    @classmethod
    def from_args(cls, args: argparse.Namespace, workdir: Path) -> BucketServer:  # pragma: no cover
        """The server ``run`` starts, from its options."""
        raise NotImplementedError

    @classmethod
    def launcher_main(cls, module: str, doc: str | None, argv: Sequence[str] | None = None) -> int:
        """``python -m <module> install`` prints :meth:`ensure`'s path; ``run [--dir DIR]
        [--<bucket_word> NAME]...`` serves until SIGINT or SIGTERM (:func:`serve_until_stopped`),
        the buckets created, and prints :meth:`banner`."""
        ap, run = launcher_parser(module, doc, install_help=cls.install_help, run_help=cls.run_help)
        cls.add_run_options(run)
        run.add_argument(
            f"--{cls.bucket_word}",
            dest="buckets",
            metavar="NAME",
            action="append",
            default=[],
            help=f"{cls.bucket_word} to create (repeatable)",
        )
        args = ap.parse_args(argv)
        if args.cmd == "install":
            print(cls.ensure())
            return 0
        server = cls.from_args(args, work_dir(args.dir, f"{cls.name}-"))
        return serve_until_stopped(server, server.banner, prepare=lambda: server.create_buckets(args.buckets))


def http_answers(url: str, timeout: float = 1.0) -> bool:
    """True when something answers HTTP at ``url`` (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


# -- processes ------------------------------------------------------------------------------
def terminate_process(proc: subprocess.Popen[bytes], timeout: float, kill_wait: float = 10.0) -> int | None:
    """SIGTERM, wait up to ``timeout`` s, then SIGKILL; the exit code (None if it never went)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_process(proc, kill_wait)
    return proc.returncode


def kill_process(proc: subprocess.Popen[bytes], wait: float = 10.0) -> int | None:
    """SIGKILL (no clean shutdown) and wait up to ``wait`` s for the process to be gone."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(wait)
    return proc.returncode


# -- the command line of a launcher -----------------------------------------------------------
def launcher_parser(
    module: str,
    doc: str | None,
    install_help: str,
    run_help: str,
    install_options: Callable[[argparse.ArgumentParser], object] | None = None,
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """``python -m devstack.<module> install|run [--dir DIR]``: the parser and its ``run``
    subparser (for the launcher's own options); ``install_options`` adds options to
    ``install``. ``args.cmd`` is ``install`` or ``run``."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=(doc or "").split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    install = sub.add_parser("install", help=install_help)
    if install_options:
        install_options(install)
    run = sub.add_parser("run", help=run_help)
    run.add_argument("--dir", default=None, help="work/data directory (default: a temp dir)")
    return ap, run


def work_dir(given: str | None, prefix: str) -> Path:
    """The ``--dir`` given, else a new temporary directory named ``prefix...``."""
    return Path(given or tempfile.mkdtemp(prefix=prefix))


def wait_for(
    what: str,
    predicate: Callable[[], Any],
    timeout: float = 180,
    interval: float = 0.5,
    diagnose: Callable[[], str] | None = None,
):
    """``predicate()``'s first true value; AssertionError naming ``what`` (and, when given,
    ``diagnose()``'s account of the state) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}\n{diagnose() if diagnose else ''}"
            )
        time.sleep(interval)


def wait_for_stop_signal(
    alive: Callable[[], bool] | None = None, poll: float = 0.5, ready: Callable[[], None] | None = None
) -> None:
    """Block until SIGINT or SIGTERM arrives (both: a background job may ignore SIGINT), or
    until ``alive()`` turns false. Python handlers, not a signal mask: a thread a client library
    started cannot take the signal and die of it. ``ready`` runs once the handlers are in place
    (say, printing that the server is up: a signal sent as soon as that is read is then caught)."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
    try:
        if ready is not None:
            ready()
        while not stop.wait(None if alive is None else poll):
            if alive is not None and not alive():
                return
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_until_stopped(
    server: ServerProcess, banner: Callable[[], str], prepare: Callable[[], None] | None = None
) -> int:
    """Start ``server``, run ``prepare`` (e.g. create buckets), print ``banner()``, and stop the
    server when SIGINT or SIGTERM arrives. The exit status of a launcher's ``run``.

    A SIGTERM that comes while the server still starts stops it as Ctrl+C does (the server
    stops at interpreter exit then) instead of killing this process and orphaning the server."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with server:
            if prepare is not None:
                prepare()
            wait_for_stop_signal(ready=lambda: print(banner(), flush=True))
    except KeyboardInterrupt:
        return 130
    return 0


def user_maven_lock() -> Path:
    """The lock every Maven run on the user's local repository (``~/.m2``) holds: Maven 3.8's
    local repository is not safe for two Maven processes at once, and ``make test`` builds its
    dependencies several at a time. The Makefile's ``ONE_MAVEN`` takes the same file."""
    return default_cache_dir() / ".maven.lock"
