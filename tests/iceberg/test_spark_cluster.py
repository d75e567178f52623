"""The convert job and the follow mode on a Spark standalone cluster: a master and two workers
as separate processes (``devstack.spark_cluster``, from the pyspark distribution), the driver
in client mode under ``spark-submit``, executors whose interpreter has the dependencies but not
this checkout (the package comes from ``--py-files``), segments in S3 (SeaweedFS) and the table
in Apache Iceberg's REST catalog with its warehouse in S3: nothing depends on a local path the
driver and the executors would have to share (the encryption key files excepted, which every
node has at the same path, as docs/iceberg.md says). One worker's executor is SIGKILLed during
a conversion: Spark runs its task again elsewhere, and every offset is committed once."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.iceberg.convert_helpers import (
    SyntheticTopic,
    env_without_checkout,
    offsets,
    python_without_checkout,
    rest_s3_overrides,
    rows,
    s3_segments_toml,
    spark_submit_convert,
    wait_paused,
    zip_package,
)

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """The package zip and the executors' interpreter (without the checkout)."""
    d = tmp_path_factory.mktemp("shipped")
    return zip_package(d / "rsm_sidecar.zip"), python_without_checkout(d / "python-without-checkout")


def submit(cluster, shipped, t: SyntheticTopic, env: dict, *args: str, executor_env=None) -> subprocess.Popen:
    """``spark-submit --master spark://...`` (client mode) of ``iceberg convert`` for ``t``."""
    pkg, python = shipped
    conf = {
        "spark.pyspark.python": str(python),
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.driver.memory": "1g",
        # start the stage with both executors: the tasks are small and would all go to the first
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        "spark.locality.wait": "0",
        **{f"spark.executorEnv.{k}": v for k, v in (executor_env or {}).items()},
    }
    conf["spark.submit.deployMode"] = "client"
    cmd = spark_submit_convert(cluster.master_url, pkg, t, *args, cloud=("aws",), conf=conf)
    full_env = {**env_without_checkout(), **env, "PYSPARK_DRIVER_PYTHON": str(python)}
    return subprocess.Popen(
        cmd,
        cwd=t.workdir,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def topic_on_s3(tmp_path, s3, rest, name: str) -> tuple[SyntheticTopic, dict, dict]:
    """A topic tiered into S3, and the environment giving the job the REST catalog."""
    t = SyntheticTopic(
        tmp_path / name, name, catalog_name="lake", storage_toml=s3_segments_toml(s3.endpoint_url)
    )
    ov = rest_s3_overrides(s3.endpoint_url, rest.uri)
    env = {
        "RSM__" + k.upper().replace(".", "__"): str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in ov.items()
    }
    return t, ov, env


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        out.append(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def app_dirs(cluster) -> list[list[Path]]:
    """Per worker, the executor directories it made (``work/app-*/<executor id>``)."""
    return [sorted(w.work_dir.glob("app-*/*")) for w in cluster.workers]


def test_the_cluster_runs_without_the_checkout(spark_cluster, shipped, tmp_path):
    pkg, python = shipped
    for w in spark_cluster.workers:
        environ = Path(f"/proc/{w.pid}/environ").read_bytes().split(b"\0")
        assert not any(e.startswith(b"PYTHONPATH=") for e in environ)
    check = subprocess.run(
        [str(python), "-c", "import rsm_sidecar"],
        cwd=tmp_path,
        env=env_without_checkout(),
        capture_output=True,
        text=True,
    )
    assert "No module named 'rsm_sidecar'" in check.stderr
    assert spark_cluster.alive_workers() == 2


def test_an_executor_killed_during_a_conversion_commits_every_offset_once(
    spark_cluster, shipped, s3, rest, tmp_path
):
    t, ov, env = topic_on_s3(tmp_path, s3, rest, "killed")
    t.simple_segments(0, 3)
    t.simple_segments(1, 3)  # 6 tasks, 360 records
    pause_dir = tmp_path / "pause"
    before = app_dirs(spark_cluster)
    proc = submit(
        spark_cluster,
        shipped,
        t,
        env,
        "--json",
        executor_env={"RSM_ICEBERG_PAUSE_AT": "write", "RSM_ICEBERG_PAUSE_DIR": str(pause_dir)},
    )
    try:
        wait_paused(proc, pause_dir, "write", timeout=400)  # an executor started the last task
        worker_pid = int((pause_dir / "write.paused").read_text())
        executors = {pid: w for w, pids in spark_cluster.executors().items() for pid in pids}
        (victim,) = [p for p in ancestors(worker_pid) if p in executors]
        doomed = descendants(victim)  # the executor JVM, its Python daemon and workers
        os.kill(victim, signal.SIGKILL)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):  # a Python worker that ended meanwhile
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in doomed):
            assert time.monotonic() < deadline, "the killed executor's processes are still there"
            time.sleep(0.1)
        (pause_dir / "write.resume").write_text("go")  # the task's next attempt runs on
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == 0, err[-5000:]
    result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert result["committed"] and sum(p["records"] for p in result["partitions"]) == 360
    assert result["tasks"] == 6
    table = t.table(**ov)
    assert len(offsets(table)) == len(set(offsets(table))) == 360
    assert rows(table) == t.expected()
    assert len(table.metadata.snapshots) == 1
    # both workers ran executors for the application, and one of them lost its executor
    new = [sorted(set(after) - set(b)) for after, b in zip(app_dirs(spark_cluster), before)]
    assert all(new), new
    assert re.search(r"Lost executor|ExecutorLostFailure", err), err[-5000:]


def test_the_follow_mode_on_the_cluster(spark_cluster, shipped, s3, rest, tmp_path):
    t, ov, env = topic_on_s3(tmp_path, s3, rest, "followed")
    t.simple_segments(0, 2)
    t.simple_segments(1, 2)
    proc = submit(spark_cluster, shipped, t, env, "--follow", "--interval", "1")
    try:

        def converted(n: int) -> bool:
            try:
                return len(offsets(t.table(**ov))) >= n
            except Exception:  # the table does not exist yet
                return False

        deadline = time.monotonic() + 400
        while not converted(240):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(proc.communicate())[-4000:]
            time.sleep(1)
        t.simple_segments(0, 1)  # tiered while the follower runs
        t.simple_segments(1, 2)
        while not converted(420):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(proc.communicate())[-4000:]
            time.sleep(1)
    finally:
        # spark-submit's JVM runs the Python driver as its child and does not pass signals on:
        # the follower stops cleanly (its round finished) on a SIGTERM of its own
        drivers = [
            p
            for p in descendants(proc.pid)[1:]  # not spark-submit's JVM itself
            if b"rsm_iceberg_job.py" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        for pid in drivers:
            os.kill(pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    assert drivers and proc.returncode == 0, (out + err)[-4000:]
    assert "[follow] followed: stopped" in out  # the Python driver's output goes to stdout
    table = t.table(**ov)
    assert rows(table) == t.expected() and len(t.records) == 420
