"""A real Apache Kafka broker for development and tests, built from Maven Central jars.

Two pieces:

* :class:`KafkaDistribution` gathers ``org.apache.kafka:kafka_2.13:<version>``, its runtime
  dependencies and the logging binding the release tarball would add (log4j2's SLF4J 1.x
  binding on 4.x, reload4j on 3.x) into ``<cache_dir>/kafka-<version>/lib`` by running Maven on
  ``devstack/kafka-jars.pom.xml``. Maven's local repository is ``<cache_dir>/m2`` so nothing is
  written outside the cache directory. A stamp file makes :meth:`KafkaDistribution.ensure`
  idempotent; a lock file makes it safe to call from concurrent processes.
* :class:`KafkaBroker` runs one combined broker+controller KRaft node on 127.0.0.1: it writes
  ``server.properties``, formats the storage with ``kafka.tools.StorageTool`` (a separate JVM,
  since it ends with ``System.exit``), starts ``kafka.Kafka`` with logs in ``<workdir>/logs`` and
  waits until the broker answers a metadata request.

Environment: ``KAFKA_VERSION`` selects the version (default :data:`DEFAULT_KAFKA_VERSION`),
``RSM_CACHE_DIR`` the cache directory (default ``<repo>/.cache``), ``JAVA_HOME`` the JVM and
``MVN`` the Maven executable.

Command line (from the repository root)::

    .venv/bin/python -m devstack.kafka jars            # download, print the lib dir
    .venv/bin/python -m devstack.kafka broker          # a broker on 127.0.0.1:9092 until Ctrl-C

Example::

    dist = KafkaDistribution.ensure()
    with KafkaBroker(dist, tmp_path / "kafka") as broker:
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers})
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from devstack.common import (
    default_cache_dir,
    file_lock,
    free_ports,
    kill_process,
    terminate_process,
    wait_for_stop_signal,
)
from devstack.ports import START_ATTEMPTS, start_retrying

if TYPE_CHECKING:
    from confluent_kafka.admin import NewTopic

#: The newest Kafka release whose whole dependency set resolves from Maven Central (4.4.0's
#: ``kafka-tools-api`` was missing until late November 2026). 3.9.2 is tested too.
DEFAULT_KAFKA_VERSION = "4.4.0"

POM_PATH = Path(__file__).resolve().parent / "kafka-jars.pom.xml"
_STAMP_NAME = ".devstack-complete.json"
_LOG4J2_BINDING = "log4j-slf4j-impl"
#: what ``kafka.Kafka`` logs once its servers are up (3.x and 4.x)
_STARTED_MESSAGE = "Kafka Server started"


class DevstackError(RuntimeError):
    """Gathering the jars or running the broker failed; the message says what and where."""


class _ControllerMoved(DevstackError):
    """A broker-only node waited for a controller that started again on other ports (its first
    ports were taken): the broker starts again with the new ``controller.quorum.voters``."""


#: for a JVM that runs seconds (a tool, the storage formatter): the JIT's first tier and the
#: serial collector. kafka-dump-log.sh --deep-iteration over the test fixtures' segments took
#: 1.1-1.4 CPU-s instead of 1.8-2.4 (five runs each).
QUICK_START_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def default_kafka_version() -> str:
    """``$KAFKA_VERSION`` if set, else :data:`DEFAULT_KAFKA_VERSION`."""
    return os.environ.get("KAFKA_VERSION", "").strip() or DEFAULT_KAFKA_VERSION


def parse_version(version: str) -> tuple[int, ...]:
    """``"3.9.2"`` -> ``(3, 9, 2)``; raises :class:`ValueError` for anything else."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise ValueError(f"not a Kafka release version: {version!r} (expected e.g. 4.3.1)")
    return tuple(int(p) for p in version.split("."))


