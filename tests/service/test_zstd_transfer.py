"""Compressed transfer (rsm.proto ``accept_zstd_max_bytes`` / ``ZstdSlice``): a client that
decompresses zstd frames itself gets the stored, verified, decrypted frames of a compressed
segment's chunks instead of their original bytes, wherever that is smaller; every other byte as
before. A real sidecar on loopback TCP; the client is tests.service.rsm_client's, which checks
every message as the contract tells a client to."""

from __future__ import annotations

import os
import random

import grpc
import pytest

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.format.keys import SegmentMetadata
from rsm_sidecar.segment.reader import FrameSlice
from tests.service.rsm_client import SegmentFilesOnDisk, metadata, seg_id

KiB = 1024
CHUNK = 64 * KiB


def _records(n_bytes: int, seed: int = 7) -> bytes:
    """Text records like a JSON producer's: compress about 3-5x with zstd."""
    rnd = random.Random(seed)
    out = bytearray()
    while len(out) < n_bytes:
        out += (
            f'{{"order":{rnd.randrange(10**9)},"customer":"c-{rnd.randrange(5000):05d}",'
            f'"amount":{rnd.random() * 1000:.2f},"state":"{rnd.choice(["new", "paid", "sent"])}"}}\n'
        ).encode()
    return bytes(out[:n_bytes])


def _copied(sc, tmp_path, log: bytes, n: int = 1):
    files = SegmentFilesOnDisk(str(tmp_path / f"seg{n}"), log)
    md = metadata(seg_id(n), size=len(log))
    md.custom_metadata = sc.client.copy(files.stream_requests(md)).custom_metadata
    return md


def _fetches(sc) -> dict[str, float]:
    import prometheus_client

    text = prometheus_client.generate_latest(sc.sidecar.metrics.registry).decode()
    out = {}
    for kind in ("fetch_served", "fetch_zstd"):
        line = [ln for ln in text.splitlines() if ln.startswith(f'rsm_bytes_total{{kind="{kind}"}}')]
        out[kind] = float(line[0].split()[-1]) if line else 0.0
    return out


@pytest.mark.parametrize("encryption", [False, True])
def test_ranges_come_as_frames_with_the_same_bytes_and_fewer_of_them(start_sidecar, tmp_path, encryption):
    sc = start_sidecar(encryption=encryption, segment__chunk_size=CHUNK, segment__compression_heuristic=False)
    log = _records(10 * CHUNK + 1234)
    md = _copied(sc, tmp_path, log)
    got, framed, plain = sc.client.fetch_zstd(md)
    assert got == log
    # whole chunks as frames: compressed 3x or better; only the last short one may come as data
    assert framed * 3 < len(log) and plain <= len(log) - 10 * CHUNK
    before = _fetches(sc)
    for start, end in [
        (0, 0),
        (1, 2 * CHUNK),
        (CHUNK - 1, CHUNK),
        (CHUNK + 100, 4 * CHUNK - 100),
        (5 * CHUNK, None),
        (len(log) - 1, None),
        (3 * CHUNK + 7, 10**9),
    ]:
        want = log[start : None if end is None else end + 1]
        assert sc.client.fetch_zstd(md, start, end)[0] == want, (start, end)
        assert sc.client.fetch(md, start, end) == want  # a client that takes no frames: as before
    after = _fetches(sc)
    assert after["fetch_zstd"] > before["fetch_zstd"]


def test_frames_only_where_smaller_and_within_what_the_client_accepts(start_sidecar, tmp_path):
    sc = start_sidecar(encryption=True, segment__chunk_size=CHUNK, segment__compression_heuristic=False)
    log = _records(4 * CHUNK)
    md = _copied(sc, tmp_path, log)
    # chunks larger than the client accepts: every byte in data
    got, framed, plain = sc.client.fetch_zstd(md, max_bytes=CHUNK - 1)
    assert (got, framed, plain) == (log, 0, len(log))
    # a few bytes of a chunk are fewer than its frame: data
    got, framed, plain = sc.client.fetch_zstd(md, 10, 20)
    assert (got, framed, plain) == (log[10:21], 0, 11)
    # incompressible chunks: their frames are no smaller than their bytes, so data
    noise = os.urandom(3 * CHUNK)
    md2 = _copied(sc, tmp_path, noise, 2)
    got, framed, plain = sc.client.fetch_zstd(md2)
    assert (got, framed, plain) == (noise, 0, len(noise))


