"""The scratch directory of a job's Spark driver, and what a killed job left in it.

A Spark driver keeps temporary files under ``spark.local.dir`` and the JVM's ``java.io.tmpdir``
(both ``/tmp`` unless set): a copy of every jar of ``spark.jars`` (58 MiB with the Iceberg runtime
and sqlite-jdbc), the block manager's and the artifact manager's directories, native libraries
that sqlite-jdbc, lz4-java and snappy-java extract. Spark deletes them when its JVM exits
normally; a driver killed with -9 (the kernel's OOM killer, a pod killed past its grace period)
leaves them, so a follow job in a crash loop fills its temporary file system, 58 MiB a restart.

So a job that starts its own session claims a directory of its own under a base directory
(``iceberg.spark.scratch_dir``; by default ``<temp dir>/rsm-iceberg-<uid>``) and points
``spark.local.dir`` and its JVM's ``java.io.tmpdir`` there. It holds an exclusive ``flock`` on a
file in that directory for the life of its process; the kernel releases the lock when the process
ends, however it ends. Claiming sweeps the base: a directory whose lock can be taken belongs to a
job that is gone, and is removed. A job that ends normally removes its own directory at exit.

The base is checked like the sidecar's hand-off directory (:mod:`rsm_sidecar.private_dir`): in a
shared ``/tmp`` someone else could otherwise plant it, or links in it, before the job starts.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path

from rsm_sidecar.errors import ConfigError
from rsm_sidecar.private_dir import private_dir_problem

#: The lock file inside a claimed directory.
LOCK_NAME = "owner.lock"
#: Prefix of claimed directories; nothing else in the base is touched.
PREFIX = "job-"
#: A claimed directory without its lock file is left alone this long (its job may be creating it).
UNLOCKED_GRACE_SECONDS = 600.0

#: base directory -> (claimed directory, the open lock file) of this process
_claimed: dict[Path, tuple[Path, int]] = {}


def default_base() -> Path:
    """``<temp dir>/rsm-iceberg-<uid>``: one per user, so users never share (or trust) one."""
    return Path(tempfile.gettempdir()) / f"rsm-iceberg-{os.geteuid()}"


def claim(base: Path | None = None) -> Path:
    """This process's scratch directory under ``base`` (:func:`default_base` when None), created
    and locked at the first call; every call returns the same directory for the same base. The
    directories of jobs that are gone are removed first."""
    base = Path(base) if base is not None else default_base()
    if base in _claimed:
        return _claimed[base][0]
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        problem = private_dir_problem(base)
    except OSError as e:  # a read-only or missing temp dir, a file in the way
        raise ConfigError(f"iceberg.spark.scratch_dir: cannot create {base}: {e}") from e
    if problem:
        raise ConfigError(f"iceberg.spark.scratch_dir: {base} {problem}")
    sweep(base)
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base))
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and ours: cannot be held by another
    _claimed[base] = (path, fd)
    atexit.register(_release, base)
    return path


def sweep(base: Path) -> list[Path]:
    """Removes the claimed directories under ``base`` whose job is gone (their lock is free);
    returns them. Directories of live jobs and anything not named ``job-*`` stay."""
    removed = []
    for entry in sorted(base.iterdir()):
        if not entry.name.startswith(PREFIX) or entry.is_symlink() or not entry.is_dir():
            continue
        if any(entry == mine for mine, _ in _claimed.values()):
            continue
        try:
            fd = os.open(entry / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            # no lock file: being created right now, or its job died before it locked it
            if time.time() - entry.stat().st_mtime > UNLOCKED_GRACE_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its job is running
        try:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
        finally:
            os.close(fd)
    return removed


def _release(base: Path) -> None:
    """At exit: removes this process's directory (what Spark's own hooks left) and unlocks it."""
    path, fd = _claimed.pop(base)
    shutil.rmtree(path, ignore_errors=True)
    os.close(fd)
