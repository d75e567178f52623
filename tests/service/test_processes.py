"""Real `rsm-sidecar serve` processes: one owner per socket and per journal, two sidecars
sharing one bucket (two brokers around a leader change) with kill -9, and what the
files they create let other users of the host do (issue 10, items 7, 10, 14, 15)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from devstack.sidecar import SidecarProcess
from rsm_sidecar.transform.keyring import write_key_pair
from tests.helpers import REPO
from tests.service.rsm_client import Client, SegmentFilesOnDisk, metadata, seg_id

KiB, MiB = 1024, 1024 * 1024
EMPTY_CONFIG = REPO / "tests" / "service" / "empty.toml"


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("proc-keys")
    write_key_pair(d / "k.public.pem", d / "k.private.pem", 2048)
    return {
        "RSM__ENCRYPTION__ENABLED": "true",
        "RSM__ENCRYPTION__ACTIVE_KEY_ID": "k",
        "RSM__ENCRYPTION__KEYS__k__PUBLIC_KEY_FILE": str(d / "k.public.pem"),
        "RSM__ENCRYPTION__KEYS__k__PRIVATE_KEY_FILE": str(d / "k.private.pem"),
    }


def _env(work: Path, storage: dict[str, str], keys: dict[str, str], **extra) -> dict[str, str]:
    (work / "logs-dir").mkdir(parents=True, exist_ok=True)
    env = {
        "RSM__SERVER__LISTEN": f"unix://{work / 'rsm.sock'}",
        "RSM__METRICS__LISTEN": "",
        "RSM__COPY__JOURNAL_DIR": str(work / "journal"),
        "RSM__COPY__ALLOWED_DIRS": str(work / "logs-dir"),
        "RSM__SEGMENT__CHUNK_SIZE": "256KiB",
        **storage,
        **keys,
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _serve(work: Path, env: dict[str, str]) -> SidecarProcess:
    return SidecarProcess(EMPTY_CONFIG, work, env, env["RSM__SERVER__LISTEN"]).start()


def _run_serve(env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rsm_sidecar.cli.main", "serve", "--config", str(EMPTY_CONFIG)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


# -- item 10: one sidecar per socket and per journal -----------------------------------------
def test_a_second_sidecar_on_the_same_socket_or_journal_refuses_to_start(tmp_path, keys):
    local = {"RSM__STORAGE__LOCAL__ROOT": str(tmp_path / "remote")}
    (tmp_path / "remote").mkdir()
    first = _serve(tmp_path / "a", _env(tmp_path / "a", local, keys))
    try:
        same_socket = _env(
            tmp_path / "b", local, keys, RSM__SERVER__LISTEN=f"unix://{tmp_path / 'a' / 'rsm.sock'}"
        )
        r = _run_serve(same_socket)
        assert r.returncode != 0 and "is locked by another rsm-sidecar process" in r.stderr, r.stderr[-2000:]
        assert f"pid {first.pid}" in r.stderr and "Traceback" not in r.stderr
        same_journal = _env(
            tmp_path / "c", local, keys, RSM__COPY__JOURNAL_DIR=str(tmp_path / "a" / "journal")
        )
        r = _run_serve(same_journal)
        assert r.returncode != 0 and "copy.journal_dir" in r.stderr and "locked" in r.stderr, r.stderr[-2000:]
        # the first one still serves on its socket, which is 0600
        files = SegmentFilesOnDisk(str(tmp_path / "a" / "logs-dir" / "t-0"), os.urandom(10 * KiB))
        client = Client(first.target)
        client.copy(files.path_request(metadata(seg_id(1), size=10 * KiB)))
        assert client.fetch(metadata(seg_id(1), size=10 * KiB)) == open(files.log_path, "rb").read()
        client.close()
        assert stat.S_IMODE(os.stat(tmp_path / "a" / "rsm.sock").st_mode) == 0o600
    finally:
        first.stop()
    again = _serve(tmp_path / "a", _env(tmp_path / "a", local, keys))  # after it exits, a new one starts
    again.stop()


# -- item 15: files other users of the host must not read -------------------------------------
def test_stored_objects_and_journal_entries_are_private_and_exposed_keys_are_refused(tmp_path, keys):
    local = {"RSM__STORAGE__LOCAL__ROOT": str(tmp_path / "remote")}
    (tmp_path / "remote").mkdir()
    exposed = tmp_path / "exposed.pem"
    exposed.write_bytes(Path(keys["RSM__ENCRYPTION__KEYS__k__PRIVATE_KEY_FILE"]).read_bytes())
    exposed.chmod(0o644)
    bad = _env(tmp_path / "x", local, keys, RSM__ENCRYPTION__KEYS__k__PRIVATE_KEY_FILE=str(exposed))
    r = _run_serve(bad)
    assert r.returncode != 0 and "accessible to other users" in r.stderr and "chmod 600" in r.stderr, (
        r.stderr[-2000:]
    )
    sc = _serve(
        tmp_path / "x",
        {**bad, "RSM__ENCRYPTION__ALLOW_EXPOSED_PRIVATE_KEYS": "true", "RSM__ENCRYPTION__ENABLED": "false"},
    )
    try:
        files = SegmentFilesOnDisk(str(tmp_path / "x" / "logs-dir" / "t-0"), os.urandom(10 * KiB))
        client = Client(sc.target)
        client.copy(files.path_request(metadata(seg_id(2), size=10 * KiB)))
        client.close()
    finally:
        sc.stop()
    stored = [p for p in (tmp_path / "remote").rglob("*") if p.is_file()]
    assert len(stored) == 3
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in stored), {
        p.name: oct(p.stat().st_mode) for p in stored
    }
    journal = tmp_path / "x" / "journal"
    assert stat.S_IMODE(journal.stat().st_mode) == 0o700


# -- item 14: what killed copies leave is removed while the sidecar runs -----------------------
def test_temp_files_of_killed_copies_are_removed_by_the_periodic_sweep(tmp_path, keys):
    root = tmp_path / "remote"
    root.mkdir()
    local = {"RSM__STORAGE__LOCAL__ROOT": str(root)}
    env = _env(tmp_path / "w", local, keys, RSM__COPY__JOURNAL_SWEEP_SECONDS=1)
    victim = _serve(tmp_path / "w", env)
    files = SegmentFilesOnDisk(str(tmp_path / "w" / "logs-dir" / "t-0"), log_size=48 * MiB)
    md = metadata(seg_id(3), size=files.log_size)
    client = Client(victim.target)
    threading.Thread(
        target=lambda: _ignore(lambda: client.copy(files.stream_requests(md))), daemon=True
    ).start()
    deadline = time.monotonic() + 30
    while not [p for p in root.rglob("*") if p.is_file()] and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)  # kill -9 in the middle of the copy
    victim._proc.wait(10)
    client.close()
    left = [p for p in root.rglob("*") if p.is_file()]
    assert left, "nothing was being written when the sidecar was killed"
    journal_tmp = tmp_path / "w" / "journal" / ".dead.tmp"
    journal_tmp.write_text("{")  # an interrupted journal write
    restarted = _serve(tmp_path / "w", env)
    try:
        deadline = time.monotonic() + 10
        while [p for p in root.rglob("*") if p.is_file()] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in root.rglob("*") if p.is_file()] == []
        assert not journal_tmp.exists()
        # a temp file a writer died with while this sidecar runs goes at the next periodic sweep
        from rsm_sidecar.storage.local import TMP_DIR

        orphan_dir = root / TMP_DIR
        orphan_dir.mkdir(parents=True, exist_ok=True)
        orphan = orphan_dir / "0123456789abcdef.part"
        orphan.write_bytes(b"x" * 1000)
        deadline = time.monotonic() + 10
        while orphan.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not orphan.exists(), "a dead writer's temp file was not removed by the periodic sweep"
    finally:
        restarted.stop()


def _ignore(fn):
    try:
        fn()
    except grpc.RpcError:
        pass


# -- item 10: two sidecars, one bucket (two brokers around a leader change) ------------------
@pytest.mark.slow
def test_two_sidecars_on_one_bucket_keep_each_others_segments_through_kill_9(tmp_path, keys):
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    from devstack.s3server import SeaweedS3Server

    with SeaweedS3Server(tmp_path / "s3", access_key="two-access", secret_key="two-secret-key-123") as s3:
        s3.create_bucket("shared")
        storage = {
            "RSM__STORAGE__BACKEND": "s3",
            "RSM__STORAGE__S3__BUCKET": "shared",
            "RSM__STORAGE__S3__ENDPOINT_URL": s3.endpoint_url,
            "RSM__STORAGE__S3__REGION": "us-east-1",
            "RSM__STORAGE__S3__ADDRESSING_STYLE": "path",
            "RSM__STORAGE__S3__ACCESS_KEY_ID": "two-access",
            "RSM__STORAGE__S3__SECRET_ACCESS_KEY": "two-secret-key-123",
        }
        env_a = _env(tmp_path / "a", storage, keys, RSM__COPY__JOURNAL_SWEEP_SECONDS=1)
        env_b = _env(tmp_path / "b", storage, keys, RSM__COPY__JOURNAL_SWEEP_SECONDS=1)
        a, b = _serve(tmp_path / "a", env_a), _serve(tmp_path / "b", env_b)
        acked: dict[str, tuple] = {}
        try:
            # broker A leads: segments 0..3
            ca = Client(a.target)
            for n in range(4):
                f = SegmentFilesOnDisk(str(tmp_path / "a" / "logs-dir" / f"s{n}"), os.urandom(300 * KiB + n))
                md = metadata(seg_id(100 + n), start=100 * n, end=100 * n + 99, size=f.log_size)
                ca.copy(f.path_request(md))
                acked[md.segment_id] = (md, open(f.log_path, "rb").read())
            # A starts a large copy and is killed -9 in the middle (the old leader dies)
            big = SegmentFilesOnDisk(str(tmp_path / "a" / "logs-dir" / "big"), log_size=160 * MiB)
            big_md = metadata(seg_id(199), start=400, end=499, size=big.log_size)
            big_done = []
            threading.Thread(
                target=lambda: _ignore(lambda: big_done.append(ca.copy(big.stream_requests(big_md)))),
                daemon=True,
            ).start()
            deadline = time.monotonic() + 30
            while not list((tmp_path / "a" / "journal").glob("*.json")) and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # parts of the .log are in the bucket
            os.killpg(a.pid, signal.SIGKILL)
            a._proc.wait(10)
            ca.close()
            # broker B leads now: it copies the same offsets again under new ids, and more
            cb = Client(b.target)
            for n in range(4, 8):
                f = SegmentFilesOnDisk(str(tmp_path / "b" / "logs-dir" / f"s{n}"), os.urandom(200 * KiB + n))
                md = metadata(seg_id(100 + n), start=100 * n, end=100 * n + 99, size=f.log_size)
                cb.copy(f.stream_requests(md))
                acked[md.segment_id] = (md, open(f.log_path, "rb").read())
            # A comes back (a follower now): its start-up sweep removes only its own leftovers
            a = _serve(tmp_path / "a", env_a)
            ca = Client(a.target)
            time.sleep(2.5)  # a few periodic sweeps on both
            assert list((tmp_path / "a" / "journal").glob("*.json")) == [], (
                "the killed copy's entry was not settled"
            )
            keys_now = [o for o in _list_keys(s3)]
            assert not big_done, "the large copy finished before the kill"
            assert not any(big_md.segment_id in k for k in keys_now), (
                "the killed copy's objects were left behind: "
                f"{[k for k in keys_now if big_md.segment_id in k]}"
            )
            for sid, (md, data) in acked.items():
                assert ca.fetch(md) == data and cb.fetch(md) == data, sid
            # retention on the new leader deletes the old leader's segments
            for n in range(2):
                cb.delete(acked[seg_id(100 + n)][0])
            for sid, (md, data) in acked.items():
                if sid in (seg_id(100), seg_id(101)):
                    with pytest.raises(grpc.RpcError) as e:
                        cb.fetch(md)
                    assert e.value.code() == grpc.StatusCode.NOT_FOUND
                    try:  # the other sidecar may still hold the segment's verified bytes in its cache
                        assert ca.fetch(md) == data
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.NOT_FOUND
                else:
                    assert ca.fetch(md) == data
            ca.close()
            cb.close()
        finally:
            a.stop()
            b.stop()


def _list_keys(s3) -> list[str]:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="two-access",
        aws_secret_access_key="two-secret-key-123",
    )
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket="shared"):
        out += [o["Key"] for o in page.get("Contents", [])]
    return out
