"""The gRPC service end to end (a real server on loopback, local-directory storage)."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.format import custom_metadata as cm
from rsm_sidecar.format.keys import SegmentMetadata
from rsm_sidecar.storage.local import LocalObjectStore
from tests.service.rsm_client import Client, SegmentFilesOnDisk, metadata, seg_id

KiB = 1024


def _code(excinfo) -> grpc.StatusCode:
    return excinfo.value.code()


@pytest.mark.parametrize("mode", ["stream", "path"])
@pytest.mark.parametrize("encryption", [False, True])
def test_copy_fetch_indexes_delete(start_sidecar, tmp_path, mode, encryption):
    sc = start_sidecar(encryption=encryption)
    log = os.urandom(300 * KiB) + b"x" * (200 * KiB)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), log)
    md = metadata(seg_id(1), 100, 199, size=len(log))
    resp = sc.client.copy(
        files.stream_requests(md, piece=100_000) if mode == "stream" else files.path_request(md)
    )
    fields = cm.decode(resp.custom_metadata)
    assert fields[cm.REMOTE_SIZE] == resp.stored_bytes > 0
    assert fields[cm.OBJECT_PREFIX] == ""
    assert len(resp.custom_metadata) <= 128
    md.custom_metadata = resp.custom_metadata  # the broker hands it back on fetch/delete
    assert sc.client.fetch(md) == log
    assert sc.client.fetch(md, 12345) == log[12345:]
    assert sc.client.fetch(md, 70_000, 200_000) == log[70_000:200_001]
    for index_type, name in (
        (pb.OFFSET, "offset"),
        (pb.TIMESTAMP, "timestamp"),
        (pb.PRODUCER_SNAPSHOT, "producerSnapshot"),
        (pb.TRANSACTION, "transaction"),
    ):
        assert sc.client.index(md, index_type) == files.indexes[name]
    assert sc.client.index(md, pb.LEADER_EPOCH) == files.leader_epoch
    assert len(sc.objects()) == 3
    sc.client.delete(md)
    assert sc.objects() == []
    with pytest.raises(grpc.RpcError) as e:
        sc.client.fetch(md)
    assert _code(e) == grpc.StatusCode.NOT_FOUND
    sc.client.delete(md)  # idempotent


def test_fetch_positions_follow_the_contract(start_sidecar, tmp_path):
    sc = start_sidecar()
    log = os.urandom(100 * KiB)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), log)
    md = metadata(seg_id(2), size=len(log))
    sc.client.copy(files.stream_requests(md))
    assert sc.client.fetch(md, 1000, 10**9) == log[1000:]  # end clamped
    assert sc.client.fetch(md, len(log) - 1) == log[-1:]
    assert sc.client.fetch(md, len(log)) == b""  # reading from the end: nothing
    for start, end, code in (
        (-1, None, grpc.StatusCode.INVALID_ARGUMENT),
        (10, 5, grpc.StatusCode.INVALID_ARGUMENT),
        (len(log) + 1, None, grpc.StatusCode.OUT_OF_RANGE),
    ):
        with pytest.raises(grpc.RpcError) as e:
            sc.client.fetch(md, start, end)
        assert _code(e) == code, (start, end)


def test_missing_segment_and_missing_txn_index_are_not_found(start_sidecar, tmp_path):
    sc = start_sidecar()
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(5000), txn=False)
    md = metadata(seg_id(3), size=5000)
    sc.client.copy(files.stream_requests(md))
    with pytest.raises(grpc.RpcError) as e:
        sc.client.index(md, pb.TRANSACTION)
    assert _code(e) == grpc.StatusCode.NOT_FOUND and "transaction" in e.value.details()
    for call in (
        lambda: sc.client.fetch(metadata(seg_id(99))),
        lambda: sc.client.index(metadata(seg_id(99)), pb.OFFSET),
    ):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert _code(e) == grpc.StatusCode.NOT_FOUND
    sc.client.delete(metadata(seg_id(98)))  # never existed: OK


def test_empty_segment(start_sidecar, tmp_path):
    sc = start_sidecar(encryption=True)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), b"")
    md = metadata(seg_id(4), size=0)
    sc.client.copy(files.stream_requests(md))
    assert sc.client.fetch(md) == b""


@pytest.mark.parametrize("encryption", [False, True])
@pytest.mark.parametrize("compression", [False, True])
def test_flipped_byte_in_any_chunk_fails_naming_segment_and_chunk(
    start_sidecar, tmp_path, encryption, compression
):
    sc = start_sidecar(
        encryption=encryption,
        segment__compression=compression,
        segment__compression_heuristic=False,
        segment__chunk_size=16 * KiB,
        cache__chunk_bytes=0,
        cache__prefetch_bytes=0,
    )
    log = (b"0123456789abcdef" * 4096)[: 5 * 16 * KiB - 100]
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), log)
    md = metadata(seg_id(5), size=len(log))
    resp = sc.client.copy(files.stream_requests(md))
    log_key = resp.object_key_base + ".log"
    path = sc.root / log_key
    stored = path.read_bytes()
    manifest = sc.sidecar.reader.open(SegmentMetadata.from_proto(md)).manifest
    for chunk in manifest.chunk_index.chunks():
        bad = bytearray(stored)
        bad[chunk.transformed_position + chunk.transformed_size // 2] ^= 0x40
        path.write_bytes(bytes(bad))
        received = bytearray()
        with pytest.raises(grpc.RpcError) as e:
            for msg in sc.client.fetch_stream(md):
                received += msg.data
        assert _code(e) == grpc.StatusCode.DATA_LOSS
        assert log_key in e.value.details() and f"chunk {chunk.id}" in e.value.details()
        assert bytes(received) == log[: len(received)]  # never wrong bytes
        assert len(received) <= chunk.original_position
    path.write_bytes(stored)
    assert sc.client.fetch(md) == log


@pytest.mark.parametrize("encryption", [False, True])
def test_flipped_byte_in_indexes_or_manifest_fails(start_sidecar, tmp_path, encryption):
    sc = start_sidecar(encryption=encryption)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(10 * KiB))
    md = metadata(seg_id(6), size=10 * KiB)
    base = sc.client.copy(files.stream_requests(md)).object_key_base
    idx_path = sc.root / (base + ".indexes")
    raw = bytearray(idx_path.read_bytes())
    raw[900] ^= 1  # inside the time index (offset index is 800 bytes, +28 when encrypted)
    idx_path.write_bytes(bytes(raw))
    with pytest.raises(grpc.RpcError) as e:
        sc.client.index(md, pb.TIMESTAMP)
    assert _code(e) == grpc.StatusCode.DATA_LOSS and "timestamp index" in e.value.details()
    man_path = sc.root / (base + ".rsm-manifest")
    man = bytearray(man_path.read_bytes())
    man[len(man) // 2] ^= 1
    man_path.write_bytes(bytes(man))
    restarted = start_sidecar(encryption=encryption)  # no cached manifest
    with pytest.raises(grpc.RpcError) as e:
        restarted.client.fetch(md)
    assert _code(e) == grpc.StatusCode.DATA_LOSS and ".rsm-manifest" in e.value.details()
    man_path.write_bytes(bytes(man[:40]))  # truncated
    with pytest.raises(grpc.RpcError) as e:
        start_sidecar(encryption=encryption).client.fetch(md)
    assert _code(e) == grpc.StatusCode.DATA_LOSS


def test_missing_log_object_is_not_found(start_sidecar, tmp_path):
    sc = start_sidecar()
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(10 * KiB))
    md = metadata(seg_id(7), size=10 * KiB)
    base = sc.client.copy(files.stream_requests(md)).object_key_base
    os.unlink(sc.root / (base + ".log"))
    with pytest.raises(grpc.RpcError) as e:
        start_sidecar().client.fetch(md)
    assert _code(e) == grpc.StatusCode.NOT_FOUND and ".log" in e.value.details()


def test_key_rotation_keeps_old_segments_readable(start_sidecar, tmp_path):
    a = start_sidecar(encryption="A")
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(50 * KiB))
    md_a = metadata(seg_id(8), size=50 * KiB)
    a.client.copy(files.stream_requests(md_a))
    assert a.sidecar.reader.open(SegmentMetadata.from_proto(md_a)).manifest.key_id == "A"
    b = start_sidecar(encryption="B")  # rotated: B active, A kept for reading
    md_b = metadata(seg_id(9), size=50 * KiB)
    b.client.copy(files.stream_requests(md_b))
    assert b.sidecar.reader.open(SegmentMetadata.from_proto(md_b)).manifest.key_id == "B"
    assert b.client.fetch(md_a) == b.client.fetch(md_b)
    only_b = start_sidecar(encryption="B", key_ids=("B",))
    with pytest.raises(grpc.RpcError) as e:
        only_b.client.fetch(md_a)
    assert _code(e) == grpc.StatusCode.FAILED_PRECONDITION and "'A'" in e.value.details()


def test_short_stream_fails_and_leaves_nothing(start_sidecar, tmp_path):
    sc = start_sidecar()
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(300 * KiB))
    md = metadata(seg_id(10), size=300 * KiB)
    reqs = list(files.stream_requests(md, piece=64 * KiB))
    with pytest.raises(grpc.RpcError) as e:
        sc.client.copy(iter(reqs[:3]))  # begin + 2 pieces of the log
    assert _code(e) == grpc.StatusCode.FAILED_PRECONDITION and "stream ended" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        sc.client.copy(iter(reqs[:-1]))  # the last index missing
    assert _code(e) == grpc.StatusCode.FAILED_PRECONDITION
    assert sc.objects() == []
    sc.client.copy(iter(reqs))  # a retry succeeds
    assert sc.client.fetch(md) == open(files.log_path, "rb").read()


def test_out_of_order_stream_is_invalid(start_sidecar, tmp_path):
    sc = start_sidecar()
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(10 * KiB))
    md = metadata(seg_id(11), size=10 * KiB)
    reqs = list(files.stream_requests(md))
    reqs[2], reqs[3] = reqs[3], reqs[2]  # time index before offset index
    with pytest.raises(grpc.RpcError) as e:
        sc.client.copy(iter(reqs))
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    assert sc.objects() == []


@pytest.mark.parametrize("change", ["append", "truncate", "delete", "replace"])
def test_segment_file_changing_during_path_copy_fails_and_leaves_nothing(start_sidecar, tmp_path, change):
    # zstd at level 19 on random bytes makes the copy slow enough to change the file under it.
    sc = start_sidecar(
        segment__compression_heuristic=False,
        segment__compression_level=19,
        segment__chunk_size=256 * KiB,
        copy__parallelism=1,
    )
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), log_size=24 * 1024 * KiB)
    md = metadata(seg_id(12), size=files.log_size)
    errors = []

    def run():
        try:
            sc.client.copy(files.path_request(md))
        except grpc.RpcError as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    tmp = sc.root / ".tmp"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (
        tmp.exists() and any(p.stat().st_size > 0 for p in tmp.iterdir())
    ):
        time.sleep(0.005)
    if change == "append":
        with open(files.log_path, "ab") as f:
            f.write(b"late batch")
    elif change == "truncate":
        os.truncate(files.log_path, 1000)
    elif change == "delete":
        os.unlink(files.log_path)
    else:
        os.rename(files.log_path, files.log_path + ".old")
        with open(files.log_path, "wb") as f:
            f.write(b"new file")
    t.join(120)
    assert errors, "the copy should have failed"
    assert errors[0].code() == grpc.StatusCode.FAILED_PRECONDITION, errors[0].details()
    assert sc.objects() == []


def test_path_mode_respects_allowed_dirs(start_sidecar, tmp_path):
    (tmp_path / "kafka-logs").mkdir()
    sc = start_sidecar(copy__allowed_dirs=[str(tmp_path / "kafka-logs")])
    files = SegmentFilesOnDisk(str(tmp_path / "elsewhere"), os.urandom(1000))
    with pytest.raises(grpc.RpcError) as e:
        sc.client.copy(files.path_request(metadata(seg_id(13), size=1000)))
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT and "allowed_dirs" in e.value.details()
    ok = SegmentFilesOnDisk(str(tmp_path / "kafka-logs" / "t-0"), os.urandom(1000))
    sc.client.copy(ok.path_request(metadata(seg_id(14), size=1000)))


class FailingStore(LocalObjectStore):
    """A store whose manifest writes fail, as a storage outage at the last step would.
    (The local filesystem cannot be made to fail only on one object; the S3/GCS fault
    tests stop real servers instead.)"""

    def put(self, key, data):
        if key.endswith(".rsm-manifest"):
            from rsm_sidecar.storage.base import StorageUnavailable

            raise StorageUnavailable(f"injected outage writing {key}")
        super().put(key, data)


def test_failed_copy_removes_what_it_wrote_and_is_retriable(start_sidecar, tmp_path):
    root = tmp_path / "remote"
    sc = start_sidecar(store=FailingStore(root, fsync=False))
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(200 * KiB))
    md = metadata(seg_id(15), size=200 * KiB)
    with pytest.raises(grpc.RpcError) as e:
        sc.client.copy(files.stream_requests(md))
    assert _code(e) == grpc.StatusCode.UNAVAILABLE and "injected outage" in e.value.details()
    assert sc.objects() == []


def test_concurrent_copies_and_fetches(start_sidecar, tmp_path):
    import concurrent.futures

    sc = start_sidecar(encryption=True, segment__chunk_size=32 * KiB)
    segments = []
    for i in range(10):
        log = os.urandom(150 * KiB + i * 777)
        segments.append(
            (metadata(seg_id(100 + i), size=len(log)), SegmentFilesOnDisk(str(tmp_path / f"s{i}"), log), log)
        )
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        list(pool.map(lambda s: sc.client.copy(s[1].stream_requests(s[0], piece=50 * KiB)), segments))
        results = list(pool.map(lambda s: sc.client.fetch(s[0], 1000), segments))
    assert results == [s[2][1000:] for s in segments]
    # 10 copies and 10 fetches at the same time
    more = [(metadata(seg_id(200 + i), size=len(s[2])), s[1], s[2]) for i, s in enumerate(segments)]
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        copies = [pool.submit(sc.client.copy, m[1].stream_requests(m[0], piece=50 * KiB)) for m in more]
        fetches = [pool.submit(sc.client.fetch, s[0], 5000, 100_000) for s in segments]
        assert [f.result() for f in fetches] == [s[2][5000:100_001] for s in segments]
        for c in copies:
            c.result()
    for m in more:
        assert sc.client.fetch(m[0]) == m[2]


def test_health_and_metrics(start_sidecar, tmp_path):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    sc = start_sidecar()
    health = health_pb2_grpc.HealthStub(sc.client.channel)
    assert (
        health.Check(health_pb2.HealthCheckRequest(service="rsm.v1.RemoteStorage")).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(100 * KiB))
    md = metadata(seg_id(16), size=100 * KiB)
    sc.client.copy(files.stream_requests(md))
    sc.client.fetch(md)
    sc.client.fetch(md)
    import prometheus_client

    text = prometheus_client.generate_latest(sc.sidecar.metrics.registry).decode()
    assert 'rsm_operations_total{op="copy",outcome="OK"} 1.0' in text
    assert 'rsm_operations_total{op="fetch",outcome="OK"} 2.0' in text
    assert 'rsm_bytes_total{kind="fetch_served"} 204800.0' in text
    assert 'rsm_cache_events_total{cache="chunk",event="hit"}' in text
    assert 'rsm_storage_requests_total{backend="local",op="GET"}' in text


def test_graceful_shutdown_drains_in_flight_copy(start_sidecar, tmp_path):
    sc = start_sidecar()
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(400 * KiB))
    md = metadata(seg_id(17), size=400 * KiB)
    reqs = list(files.stream_requests(md, piece=50 * KiB))
    release = threading.Event()

    def slow():
        for i, r in enumerate(reqs):
            if i == 3:
                release.wait(10)
            yield r

    result = {}
    t = threading.Thread(target=lambda: result.setdefault("resp", sc.client.copy(slow())))
    t.start()
    time.sleep(0.5)
    stopper = threading.Thread(target=sc.server.stop, kwargs={"grace": 20})
    stopper.start()
    time.sleep(0.5)
    late = Client(sc.server.address)
    with pytest.raises(grpc.RpcError) as e:  # new calls are refused while draining
        late.fetch(md, timeout=5)
    assert _code(e) == grpc.StatusCode.UNAVAILABLE
    release.set()
    t.join(30)
    stopper.join(30)
    assert result["resp"].stored_bytes > 0
    assert LocalObjectStore(sc.root).exists(result["resp"].object_key_base + ".rsm-manifest")


def test_logs_never_contain_key_material(start_sidecar, tmp_path, caplog):
    import base64
    import logging

    caplog.set_level(logging.DEBUG)
    sc = start_sidecar(encryption=True)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(100 * KiB))
    md = metadata(seg_id(18), size=100 * KiB)
    sc.client.copy(files.stream_requests(md))
    sc.client.fetch(md)
    manifest = sc.sidecar.reader.open(SegmentMetadata.from_proto(md)).manifest
    dek = sc.sidecar.keyring.unwrap("A", manifest.encryption.wrapped_key)
    text = "\n".join(r.getMessage() + str(getattr(r, "fields", "")) for r in caplog.records)
    assert "copied" in text
    for secret in (dek.hex(), base64.b64encode(dek).decode(), manifest.encryption.aad.hex(), "PRIVATE KEY"):
        assert secret not in text


class RecordingStore(LocalObjectStore):
    """Records the order of deletes (observes the real local store)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.deleted: list[str] = []

    def delete(self, key):
        self.deleted.append(key)
        super().delete(key)


