"""The ObjectStore contract, written once and run against every backend.

A backend's test module subclasses ``ObjectStoreContract`` and provides a ``store``
fixture (a fresh, empty-prefixed store against a real server). Each test works under
its own random prefix so backends may share one bucket.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import os
import uuid

import pytest

from rsm_sidecar.storage.base import InvalidRange, ObjectNotFound, ObjectStore

MiB = 1024 * 1024


def blob(n: int, seed: int = 0) -> bytes:
    return (bytes((i * 31 + seed) & 0xFF for i in range(256))) * (n // 256) + bytes(
        (i * 31 + seed) & 0xFF for i in range(n % 256)
    )


class ObjectStoreContract:
    @pytest.fixture
    def p(self) -> str:
        """A unique key prefix for one test."""
        return f"contract-{uuid.uuid4().hex[:12]}/"

    # -- put / get -------------------------------------------------------------
    def test_put_get_roundtrip(self, store: ObjectStore, p: str):
        data = blob(1000)
        store.put(p + "a", data)
        assert store.get(p + "a") == data
        assert store.size(p + "a") == 1000
        assert store.exists(p + "a")

    def test_put_replaces_existing_object(self, store: ObjectStore, p: str):
        store.put(p + "a", b"first version")
        store.put(p + "a", b"second")
        assert store.get(p + "a") == b"second"

    def test_zero_byte_object(self, store: ObjectStore, p: str):
        store.put(p + "empty", b"")
        assert store.get(p + "empty") == b""
        assert store.size(p + "empty") == 0
        with pytest.raises(InvalidRange):
            store.get_range(p + "empty", 0, 10)

    def test_missing_object_is_not_found(self, store: ObjectStore, p: str):
        with pytest.raises(ObjectNotFound) as e:
            store.get(p + "missing")
        assert p + "missing" in str(e.value)
        with pytest.raises(ObjectNotFound):
            store.get_range(p + "missing", 0, 10)
        with pytest.raises(ObjectNotFound):
            store.size(p + "missing")
        assert not store.exists(p + "missing")

    # -- ranges ------------------------------------------------------------------
    def test_ranged_reads(self, store: ObjectStore, p: str):
        data = blob(10_000, seed=7)
        store.put(p + "r", data)
        assert store.get_range(p + "r", 0, 0) == data[:1]
        assert store.get_range(p + "r", 1234, 5678) == data[1234:5679]
        assert store.get_range(p + "r", 9999, 9999) == data[9999:]
        assert store.get_range(p + "r", 0, 9999) == data

    def test_range_past_the_end_is_truncated_and_start_past_end_is_invalid(self, store: ObjectStore, p: str):
        data = blob(100)
        store.put(p + "r", data)
        assert store.get_range(p + "r", 90, 1000) == data[90:]
        with pytest.raises(InvalidRange):
            store.get_range(p + "r", 100, 200)
        with pytest.raises(InvalidRange):
            store.get_range(p + "r", 5000, 6000)

    # -- streaming writer --------------------------------------------------------
    def test_streaming_writer_large_object(self, store: ObjectStore, p: str):
        # Larger than any multipart part size a backend uses in tests, written in
        # odd-sized pieces.
        total = 0
        pieces = []
        with store.open_writer(p + "big") as w:
            for i in range(23):
                piece = blob(MiB + 12345 * i, seed=i)
                pieces.append(piece)
                w.write(piece)
                total += len(piece)
            assert w.commit() == total
        data = b"".join(pieces)
        assert store.size(p + "big") == total
        assert store.get_range(p + "big", 5 * MiB - 10, 5 * MiB + 10) == data[5 * MiB - 10 : 5 * MiB + 11]
        assert store.get(p + "big") == data

    def test_object_invisible_until_commit(self, store: ObjectStore, p: str):
        w = store.open_writer(p + "pending")
        w.write(b"x" * 1000)
        assert not store.exists(p + "pending")
        assert [o.key for o in store.list(p)] == []
        w.commit()
        assert store.get(p + "pending") == b"x" * 1000

    def test_abort_leaves_nothing(self, store: ObjectStore, p: str):
        # More than one part of any backend's multipart/resumable upload in tests, so
        # aborting a started multipart upload is exercised, not just an in-memory buffer.
        w = store.open_writer(p + "aborted")
        for i in range(3):
            w.write(blob(5 * MiB, seed=i))
        w.abort()
        w.abort()  # idempotent
        assert not store.exists(p + "aborted")
        assert list(store.list(p)) == []

    def test_exception_in_with_block_aborts(self, store: ObjectStore, p: str):
        with pytest.raises(RuntimeError):
            with store.open_writer(p + "boom") as w:
                w.write(blob(12 * MiB))
                raise RuntimeError("producer failed")
        assert not store.exists(p + "boom")
        assert list(store.list(p)) == []

    def test_abort_does_not_touch_previous_version(self, store: ObjectStore, p: str):
        store.put(p + "k", b"committed")
        w = store.open_writer(p + "k")
        w.write(b"replacement")
        w.abort()
        assert store.get(p + "k") == b"committed"

    # -- delete ------------------------------------------------------------------
    def test_delete_is_idempotent(self, store: ObjectStore, p: str):
        store.put(p + "d", b"x")
        store.delete(p + "d")
        assert not store.exists(p + "d")
        store.delete(p + "d")
        store.delete(p + "never-existed")

    def test_delete_many_with_missing_keys(self, store: ObjectStore, p: str):
        keys = [f"{p}dm/{i:05d}" for i in range(5)]
        for k in keys:
            store.put(k, k.encode())
        store.delete_many(keys + [p + "dm/absent-1", p + "dm/absent-2"])
        assert list(store.list(p)) == []

    def test_delete_many_beyond_one_batch(self, store: ObjectStore, p: str):
        keys = [f"{p}many/{i:05d}" for i in range(1100)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda k: store.put(k, b"."), keys))
        assert len(list(store.list(p))) == 1100
        store.delete_many(keys)
        assert list(store.list(p)) == []

    # -- list --------------------------------------------------------------------
    def test_list_by_prefix_sorted_with_sizes(self, store: ObjectStore, p: str):
        names = [
            "t-a/0/00000000000000000010-x.log",
            "t-a/0/00000000000000000002-y.log",
            "t-a/1/00000000000000000000-z.log",
            "t-b/0/00000000000000000000-w.log",
        ]
        for i, n in enumerate(names):
            store.put(p + n, b"x" * (i + 1))
        listed = list(store.list(p + "t-a/"))
        assert [o.key for o in listed] == sorted(p + n for n in names[:3])
        assert {o.key: o.size for o in listed}[p + names[2]] == 3
        now = datetime.datetime.now(datetime.UTC)
        for o in listed:
            assert o.last_modified.tzinfo is not None
            assert abs((now - o.last_modified).total_seconds()) < 600
        # a prefix that ends inside a name, not at a separator
        assert [o.key for o in store.list(p + "t-a/0/0000000000000000001")] == [p + names[0]]
        assert list(store.list(p + "nothing-here/")) == []

    def test_keys_with_kafka_topic_characters(self, store: ObjectStore, p: str):
        key = (
            p
            + "my.topic_name-with-dots-AbCdEfGhIjKlMnOpQrStUv/12/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.rsm-manifest"
        )
        store.put(key, b"{}")
        assert store.get(key) == b"{}"
        assert [o.key for o in store.list(p)] == [key]

    # -- accounting and concurrency ---------------------------------------------
    def test_requests_are_counted(self, store: ObjectStore, p: str):
        before = sum(store.requests.values())
        store.put(p + "c", b"abc")
        store.get_range(p + "c", 0, 1)
        after = store.requests
        assert sum(after.values()) >= before + 2

    def test_concurrent_writers_to_different_keys(self, store: ObjectStore, p: str):
        def write(i: int) -> None:
            with store.open_writer(f"{p}conc/{i}") as w:
                w.write(blob(300_000, seed=i))
                w.commit()

        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            list(pool.map(write, range(10)))
        for i in range(10):
            assert store.get(f"{p}conc/{i}") == blob(300_000, seed=i)

    def test_check_passes_on_a_usable_store(self, store: ObjectStore):
        store.check()
