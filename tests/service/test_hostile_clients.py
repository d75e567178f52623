"""A client that reaches the port and lies, through the real gRPC service: it must not
read host files, reach other topics' objects, exhaust the server, or get anything but a
precise status for malformed requests (issue 10, items 5, 6, 11, 12, 13, 16)."""

from __future__ import annotations

import logging
import os
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.format import custom_metadata as cm
from tests.service.rsm_client import SegmentFilesOnDisk, metadata, seg_id

KiB = 1024


def _err(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def _path_copy(sc, md, log_path: str, files: SegmentFilesOnDisk):
    f = files.files(True)
    f.log_path = log_path
    return sc.client.copy(
        iter(
            [
                pb.CopySegmentRequest(
                    begin=pb.CopyBegin(
                        metadata=md, mode=pb.PATH, files=f, leader_epoch_checkpoint=files.leader_epoch
                    )
                )
            ]
        ),
        timeout=20,
    )


# -- item 5: path mode reads only regular files under the broker's log directories -------------
def test_path_mode_is_disabled_unless_allowed_dirs_names_the_log_dirs(start_sidecar, tmp_path):
    sc = start_sidecar(copy__allowed_dirs=[])
    files = SegmentFilesOnDisk(str(tmp_path / "logs" / "t-0"), os.urandom(KiB))
    e = _err(lambda: sc.client.copy(files.path_request(metadata(seg_id(1), size=KiB))))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "copy.allowed_dirs is empty" in e.details()
    assert sc.objects() == []


def test_path_mode_refuses_host_files_symlinks_dotdot_devices_fifos_and_directories(start_sidecar, tmp_path):
    logs = tmp_path / "logs"
    files = SegmentFilesOnDisk(str(logs / "t-0"), os.urandom(KiB))
    secret = tmp_path / "secret.pem"
    secret.write_bytes(b"-----BEGIN PRIVATE KEY-----\n" + os.urandom(100))
    (logs / "t-0" / "link.log").symlink_to(secret)
    (logs / "t-0" / "zero.log").symlink_to("/dev/zero")
    os.mkfifo(logs / "t-0" / "fifo.log")
    sc = start_sidecar(copy__allowed_dirs=[str(logs)])
    md = metadata(seg_id(2), size=KiB)
    cases = {
        str(secret): "outside copy.allowed_dirs",
        "/etc/passwd": "outside copy.allowed_dirs",
        str(logs / "t-0" / "link.log"): "outside copy.allowed_dirs",
        str(logs / "t-0" / ".." / ".." / "secret.pem"): "outside copy.allowed_dirs",
        str(logs / "t-0" / "zero.log"): "outside copy.allowed_dirs",
        str(logs / "t-0" / "fifo.log"): "not a regular file",
        str(logs / "t-0"): "not a regular file",
        str(logs / "t-0" / "x\x00.log"): "not an absolute path",
        "relative/00.log": "not an absolute path",
    }
    for path, why in cases.items():
        t0 = time.monotonic()
        e = _err(lambda path=path: _path_copy(sc, md, path, files))
        assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), (path, e)
        assert why in e.details(), (path, e.details())
        assert time.monotonic() - t0 < 5, f"{path}: the server blocked"
    assert sc.objects() == []
    sc.client.copy(files.path_request(md))  # the real log directory still works
    assert sc.client.fetch(md) == open(files.log_path, "rb").read()


