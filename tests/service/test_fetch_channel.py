"""The fetch channel (rsm.proto, "The fetch channel") against a real sidecar: byte-exact ranges
across chunk and segment boundaries over TCP, TCP + mTLS and the Unix socket, several exchanges
on one connection, every status a fetch can end with (before and after bytes went out), tampering
refused, a client that stops reading or goes away, and gRPC beside it on the same address."""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.service import fetch_channel
from tests.service.rsm_client import (
    FetchChannelClient,
    FetchChannelError,
    SegmentFilesOnDisk,
    metadata,
    seg_id,
)
from tests.service.test_resources import CHUNK, MAX_RANGE, PREFETCH, counted_sidecar

KiB = 1024
MiB = 1024 * KiB


def _copy(sc, tmp_path, n: int, log: bytes, start: int = 0, end: int = 99, partition: int = 0):
    files = SegmentFilesOnDisk(str(tmp_path / f"seg{n}"), log)
    md = metadata(seg_id(n), start, end, size=len(log), partition=partition)
    md.custom_metadata = sc.client.copy(files.stream_requests(md)).custom_metadata
    return md


def _closed_by_peer(sock) -> bool:
    """Whether the peer closed the connection (cleanly, or with a reset for bytes it left unread)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _metric(sc, name: str, **labels: str) -> float:
    return sc.sidecar.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("encryption", [False, True])
def test_ranges_are_byte_exact_across_chunks_and_exchanges_share_a_connection(
    start_sidecar, tmp_path, encryption
):
    sc = start_sidecar(encryption=encryption, segment__chunk_size=64 * KiB)
    log = os.urandom(700 * KiB) + b"z" * (300 * KiB + 123)  # chunks compress differently
    md = _copy(sc, tmp_path, 1, log)
    client = FetchChannelClient(sc.server.address)
    try:
        for start, end in (
            (0, None),
            (0, 0),
            (64 * KiB - 1, 64 * KiB),  # one byte each side of a chunk boundary
            (12345, 12345 + 3 * 64 * KiB),
            (len(log) - 1, None),
            (100_000, 10**9),  # end clamped to the segment's last byte
            (len(log), None),  # from the end: nothing
        ):
            data, done = client.fetch(md, start, end)
            want = log[start : (len(log) if end is None else end + 1)]
            assert data == want, (start, end)
            assert done.length == len(want) and done.code == 0
    finally:
        client.close()
    assert _metric(sc, "rsm_operations_total", op="fetch", outcome="OK") == 7


def test_indexes_come_over_the_channel_as_over_grpc(start_sidecar, tmp_path):
    sc = start_sidecar(encryption=True)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(5000), txn=False)
    md = metadata(seg_id(1), size=5000)
    md.custom_metadata = sc.client.copy(files.stream_requests(md)).custom_metadata
    client = FetchChannelClient(sc.server.address)
    try:
        for index_type, name in (
            (pb.OFFSET, "offset"),
            (pb.TIMESTAMP, "timestamp"),
            (pb.PRODUCER_SNAPSHOT, "producerSnapshot"),
        ):
            assert client.index(md, index_type) == files.indexes[name] == sc.client.index(md, index_type)
        assert client.index(md, pb.LEADER_EPOCH) == files.leader_epoch
        with pytest.raises(FetchChannelError) as e:  # no transaction index: NOT_FOUND, as the broker expects
            client.index(md, pb.TRANSACTION)
        assert e.value.status == grpc.StatusCode.NOT_FOUND.value and "transaction" in e.value.message
        with pytest.raises(FetchChannelError) as e:
            client.index(md, 99)
        assert e.value.status == grpc.StatusCode.INVALID_ARGUMENT.value
        assert client.fetch(md)[0] == open(files.log_path, "rb").read()  # and the connection serves on
    finally:
        client.close()
    assert _metric(sc, "rsm_operations_total", op="fetch_index", outcome="OK") >= 4


def test_the_range_that_ends_a_segment_names_the_next_one(start_sidecar, tmp_path):
    sc = start_sidecar(segment__chunk_size=64 * KiB)
    first = _copy(sc, tmp_path, 1, os.urandom(200 * KiB), 0, 99)
    second_log = os.urandom(150 * KiB)
    second = _copy(sc, tmp_path, 2, second_log, 100, 199)
    client = FetchChannelClient(sc.server.address)
    try:
        _, done = client.fetch(first, 100 * KiB, want_next_segment=True)
        assert done.next_segment.segment_id == second.segment_id
        assert done.next_segment.start_offset == 100 and done.next_segment.end_offset == 199
        assert done.next_segment.segment_size_in_bytes == len(second_log)
        _, done = client.fetch(first, 0, 1000, want_next_segment=True)  # not to the end: no name
        assert not done.HasField("next_segment")
        data, _ = client.fetch(done.next_segment if done.HasField("next_segment") else second, 0)
        assert data == second_log
    finally:
        client.close()


@pytest.mark.parametrize(
    "start,end,status",
    [
        (-1, None, grpc.StatusCode.INVALID_ARGUMENT),
        (10, 5, grpc.StatusCode.INVALID_ARGUMENT),
        (5001, None, grpc.StatusCode.OUT_OF_RANGE),
    ],
)
def test_refused_ranges_end_with_their_status_and_the_connection_goes_on(
    start_sidecar, tmp_path, start, end, status
):
    sc = start_sidecar()
    log = os.urandom(5000)
    md = _copy(sc, tmp_path, 1, log)
    client = FetchChannelClient(sc.server.address)
    try:
        with pytest.raises(FetchChannelError) as e:
            client.fetch(md, start, end)
        assert e.value.status == status.value and e.value.received == 0
        with pytest.raises(FetchChannelError) as e:
            client.fetch(metadata(seg_id(99), size=10))
        assert e.value.status == grpc.StatusCode.NOT_FOUND.value and "not found" in e.value.message
        assert client.fetch(md)[0] == log  # the same connection serves the next request
    finally:
        client.close()


def test_a_chunk_tampered_with_fails_the_read_after_the_bytes_before_it(start_sidecar, tmp_path):
    sc = start_sidecar(
        encryption=True, segment__chunk_size=64 * KiB, cache__chunk_bytes=0, cache__prefetch_bytes=0
    )
    log = os.urandom(5 * 64 * KiB)
    md = _copy(sc, tmp_path, 1, log)
    (key,) = [k for k in sc.objects() if k.endswith(".log")]
    path = sc.root / key
    stored = bytearray(path.read_bytes())
    stored[len(stored) * 3 // 5] ^= 0x01  # inside the fourth chunk
    path.write_bytes(bytes(stored))
    client = FetchChannelClient(sc.server.address)
    try:
        client.request(md)
        received = bytearray()
        end = None
        for kind, payload in client.frames():
            if kind == fetch_channel.DATA:
                received += payload
            else:
                end = pb.FetchEnd.FromString(payload)
        assert end is not None and end.code == grpc.StatusCode.DATA_LOSS.value[0]
        assert key in end.message and "chunk" in end.message
        assert end.length == len(received) and bytes(received) == log[: len(received)]  # never a wrong byte
        assert len(received) < 3 * 64 * KiB + 1
    finally:
        client.close()


def test_a_client_that_goes_away_stops_the_storage_reads(start_sidecar, tmp_path):
    store, sc, md = counted_sidecar(start_sidecar, tmp_path)
    client = FetchChannelClient(sc.server.address, receive_buffer=256 * KiB)
    client.request(md)
    kind, payload = next(client.frames())
    assert kind == fetch_channel.DATA and len(payload) > 0
    client.close()  # mid-range, unread bytes in its buffer: the sidecar's next write fails
    deadline = time.monotonic() + 10
    while _metric(sc, "rsm_operations_total", op="fetch", outcome="CANCELLED") < 1:
        assert time.monotonic() < deadline, "the sidecar did not notice the client went away"
        time.sleep(0.05)
    time.sleep(2)  # prefetches already submitted finish
    read = store.downloaded
    # one run, the prefetch window, and what the two sockets' buffers held: the sidecar's fixed
    # send buffer (doubled by Linux) and the client's receive buffer, each rounded up to a chunk
    bound = MAX_RANGE + PREFETCH + CHUNK + 28 * (64 * MiB // CHUNK)
    assert read <= bound, f"read {read / MiB:.1f} MiB after the client left (bound {bound / MiB:.1f})"
    time.sleep(1)
    assert store.downloaded == read, "storage reads continued after the client left"
    assert len(FetchChannelClient(sc.server.address).fetch(md)[0]) == 64 * MiB


def test_a_client_that_stops_reading_is_disconnected_after_the_idle_timeout(start_sidecar, tmp_path):
    sc = start_sidecar(segment__chunk_size=4 * MiB, segment__compression=False, fetch__idle_timeout_seconds=1)
    md = sc.client.copy_a_segment(tmp_path / "seg", 64 * MiB)
    client = FetchChannelClient(sc.server.address, receive_buffer=64 * KiB)
    client.request(md)  # and never read: the sidecar's writes block once the buffers are full
    deadline = time.monotonic() + 20
    while _metric(sc, "rsm_operations_total", op="fetch", outcome="CANCELLED") < 1:
        assert time.monotonic() < deadline, "a client that reads nothing was never disconnected"
        time.sleep(0.1)
    assert _metric(sc, "rsm_in_flight", op="fetch") == 0  # its slot is free
    client.close()


def test_a_request_beyond_the_fetch_slots_is_refused_at_once(start_sidecar, tmp_path):
    sc = start_sidecar(segment__chunk_size=4 * MiB, segment__compression=False, fetch__max_concurrent=1)
    md = sc.client.copy_a_segment(tmp_path / "seg", 64 * MiB)
    holder = FetchChannelClient(sc.server.address, receive_buffer=64 * KiB)
    holder.request(md)  # holds the one slot: it reads nothing
    next(holder.frames())
    other = FetchChannelClient(sc.server.address)
    try:
        t0 = time.monotonic()
        with pytest.raises(FetchChannelError) as e:
            other.fetch(md, 0, 1000)
        assert e.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED.value
        assert "fetch.max_concurrent" in e.value.message and time.monotonic() - t0 < 5
    finally:
        holder.close()
        other.close()


def test_malformed_requests_are_answered_or_the_connection_closed(start_sidecar, tmp_path):
    sc = start_sidecar()
    md = _copy(sc, tmp_path, 1, os.urandom(5000))
    client = FetchChannelClient(sc.server.address)
    try:
        client.sock.sendall(fetch_channel.FRAME_HEADER.pack(fetch_channel.REQUEST, 3) + b"\xff\xff\xff")
        ((kind, payload),) = list(client.frames())
        end = pb.FetchEnd.FromString(payload)
        assert end.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "malformed" in end.message
        assert _closed_by_peer(client.sock)  # and the connection is closed
    finally:
        client.close()
    client = FetchChannelClient(sc.server.address)
    try:
        client.sock.sendall(fetch_channel.FRAME_HEADER.pack(fetch_channel.DATA, 10) + b"x" * 10)
        assert _closed_by_peer(client.sock)  # not a request frame: closed
    finally:
        client.close()
    assert FetchChannelClient(sc.server.address).fetch(md)[0]  # the sidecar serves on


def test_the_unix_socket_serves_gRPC_and_the_fetch_channel(start_sidecar, tmp_path):
    sock = tmp_path / "s" / "rsm.sock"
    sc = start_sidecar(server__listen=f"unix://{sock}")
    log = os.urandom(300 * KiB)
    md = _copy(sc, tmp_path, 1, log)
    assert sc.client.fetch(md) == log  # gRPC
    assert FetchChannelClient(f"unix://{sock}").fetch(md, 7)[0] == log[7:]
    assert oct(sock.stat().st_mode & 0o777) == "0o600"


def test_concurrent_connections_read_their_own_bytes(start_sidecar, tmp_path):
    sc = start_sidecar(encryption=True, segment__chunk_size=256 * KiB)
    logs = [os.urandom(3 * MiB + i * 1000) for i in range(4)]
    mds = [_copy(sc, tmp_path, i + 1, log, partition=i) for i, log in enumerate(logs)]
    errors: list[BaseException] = []

    def reader(i: int) -> None:
        try:
            client = FetchChannelClient(sc.server.address)
            for start in range(0, len(logs[i]), 700 * KiB):
                assert client.fetch(mds[i], start, start + MiB)[0] == logs[i][start : start + MiB + 1]
            client.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(i % 4,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_a_stopping_sidecar_ends_exchanges_in_flight_and_closes_idle_connections(start_sidecar, tmp_path):
    """SIGTERM's drain (fetch_channel.FetchChannel.drain): the range in flight arrives whole, a
    connection between exchanges is closed at once, a new one is refused; stop waits for the range."""
    sc = start_sidecar(segment__chunk_size=4 * MiB, segment__compression=False)
    md = sc.client.copy_a_segment(tmp_path / "seg", 64 * MiB)
    busy = FetchChannelClient(sc.server.address, receive_buffer=256 * KiB)
    idle = FetchChannelClient(sc.server.address)
    try:
        assert len(idle.fetch(md, 0, 9)[0]) == 10  # one exchange done: now between exchanges
        busy.request(md)
        frames = busy.frames()
        kind, first = next(frames)
        assert kind == fetch_channel.DATA
        stopper = threading.Thread(target=sc.server.stop, kwargs={"grace": 30})
        stopper.start()
        idle.sock.settimeout(10)
        assert _closed_by_peer(idle.sock), "the idle connection was not closed"
        with pytest.raises(OSError):  # refused (the listener stopped), not relayed to a draining server
            FetchChannelClient(sc.server.address, timeout=5)
        # 64 MiB cannot have fit in the sockets' buffers: the range is still in flight, and stop waits
        assert stopper.is_alive(), "stop returned before the range in flight ended"
        got = len(first)
        for kind, payload in frames:
            if kind == fetch_channel.DATA:
                got += len(payload)
            else:
                done = pb.FetchEnd.FromString(payload)
                assert (done.code, done.length) == (0, 64 * MiB), done
        assert got == 64 * MiB
        stopper.join(30)
        assert not stopper.is_alive(), "stop did not return once the range ended"
    finally:
        busy.close()
        idle.close()


def test_a_range_still_in_flight_after_the_grace_is_cut_never_failed(start_sidecar, tmp_path):
    """Past ``server.shutdown_grace_seconds`` the drain cuts the connection: the client sees a broken
    stream, which the shim resumes on the restarted sidecar, never an error status, which would fail
    the broker's read."""
    sc = start_sidecar(segment__chunk_size=4 * MiB, segment__compression=False)
    md = sc.client.copy_a_segment(tmp_path / "seg", 64 * MiB)
    client = FetchChannelClient(sc.server.address, receive_buffer=64 * KiB)
    try:
        client.request(md)
        frames = client.frames()
        assert next(frames)[0] == fetch_channel.DATA
        t0 = time.monotonic()
        sc.server.stop(grace=1)  # the client reads nothing meanwhile
        stopped = time.monotonic() - t0
        assert 1 <= stopped < 10, f"stop took {stopped:.1f} s with a grace of 1 s"
        with pytest.raises((fetch_channel.ConnectionLost, ConnectionError, OSError)):
            for kind, payload in frames:
                assert kind == fetch_channel.DATA, pb.FetchEnd.FromString(payload)
    finally:
        client.close()