def test_delete_removes_the_manifest_first(start_sidecar, tmp_path):
    store = RecordingStore(tmp_path / "remote", fsync=False)
    sc = start_sidecar(store=store)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(10 * KiB))
    md = metadata(seg_id(19), size=10 * KiB)
    sc.client.copy(files.stream_requests(md))
    store.deleted.clear()  # a copy first removes any manifest an earlier attempt of the same id left
    sc.client.delete(md)
    assert store.deleted[0].endswith(".rsm-manifest")
    assert sorted(k.rsplit(".", 1)[1] for k in store.deleted) == ["indexes", "log", "rsm-manifest"]
    assert sc.objects() == []


def test_metrics_are_served_over_http(start_sidecar, tmp_path):
    import urllib.request

    from devstack.common import free_port

    port = free_port()
    sc = start_sidecar(metrics__listen=f"127.0.0.1:{port}")
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(10 * KiB))
    md = metadata(seg_id(20), size=10 * KiB)
    sc.client.copy(files.stream_requests(md))
    with pytest.raises(grpc.RpcError):
        sc.client.fetch(metadata(seg_id(21)))
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'rsm_operations_total{op="copy",outcome="OK"} 1.0' in text
    assert 'rsm_operations_total{op="fetch",outcome="NOT_FOUND"} 1.0' in text
    assert "rsm_operation_seconds_bucket" in text and "rsm_cache_bytes" in text


