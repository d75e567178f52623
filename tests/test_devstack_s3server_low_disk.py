"""The test S3 server (devstack/s3server.py) keeps taking writes on a disk with little room
left. `weed mini`, which it ran before, marks every volume read-only below 1% of the disk free
and then holds each PUT until the client's read timeout: on a CI disk of 252 GB with under
2.5 GB free, 38 tests failed that way. Here a real ext4 file system of 30 GB (a sparse file,
loop-mounted) is filled to about 200 MB free, 0.7% of it, and the server keeps its data there."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

MiB = 1024 * 1024


@pytest.fixture
def nearly_full_filesystem(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root and mkfs.ext4 to loop-mount a file system (CI runs as root)")
    image, mountpoint = tmp_path / "disk.img", tmp_path / "disk"
    mountpoint.mkdir()
    subprocess.run(["truncate", "-s", "30G", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mountpoint)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"no loop device here: {mounted.stderr.decode().strip()}")
    try:
        free = shutil.disk_usage(mountpoint).free
        subprocess.run(["fallocate", "-l", str(free - 200 * MiB), str(mountpoint / "filler")], check=True)
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def test_the_s3_server_takes_writes_with_under_one_percent_of_its_disk_free(nearly_full_filesystem):
    from devstack.s3server import SeaweedS3Server

    usage = shutil.disk_usage(nearly_full_filesystem)
    assert usage.free < usage.total / 100, "the file system is not below 1% free"
    with SeaweedS3Server(nearly_full_filesystem / "s3", access_key="low", secret_key="disk-secret") as s3:
        s3.create_bucket("low-disk")
        client = s3.client(read_timeout=10)
        for i in range(20):
            client.put_object(Bucket="low-disk", Key=f"k{i}", Body=os.urandom(64 * 1024))
        body = client.get_object(Bucket="low-disk", Key="k7")["Body"].read()
        assert len(body) == 64 * 1024
        listed = client.list_objects_v2(Bucket="low-disk")["KeyCount"]
        assert listed == 20