# -- item 6: custom metadata cannot steer keys into another topic -----------------------------
def test_custom_metadata_cannot_reach_another_topics_objects(start_sidecar, tmp_path):
    sc = start_sidecar()
    files = SegmentFilesOnDisk(str(tmp_path / "v"), os.urandom(10 * KiB))
    victim = metadata(seg_id(3), size=10 * KiB, topic="victim", topic_id="AAAAAAAAAAAAAAAAAAAAAA")
    sc.client.copy(files.stream_requests(victim))
    victim_keys = sc.objects()
    base = victim_keys[0].rsplit(".", 1)[0]
    prefix = base.rsplit("/", 1)[0] + "/"
    refused = [
        {cm.OBJECT_KEY: base.split("/", 0)[0]},
        {cm.OBJECT_KEY: base.rsplit("/", 3)[1] + "/" + "x"},
        {cm.OBJECT_PREFIX: "../" + prefix},
        {cm.OBJECT_PREFIX: "/" + prefix},
        {cm.OBJECT_KEY: "../../" + base},
        {cm.OBJECT_PREFIX: "a/./b/"},
    ]
    for fields in refused:
        md = metadata(
            seg_id(3), topic="attacker", topic_id="BBBBBBBBBBBBBBBBBBBBBB", custom=cm.encode(fields)
        )
        for call in (lambda md=md: sc.client.delete(md), lambda md=md: sc.client.fetch(md)):
            e = _err(call)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (fields, e.details())
    # a clean prefix is the client's to choose (segments stay readable after storage.key_prefix
    # changes), but the key under it always names the request's own topic and segment
    md = metadata(
        seg_id(3),
        topic="attacker",
        topic_id="BBBBBBBBBBBBBBBBBBBBBB",
        custom=cm.encode({cm.OBJECT_PREFIX: prefix}),
    )
    sc.client.delete(md)
    assert _err(lambda: sc.client.fetch(md)).code() == grpc.StatusCode.NOT_FOUND
    assert sc.objects() == victim_keys
    assert sc.client.fetch(victim) == open(files.log_path, "rb").read()


# -- item 11: stalled copies cannot starve the server -----------------------------------------
def _stalled(files, md, stop: threading.Event):
    requests = files.stream_requests(md, piece=4 * KiB)
    yield next(requests)
    yield next(requests)
    stop.wait(60)


def test_stalled_copies_get_resource_exhausted_and_time_out_while_health_and_fetch_answer(
    start_sidecar, tmp_path, caplog
):
    sc = start_sidecar(copy__max_concurrent=2, copy__idle_timeout_seconds=6)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(64 * KiB))
    ok = metadata(seg_id(10), size=64 * KiB)
    sc.client.copy(files.stream_requests(ok))
    stop = threading.Event()
    outcomes = []

    def stalled(n):
        try:
            sc.client.copy(_stalled(files, metadata(seg_id(20 + n), size=64 * KiB), stop))
            outcomes.append("OK")
        except grpc.RpcError as e:
            outcomes.append((e.code(), e.details()))

    threads = [threading.Thread(target=stalled, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    time.sleep(1)
    e = _err(lambda: sc.client.copy(files.stream_requests(metadata(seg_id(30), size=64 * KiB))))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "copy.max_concurrent" in e.details()
    health = health_pb2_grpc.HealthStub(sc.client.channel)
    assert (
        health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    assert sc.client.fetch(ok, timeout=5) == open(files.log_path, "rb").read()
    assert outcomes == [], "health and fetch were answered only after the stalled copies ended"
    for t in threads:
        t.join(20)
    stop.set()
    # the server cancels an idle stream (a stalled client cannot be sent a status while the
    # server waits for its next message); the log names the setting
    assert len(outcomes) == 2 and all(o[0] == grpc.StatusCode.CANCELLED for o in outcomes), outcomes
    deadline = time.monotonic() + 10
    while True:
        timeouts = [r for r in caplog.records if "copy.idle_timeout_seconds" in r.getMessage()]
        if len(timeouts) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(timeouts) == 2 and all(r.levelno == logging.WARNING for r in timeouts)
    sc.client.copy(files.stream_requests(metadata(seg_id(31), size=64 * KiB)))  # the slots are free again
    assert [k for k in sc.objects() if seg_id(20) in k or seg_id(21) in k] == []


# -- item 12: the longest topic names Kafka allows ---------------------------------------------
@pytest.mark.parametrize("length", [232, 233, 249])
def test_topics_up_to_249_characters_are_tiered_on_local_storage(start_sidecar, tmp_path, length):
    sc = start_sidecar(copy__journal_dir=str(tmp_path / "journal"))
    topic = ("t" * length)[:length]
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(10 * KiB))
    md = metadata(seg_id(40), size=10 * KiB, topic=topic)
    sc.client.copy(files.stream_requests(md))
    assert sc.client.fetch(md) == files_bytes(files)
    assert sc.sidecar.copier.journal.pending() == []
    assert all(len(part.encode()) <= 255 for k in sc.objects() for part in k.split("/"))
    sc.client.delete(md)
    assert sc.objects() == []


def files_bytes(files) -> bytes:
    return open(files.log_path, "rb").read()


# -- item 13: precise status codes for malformed requests -------------------------------------
def test_malformed_requests_get_invalid_argument_not_internal(start_sidecar, tmp_path):
    sc = start_sidecar()
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(10 * KiB))
    md = metadata(seg_id(50), size=10 * KiB)
    sc.client.copy(files.stream_requests(md))
    e = _err(lambda: sc.client.index(md, 77))  # an IndexType this server does not know
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = [
        metadata(seg_id(50), custom=b"\x07garbage"),
        metadata(seg_id(50) + "\n"),
        metadata(seg_id(50), topic="."),
        metadata(seg_id(50), topic=".."),
        metadata(seg_id(50), topic="x" * 100_000),
    ]
    for m in bad:
        for call in (lambda m=m: sc.client.fetch(m), lambda m=m: sc.client.delete(m)):
            e = _err(call)
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (m.topic_name[:20], e.code(), e.details())
            assert len(e.details()) < 2100
    # bytes that are not a valid message at all (a string field with invalid UTF-8)
    raw = pb.DeleteSegmentRequest(metadata=metadata(seg_id(50), topic="QQ")).SerializeToString()
    delete = sc.client.channel.unary_unary("/rsm.v1.RemoteStorage/DeleteSegment")
    e = _err(lambda: delete(raw.replace(b"QQ", b"\xff\xfe"), timeout=10))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sc.client.fetch(md) == files_bytes(files)


def test_a_truncated_indexes_object_is_data_loss(start_sidecar, tmp_path):
    sc = start_sidecar(encryption=True)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(10 * KiB))
    md = metadata(seg_id(51), size=10 * KiB)
    sc.client.copy(files.stream_requests(md))
    key = next(k for k in sc.objects() if k.endswith(".indexes"))
    sc.store.put(key, sc.store.get(key)[:100])
    e = _err(lambda: sc.client.index(md, pb.TRANSACTION))
    assert e.code() == grpc.StatusCode.DATA_LOSS and seg_id(51) in e.details()