class OutageStore(LocalObjectStore):
    """A local store that can be switched into an outage: writes of manifests and deletes
    of data objects fail, as when object storage goes away in the middle of a copy. (The local
    filesystem cannot be made unavailable for one process; the e2e tests make the storage
    directory unwritable and kill the sidecar for real.)"""

    down = False

    def put(self, key, data):
        if self.down and key.endswith(".rsm-manifest"):
            from rsm_sidecar.storage.base import StorageUnavailable

            raise StorageUnavailable(f"injected outage writing {key}")
        super().put(key, data)

    def delete(self, key):
        # a copy first removes an earlier attempt's manifest (absent here); the outage
        # starts after that, so the data objects it writes can no longer be deleted
        if self.down and not key.endswith(".rsm-manifest"):
            from rsm_sidecar.storage.base import StorageUnavailable

            raise StorageUnavailable(f"injected outage deleting {key}")
        super().delete(key)


def copy_in_an_outage(start_sidecar, tmp_path, segment: int):
    """A sidecar with a copy journal (swept only when a test says) on an :class:`OutageStore`,
    and a copy of a 100 KiB segment that failed UNAVAILABLE in an outage still going on: the
    store, the sidecar, the segment's files and its metadata."""
    store = OutageStore(tmp_path / "remote", fsync=False)
    sc = start_sidecar(
        store=store, copy__journal_dir=str(tmp_path / "journal"), copy__journal_sweep_seconds=3600
    )
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(100 * KiB))
    md = metadata(seg_id(segment), size=100 * KiB)
    store.down = True
    with pytest.raises(grpc.RpcError) as e:
        sc.client.copy(files.stream_requests(md))
    assert _code(e) == grpc.StatusCode.UNAVAILABLE
    return store, sc, files, md