# --------------------------------------------------------------------------------------------
# The distribution
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaDistribution:
    """A directory of jars that can run a Kafka broker: ``<home>/lib/*.jar``."""

    version: str
    home: Path

    @property
    def lib_dir(self) -> Path:
        return self.home / "lib"

    @property
    def classpath(self) -> str:
        return str(self.lib_dir / "*")

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return parse_version(self.version)

    @property
    def uses_log4j2(self) -> bool:
        """4.x logs through log4j2 (KIP-653); 3.x through reload4j."""
        return self.version_tuple >= (4, 0, 0)

    @classmethod
    def ensure(
        cls,
        version: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        *,
        mvn: str | None = None,
        timeout: float = 900.0,
    ) -> KafkaDistribution:
        """Return the distribution for ``version``, downloading it first if needed.

        Idempotent: a stamp file written last marks a complete ``lib`` directory (and records
        the POM's hash, so editing the POM re-gathers the jars). Raises :class:`DevstackError`
        with Maven's output if Maven fails.
        """
        version = version or default_kafka_version()
        parse_version(version)
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        home = cache / f"kafka-{version}"
        dist = cls(version=version, home=home)
        pom_hash = hashlib.sha256(POM_PATH.read_bytes()).hexdigest()
        cache.mkdir(parents=True, exist_ok=True)
        with file_lock(cache / f"kafka-{version}.lock"):
            if dist._stamp_matches(pom_hash):
                return dist
            dist._download(cache, pom_hash, mvn or os.environ.get("MVN") or "mvn", timeout)
        return dist

    def _stamp_matches(self, pom_hash: str) -> bool:
        stamp = self.home / _STAMP_NAME
        try:
            data = json.loads(stamp.read_text())
        except (OSError, ValueError):
            return False
        if data.get("pom_sha256") != pom_hash or data.get("version") != self.version:
            return False
        return all((self.lib_dir / jar).is_file() for jar in data.get("jars", []))

    def _download(self, cache: Path, pom_hash: str, mvn: str, timeout: float) -> None:
        if shutil.which(mvn) is None:
            raise DevstackError(f"Maven executable {mvn!r} not found on PATH (set $MVN)")
        staging = self.home / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        base = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(POM_PATH),
            f"-Dmaven.repo.local={cache / 'm2'}",
            f"-Dkafka.version={self.version}",
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ]
        if self.uses_log4j2:
            _run_maven(base, self.version, timeout)
            # Pick the binding matching the log4j-core that kafka-server brought in.
            log4j_version = _jar_version(staging, "log4j-core")
            if log4j_version is None:
                raise DevstackError(
                    f"Kafka {self.version}: no log4j-core jar among its runtime dependencies "
                    f"in {staging}; cannot choose the log4j2 SLF4J binding"
                )
            _run_maven(
                base
                + [
                    "-Plog4j2",
                    f"-Dlog4j2.version={log4j_version}",
                    f"-DincludeArtifactIds={_LOG4J2_BINDING}",
                ],
                self.version,
                timeout,
            )
        else:
            _run_maven(base + ["-Preload4j"], self.version, timeout)
        jars = sorted(p.name for p in staging.glob("*.jar"))
        if f"kafka_2.13-{self.version}.jar" not in jars:
            raise DevstackError(f"Maven finished but {staging} lacks kafka_2.13-{self.version}.jar")
        shutil.rmtree(self.lib_dir, ignore_errors=True)
        staging.rename(self.lib_dir)
        stamp = {"version": self.version, "pom_sha256": pom_hash, "jars": jars}
        tmp = self.home / (_STAMP_NAME + ".tmp")
        tmp.write_text(json.dumps(stamp, indent=1))
        tmp.rename(self.home / _STAMP_NAME)

    def java_command(
        self,
        main_class: str,
        args: Iterable[str] = (),
        jvm_options: Iterable[str] = (),
        extra_classpath: Iterable[Path] = (),
    ) -> list[str]:
        """The argv that runs ``main_class`` on this distribution's class path (plus
        ``extra_classpath``)."""
        cp = os.pathsep.join([self.classpath, *map(str, extra_classpath)])
        return [_java_executable(), *jvm_options, "-cp", cp, main_class, *args]

    def log_config_options(self, config_file: Path) -> list[str]:
        """JVM options pointing the logging framework of this version at ``config_file``."""
        if self.uses_log4j2:
            return [f"-Dlog4j2.configurationFile={config_file}"]
        return [f"-Dlog4j.configuration={config_file.as_uri()}"]

    def write_log_config(self, path: Path, log_file: Path, level: str = "INFO") -> Path:
        """Write a logging config (log4j2 or log4j 1 syntax) sending everything to ``log_file``."""
        if self.uses_log4j2:
            text = (
                "status = warn\n"
                "appender.file.type = File\n"
                "appender.file.name = FILE\n"
                f"appender.file.fileName = {log_file}\n"
                "appender.file.layout.type = PatternLayout\n"
                "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
                f"rootLogger.level = {level}\n"
                "rootLogger.appenderRef.file.ref = FILE\n"
                # The state-change and request loggers are chatty at INFO/DEBUG.
                "logger.kafkaRequest.name = kafka.request.logger\n"
                "logger.kafkaRequest.level = WARN\n"
            )
        else:
            text = (
                f"log4j.rootLogger={level}, file\n"
                "log4j.appender.file=org.apache.log4j.FileAppender\n"
                f"log4j.appender.file.File={log_file}\n"
                "log4j.appender.file.layout=org.apache.log4j.PatternLayout\n"
                "log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
                "log4j.logger.kafka.request.logger=WARN\n"
            )
        path.write_text(text)
        return path


