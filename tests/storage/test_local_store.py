"""The ObjectStore contract on the local-directory backend, plus what only it does."""

from __future__ import annotations

import os
import time

import pytest

from rsm_sidecar.errors import ConfigError, InvalidArgument
from rsm_sidecar.storage.local import LocalObjectStore
from tests.storage.contract import ObjectStoreContract


@pytest.fixture
def store(tmp_path):
    s = LocalObjectStore(tmp_path / "objects")
    s.check()
    return s


class TestLocalContract(ObjectStoreContract):
    pass


def test_commit_is_atomic_rename_and_leaves_no_temp_files(store, tmp_path):
    with store.open_writer("a/b/c.log") as w:
        w.write(b"x" * 100)
        tmp_files = os.listdir(tmp_path / "objects" / ".tmp")
        assert len(tmp_files) == 1
        assert not (tmp_path / "objects" / "a" / "b" / "c.log").exists()
        w.commit()
    assert os.listdir(tmp_path / "objects" / ".tmp") == []
    assert (tmp_path / "objects" / "a" / "b" / "c.log").read_bytes() == b"x" * 100


def test_delete_prunes_empty_directories(store, tmp_path):
    store.put("t/0/a.log", b"1")
    store.put("t/0/b.log", b"2")
    store.delete("t/0/a.log")
    assert (tmp_path / "objects" / "t" / "0").is_dir()
    store.delete("t/0/b.log")
    assert not (tmp_path / "objects" / "t").exists()
    assert (tmp_path / "objects").is_dir()


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a", ".tmp/x", "a\x00b"])
def test_keys_that_escape_the_root_are_rejected(store, key):
    with pytest.raises(InvalidArgument):
        store.put(key, b"x")


def test_unusable_root_fails_check_naming_the_key(tmp_path):
    # A directory below a regular file can never be created, whoever runs the test.
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ConfigError) as e:
        LocalObjectStore(tmp_path / "file" / "sub").check()
    assert "storage.local.root" in str(e.value)
    assert str(tmp_path / "file" / "sub") in str(e.value)


def test_fsync_can_be_disabled(tmp_path):
    s = LocalObjectStore(tmp_path, fsync=False)
    s.put("k", b"v")
    assert s.get("k") == b"v"


def test_the_local_listing_is_in_byte_order_across_directories(tmp_path):
    """As S3 lists ('-' sorts before '/'), which a walk of the directories does not give."""
    store = LocalObjectStore(tmp_path, fsync=False)
    names = ["t-a/0/1.log", "t-a/10/1.log", "t-a-b/0/1.log", "t-a.x"]
    for n in names:
        store.put(n, b"x")
    assert (
        [o.key for o in store.list("")]
        == sorted(names)
        == ["t-a-b/0/1.log", "t-a.x", "t-a/0/1.log", "t-a/10/1.log"]
    )
    assert [o.key for o in store.list("t-a", start_after="t-a-b/1")] == [
        "t-a.x",
        "t-a/0/1.log",
        "t-a/10/1.log",
    ]
    assert [o.key for o in store.list("", start_after="t-a.x")] == ["t-a/0/1.log", "t-a/10/1.log"]


def test_a_sweep_between_a_writers_create_and_its_lock_spares_the_write(store, tmp_path, monkeypatch):
    """Another sidecar sharing the directory (or this one's periodic sweep) sweeps at the moment
    a writer has created its temp file but not yet locked it. The moment is forced by running the
    sweep from inside the writer's ``flock`` call (a scheduling race no server can be made to
    produce on demand); the write must still commit and read back."""
    from rsm_sidecar.storage import local

    real_flock = local.fcntl.flock
    swept = []

    def flock_after_a_sweep(fd, op):
        if op == local.fcntl.LOCK_EX and not swept:  # the writer's lock (the sweep's is non-blocking)
            swept.append(None)
            swept[0] = LocalObjectStore(tmp_path / "objects").remove_leftovers()
        return real_flock(fd, op)

    monkeypatch.setattr(local.fcntl, "flock", flock_after_a_sweep)
    with store.open_writer("t/0/x.log") as w:
        w.write(b"y" * 1000)
        w.commit()
    assert swept == [0]
    assert store.get("t/0/x.log") == b"y" * 1000
    assert os.listdir(tmp_path / "objects" / ".tmp") == []


def test_two_sidecars_starting_at_once_on_one_directory_both_start(tmp_path):
    """Each start-up check probes the directory and sweeps it: one's sweep must not delete the
    other's probe (it did: 'is not writable: No such file or directory' on a cluster's start)."""
    import threading

    errors: list[BaseException] = []

    def start_many() -> None:
        try:
            for _ in range(300):
                LocalObjectStore(tmp_path / "shared").check()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=start_many) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_the_sweep_removes_a_dead_writers_files_and_spares_young_unlocked_ones(store, tmp_path):
    from rsm_sidecar.storage.local import UNLOCKED_GRACE_SECONDS

    tmp = tmp_path / "objects" / ".tmp"
    dead_part = tmp / "0123.part"  # a writer killed while writing: removed at once
    dead_part.write_bytes(b"x")
    young_new = tmp / "4567.new"  # a writer between its create and its lock
    young_new.write_bytes(b"")
    young_probe = tmp / "probe-89ab"  # another sidecar's start-up check
    young_probe.write_bytes(b"")
    old_new = tmp / "cdef.new"  # a writer killed between its create and its lock
    old_new.write_bytes(b"")
    old = time.time() - UNLOCKED_GRACE_SECONDS - 1
    os.utime(old_new, (old, old))
    with store.open_writer("t/0/live.log") as w:  # a live writer's .part is locked: kept
        w.write(b"z")
        assert store.remove_leftovers() == 2
        assert sorted(os.listdir(tmp)) == sorted(
            [young_new.name, young_probe.name, os.path.basename(w.tmp_path)]
        )
        w.commit()
    assert store.get("t/0/live.log") == b"z"
