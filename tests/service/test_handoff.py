"""Fetch hand-off against the real gRPC server on a real Unix socket: a fetch that accepts it
gets one ``HandoffFile`` naming a file in ``<socket>.handoff/`` with exactly the requested
bytes; TCP, old clients and large ranges stream as before; an unsafe directory turns it off;
a failed write falls back to streaming; nothing is left behind."""

from __future__ import annotations

import logging
import os
import stat
import time

import grpc
import pytest

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.format import custom_metadata as cm
from rsm_sidecar.service import handoff as handoff_module
from tests.service.rsm_client import Client, SegmentFilesOnDisk, metadata, seg_id

KiB, MiB = 1024, 1024 * 1024


def _copy(running, tmp_path, n: int = 1, size: int = 3 * MiB + 4321):
    seg = SegmentFilesOnDisk(str(tmp_path / f"seg{n}"), log_size=size)
    md = metadata(seg_id(n), size=seg.log_size)
    running.client.copy(seg.path_request(md))
    md.state = pb.COPY_SEGMENT_FINISHED
    with open(seg.log_path, "rb") as f:
        return md, f.read()


def _fetch(client: Client, md, start: int, end: int | None, accept: bool) -> list[pb.FetchSegmentResponse]:
    req = pb.FetchSegmentRequest(metadata=md, start_position=start, accept_handoff=accept)
    if end is not None:
        req.end_position = end
    return list(client.stub.FetchSegment(req, timeout=30))


def _counter(running, kind: str) -> float:
    return running.sidecar.metrics.bytes.labels(kind)._value.get()


@pytest.fixture
def unix_sidecar(start_sidecar, tmp_path):
    def start(**overrides):
        sock = tmp_path / "run" / "rsm.sock"
        return start_sidecar(encryption=True, server__listen=f"unix://{sock}", **overrides), sock

    return start


def test_a_fetch_that_accepts_hand_off_gets_one_file_with_exactly_the_range(unix_sidecar, tmp_path):
    running, sock = unix_sidecar()
    md, data = _copy(running, tmp_path)
    d = sock.parent / "rsm.sock.handoff"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for start, end in ((0, MiB - 1), (123_457, 123_457 + 1_114_111), (len(data) - 999, None), (5, 5)):
        msgs = _fetch(running.client, md, start, end, accept=True)
        assert len(msgs) == 1 and msgs[0].HasField("handoff") and not msgs[0].data
        h = msgs[0].handoff
        path = d / h.name
        assert "/" not in h.name and stat.S_IMODE(path.stat().st_mode) == 0o600
        want = data[start : (end + 1 if end is not None else len(data))]
        assert h.length == len(want) and path.read_bytes() == want
        path.unlink()  # as the shim does once it has the file open
    assert list(d.iterdir()) == []
    assert _counter(running, "fetch_handoff") == _counter(running, "fetch_served") > 2 * MiB


def test_old_clients_tcp_and_ranges_beyond_the_limit_stream_as_before(start_sidecar, unix_sidecar, tmp_path):
    running, sock = unix_sidecar(fetch__handoff_max_bytes=512 * KiB)
    md, data = _copy(running, tmp_path)
    # an old client (no accept_handoff), and a range beyond fetch.handoff_max_bytes
    for start, end, accept in ((0, 400_000, False), (0, 600_000, True)):
        msgs = _fetch(running.client, md, start, end, accept)
        assert not any(m.HasField("handoff") for m in msgs)
        assert b"".join(m.data for m in msgs) == data[start : end + 1]
    assert list((sock.parent / "rsm.sock.handoff").iterdir()) == []
    # over TCP there is no hand-off directory and a client asking for hand-off gets data
    tcp = start_sidecar(encryption=True, storage__local={"root": str(running.root), "fsync": False})
    msgs = _fetch(tcp.client, md, 0, 300_000, accept=True)
    assert not any(m.HasField("handoff") for m in msgs)
    assert b"".join(m.data for m in msgs) == data[:300_001]
    assert tcp.server.servicer.handoff is None