# -- item 16: routine failures are one WARN line; the real cause reaches the client ------------
def test_a_client_that_disconnects_mid_copy_is_one_warning_without_traceback(start_sidecar, tmp_path, caplog):
    sc = start_sidecar(copy__journal_dir=str(tmp_path / "journal"))
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(256 * KiB))
    md = metadata(seg_id(60), size=256 * KiB)
    caplog.set_level(logging.INFO)
    stop = threading.Event()
    call = sc.client.stub.CopySegment.future(_stalled(files, md, stop), timeout=60)
    time.sleep(0.5)
    call.cancel()  # the broker goes away
    stop.set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        "copy" in r.getMessage() and r.levelno >= logging.WARNING for r in caplog.records
    ):
        time.sleep(0.1)
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert problems and all(r.levelno == logging.WARNING and r.exc_info is None for r in problems), [
        (r.levelname, r.getMessage()) for r in problems
    ]
    assert any(seg_id(60) in r.getMessage() for r in problems)
    assert sc.objects() == [] and sc.sidecar.copier.journal.pending() == []


def test_a_temp_file_that_cannot_be_removed_does_not_hide_the_real_error(
    start_sidecar, tmp_path, caplog, monkeypatch
):
    """The copy fails for a reason of its own (the client sends fewer bytes than it
    declared) and removing the aborted upload's temp file fails too. A filesystem cannot be
    made to refuse one unlink to root, so os.unlink is replaced for this test only."""
    import rsm_sidecar.storage.local as local

    real_unlink = os.unlink

    def failing_unlink(path, *a, **kw):
        if str(path).endswith(".part"):
            raise OSError(5, "Input/output error")
        return real_unlink(path, *a, **kw)

    sc = start_sidecar()
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(300 * KiB))
    md = metadata(seg_id(61), size=400 * KiB)  # declares more than it sends
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(local.os, "unlink", failing_unlink)
    reqs = list(files.stream_requests(md))
    reqs[0].begin.files.log_size = 400 * KiB
    e = _err(lambda: sc.client.copy(iter(reqs)))
    monkeypatch.setattr(local.os, "unlink", real_unlink)
    assert e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT), e.details()
    assert "307200 of 409600 bytes" in e.details(), e.details()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert any(
        "could not remove the temp file" in r.getMessage() and r.levelno == logging.WARNING
        for r in caplog.records
    )
    assert sc.store.remove_leftovers() == 1  # the periodic sweep removes it later