def _run_maven(argv: list[str], version: str, timeout: float) -> None:
    """Maven with ``<cache>/m2`` as its local repository, one process at a time (``make test``
    gathers two Kafka versions at once; Maven 3.8's repository is not safe for that)."""
    try:
        with file_lock(default_cache_dir() / "m2.lock"):
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise DevstackError(
            f"Maven did not finish within {timeout:.0f}s gathering Kafka {version}: {' '.join(argv)}"
        ) from exc
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()
        errors = [line for line in output.splitlines() if "[ERROR]" in line] or output.splitlines()
        raise DevstackError(
            f"Maven failed (exit {proc.returncode}) gathering Kafka {version} from Maven Central:\n"
            + "\n".join(errors[:15])
            + f"\ncommand: {' '.join(argv)}"
        )


def _jar_version(lib: Path, artifact: str) -> str | None:
    for jar in lib.glob(f"{artifact}-*.jar"):
        m = re.fullmatch(re.escape(artifact) + r"-(\d[\w.\-]*)\.jar", jar.name)
        if m:
            return m.group(1)
    return None


def _java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise DevstackError("no java executable: set JAVA_HOME or put java on PATH")
    return java


# --------------------------------------------------------------------------------------------
# The broker
# --------------------------------------------------------------------------------------------


