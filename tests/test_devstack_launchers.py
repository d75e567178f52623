"""The devstack launchers' ``run`` command (devstack/common.py: launcher_parser,
serve_until_stopped, terminate_process), with the real servers: it prints where the server
is, creates the buckets asked for, and a SIGTERM stops the server with it, also while it is
still starting (no orphaned server process)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from devstack.common import REPO_ROOT


def _launch(module: str, workdir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", module, "run", "--dir", str(workdir), *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _processes_using(workdir: Path) -> dict[int, str]:
    """The running processes (pid: command line) that name ``workdir``: the server we started."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(workdir) in cmd and int(pid) != os.getpid() and " -m devstack." not in cmd:
            out[int(pid)] = cmd
    return out


def _stops_cleanly_on_sigterm(proc, workdir) -> None:
    """The running server exits 0 on SIGTERM, leaving no process behind."""
    assert _processes_using(workdir), "the server process is not running"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not _processes_using(workdir)


def _kill_all(proc: subprocess.Popen[str], workdir: Path) -> None:
    """After a failure: the launcher and whatever server it left (so no test leaves one)."""
    proc.kill()
    proc.wait()
    for pid in _processes_using(workdir):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def _running(module: str, workdir: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The launcher of ``module`` running: it and the first line it printed (its banner); at the
    end it and whatever server it left are killed (:func:`_kill_all`)."""
    proc = _launch(module, workdir, *args)
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline()
    finally:
        _kill_all(proc, workdir)


def test_run_prints_the_endpoint_creates_buckets_and_stops_on_sigterm(tmp_path):
    workdir = tmp_path / "gcs"
    with _running("devstack.gcsserver", workdir, "--bucket", "rsm-a", "--bucket", "rsm-b") as (proc, line):
        m = re.match(r"GCS endpoint (http://127\.0\.0\.1:\d+) \(data (\S+), log (\S+)\)", line)
        assert m, line
        assert m.group(2) == str(workdir / "data")
        with urllib.request.urlopen(f"{m.group(1)}/storage/v1/b?project=test", timeout=10) as r:
            names = {b["name"] for b in json.load(r).get("items", [])}
        assert {"rsm-a", "rsm-b"} <= names
        _stops_cleanly_on_sigterm(proc, workdir)


def test_sigterm_during_start_up_leaves_no_server_behind(tmp_path):
    workdir = tmp_path / "s3"
    proc = _launch("devstack.s3server", workdir, "--bucket", "rsm")
    try:
        deadline = time.monotonic() + 60
        while not _processes_using(workdir):  # the server is spawned, not yet ready
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) != 0  # interrupted: no banner, a non-zero status
        assert proc.stdout is not None and "S3 endpoint" not in proc.stdout.read()
        assert not _processes_using(workdir)
    finally:
        _kill_all(proc, workdir)


def test_azurite_run_prints_endpoint_and_a_working_connection_string(tmp_path):
    workdir = tmp_path / "azure"
    containers = ("--container", "rsm-a", "--container", "rsm-b")
    with _running("devstack.azurite", workdir, *containers) as (proc, line):
        m = re.match(
            r"Azure Blob endpoint (http://127\.0\.0\.1:\d+/rsmdev) \(account rsmdev, data (\S+), log (\S+)\)",
            line,
        )
        assert m, line
        assert m.group(2) == str(workdir / "data")
        cs = proc.stdout.readline().removeprefix("connection string: ").strip()
        assert f"BlobEndpoint={m.group(1)};" in cs
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(cs) as client:
            assert {"rsm-a", "rsm-b"} <= {c.name for c in client.list_containers()}
        _stops_cleanly_on_sigterm(proc, workdir)


def test_the_s3_server_writes_its_logs_in_its_work_directory(tmp_path):
    """weed writes its own log files to the temp directory unless told otherwise: every test
    server left one in /tmp. They now go to the server's work directory."""
    import tempfile

    from devstack.s3server import SeaweedS3Server

    before = {p.name for p in Path(tempfile.gettempdir()).glob("weed.*")}
    with SeaweedS3Server(tmp_path / "s3"):
        pass
    assert list((tmp_path / "s3").glob("weed.*.log.INFO.*"))
    assert {p.name for p in Path(tempfile.gettempdir()).glob("weed.*")} <= before


def test_the_s3_server_serves_on_the_address_it_is_given(tmp_path):
    """``host``: the S3 server listens on that address of this machine (for a sidecar in a
    network namespace: our end of its veth pair), is ready there and serves objects there (weed
    listens on loopback as well, by its own choice)."""
    from devstack.s3server import SeaweedS3Server

    with SeaweedS3Server(tmp_path / "s3", host="127.0.0.2") as s3:
        assert s3.endpoint_url == f"http://127.0.0.2:{s3.s3}"
        s3.create_bucket("on-another-address")
        client = s3.client()
        client.put_object(Bucket="on-another-address", Key="k", Body=b"stored")
        assert client.get_object(Bucket="on-another-address", Key="k")["Body"].read() == b"stored"
