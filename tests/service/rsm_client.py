"""A small Python client of the rsm.v1 contract, for tests and benchmarks (the broker
uses the Java shim)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import zstandard

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar._proto.rsm.v1 import rsm_pb2_grpc

MiB = 1024 * 1024


def metadata(
    segment_id: str,
    start: int = 0,
    end: int = 99,
    size: int = 0,
    topic: str = "orders",
    topic_id: str = "MWJ6FHTfRYy67jzwZdeqSQ",
    partition: int = 0,
    custom: bytes | None = None,
) -> pb.SegmentMetadata:
    m = pb.SegmentMetadata(
        topic_id=topic_id,
        topic_name=topic,
        partition=partition,
        segment_id=segment_id,
        start_offset=start,
        end_offset=end,
        max_timestamp_ms=1_700_000_000_000,
        broker_id=1,
        event_timestamp_ms=1_700_000_000_001,
        segment_size_in_bytes=size,
        state=pb.COPY_SEGMENT_STARTED,
    )
    m.segment_leader_epochs[0] = start
    if custom is not None:
        m.custom_metadata = custom
    return m


def seg_id(n: int) -> str:
    return f"S{n:021d}"


class SegmentFilesOnDisk:
    """A segment's files as a broker would hand them over."""

    def __init__(
        self, directory: str, log: bytes | None = None, log_size: int | None = None, txn: bool = True
    ):
        os.makedirs(directory, exist_ok=True)
        self.dir = directory
        self.log_path = os.path.join(directory, "00000000000000000000.log")
        with open(self.log_path, "wb") as f:
            if log is not None:
                f.write(log)
            else:  # a large file without holding it in memory
                block = os.urandom(MiB)
                for i in range(log_size // MiB):
                    f.write(block[i % 7 :] + block[: i % 7])
                f.write(block[: log_size % MiB])
        self.indexes = {
            "offset": os.urandom(800),
            "timestamp": os.urandom(1200),
            "producerSnapshot": os.urandom(100),
            "transaction": os.urandom(34 * 3) if txn else None,
        }
        self.leader_epoch = b"0\n1\n0 0\n"
        self.paths = {}
        for name, data in self.indexes.items():
            if data is not None:
                p = os.path.join(directory, f"00000000000000000000.{name}")
                with open(p, "wb") as f:
                    f.write(data)
                self.paths[name] = p

    @property
    def log_size(self) -> int:
        return os.path.getsize(self.log_path)

    def files(self, with_paths: bool) -> pb.SegmentFiles:
        f = pb.SegmentFiles(
            log_size=self.log_size,
            offset_index_size=len(self.indexes["offset"]),
            time_index_size=len(self.indexes["timestamp"]),
            producer_snapshot_size=len(self.indexes["producerSnapshot"]),
        )
        if self.indexes["transaction"] is not None:
            f.transaction_index_size = len(self.indexes["transaction"])
        if with_paths:
            f.log_path, f.offset_index_path = self.log_path, self.paths["offset"]
            f.time_index_path, f.producer_snapshot_path = (
                self.paths["timestamp"],
                self.paths["producerSnapshot"],
            )
            if "transaction" in self.paths:
                f.transaction_index_path = self.paths["transaction"]
        return f

    def stream_requests(self, md: pb.SegmentMetadata, piece: int = MiB) -> Iterator[pb.CopySegmentRequest]:
        yield pb.CopySegmentRequest(
            begin=pb.CopyBegin(
                metadata=md,
                mode=pb.STREAM,
                files=self.files(False),
                leader_epoch_checkpoint=self.leader_epoch,
            )
        )
        with open(self.log_path, "rb") as f:
            while data := f.read(piece):
                yield pb.CopySegmentRequest(data=pb.CopyData(file=pb.LOG, data=data))
        for kind, name in (
            (pb.OFFSET_INDEX, "offset"),
            (pb.TIME_INDEX, "timestamp"),
            (pb.PRODUCER_SNAPSHOT_FILE, "producerSnapshot"),
            (pb.TRANSACTION_INDEX, "transaction"),
        ):
            data = self.indexes[name]
            if data:
                yield pb.CopySegmentRequest(data=pb.CopyData(file=kind, data=data))

    def path_request(self, md: pb.SegmentMetadata) -> Iterator[pb.CopySegmentRequest]:
        yield pb.CopySegmentRequest(
            begin=pb.CopyBegin(
                metadata=md, mode=pb.PATH, files=self.files(True), leader_epoch_checkpoint=self.leader_epoch
            )
        )


class Client:
    def __init__(self, target: str):
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 8 * MiB)])
        self.stub = rsm_pb2_grpc.RemoteStorageStub(self.channel)

    def copy(self, requests, timeout: float = 120) -> pb.CopySegmentResponse:
        return self.stub.CopySegment(requests, timeout=timeout)

    def fetch(self, md, start: int = 0, end: int | None = None, timeout: float = 120) -> bytes:
        req = pb.FetchSegmentRequest(metadata=md, start_position=start)
        if end is not None:
            req.end_position = end
        return b"".join(r.data for r in self.stub.FetchSegment(req, timeout=timeout))

    def fetch_zstd(
        self, md, start: int = 0, end: int | None = None, max_bytes: int = 8 * MiB, timeout: float = 120
    ) -> tuple[bytes, int, int]:
        """A fetch that accepts zstd frames of chunks up to ``max_bytes``, decoded as rsm.proto's
        ``ZstdSlice`` tells a client to (exact size, slice in range): (the bytes, frame bytes
        received, bytes received in ``data``)."""
        req = pb.FetchSegmentRequest(metadata=md, start_position=start, accept_zstd_max_bytes=max_bytes)
        if end is not None:
            req.end_position = end
        out = bytearray()
        framed = plain = 0
        for r in self.stub.FetchSegment(req, timeout=timeout):
            if r.HasField("zstd"):
                z = r.zstd
                assert not r.data and 0 < z.size <= max_bytes and len(z.frame) <= MiB, z
                assert 0 <= z.offset < z.offset + z.length <= z.size, z
                whole = zstandard.ZstdDecompressor().decompress(z.frame, max_output_size=z.size)
                assert len(whole) == z.size
                out += whole[z.offset : z.offset + z.length]
                framed += len(z.frame)
            else:
                out += r.data
                plain += len(r.data)
        return bytes(out), framed, plain

    def fetch_stream(self, md, start: int = 0, end: int | None = None, timeout: float = 120):
        req = pb.FetchSegmentRequest(metadata=md, start_position=start)
        if end is not None:
            req.end_position = end
        return self.stub.FetchSegment(req, timeout=timeout)

    def index(self, md, index_type) -> bytes:
        return b"".join(
            r.data
            for r in self.stub.FetchIndex(
                pb.FetchIndexRequest(metadata=md, index_type=index_type), timeout=60
            )
        )

    def delete(self, md) -> None:
        self.stub.DeleteSegment(pb.DeleteSegmentRequest(metadata=md), timeout=60)

    def close(self) -> None:
        self.channel.close()