def random_cluster_id() -> str:
    """A Kafka ``Uuid`` string (22 chars of URL-safe base64), as ``StorageTool random-uuid``."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def format_properties(props: Mapping[str, object]) -> str:
    """Render a Java properties file (one ``key=value`` per line, values escaped)."""
    lines = []
    for key, value in props.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        text = str(value)
        if "\n" in text or "\r" in text or "\n" in key:
            raise ValueError(f"property {key!r} has a line break in its value")
        if re.search(r"[\s=:#!\\]", key):
            raise ValueError(f"property key {key!r} needs escaping; not supported")
        lines.append(f"{key}={text.replace(chr(92), chr(92) * 2)}")
    return "\n".join(lines) + "\n"


#: ``role`` of a :class:`KafkaBroker` -> its ``process.roles``
ROLES = {"combined": "broker,controller", "broker": "broker", "controller": "controller"}


class KafkaBroker:
    """One KRaft node on 127.0.0.1: by default a combined broker+controller (a cluster of its
    own); ``role="controller"`` or ``role="broker"`` (with ``quorum_voters``, the controllers'
    ``controller.quorum.voters``, or a function that returns them: a broker started while its
    controller moves to other ports starts again with the new ones) for a node of a larger
    cluster (devstack/cluster.py).

    ``workdir`` receives ``server.properties``, the log4j config, ``data/`` (the log dir) and
    ``logs/`` (``server.log``, ``stdout.log``, ``storage-tool.log``). Ports are those of
    :mod:`devstack.ports` unless given (``ports={"broker": 9092, "controller": 9093}``); the
    first start tries again on new ones if the JVM finds one taken (noted in ``server.log``),
    unless a port was given. ``extra_properties`` are merged last into ``server.properties``
    (a value of ``None`` removes a default), so a tiered-storage broker is just::

        KafkaBroker(dist, wd, extra_properties={"remote.log.storage.system.enable": True, ...})

    ``jvm_options`` are appended after the heap options; ``env`` is added to the broker's
    environment (e.g. ``KAFKA_OPTS`` is not read here: pass JVM options directly);
    ``extra_classpath`` is added to the broker's class path (a plugin jar put beside Kafka's own,
    as in ``libs/``). Use it as a context manager or call :meth:`start` and :meth:`stop`.

    A broker counts as started once it is registered and unfenced (its own metadata lists it);
    a controller once its server has started.
    """

    def __init__(
        self,
        dist: KafkaDistribution,
        workdir: str | os.PathLike,
        *,
        extra_properties: Mapping[str, object] | None = None,
        ports: Mapping[str, int] | None = None,
        jvm_options: Iterable[str] = (),
        heap_options: Iterable[str] = ("-Xmx1G", "-Xms1G"),
        env: Mapping[str, str] | None = None,
        node_id: int = 1,
        cluster_id: str | None = None,
        startup_timeout: float = 120.0,
        log_level: str = "INFO",
        extra_classpath: Iterable[Path] = (),
        role: str = "combined",
        quorum_voters: str | Callable[[], str] | None = None,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; use one of {', '.join(ROLES)}")
        if (role == "broker") != (quorum_voters is not None):
            raise ValueError("quorum_voters (the controllers' node@host:port list) goes with role='broker'")
        self.role = role
        self.quorum_voters = quorum_voters
        self.dist = dist
        self.extra_classpath = [Path(p) for p in extra_classpath]
        self.workdir = Path(workdir).resolve()
        self.extra_properties = dict(extra_properties or {})
        self._given_ports = dict(ports or {})
        unknown = set(self._given_ports) - {"broker", "controller"}
        if unknown:
            raise ValueError(f"unknown port names {sorted(unknown)}; use 'broker', 'controller'")
        self.jvm_options = list(jvm_options)
        self.heap_options = list(heap_options)
        self.env = dict(env or {})
        self.node_id = node_id
        self.cluster_id = cluster_id or random_cluster_id()
        self.startup_timeout = startup_timeout
        self.log_level = log_level
        self._pick_ports()
        self._started_once = False
        self._voters_started = ""
        self._proc: subprocess.Popen | None = None
        self._stdout = None
        self._finalizer: weakref.finalize | None = None

    # -- paths and properties ----------------------------------------------------------------

    def _pick_ports(self) -> None:
        """The given ports, leased ones for the rest; None for a listener the role has not."""
        given = self._given_ports
        names = ["broker", "controller"] if self.role == "combined" else [self.role]  # its listeners
        leased = iter(free_ports(sum(1 for n in names if not given.get(n))))
        self.broker_port = None if self.role == "controller" else given.get("broker") or next(leased)
        self.controller_port = None if self.role == "broker" else given.get("controller") or next(leased)

    def _ports(self) -> dict[str, int | None]:
        return {"broker": self.broker_port, "controller": self.controller_port}

    def _voters(self) -> str:
        """The controllers' ``controller.quorum.voters`` a broker-only node is given, as of now."""
        return self.quorum_voters() if callable(self.quorum_voters) else str(self.quorum_voters)

    @property
    def bootstrap_servers(self) -> str:
        if self.broker_port is None:
            raise DevstackError(f"node {self.node_id} is a controller: it has no broker listener")
        return f"127.0.0.1:{self.broker_port}"

    @property
    def controller_voter(self) -> str:
        """This node in ``controller.quorum.voters`` syntax (``id@host:port``)."""
        if self.controller_port is None:
            raise DevstackError(f"node {self.node_id} is a broker: it has no controller listener")
        return f"{self.node_id}@127.0.0.1:{self.controller_port}"

    @property
    def log_dirs(self) -> list[Path]:
        """The broker's log directories (where ``<topic>-<partition>/`` folders appear)."""
        value = self.properties().get("log.dirs") or self.properties().get("log.dir")
        return [Path(p) for p in str(value).split(",")]

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def server_log(self) -> Path:
        return self.logs_dir / "server.log"

    @property
    def properties_file(self) -> Path:
        return self.workdir / "server.properties"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def partition_dir(self, topic: str, partition: int = 0) -> Path:
        """``<log.dir>/<topic>-<partition>`` in the first log dir that has it."""
        for d in self.log_dirs:
            candidate = d / f"{topic}-{partition}"
            if candidate.is_dir():
                return candidate
        return self.log_dirs[0] / f"{topic}-{partition}"

    def properties(self) -> dict[str, object]:
        """The ``server.properties`` content: defaults overridden by ``extra_properties``."""
        b, c = self.broker_port, self.controller_port
        listeners = {"broker": f"PLAINTEXT://127.0.0.1:{b}", "controller": f"CONTROLLER://127.0.0.1:{c}"}
        if self.role == "combined":
            voters = self.controller_voter
            listeners_value = f"{listeners['broker']},{listeners['controller']}"
        elif self.role == "broker":
            voters = self._voters()
            listeners_value = listeners["broker"]
        else:
            voters = self.controller_voter
            listeners_value = listeners["controller"]
        props: dict[str, object] = {
            "process.roles": ROLES[self.role],
            "node.id": self.node_id,
            "controller.quorum.voters": voters,
            "listeners": listeners_value,
            "advertised.listeners": listeners["broker"],
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            "num.partitions": 1,
            "default.replication.factor": 1,
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 1,
            "group.initial.rebalance.delay.ms": 0,
        }
        if self.role == "controller":
            for key in ("advertised.listeners", "inter.broker.listener.name"):
                del props[key]
        if self.dist.uses_log4j2:
            props["share.coordinator.state.topic.replication.factor"] = 1
            props["share.coordinator.state.topic.min.isr"] = 1
        for key, value in self.extra_properties.items():
            if value is None:
                props.pop(key, None)
            else:
                props[key] = value
        return props

    # -- lifecycle ---------------------------------------------------------------------------

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _java_tmp(self) -> Path:
        path = self.workdir / "tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def start(self) -> KafkaBroker:
        """Write the config, format the storage if new, start the JVM and wait until ready.

        On the first start with ports not given, a port found taken ("Address already in use")
        is retried on new ports (:func:`~devstack.ports.start_retrying`). Later starts
        (``restart``) keep the ports, so ``bootstrap_servers`` stays valid.
        """
        if self.is_running():
            raise DevstackError(f"broker in {self.workdir} is already running (pid {self.pid})")
        for _ in range(START_ATTEMPTS):
            try:
                start_retrying(
                    self._start_once,
                    what=f"Kafka node {self.node_id} ({self.role})",
                    log_file=self.server_log,
                    ports=self._ports,
                    choose_new_ports=None if (self._given_ports or self._started_once) else self._pick_ports,
                )
            except _ControllerMoved as moved:
                with open(self.server_log, "a") as f:
                    f.write(f"devstack: {moved}; starting again\n")
                continue
            self._started_once = True
            return self
        raise DevstackError(f"Kafka node {self.node_id}: its controller moved {START_ATTEMPTS} times")

    def _start_once(self) -> None:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        props = self.properties()
        self._voters_started = str(props["controller.quorum.voters"])
        self.properties_file.write_text(format_properties(props))
        self._format_storage()
        log_config = self.dist.write_log_config(
            self.workdir / ("log4j2.properties" if self.dist.uses_log4j2 else "log4j.properties"),
            self.server_log,
            self.log_level,
        )
        argv = self.dist.java_command(
            "kafka.Kafka",
            [str(self.properties_file)],
            [
                *self.heap_options,
                "-XX:+UseG1GC",
                "-Djava.awt.headless=true",
                f"-Dkafka.logs.dir={self.logs_dir}",
                # native libraries the broker extracts (lz4, snappy, zstd), which a broker killed
                # with -9 would leave in /tmp
                f"-Djava.io.tmpdir={self._java_tmp()}",
                *self.dist.log_config_options(log_config),
                *self.jvm_options,
            ],
            self.extra_classpath,
        )
        self._stdout = open(self.logs_dir / "stdout.log", "ab")
        log_offset = self.server_log.stat().st_size if self.server_log.exists() else 0
        self._proc = subprocess.Popen(
            argv,
            cwd=self.workdir,
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
        # Never leave a JVM behind if the caller forgets stop() or the interpreter exits.
        self._finalizer = weakref.finalize(self, _kill_quietly, self._proc)
        try:
            self._wait_ready(log_offset)
        except BaseException:
            self.kill()
            raise

    def _format_storage(self) -> None:
        meta = [Path(d) / "meta.properties" for d in self.log_dirs]
        if all(p.exists() for p in meta):
            return
        if self.role == "broker":
            self._write_meta_properties(meta)
            return
        log_config = self.dist.write_log_config(
            self.workdir / ("log4j2-tool.properties" if self.dist.uses_log4j2 else "log4j-tool.properties"),
            self.logs_dir / "storage-tool.log",
        )
        argv = self.dist.java_command(
            "kafka.tools.StorageTool",
            ["format", "-t", self.cluster_id, "-c", str(self.properties_file)],
            ["-Xmx256M", *QUICK_START_JVM_OPTIONS, *self.dist.log_config_options(log_config)],
        )
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=120, env={**os.environ, **self.env}
            )
        except subprocess.TimeoutExpired as exc:
            raise DevstackError(f"kafka.tools.StorageTool format timed out in {self.workdir}") from exc
        if proc.returncode != 0:
            raise DevstackError(
                f"kafka.tools.StorageTool format failed (exit {proc.returncode}) for "
                f"{self.properties_file}:\n{(proc.stdout + proc.stderr).strip()[-3000:]}"
            )

    def _write_meta_properties(self, files: list[Path]) -> None:
        """What ``StorageTool format`` writes for a broker-only node, without its JVM (two
        seconds of CPU per broker): each log dir's ``meta.properties`` naming the cluster, the
        node and the directory. Controllers (the metadata log's bootstrap snapshot) and
        combined nodes are formatted by the tool."""
        for path in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(
                f"version=1\ncluster.id={self.cluster_id}\nnode.id={self.node_id}\n"
                f"directory.id={random_cluster_id()}\n"
            )
            tmp.rename(path)

    def _wait_ready(self, log_offset: int) -> None:
        from confluent_kafka.admin import AdminClient  # dev dependency; imported lazily

        deadline = time.monotonic() + self.startup_timeout
        admin = None
        if self.role != "controller":
            # librdkafka logs connection refusals while the JVM boots; route them to Python logging.
            admin = AdminClient(
                {
                    "bootstrap.servers": self.bootstrap_servers,
                    "socket.connection.setup.timeout.ms": 2000,
                    "logger": logging.getLogger("devstack.kafka.admin"),
                }
            )
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise DevstackError(
                    f"Kafka {self.dist.version} exited with code {self._proc.returncode} during "
                    f"startup (workdir {self.workdir}).\n{self.log_tail()}"
                )
            if admin is None:
                if _STARTED_MESSAGE in self._log_since(log_offset):
                    return
            elif (
                self.role == "broker"
                and callable(self.quorum_voters)
                and self._voters() != self._voters_started
            ):
                raise _ControllerMoved(
                    f"the controller moved from {self._voters_started} to {self._voters()}"
                )
            else:
                try:
                    # registered with the controller and unfenced: the metadata lists this node
                    if self.node_id in admin.list_topics(timeout=2).brokers:
                        return
                except Exception as exc:  # KafkaException while the port is not yet open
                    last_error = exc
            time.sleep(0.25)
        where = f"on {self.bootstrap_servers}" if admin is not None else f"({self.server_log})"
        raise DevstackError(
            f"Kafka {self.dist.version} node {self.node_id} ({self.role}) was not ready {where} within "
            f"{self.startup_timeout:.0f}s (last error: {last_error}).\n{self.log_tail()}"
        )

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.server_log, "rb") as f:
                f.seek(offset)
                return f.read(8 * 1024 * 1024).decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of ``server.log`` and ``stdout.log``, for error messages."""
        out = []
        for path in (self.server_log, self.logs_dir / "stdout.log"):
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path} (last {len(tail)} lines) ---\n" + "\n".join(tail))
        return "\n".join(out)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (controlled shutdown), wait up to ``timeout`` s, then SIGKILL. Returns the exit code."""
        if self._proc is None:
            return None
        terminate_process(self._proc, timeout, kill_wait=30)
        return self._cleanup()

    def kill(self) -> int | None:
        """SIGKILL, no clean shutdown (the next start recovers the logs)."""
        if self._proc is None:
            return None
        kill_process(self._proc, 30)
        return self._cleanup()

    def restart(self, timeout: float = 30.0) -> KafkaBroker:
        """Stop and start again on the same data dir and ports."""
        self.stop(timeout)
        return self.start()

    def _cleanup(self) -> int | None:
        code = self._proc.returncode if self._proc is not None else None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._stdout is not None:
            self._stdout.close()
            self._stdout = None
        return code

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running() else "stopped"
        return f"KafkaBroker({self.dist.version}, {self.bootstrap_servers}, {state})"


