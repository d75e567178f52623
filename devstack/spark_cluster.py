"""A Spark standalone cluster for development and tests: a master and workers as separate
processes, from the pyspark distribution in the virtualenv (``spark-class``; nothing else to
download).

:class:`SparkStandaloneCluster` starts the master on 127.0.0.1 (RPC and web UI ports of
:mod:`devstack.ports`), then the workers in parallel (each with its own cores, memory, work
directory and ports), and is ready when the master's ``/json/`` lists every worker ``ALIVE``.
Applications connect to :attr:`~SparkStandaloneCluster.master_url` (``spark://127.0.0.1:<port>``)
with the driver in client mode (``spark-submit --master ...``): each worker starts an executor
JVM for them, whose Python workers run the interpreter the application names
(``spark.pyspark.python``).
:meth:`~SparkStandaloneCluster.executors` lists the executor JVMs, per worker, so that a test
can kill one.

    python -m devstack.spark_cluster run --workers 2   # until Ctrl+C, prints the master URL
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from devstack.common import HOST, ServerProcess, http_answers, wait_for_stop_signal, work_dir

#: the JVM class of an executor a worker starts for an application
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> Path:
    """The pyspark distribution of this interpreter (its ``bin/`` and ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_class() -> Path:
    return spark_home() / "bin" / "spark-class"


class _SparkDaemon(ServerProcess):
    startup_timeout = 120.0  # JVM start on a loaded 2-core machine
    port_names = ("port", "ui_port")
    port: int
    ui_port: int
    #: the variable of the daemon's JVM options (spark-class reads it for this daemon only)
    options_variable: str

    def __init__(self, workdir: Path, memory: str):
        super().__init__(workdir)
        self.memory = memory

    def environment(self) -> Mapping[str, str]:
        # no PYTHONPATH: executors inherit the worker's environment, and an application ships
        # its own code (--py-files); nothing of whoever started the cluster leaks into them
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SPARK_", "PYSPARK_")) and k != "PYTHONPATH"
        }
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_DAEMON_MEMORY=self.memory,
            SPARK_LOG_DIR=str(self.workdir),
            SPARK_LOCAL_DIRS=str(self.workdir / "local"),
            SPARK_NO_DAEMONIZE="1",
        )
        # a port found taken fails the start (ServerProcess starts again on new ports), instead
        # of Spark moving to the next port up, where neither the URLs here nor the workers look
        env[self.options_variable] = "-Dspark.port.maxRetries=0"
        return env

    def daemon_command(self, main_class: str, *arguments: str, options: Sequence[str] = ()) -> list[str]:
        """``spark-class <main_class> <arguments>``, listening on :data:`HOST` on its ports, with
        ``options``."""
        listen = ["--host", HOST, "--port", str(self.port), "--webui-port", str(self.ui_port)]
        return [str(spark_class()), main_class, *arguments, *listen, *options]

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the JVM (a worker kills its executors), then SIGKILL its whole process group:
        no executor of it survives."""
        pid = self.pid
        super().stop(timeout)
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class SparkMaster(_SparkDaemon):
    name = "spark-master"
    options_variable = "SPARK_MASTER_OPTS"

    def __init__(self, workdir: Path, memory: str = "256m"):
        super().__init__(workdir, memory)
        self.choose_ports()

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.ui_port}"

    def command(self) -> list[str]:
        return self.daemon_command("org.apache.spark.deploy.master.Master")

    def is_ready(self) -> bool:
        return http_answers(f"{self.ui_url}/json/")

    def state(self) -> dict:  # type: ignore[override]
        """The master's ``/json/`` (workers, applications)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as r:
            return json.loads(r.read())


class SparkWorker(_SparkDaemon):
    name = "spark-worker"
    options_variable = "SPARK_WORKER_OPTS"

    def __init__(
        self, workdir: Path, master: SparkMaster, cores: int, memory: str, daemon_memory: str = "256m"
    ):
        super().__init__(workdir, daemon_memory)
        self.master, self.cores, self.worker_memory = master, cores, memory
        self.choose_ports()

    @property
    def work_dir(self) -> Path:
        """Where the worker keeps each application's executor directories (``app-*/<n>/``)."""
        return self.workdir / "work"

    def command(self) -> list[str]:
        options = ["--cores", str(self.cores), "--memory", self.worker_memory]
        options += ["--work-dir", str(self.work_dir)]
        return self.daemon_command("org.apache.spark.deploy.worker.Worker", self.master.url, options=options)

    def is_ready(self) -> bool:
        try:
            return "Successfully registered with master" in self.log_file.read_text(errors="replace")
        except OSError:
            return False


class SparkStandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each."""

    def __init__(self, workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        self.workdir = Path(workdir)
        self.master = SparkMaster(self.workdir / "master")
        self.workers = [
            SparkWorker(self.workdir / f"worker-{i}", self.master, cores, memory) for i in range(workers)
        ]

    @property
    def master_url(self) -> str:
        return self.master.url

    def start(self) -> SparkStandaloneCluster:
        self.master.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(len(self.workers)) as pool:
                list(pool.map(lambda w: w.start(), self.workers))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for w in self.workers:
            w.stop()
        self.master.stop()

    def alive_workers(self) -> int:
        return sum(1 for w in self.master.state().get("workers", []) if w.get("state") == "ALIVE")

    def executors(self) -> dict[int, list[int]]:
        """Worker index -> the pids of the executor JVMs it runs now."""
        out: dict[int, list[int]] = {i: [] for i in range(len(self.workers))}
        by_parent = {w.pid: i for i, w in enumerate(self.workers)}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if EXECUTOR_CLASS.encode() in cmd and ppid in by_parent:
                out[by_parent[ppid]].append(int(entry))
        return out

    def __enter__(self) -> SparkStandaloneCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m devstack.spark_cluster", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="a master and workers until Ctrl+C")
    run.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    run.add_argument("--workers", type=int, default=2)
    run.add_argument("--cores", type=int, default=1, help="cores per worker")
    run.add_argument("--memory", default="1g", help="memory per worker for executors")
    args = ap.parse_args(argv)
    cluster = SparkStandaloneCluster(
        work_dir(args.dir, "spark-cluster-"), args.workers, args.cores, args.memory
    )
    with cluster:
        banner = (
            f"Spark master {cluster.master_url} (web UI {cluster.master.ui_url}), {args.workers} worker(s)"
        )
        wait_for_stop_signal(alive=cluster.master.is_running, ready=lambda: print(banner, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