@pytest.mark.parametrize("unsafe", ["group_writable", "symlink", "file"])
def test_an_unsafe_hand_off_directory_turns_it_off_with_a_warning(unix_sidecar, tmp_path, caplog, unsafe):
    d = tmp_path / "run" / "rsm.sock.handoff"
    d.parent.mkdir(parents=True)
    if unsafe == "group_writable":
        d.mkdir()
        os.chmod(d, 0o770)
    elif unsafe == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        d.symlink_to(tmp_path / "elsewhere")
    else:
        d.write_bytes(b"not a directory")
    with caplog.at_level(logging.WARNING, logger="rsm_sidecar.service.handoff"):
        running, _ = unix_sidecar()
    assert running.server.servicer.handoff is None
    assert "fetch hand-off is off" in caplog.text and str(d) in caplog.text
    md, data = _copy(running, tmp_path)
    msgs = _fetch(running.client, md, 0, MiB, accept=True)
    assert b"".join(m.data for m in msgs) == data[: MiB + 1]


def test_leftovers_are_removed_at_start_up_and_stale_files_while_serving(unix_sidecar, tmp_path):
    d = tmp_path / "run" / "rsm.sock.handoff"
    d.mkdir(parents=True, mode=0o700)
    (d / "left-by-a-killed-sidecar").write_bytes(b"x" * 1000)
    running, _ = unix_sidecar()
    assert list(d.iterdir()) == []
    md, _ = _copy(running, tmp_path)
    # a client that never opens its file (cancelled, died): removed after STALE_SECONDS
    name = _fetch(running.client, md, 0, 1000, accept=True)[0].handoff.name
    old = time.time() - handoff_module.STALE_SECONDS - 5
    os.utime(d / name, (old, old))
    fresh = _fetch(running.client, md, 0, 1000, accept=True)[0].handoff.name
    assert sorted(p.name for p in d.iterdir()) == [fresh]


def test_a_failed_hand_off_write_streams_the_bytes_instead(unix_sidecar, tmp_path, caplog):
    running, sock = unix_sidecar()
    md, data = _copy(running, tmp_path)
    d = sock.parent / "rsm.sock.handoff"
    os.rmdir(d)  # someone removed the directory while the sidecar runs: every create fails
    with caplog.at_level(logging.WARNING, logger="rsm_sidecar.service.handoff"):
        for _ in range(2):
            msgs = _fetch(running.client, md, 1000, 1000 + MiB, accept=True)
            assert not any(m.HasField("handoff") for m in msgs)
            assert b"".join(m.data for m in msgs) == data[1000 : 1001 + MiB]
    assert caplog.text.count("fetch hand-off failed") == 1  # said once
    assert not d.exists()


def test_a_fetch_error_is_reported_not_handed_off(unix_sidecar, tmp_path):
    running, sock = unix_sidecar()
    md, _ = _copy(running, tmp_path)
    for key in running.objects():
        if key.endswith(".log"):
            p = running.root / key
            stored = bytearray(p.read_bytes())
            stored[1000] ^= 1  # a flipped bit in the first chunk: its GCM tag no longer matches
            p.write_bytes(bytes(stored))
    with pytest.raises(grpc.RpcError) as e:
        _fetch(running.client, md, 0, 2 * MiB, accept=True)
    assert e.value.code() == grpc.StatusCode.DATA_LOSS
    assert list((sock.parent / "rsm.sock.handoff").iterdir()) == []


def test_a_client_that_never_deletes_its_files_cannot_fill_the_host(unix_sidecar, tmp_path, caplog):
    # 4 concurrent fetches of at most 256 KiB: at most 1 MiB and 8 files may wait for clients
    running, sock = unix_sidecar(fetch__max_concurrent=4, fetch__handoff_max_bytes=256 * KiB)
    md, data = _copy(running, tmp_path)
    d = sock.parent / "rsm.sock.handoff"
    handed = 0
    with caplog.at_level(logging.WARNING, logger="rsm_sidecar.service.handoff"):
        for i in range(20):
            start = i * 100_000
            msgs = _fetch(running.client, md, start, start + 200_000 - 1, accept=True)
            if msgs[0].HasField("handoff"):
                handed += 1
            else:  # no room: the bytes stream over gRPC, still exactly the range
                assert b"".join(m.data for m in msgs) == data[start : start + 200_000]
    assert handed == 5  # 5 x 200,000 bytes fit in 1 MiB, the 6th would not
    assert sum(p.stat().st_size for p in d.iterdir()) <= 1 * MiB and len(list(d.iterdir())) == 5
    assert "wait in" in caplog.text
    for p in d.iterdir():  # the client finally opens them: hand-off resumes
        p.unlink()
    assert _fetch(running.client, md, 0, 199_999, accept=True)[0].HasField("handoff")


