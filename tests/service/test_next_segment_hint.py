"""``want_next_segment`` (rsm.proto): a range that ends at its segment's end names the partition's
next stored segment, with what a fetch of it needs, over the fetch channel (in its 'E' frame) and
over gRPC (a last message without data); never a guess that storage cannot back (two candidates,
a planted manifest, a key that names another segment than its manifest holds)."""

from __future__ import annotations

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.format import custom_metadata as cm
from tests.service.rsm_client import FetchChannelClient, SegmentFilesOnDisk, metadata, seg_id

MiB = 1024 * 1024


def _copy_at(running, tmp_path, n: int, first: int, size: int, partition: int = 0):
    """Segment ``seg_id(n)`` of ``partition`` holding offsets ``first..first + 99``."""
    files = SegmentFilesOnDisk(str(tmp_path / f"seg{n}"), log_size=size)
    md = metadata(seg_id(n), first, first + 99, size=size, partition=partition)
    md.custom_metadata = running.client.copy(files.path_request(md)).custom_metadata
    with open(files.log_path, "rb") as f:
        return md, f.read()


def _named(client: FetchChannelClient, md, start: int, end: int | None, want: bool = True) -> pb.FetchEnd:
    """One range over the fetch channel asking ``want_next_segment``: its end frame."""
    return client.fetch(md, start, end, want_next_segment=want)[1]


def test_a_range_to_the_segments_end_names_the_next_segment_when_asked(start_sidecar, tmp_path):
    """No name for a range short of the end, without the flag, after the last segment, when two
    segments start at the next offset, or when the one there has a planted manifest."""
    running = start_sidecar(encryption=True)
    md1, data1 = _copy_at(running, tmp_path, 1, 0, MiB + 17)
    md2, data2 = _copy_at(running, tmp_path, 2, 100, MiB + 34)
    _copy_at(running, tmp_path, 3, 100, 4321, partition=1)  # another partition, same offset
    tail = len(data1) - 1000
    client = FetchChannelClient(running.server.address)
    try:
        hint = _named(client, md1, tail, None).next_segment
        assert (hint.topic_id, hint.topic_name, hint.partition) == (
            md2.topic_id,
            md2.topic_name,
            md2.partition,
        )
        assert (hint.segment_id, hint.start_offset, hint.end_offset) == (seg_id(2), 100, 199)
        assert hint.segment_size_in_bytes == len(data2) and not hint.HasField("custom_metadata")
        assert client.fetch(hint)[0] == data2  # the hint is enough to read that segment
        assert _named(client, md1, tail, len(data1) - 1).HasField("next_segment")  # an explicit end

        assert not _named(client, md1, 0, len(data1) - 2).HasField("next_segment")  # short of the end
        assert not _named(client, md1, tail, None, want=False).HasField("next_segment")
        assert not _named(client, md2, 0, None).HasField("next_segment")  # the last one

        # partition 2: two segments start at offset 100 (two leaders' copies): which is next is unknown
        md4, _ = _copy_at(running, tmp_path, 4, 0, 5000, partition=2)
        _copy_at(running, tmp_path, 5, 100, 999, partition=2)
        _copy_at(running, tmp_path, 6, 100, 998, partition=2)
        assert not _named(client, md4, 0, None).HasField("next_segment")

        # partition 3: someone who can write the bucket plants a manifest at offset 100
        md7, _ = _copy_at(running, tmp_path, 7, 0, 5000, partition=3)
        real = next(p for p in (tmp_path / "remote").rglob("*.rsm-manifest") if seg_id(7) in p.name)
        planted = real.with_name(real.name.replace(f"{0:020d}-{seg_id(7)}", f"{100:020d}-{seg_id(8)}"))
        planted.write_bytes(real.read_bytes())  # a valid manifest, of another segment
        assert not _named(client, md7, 0, None).HasField("next_segment")
    finally:
        client.close()


def test_a_streamed_range_to_the_segments_end_names_the_next_segment_in_a_last_message(
    start_sidecar, tmp_path
):
    """Over gRPC (a shim talking to a sidecar without the fetch channel, or an older shim): the
    range ends with one message naming the next segment and holding no data; without the flag, or
    short of the end, no such message."""
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
    (md1, _), (md2, data2) = segs
    files3 = SegmentFilesOnDisk(str(tmp_path / "seg3"), log_size=5000)
    writer.client.copy(files3.path_request(metadata(seg_id(3), 200, 299, size=5000)))
    # someone who can write the bucket moves segment 3's manifest to another segment's name
    real = next(p for p in (tmp_path / "remote").rglob("*.rsm-manifest") if seg_id(3) in p.name)
    real.rename(real.with_name(real.name.replace(seg_id(3), seg_id(9))))

    sock = tmp_path / "run" / "rsm.sock"
    start_sidecar(encryption=True, storage__key_prefix="new/", server__listen=f"unix://{sock}")
    client = FetchChannelClient(f"unix://{sock}")
    try:
        hint = _named(client, md1, 0, None).next_segment
        assert hint.segment_id == seg_id(2) and hint.HasField("custom_metadata")
        assert cm.decode(hint.custom_metadata) == {cm.OBJECT_PREFIX: "old/"}
        assert client.fetch(hint)[0] == data2
        # the one key at offset 200 names segment 9, its manifest holds segment 3: no name
        md2.custom_metadata = hint.custom_metadata
        assert not _named(client, md2, 0, None).HasField("next_segment")
    finally:
        client.close()
