"""The ObjectStore contract on the local-directory backend, plus what only it does."""

from __future__ import annotations

import os

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