def test_journal_sweep_removes_what_a_failed_cleanup_left(start_sidecar, tmp_path):
    store, sc, files, md = copy_in_an_outage(start_sidecar, tmp_path, 30)
    left = sc.objects()
    assert left and not any(k.endswith(".rsm-manifest") for k in left)  # never readable
    journal = sc.sidecar.copier.journal
    assert len(journal.pending()) == 1
    assert journal.sweep() == 0 and len(journal.pending()) == 1  # still down: kept for later
    store.down = False
    assert journal.sweep() == 1
    assert sc.objects() == [] and journal.pending() == []
    sc.client.copy(files.stream_requests(md))  # and the broker's retry succeeds
    assert journal.pending() == []


def test_leftovers_of_a_killed_copy_are_removed_at_start_up(start_sidecar, tmp_path):
    from rsm_sidecar.segment.journal import CopyJournal

    root, journal_dir = tmp_path / "remote", tmp_path / "journal"
    store = LocalObjectStore(root, fsync=False)
    # what a process killed between writing the data and the manifest leaves behind
    base = "tiered/orders-MWJ6FHTfRYy67jzwZdeqSQ/0/00000000000000000000-S000000000000000000031"
    killed = CopyJournal(journal_dir, store)
    killed.begin(base, "0" * 32)
    killed.close()  # the killed process's lock ends with it
    store.put(base + ".log", b"partial data")
    store.put(base + ".indexes", b"partial indexes")
    sc = start_sidecar(store=store, copy__journal_dir=str(journal_dir))
    # the first sweep runs beside serving (right after start-up), not before it; it deletes the
    # objects first and the journal entry after them, so wait for both
    journal = sc.sidecar.copier.journal
    deadline = time.monotonic() + 30
    while (sc.objects() or journal.pending()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sc.objects() == []
    assert journal.pending() == []
    import prometheus_client

    assert "rsm_copy_leftovers 0.0" in prometheus_client.generate_latest(sc.sidecar.metrics.registry).decode()


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16383, 16384, 1024 * 1024])
def test_fetch_responses_encoded_by_hand_are_what_protobuf_encodes(size):
    """FetchSegment's messages are serialized without a message object (one copy less per
    MiB); they must stay byte-identical to protobuf's encoding of the contract."""
    from rsm_sidecar.service.servicer import encode_fetch_response

    data = os.urandom(size)
    assert encode_fetch_response(memoryview(data)) == pb.FetchSegmentResponse(data=data).SerializeToString()
    assert pb.FetchSegmentResponse.FromString(encode_fetch_response(data)).data == data