def test_a_frame_over_one_mib_comes_as_data(start_sidecar, tmp_path):
    """A gRPC message carries at most 1 MiB: a chunk whose frame is larger (8 MiB of records
    compress to about 1.6 MiB) comes decompressed, however much the client accepts; the same
    records in 4 MiB chunks (frames of about 0.8 MiB) come as frames."""
    for n, chunk_size, sent_as_frames in ((1, 8 * 1024 * KiB, False), (2, 4 * 1024 * KiB, True)):
        sc = start_sidecar(
            encryption=True, segment__chunk_size=chunk_size, segment__compression_heuristic=False
        )
        log = _records(chunk_size)
        md = _copied(sc, tmp_path, log, n)
        got, framed, plain = sc.client.fetch_zstd(md, max_bytes=16 * 1024 * KiB)
        assert got == log
        assert (framed > 0, plain) == ((True, 0) if sent_as_frames else (False, len(log)))


def test_cached_frames_serve_a_plain_reader_and_cached_bytes_serve_a_frame_reader(start_sidecar, tmp_path):
    """The chunk cache holds frames for a reader that takes them, and a chunk some reader needed
    decompressed stays cached decompressed (read in parts, it is decompressed once); either kind
    of reader gets correct bytes from either."""
    sc = start_sidecar(encryption=True, segment__chunk_size=CHUNK, segment__compression_heuristic=False)
    log = _records(6 * CHUNK)
    md = _copied(sc, tmp_path, log)
    reader = sc.sidecar.reader
    seg = reader.open(SegmentMetadata.from_proto(md))
    sc.client.fetch_zstd(md)  # caches frames
    assert reader.chunks.size_bytes * 3 < len(log)
    assert sc.client.fetch(md) == log  # decompressed from the cached frames, and cached so
    assert reader.chunks.size_bytes >= len(log)
    assert sc.client.fetch(md, CHUNK + 5, 3 * CHUNK) == log[CHUNK + 5 : 3 * CHUNK + 1]
    reader.forget(seg.base)
    assert sc.client.fetch(md) == log  # caches bytes
    got, framed, plain = sc.client.fetch_zstd(md)
    assert got == log and plain > 0  # served from the cached bytes


@pytest.mark.parametrize("encryption", [False, True])
def test_a_flipped_stored_byte_is_data_loss_before_any_frame_of_that_chunk(
    start_sidecar, tmp_path, encryption
):
    sc = start_sidecar(
        encryption=encryption,
        segment__chunk_size=CHUNK,
        segment__compression_heuristic=False,
        cache__chunk_bytes=0,
        cache__prefetch_bytes=0,
    )
    log = _records(4 * CHUNK)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), log)
    md = metadata(seg_id(3), size=len(log))
    resp = sc.client.copy(files.stream_requests(md))
    path = sc.root / (resp.object_key_base + ".log")
    stored = path.read_bytes()
    chunk = sc.sidecar.reader.open(SegmentMetadata.from_proto(md)).manifest.chunk_index.chunk(2)
    bad = bytearray(stored)
    bad[chunk.transformed_position + chunk.transformed_size // 2] ^= 0x01
    path.write_bytes(bytes(bad))
    received = []
    req = pb.FetchSegmentRequest(metadata=md, start_position=0, accept_zstd_max_bytes=CHUNK)
    with pytest.raises(grpc.RpcError) as e:
        for r in sc.client.stub.FetchSegment(req, timeout=60):
            received.append(r)
    assert e.value.code() == grpc.StatusCode.DATA_LOSS
    assert "chunk 2" in e.value.details()
    assert len(received) == 2 and all(r.HasField("zstd") for r in received)
    path.write_bytes(stored)
    assert sc.client.fetch_zstd(md)[0] == log


@pytest.mark.parametrize("frame_bytes", [1, 127, 128, 300_000, 1024 * 1024])
@pytest.mark.parametrize("offset", [0, 12345])
def test_zstd_responses_encoded_by_hand_are_what_protobuf_decodes(frame_bytes, offset):
    """Serialized without a message object (one copy of the frame); protobuf must read it as the
    contract's message, and byte for byte as it would write it where no field is zero."""
    from rsm_sidecar.service.servicer import encode_zstd_response

    piece = FrameSlice(os.urandom(frame_bytes), 4 * 1024 * 1024, offset, 200_000)
    want = pb.FetchSegmentResponse(
        zstd=pb.ZstdSlice(frame=piece.frame, size=piece.size, offset=piece.offset, length=piece.length)
    )
    assert pb.FetchSegmentResponse.FromString(encode_zstd_response(piece)) == want
    if offset:
        assert encode_zstd_response(piece) == want.SerializeToString()
