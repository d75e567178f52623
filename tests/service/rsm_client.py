"""A small Python client of the rsm.v1 contract, for tests and benchmarks (the broker
uses the Java shim)."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar._proto.rsm.v1 import rsm_pb2_grpc
from rsm_sidecar.service import fetch_channel

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

    def copy_a_segment(self, folder: Path, log_size: int) -> pb.SegmentMetadata:
        """Copy segment 1 (:class:`SegmentFilesOnDisk` of ``log_size`` in ``folder``), in path
        mode: its metadata."""
        files = SegmentFilesOnDisk(str(folder), log_size=log_size)
        md = metadata(seg_id(1), size=files.log_size)
        self.copy(files.path_request(md))
        return md

    def fetch(self, md, start: int = 0, end: int | None = None, timeout: float = 120) -> bytes:
        req = pb.FetchSegmentRequest(metadata=md, start_position=start)
        if end is not None:
            req.end_position = end
        return b"".join(r.data for r in self.stub.FetchSegment(req, timeout=timeout))

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


class FetchChannelError(Exception):
    """An exchange ended with a status other than OK (``code`` the google.rpc.Code number)."""

    def __init__(self, code: int, message: str, received: int):
        super().__init__(
            f"{grpc.StatusCode(_STATUS_BY_NUMBER[code]).name if code in _STATUS_BY_NUMBER else code}: "
            f"{message} (after {received} bytes)"
        )
        self.code = code
        self.status = _STATUS_BY_NUMBER.get(code)
        self.message = message
        self.received = received


_STATUS_BY_NUMBER = {s.value[0]: s.value for s in grpc.StatusCode}


class FetchChannelClient:
    """A client of the sidecar's fetch channel (rsm.proto, "The fetch channel"): one connection,
    exchanges one after the other, every frame checked as the shim checks it."""

    def __init__(
        self,
        target: str,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = 60,
        receive_buffer: int | None = None,
    ):
        """``receive_buffer``: the socket's SO_RCVBUF, set before it connects (None: the kernel's)."""
        if target.startswith("unix:"):
            path = target[len("unix://") :] if target.startswith("unix://") else target[len("unix:") :]
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: object = path
        else:
            host, _, port = target.rpartition(":")
            raw = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            address = (host.strip("[]"), int(port))
        if receive_buffer is not None:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        raw.settimeout(timeout)
        raw.connect(address)
        self.sock = ssl_context.wrap_socket(raw, server_hostname=server_hostname) if ssl_context else raw
        self.sock.sendall(fetch_channel.PREFACE)
        assert fetch_channel.read_exactly(self.sock, len(fetch_channel.PREFACE)) == fetch_channel.PREFACE

    def request(self, md, start: int = 0, end: int | None = None, want_next_segment: bool = False) -> None:
        req = pb.FetchSegmentRequest(metadata=md, start_position=start, want_next_segment=want_next_segment)
        if end is not None:
            req.end_position = end
        payload = req.SerializeToString()
        self.sock.sendall(fetch_channel.FRAME_HEADER.pack(fetch_channel.REQUEST, len(payload)) + payload)

    def index(self, md, index_type) -> bytes:
        """An index over the channel ('I' frame); ``FetchChannelError`` unless it ends OK."""
        payload = pb.FetchIndexRequest(metadata=md, index_type=index_type).SerializeToString()
        self.sock.sendall(
            fetch_channel.FRAME_HEADER.pack(fetch_channel.INDEX_REQUEST, len(payload)) + payload
        )
        out = bytearray()
        for kind, body in self.frames():
            if kind == fetch_channel.DATA:
                out += body
            else:
                done = pb.FetchEnd.FromString(body)
                if done.code != 0:
                    raise FetchChannelError(done.code, done.message, len(out))
                assert done.length == len(out)
        return bytes(out)

    def frames(self) -> Iterator[tuple[bytes, bytes]]:
        """The frames of one exchange, up to and including its 'E' frame."""
        while True:
            header = fetch_channel.read_exactly(self.sock, fetch_channel.FRAME_HEADER.size)
            if header is None:
                raise ConnectionError("the connection ended before the exchange's 'E' frame")
            kind, length = fetch_channel.FRAME_HEADER.unpack(header)
            payload = fetch_channel.read_exactly(self.sock, length) if length else b""
            if payload is None:
                raise ConnectionError("the connection ended inside a frame")
            yield kind, payload
            if kind == fetch_channel.END:
                return

    def fetch(
        self, md, start: int = 0, end: int | None = None, want_next_segment: bool = False
    ) -> tuple[bytes, pb.FetchEnd]:
        """The range's bytes and the exchange's end; ``FetchChannelError`` unless it ends OK with
        exactly the bytes it announced."""
        self.request(md, start, end, want_next_segment)
        out = bytearray()
        for kind, payload in self.frames():
            if kind == fetch_channel.DATA:
                assert 0 < len(payload) <= fetch_channel.MAX_DATA_FRAME_BYTES
                out += payload
            elif kind == fetch_channel.END:
                done = pb.FetchEnd.FromString(payload)
                if done.code != 0:
                    raise FetchChannelError(done.code, done.message, len(out))
                assert done.length == len(out), (done.length, len(out))
                return bytes(out), done
            else:
                raise AssertionError(f"unexpected frame type {kind!r}")
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.sock.close()
