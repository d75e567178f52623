"""The Spark driver's scratch directory (``iceberg.spark.scratch_dir``, :mod:`rsm_sidecar.iceberg.
session.scratch`): each job process claims and locks a directory of its own; it is removed at a
normal exit, and by the next job to start when its job was killed with -9 (the lock is the
kernel's: it goes with the process). Real processes, real SIGKILL; no Spark here (the killed
Spark driver's leftovers are checked in ``test_exactly_once.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg.session import scratch
from tests.helpers import REPO

#: a job process: claims a directory under argv[1], fills it as Spark would, prints it, waits
JOB = """
import sys
from pathlib import Path
from rsm_sidecar.iceberg.session import scratch
path = scratch.claim(Path(sys.argv[1]))
(path / "spark-1" / "userFiles-1").mkdir(parents=True)
(path / "spark-1" / "userFiles-1" / "runtime.jar").write_bytes(b"j" * 4096)
print(path, flush=True)
sys.stdin.readline()
"""


def start_job(base: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", JOB, str(base)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, f"the job exited with {proc.wait()} before claiming"
    return proc, Path(line)


def test_a_job_directory_is_private_and_removed_when_its_job_ends(tmp_path):
    base = tmp_path / "scratch"
    proc, path = start_job(base)
    try:
        assert path.parent == base and path.name.startswith("job-")
        assert (base.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o700, 0o700)
        assert (path / "spark-1" / "userFiles-1" / "runtime.jar").stat().st_size == 4096
        assert scratch.sweep(base) == [] and path.exists()  # alive: another job leaves it alone
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.close()
        assert proc.wait(30) == 0
    assert list(base.iterdir()) == []


def test_a_killed_jobs_directory_is_removed_by_the_next_job_to_start(tmp_path):
    base = tmp_path / "scratch"
    first, first_path = start_job(base)
    second, second_path = start_job(base)
    try:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
        assert (first_path / "spark-1" / "userFiles-1" / "runtime.jar").exists()  # what -9 leaves
        third, third_path = start_job(base)  # claiming sweeps the dead job's directory only
        try:
            assert not first_path.exists()
            assert second_path.exists() and third_path.exists()
        finally:
            third.kill()
            third.wait(30)
    finally:
        second.kill()
        second.wait(30)
    assert sorted(scratch.sweep(base)) == sorted([second_path, third_path])
    assert list(base.iterdir()) == []


def test_only_job_directories_are_swept_and_one_being_created_is_left(tmp_path):
    """Other names, links and a directory whose job has not locked it yet are left alone."""
    base = tmp_path / "scratch"
    base.mkdir(mode=0o700)
    (base / "notes.txt").write_text("mine")
    (base / "other").mkdir()
    unlocked = base / "job-123-new"  # a job between mkdtemp and its lock file: young, kept
    unlocked.mkdir()
    stale = base / "job-456-old"  # a job that died before it locked: old, removed
    stale.mkdir()
    old = time.time() - scratch.UNLOCKED_GRACE_SECONDS - 60
    os.utime(stale, (old, old))
    outside = tmp_path / "outside"  # a link named like a job's directory is never followed
    outside.mkdir()
    (outside / "keep").write_text("x")
    (base / "job-789-link").symlink_to(outside)
    assert scratch.sweep(base) == [stale]
    assert sorted(p.name for p in base.iterdir()) == ["job-123-new", "job-789-link", "notes.txt", "other"]
    assert (outside / "keep").read_text() == "x"


@pytest.mark.parametrize("how", ["group-writable", "symlink", "a file"])
def test_a_base_someone_else_could_write_is_refused(tmp_path, how):
    base = tmp_path / "scratch"
    if how == "group-writable":
        base.mkdir()
        base.chmod(0o770)
        said = "is writable by group or others (mode 0770); make it 0700"
    elif how == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        base.symlink_to(tmp_path / "elsewhere")
        said = "is a symbolic link"
    else:
        base.write_text("")
        said = "is not a directory"
    with pytest.raises(ConfigError) as e:
        scratch.claim(base)
    assert str(e.value) == f"iceberg.spark.scratch_dir: {base} {said}"


def test_a_base_that_cannot_be_created_is_a_clear_error(tmp_path):
    (tmp_path / "a-file").write_text("")
    base = tmp_path / "a-file" / "scratch"
    with pytest.raises(ConfigError) as e:
        scratch.claim(base)
    # the file in the way is named
    assert (
        str(e.value)
        == f"iceberg.spark.scratch_dir: cannot create {base}: [Errno 17] File exists: '{base.parent}'"
    )


def test_the_default_base_is_per_user_in_the_temp_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    assert scratch.default_base() == tmp_path / f"rsm-iceberg-{os.geteuid()}"