def _copy_at(running, tmp_path, n: int, first: int, size: int, partition: int = 0):
    """Segment ``seg_id(n)`` of ``partition`` holding offsets ``first..first + 99``."""
    files = SegmentFilesOnDisk(str(tmp_path / f"seg{n}"), log_size=size)
    md = metadata(seg_id(n), first, first + 99, size=size, partition=partition)
    running.client.copy(files.path_request(md))
    with open(files.log_path, "rb") as f:
        return md, f.read()


def _handed_off(running, sock, md, start: int, end: int | None, want: bool = True) -> pb.FetchSegmentResponse:
    """One hand-off fetch asking ``want_next_segment``; checks and removes the file."""
    req = pb.FetchSegmentRequest(
        metadata=md, start_position=start, accept_handoff=True, want_next_segment=want
    )
    if end is not None:
        req.end_position = end
    (msg,) = list(running.client.stub.FetchSegment(req, timeout=30))
    assert msg.HasField("handoff")
    path = sock.parent / "rsm.sock.handoff" / msg.handoff.name
    assert path.stat().st_size == msg.handoff.length
    path.unlink()
    return msg


def test_a_range_to_the_segments_end_names_the_next_segment_when_asked(unix_sidecar, tmp_path):
    """``want_next_segment``: a hand-off that ends at the segment's end names the partition's
    next stored segment, with what a fetch of it needs, and that fetch returns its bytes. No
    name for a range short of the end, without the flag, after the last segment, when two
    segments start at the next offset, or when the one there has a planted manifest."""
    running, sock = unix_sidecar()
    md1, data1 = _copy_at(running, tmp_path, 1, 0, MiB + 17)
    md2, data2 = _copy_at(running, tmp_path, 2, 100, MiB + 34)
    _copy_at(running, tmp_path, 3, 100, 4321, partition=1)  # another partition, same offset
    tail = len(data1) - 1000

    hint = _handed_off(running, sock, md1, tail, None).next_segment
    assert (hint.topic_id, hint.topic_name, hint.partition) == (md2.topic_id, md2.topic_name, md2.partition)
    assert (hint.segment_id, hint.start_offset, hint.end_offset) == (seg_id(2), 100, 199)
    assert hint.segment_size_in_bytes == len(data2) and not hint.HasField("custom_metadata")
    assert running.client.fetch(hint) == data2  # the hint is enough to read that segment
    assert _handed_off(running, sock, md1, tail, len(data1) - 1).HasField("next_segment")  # an explicit end

    assert not _handed_off(running, sock, md1, 0, len(data1) - 2).HasField("next_segment")  # short of the end
    assert not _handed_off(running, sock, md1, tail, None, want=False).HasField("next_segment")
    assert not _handed_off(running, sock, md2, 0, None).HasField("next_segment")  # the last one

    # partition 2: two segments start at offset 100 (two leaders' copies): which is next is unknown
    md4, data4 = _copy_at(running, tmp_path, 4, 0, 5000, partition=2)
    _copy_at(running, tmp_path, 5, 100, 999, partition=2)
    _copy_at(running, tmp_path, 6, 100, 998, partition=2)
    assert not _handed_off(running, sock, md4, 0, None).HasField("next_segment")

    # partition 3: someone who can write the bucket plants a manifest at offset 100
    md7, _ = _copy_at(running, tmp_path, 7, 0, 5000, partition=3)
    real = next(p for p in (tmp_path / "remote").rglob("*.rsm-manifest") if seg_id(7) in p.name)
    planted = real.with_name(real.name.replace(f"{0:020d}-{seg_id(7)}", f"{100:020d}-{seg_id(8)}"))
    planted.write_bytes(real.read_bytes())  # a valid manifest, of another segment
    assert not _handed_off(running, sock, md7, 0, None).HasField("next_segment")
    assert list((sock.parent / "rsm.sock.handoff").iterdir()) == []