#: librdkafka's errors for a request it dropped with its connection (not the broker's answer)
_DROPPED_REQUEST = ("_DESTROY_BROKER", "_TRANSPORT", "_TIMED_OUT")


def create_topics(bootstrap: str, topics: Sequence[NewTopic], timeout: float = 30, attempts: int = 3) -> None:
    """Create ``topics`` (confluent_kafka ``NewTopic``s) and wait until the controller answered.

    Right after a cluster starts, librdkafka may drop a CreateTopics request with the connection
    it was sent on (``_DESTROY_BROKER``: "Broker handle destroyed without termination", seen in
    CI when it replaced its bootstrap connection with the broker's own): such a request is sent
    again, and on that retry a topic that exists counts as created (the first request may have
    reached the controller). Any answer from the broker itself (bad config, a topic that existed
    before the first attempt) raises at once."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient  # dev dependency; imported lazily

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.list_topics(timeout=timeout)  # learn the brokers before asking them anything
    pending = list(topics)
    for attempt in range(1, attempts + 1):
        dropped = []
        for topic, future in admin.create_topics(pending).items():
            try:
                future.result(timeout)
            except KafkaException as e:
                error = e.args[0]
                if attempt > 1 and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                if error.name() not in _DROPPED_REQUEST or attempt == attempts:
                    raise
                dropped.append(topic)
        if not dropped:
            return
        logging.getLogger(__name__).info("CreateTopics for %s dropped by the client; sent again", dropped)
        pending = [t for t in pending if t.topic in dropped]


def _kill_quietly(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(Exception):
        kill_process(proc)


# --------------------------------------------------------------------------------------------
# Command line: ``python -m devstack.kafka jars|broker`` (from the repository root)
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m devstack.kafka", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    jars = sub.add_parser("jars", help="download the jars (idempotent) and print the lib dir")
    run = sub.add_parser("broker", help="run a broker in the foreground until Ctrl-C")
    for p in (jars, run):
        p.add_argument(
            "--version",
            default=None,
            help=f"Kafka version (default: $KAFKA_VERSION or {DEFAULT_KAFKA_VERSION})",
        )
        p.add_argument("--cache-dir", default=None, help="default: $RSM_CACHE_DIR or .cache")
    run.add_argument("--workdir", default=None, help="default: <cache>/kafka-broker-<port>")
    run.add_argument("--port", type=int, default=9092)
    run.add_argument("--controller-port", type=int, default=9093)
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra server.properties entry (repeatable)",
    )
    args = ap.parse_args(argv)
    dist = KafkaDistribution.ensure(args.version, args.cache_dir)
    if args.command == "jars":
        print(dist.lib_dir)
        return 0
    extra = dict(item.split("=", 1) for item in args.set)
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    workdir = Path(args.workdir) if args.workdir else cache / f"kafka-broker-{args.port}"
    broker = KafkaBroker(
        dist, workdir, extra_properties=extra, ports={"broker": args.port, "controller": args.controller_port}
    )
    broker.start()
    banner = (
        f"Kafka {dist.version} on {broker.bootstrap_servers}; data in {broker.log_dirs[0]}; "
        f"logs in {broker.logs_dir}. Ctrl-C to stop."
    )
    try:
        wait_for_stop_signal(alive=broker.is_running, ready=lambda: print(banner, flush=True))
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
