"""The ObjectStore contract, written once and run against every backend.

A backend's test module subclasses ``ObjectStoreContract`` and provides a ``store``
fixture (a fresh, empty-prefixed store against a real server). Each test works under
its own random prefix so backends may share one bucket.

A backend behind a network service subclasses ``RemoteStoreContract`` instead, which adds
the faults of a real server (stopped mid-upload, too slow, unreachable, a missing bucket,
keys it refuses) and what every remote store does (the start-up probe, documented keys).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import gc
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage.base import (
    InvalidRange,
    ObjectNotFound,
    ObjectStore,
    StorageError,
    StorageTimeout,
    StorageUnavailable,
)
from rsm_sidecar.storage.factory import open_store

DOCS = Path(__file__).resolve().parents[2] / "docs"

MiB = 1024 * 1024


def blob(n: int, seed: int = 0) -> bytes:
    return (bytes((i * 31 + seed) & 0xFF for i in range(256))) * (n // 256) + bytes(
        (i * 31 + seed) & 0xFF for i in range(n % 256)
    )


def traced_upload_peak(store, key: str, piece: bytes, times: int) -> int:
    """Writes ``piece`` ``times`` over into one upload of ``key`` and commits it; the peak of
    Python's traced memory meanwhile (tracemalloc), in bytes."""
    tracemalloc.start()
    try:
        with store.open_writer(key) as w:
            for _ in range(times):
                w.write(piece)
            w.commit()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class ObjectStoreContract:
    """Each test gets ``p``, a unique key prefix (tests/storage/conftest.py)."""

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
        for call in (
            lambda: store.get(p + "missing"),
            lambda: store.get_range(p + "missing", 0, 10),
            lambda: store.size(p + "missing"),
        ):
            with pytest.raises(ObjectNotFound) as e:
                call()
            assert p + "missing" in str(e.value)
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

    def test_write_after_commit_is_an_error(self, store: ObjectStore, p: str):
        w = store.open_writer(p + "done")
        w.write(b"abc")
        w.commit()
        with pytest.raises(StorageError):
            w.write(b"more")
        with pytest.raises(StorageError):
            w.commit()
        w.abort()  # no-op after commit
        assert store.get(p + "done") == b"abc"

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

    def test_list_from_a_key_returns_only_later_keys_in_order(self, store: ObjectStore, p: str):
        # keys of the layout's shapes only: SeaweedFS lists in directory order ("t-a/" before
        # "t-a-b/") where S3, GCS, Azure and the local store list in byte order ('-' < '/')
        names = [
            "t-a/0/00000000000000000002-y.log",
            "t-a/0/00000000000000000010-x.indexes",
            "t-a/0/00000000000000000010-x.log",
            "t-a/0/00000000000000000011-v.log",
            "t-a/1/00000000000000000000-z.log",
            "t-a/10/00000000000000000000-u.log",
        ]
        for n in names:
            store.put(p + n, b"x")
        assert [o.key for o in store.list(p)] == sorted(p + n for n in names)
        # what the Iceberg follow round asks: the segments of a partition from an offset on
        after = [o.key for o in store.list(p + "t-a/0/", start_after=p + "t-a/0/00000000000000000010")]
        assert after == [p + n for n in names[1:4]]
        # the start key itself is excluded, and later directories are still listed
        after = [o.key for o in store.list(p + "t-a/", start_after=p + names[2])]
        assert after == [p + n for n in names[3:]]
        assert list(store.list(p + "t-a/0/", start_after=p + "t-a/0/9")) == []
        assert [o.key for o in store.list(p, start_after=p + "t-a/1/")] == [p + n for n in names[4:]]

    def test_keys_with_kafka_topic_characters(self, store: ObjectStore, p: str):
        key = (
            p
            + "my.topic_name-with-dots-AbCdEfGhIjKlMnOpQrStUv/12/"
            + "00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.rsm-manifest"
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

    def test_bytes_received_are_counted(self, store: ObjectStore, p: str):
        """``bytes_read`` (the rsm_storage_bytes_read metric) is what GETs brought back: a
        ranged read counts the range, not the object; writes count nothing."""
        data = bytes(range(256)) * 40
        before = store.bytes_read
        store.put(p + "b", data)
        assert store.bytes_read == before
        assert store.get_range(p + "b", 100, 1123) == data[100:1124]
        assert store.bytes_read == before + 1024
        assert store.get(p + "b") == data
        assert store.bytes_read == before + 1024 + len(data)

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


def request_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The request counts that changed between two snapshots of ``store.requests``."""
    return {
        k: after.get(k, 0) - before.get(k, 0)
        for k in set(after) | set(before)
        if after.get(k, 0) != before.get(k, 0)
    }


class RemoteStoreContract(ObjectStoreContract):
    """The contract plus the faults of a real server, for backends behind a network service.

    The backend's test class names its ``remote`` (a ``tests.storage.conftest.RemoteBackend``:
    its servers and how stores are opened on them) and sets the attributes below.
    """

    # Its servers are reached through fixtures looked up by name, which tests/conftest.py's
    # tiering cannot see: say it here.
    pytestmark = pytest.mark.integration

    remote: Any

    @property
    def name(self) -> str:
        return str(self.remote.name)

    @property
    def part_size(self) -> int:
        return int(self.remote.part_size)

    @pytest.fixture
    def store(self, server):
        """A fresh store on the shared server."""
        store = self.make_store(server)
        yield store
        store.close()

    @pytest.fixture
    def server(self, request):
        """The session's shared server."""
        return request.getfixturevalue(self.remote.server_fixture)

    @pytest.fixture
    def server_factory(self, request):
        """Starts private servers (to stop, pause and restart); stopped after the test."""
        return request.getfixturevalue(f"{self.name}_server_factory")

    def make_store(self, server: Any, **settings: Any) -> Any:
        return self.remote.make_store(server, **settings)

    def undeletable(self, p: str) -> tuple[str, str]:
        """A key the service (or the backend) refuses to delete, and the words of the refusal."""
        raise NotImplementedError

    def small_pages(self, store: Any, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
        """Make ``store``'s listing ask for pages of ``size`` objects (instead of 1000)."""
        raise NotImplementedError

    def transport_errors(self) -> dict[str, BaseException]:
        """What the backend's client raises for a read that timed out (``read_timeout``), a
        connection that timed out (``connect_timeout``) and one that failed (``refused``)."""
        raise NotImplementedError

    def upload_requests(self, parts: int) -> dict[str, int]:
        """The requests of one upload in ``parts`` parts."""
        raise NotImplementedError

    def bounded_upload(self) -> tuple[dict[str, Any], int, float, bool]:
        """Settings of a store whose upload window is known; that window (the most part bytes
        queued or uploading); the bound of a 40 MiB upload's traced memory; whether that upload
        fills the window."""
        raise NotImplementedError

    def translate(self, store: Any, error: BaseException) -> BaseException:
        """The contract's error for the client's ``error`` in a GET of key ``k``."""
        return store._translate(error, "GET", "k")

    # -- requests ----------------------------------------------------------------------------
    def test_object_up_to_the_part_size_is_one_request(self, store, p: str):
        part = self.part_size
        before = store.requests
        with store.open_writer(p + "exact") as w:
            w.write(blob(part - 1000))
            w.write(blob(1000, seed=1))
            assert w.commit() == part
        assert request_delta(before, store.requests) == {"PUT": 1}
        assert store.get(p + "exact") == blob(part - 1000) + blob(1000, seed=1)

    def test_object_above_the_part_size_is_parts_and_one_commit(self, store, p: str):
        data = blob(3 * self.part_size + 5, seed=2)
        before = store.requests
        with store.open_writer(p + "big") as w:
            for i in range(0, len(data), 300_001):
                w.write(data[i : i + 300_001])
            assert not store.exists(p + "big")  # nothing visible before the commit
            assert w.commit() == len(data)
        assert request_delta(before, store.requests) == {**self.upload_requests(4), "HEAD": 1}
        assert store.get(p + "big") == data

    def test_ranged_read_spanning_several_parts_is_one_request(self, store, p: str):
        part = self.part_size
        data = blob(3 * part, seed=5)
        store.put(p + "r", data)
        before = store.requests
        got = store.get_range(p + "r", part - 4096, 2 * part + 4095)  # crosses two part boundaries
        assert got == data[part - 4096 : 2 * part + 4096]
        assert request_delta(before, store.requests) == {"GET": 1}

    def test_upload_memory_is_bounded_by_its_window(self, server, p: str):
        options, window, traced, filled = self.bounded_upload()
        store = self.make_store(server, **options)
        try:
            peak = traced_upload_peak(store, p + "bounded", blob(MiB, seed=3), 40)
            assert store.peak_buffered_bytes <= window
            if filled:
                assert store.peak_buffered_bytes == window  # the window was used
            assert peak < traced, f"peak traced memory {peak / MiB:.1f} MiB"
            assert store.size(p + "bounded") == 40 * MiB
            assert store.buffered_bytes == 0
        finally:
            store.close()

    # -- faults ----------------------------------------------------------------------------
    def test_server_stopped_during_upload_then_back(self, server_factory, p: str):
        server = server_factory()
        store = self.make_store(server, max_attempts=2, connect_timeout=1.0, read_timeout=5.0)
        key = p + "segment.log"
        part = self.part_size
        try:
            store.put(key, b"previous version")
            w = store.open_writer(key)
            w.write(blob(2 * part + 1))  # upload session open, parts sent
            server.stop()
            with pytest.raises(StorageUnavailable) as e:
                w.write(blob(2 * part))
                w.commit()
            assert key in str(e.value) and server.endpoint_url in str(e.value)
            server.start()
            # a restarted server may answer 5xx until it has loaded its data (SeaweedFS's volume
            # server after its S3 port is up): it is back when it serves reads again
            deadline = time.monotonic() + 30
            while True:
                try:
                    previous = store.get(key)
                    break
                except StorageUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            assert previous == b"previous version"  # nothing partial was published
            data = blob(3 * part + 3, seed=6)
            with store.open_writer(key) as w2:
                w2.write(data)
                w2.commit()
            assert store.get(key) == data
            assert [o.key for o in store.list(p)] == [key]
        finally:
            store.close()

    def test_storage_slower_than_the_read_timeout(self, server_factory, p: str):
        server = server_factory()
        store = self.make_store(server, read_timeout=1.0, max_attempts=2)
        try:
            store.put(p + "slow", b"data")
            server.pause()  # SIGSTOP: connections are accepted, nothing answers
            assert server.state() == "T"
            t0 = time.monotonic()
            with pytest.raises(StorageTimeout) as e:
                store.get_range(p + "slow", 0, 3)
            elapsed = time.monotonic() - t0
            msg = str(e.value)
            assert (
                "read timeout of 1s" in msg
                and f"storage.{self.name}.read_timeout" in msg
                and p + "slow" in msg
            )
            assert elapsed >= 1.0 and elapsed < 10, elapsed
            assert e.value.retriable
            assert store.requests["GET"] == 2  # both attempts counted
        finally:
            server.resume()
            store.close()

    def test_unreachable_endpoint_is_unavailable_at_check(self, server_factory):
        server = server_factory()
        store = self.make_store(server, max_attempts=1, connect_timeout=1.0)
        server.stop()
        try:
            with pytest.raises(StorageUnavailable) as e:
                store.check()
            assert store.bucket in str(e.value) and server.endpoint_url in str(e.value)
        finally:
            store.close()

    def test_missing_bucket_fails_check_naming_it(self, server):
        store = self.make_store(server, bucket="no-such-bucket-here")
        try:
            with pytest.raises(ConfigError) as e:
                store.check()
            msg = str(e.value)
            assert "no-such-bucket-here" in msg and "does not exist" in msg and server.endpoint_url in msg
            assert f"storage.{self.name}.{self.remote.bucket_setting}" in msg
            assert self.remote.credentials in msg
        finally:
            store.close()

    def test_garbage_collected_writer_cancels_its_upload(self, store, p: str):
        w = store.open_writer(p + "gc")
        w.write(blob(2 * self.part_size + 10))
        del w
        gc.collect()
        if self.remote.cancel_request is not None:  # else the backend's test checks what is left
            assert store.requests.get(self.remote.cancel_request, 0) == 1
        assert not store.exists(p + "gc")

    def test_delete_many_reports_per_key_errors_after_deleting_the_rest(self, store, p: str):
        good = [f"{p}{i:03d}" for i in range(40)]
        for k in good:
            store.put(k, b".")
        bad, refusal = self.undeletable(p)
        with pytest.raises(StorageError) as e:
            store.delete_many(good[:20] + [bad] + good[20:] + [p + "absent"])
        msg = str(e.value)
        assert "1 of 42" in msg and store.bucket in msg and bad in msg and refusal in msg
        assert e.value.failed_keys == [bad]
        assert not isinstance(e.value, StorageUnavailable)
        assert list(store.list(p)) == []

    def test_delete_many_against_a_stopped_server_names_every_key(self, server_factory, p: str):
        server = server_factory()
        store = self.make_store(server, max_attempts=1)
        keys = [f"{p}{i}" for i in range(6)]
        try:
            for k in keys:
                store.put(k, b".")
            server.stop()
            before = store.requests
            with pytest.raises(StorageUnavailable) as e:
                store.delete_many(keys)
            assert sorted(e.value.failed_keys) == sorted(keys)
            assert all(k in str(e.value) for k in keys) and "6 of 6" in str(e.value)
            assert request_delta(before, store.requests) == self.remote.delete_requests(6)
        finally:
            store.close()

    def test_transport_errors_are_translated(self):
        store = self.remote.make_store(None, connect_timeout=2, read_timeout=3)
        try:
            errors = self.transport_errors()
            t = self.translate(store, errors["read_timeout"])
            assert isinstance(t, StorageTimeout), t
            assert f"read timeout of 3s (storage.{self.name}.read_timeout)" in str(t)
            t = self.translate(store, errors["connect_timeout"])
            assert isinstance(t, StorageTimeout) and "connect timeout of 2s" in str(t), t
            t = self.translate(store, errors["refused"])
            assert isinstance(t, StorageUnavailable) and not isinstance(t, StorageTimeout), t
        finally:
            store.close()

    # -- listing ---------------------------------------------------------------------------
    def test_list_pages_through_more_than_one_page(self, store, p: str, monkeypatch):
        keys = [f"{p}{i:04d}" for i in range(25)]
        for k in keys:
            store.put(k, b"x" * 3)
        self.small_pages(store, monkeypatch, 10)
        before = store.requests
        listed = list(store.list(p))
        assert [o.key for o in listed] == keys and {o.size for o in listed} == {3}
        assert request_delta(before, store.requests) == {"LIST": 3}

    # -- start-up check and settings -------------------------------------------------------
    def configured(self, server: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """A ``[storage.<backend>]`` table for ``server`` that sets keys away from their
        defaults, and the settings it must produce (field -> value)."""
        raise NotImplementedError

    def check_configured_store(self, store: Any) -> None:
        """What else the store opened from ``configured()`` must show (its client's options)."""
        raise NotImplementedError

    def test_open_store_from_config(self, server, p: str):
        table, expected = self.configured(server)
        cfg = Config({"storage": {"backend": self.name, "key_prefix": p, self.name: table}}, environ={})
        store = open_store(cfg)
        try:
            assert type(store).__name__ == self.remote.store_class
            assert {k: getattr(store.settings, k) for k in expected} == expected
            assert store.probe_prefix == p
            self.check_configured_store(store)
            store.check()
            data = blob(self.part_size + 1)
            with store.open_writer(p + "x") as w:
                w.write(data)
                w.commit()
            assert store.get(p + "x") == data
            redacted = repr(cfg.redacted())
            secret = {k.path.rsplit(".", 1)[1] for k in self.remote.settings_type().keys() if k.secret}
            assert all(str(v) not in redacted for k, v in table.items() if k in secret)
            assert store.bucket in store.describe() and server.endpoint_url in store.describe()
        finally:
            store.close()

    def test_check_writes_and_removes_a_probe_under_the_prefix(self, server, p: str):
        store = self.make_store(server, probe_prefix=p)
        try:
            before = store.requests
            store.check()
            assert request_delta(before, store.requests) == self.remote.check_requests
            assert list(store.list(p)) == []
        finally:
            store.close()

    def test_every_key_is_documented_in_the_storage_guide(self):
        doc = (DOCS / "storage.md").read_text()
        keys = self.remote.settings_type().keys()
        assert keys and all(k.path.startswith(f"storage.{self.name}.") for k in keys)
        missing = [k.path for k in keys if f"`{k.path}`" not in doc]
        assert missing == [], f"docs/storage.md does not describe {missing}"