def test_a_streamed_range_to_the_segments_end_names_the_next_segment_in_a_last_message(
    start_sidecar, tmp_path
):
    """Over TCP (no hand-off) the shim reads ahead in gRPC messages: a streamed range that ends
    at the segment's end, asked with ``want_next_segment``, ends with one message naming the next
    segment and holding no data; without the flag, or short of the end, no such message."""
    running = start_sidecar(encryption=True)
    md1, data1 = _copy_at(running, tmp_path, 1, 0, MiB + 17)
    _copy_at(running, tmp_path, 2, 100, 4321)
    tail = 1000  # a range of more than one message

    def streamed(end: int | None, want: bool = True) -> list[pb.FetchSegmentResponse]:
        req = pb.FetchSegmentRequest(metadata=md1, start_position=tail, want_next_segment=want)
        if end is not None:
            req.end_position = end
        return list(running.client.stub.FetchSegment(req, timeout=30))

    msgs = streamed(None)
    assert b"".join(m.data for m in msgs) == data1[tail:]
    assert [m.HasField("next_segment") for m in msgs] == [False] * (len(msgs) - 1) + [True]
    assert msgs[-1].data == b"" and msgs[-1].next_segment.segment_id == seg_id(2)
    assert msgs[-1].next_segment.segment_size_in_bytes == 4321
    assert not any(m.HasField("next_segment") for m in streamed(None, want=False))
    assert not any(m.HasField("next_segment") for m in streamed(len(data1) - 2))


def test_a_next_segment_under_an_older_key_prefix_is_named_with_that_prefix(start_sidecar, tmp_path):
    """Segments copied under an older ``storage.key_prefix``: the name of the next one carries
    its prefix in custom metadata, as the broker's metadata of it does, so a fetch by that name
    finds its objects under the new configuration. A key there that does not name the segment
    its manifest holds is not named."""
    writer = start_sidecar(encryption=True, storage__key_prefix="old/")
    segs = []
    for n, first in ((1, 0), (2, 100)):
        files = SegmentFilesOnDisk(str(tmp_path / f"seg{n}"), log_size=300_000 + n)
        md = metadata(seg_id(n), first, first + 99, size=files.log_size)
        md.custom_metadata = writer.client.copy(files.path_request(md)).custom_metadata
        with open(files.log_path, "rb") as f:
            segs.append((md, f.read()))
    (md1, data1), (md2, data2) = segs
    files3 = SegmentFilesOnDisk(str(tmp_path / "seg3"), log_size=5000)
    writer.client.copy(files3.path_request(metadata(seg_id(3), 200, 299, size=5000)))
    # someone who can write the bucket moves segment 3's manifest to another segment's name
    real = next(p for p in (tmp_path / "remote").rglob("*.rsm-manifest") if seg_id(3) in p.name)
    real.rename(real.with_name(real.name.replace(seg_id(3), seg_id(9))))

    sock = tmp_path / "run" / "rsm.sock"
    reader = start_sidecar(encryption=True, storage__key_prefix="new/", server__listen=f"unix://{sock}")
    hint = _handed_off(reader, sock, md1, 0, None).next_segment
    assert hint.segment_id == seg_id(2) and hint.HasField("custom_metadata")
    assert cm.decode(hint.custom_metadata) == {cm.OBJECT_PREFIX: "old/"}
    assert reader.client.fetch(hint) == data2
    # the one key at offset 200 names segment 9, its manifest holds segment 3: no name
    md2.custom_metadata = hint.custom_metadata
    assert not _handed_off(reader, sock, md2, 0, None).HasField("next_segment")
