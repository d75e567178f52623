"""RPC handlers: translate proto messages, run the segment operations, map errors to
gRPC status codes (see the contract's comments), count metrics."""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Iterator

import grpc

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar._proto.rsm.v1 import rsm_pb2_grpc
from rsm_sidecar.errors import Cancelled, FailedPrecondition, InvalidArgument, OutOfRange, RsmError
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.segment.copy import rechunk
from rsm_sidecar.segment.journal import delete_segment_objects
from rsm_sidecar.segment.reader import INDEX_BY_TYPE
from rsm_sidecar.service.sidecar import Sidecar

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 1024 * 1024
FILE_ORDER = [pb.LOG, pb.OFFSET_INDEX, pb.TIME_INDEX, pb.PRODUCER_SNAPSHOT_FILE, pb.TRANSACTION_INDEX]
INDEX_OF_FILE = {pb.OFFSET_INDEX: "offset", pb.TIME_INDEX: "timestamp",
                 pb.PRODUCER_SNAPSHOT_FILE: "producerSnapshot", pb.TRANSACTION_INDEX: "transaction"}


def _metadata(m: pb.SegmentMetadata) -> fkeys.SegmentMetadata:
    if not m.topic_id:
        raise InvalidArgument("request has no segment metadata")
    return fkeys.SegmentMetadata.from_proto(m)


def _abort(context: grpc.ServicerContext, op: str, metrics, err: BaseException) -> None:
    if isinstance(err, RsmError):
        code, msg = err.grpc_code, str(err)
        level = logging.INFO if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.CANCELLED) else logging.WARNING
        log.log(level, "%s failed: %s %s", op, code.name, msg, extra={"fields": {"op": op, "status": code.name}})
    else:
        code, msg = grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}"
        log.error("%s failed with an unexpected error", op, exc_info=err, extra={"fields": {"op": op}})
    metrics.operations.labels(op, code.name).inc()
    context.abort(code, msg)


def unary(op: str):
    def wrap(fn):
        @functools.wraps(fn)
        def handler(self, request, context):
            m = self.sidecar.metrics
            m.in_flight.labels(op).inc()
            t0 = time.monotonic()
            try:
                result = fn(self, request, context)
            except Exception as e:  # every failure becomes a status
                _abort(context, op, m, e)
            else:
                m.operations.labels(op, "OK").inc()
                return result
            finally:
                m.in_flight.labels(op).dec()
                m.latency.labels(op).observe(time.monotonic() - t0)
        return handler
    return wrap


def streaming(op: str):
    def wrap(fn):
        @functools.wraps(fn)
        def handler(self, request, context):
            m = self.sidecar.metrics
            m.in_flight.labels(op).inc()
            t0 = time.monotonic()
            first = True
            try:
                for msg in fn(self, request, context):
                    if first and op == "fetch":
                        m.first_byte.observe(time.monotonic() - t0)
                    first = False
                    yield msg
                    if not context.is_active():
                        raise Cancelled(f"{op} cancelled by the client")
            except GeneratorExit:
                m.operations.labels(op, "CANCELLED").inc()
                raise
            except Exception as e:
                _abort(context, op, m, e)
            else:
                m.operations.labels(op, "OK").inc()
            finally:
                m.in_flight.labels(op).dec()
                m.latency.labels(op).observe(time.monotonic() - t0)
        return handler
    return wrap


def _pieces(data: bytes) -> Iterator[bytes]:
    for i in range(0, len(data), MAX_MESSAGE_BYTES):
        yield data[i:i + MAX_MESSAGE_BYTES]


class RemoteStorageServicer(rsm_pb2_grpc.RemoteStorageServicer):
    def __init__(self, sidecar: Sidecar):
        self.sidecar = sidecar
        self._copy_slots = threading.BoundedSemaphore(sidecar.cfg["copy.max_concurrent"])

    # -- copy ------------------------------------------------------------------
    @unary("copy")
    def CopySegment(self, request_iterator, context):
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("kind") != "begin":
            raise InvalidArgument("a copy must start with a CopyBegin message")
        begin = first.begin
        md = _metadata(begin.metadata)
        s = self.sidecar
        chunk_size = s.copier.settings.chunk_size
        if begin.mode == pb.PATH:
            source = PathSource(begin.files, md, s.cfg["copy.allowed_dirs"])
        elif begin.mode == pb.STREAM:
            source = StreamSource(begin.files, request_iterator)
        else:
            raise InvalidArgument(f"unknown transfer mode {begin.mode}")
        log_size = source.log_size
        if md.segment_size and md.segment_size != log_size:
            raise FailedPrecondition(f"copy of {md.describe}: segment_size_in_bytes is {md.segment_size} but the "
                                     f".log file has {log_size} bytes")
        leader_epoch = bytes(begin.leader_epoch_checkpoint)

        def indexes():
            files = source.index_files()
            files["leaderEpoch"] = leader_epoch
            return files

        with self._copy_slots:
            t0 = time.monotonic()
            result = s.copier.copy(md, rechunk(source.log_pieces(chunk_size), chunk_size), log_size, indexes,
                                   is_cancelled=lambda: not context.is_active(),
                                   on_stored_bytes=s.metrics.bytes.labels("copy_stored").inc)
        s.metrics.bytes.labels("copy_original").inc(log_size)
        s.metrics.segments.labels(str(result.manifest.compression).lower()).inc()
        log.info("copied %s: %d bytes -> %d stored in %.2fs", md.describe, log_size, result.stored_bytes,
                 time.monotonic() - t0, extra={"fields": {"op": "copy", "segment": md.segment_id,
                                                           "key": result.base_key,
                                                           "compressed": result.manifest.compression,
                                                           "encrypted": result.manifest.encryption is not None}})
        resp = pb.CopySegmentResponse(stored_bytes=result.stored_bytes, object_key_base=result.base_key)
        if result.custom_metadata is not None:
            resp.custom_metadata = result.custom_metadata
        return resp

    # -- fetch -----------------------------------------------------------------
    @streaming("fetch")
    def FetchSegment(self, request, context):
        md = _metadata(request.metadata)
        start = request.start_position
        if start < 0:
            raise InvalidArgument(f"start position {start} is negative")
        if request.HasField("end_position") and request.end_position < start:
            raise InvalidArgument(f"end position {request.end_position} is before start position {start}")
        reader = self.sidecar.reader
        seg = reader.open(md)
        size = seg.manifest.original_size
        if start > size:
            raise OutOfRange(f"start position {start} is beyond the end of segment {md.describe} ({size} bytes)")
        end = request.end_position if request.HasField("end_position") else size - 1
        served = self.sidecar.metrics.bytes.labels("fetch_served")
        for piece in reader.read(seg, start, min(end, size - 1), views=True):
            for msg in _pieces(memoryview(piece)):
                served.inc(len(msg))
                yield pb.FetchSegmentResponse(data=bytes(msg))

    @streaming("fetch_index")
    def FetchIndex(self, request, context):
        md = _metadata(request.metadata)
        type_name = pb.IndexType.Name(request.index_type)
        if type_name not in INDEX_BY_TYPE:
            raise InvalidArgument(f"unknown index type {request.index_type}")
        reader = self.sidecar.reader
        data = reader.read_index(reader.open(md), INDEX_BY_TYPE[type_name])
        self.sidecar.metrics.bytes.labels("index_served").inc(len(data))
        for msg in _pieces(data):
            yield pb.FetchIndexResponse(data=msg)

    # -- delete ----------------------------------------------------------------
    @unary("delete")
    def DeleteSegment(self, request, context):
        md = _metadata(request.metadata)
        s = self.sidecar
        base = s.layout.base(md)
        delete_segment_objects(s.store, base)
        s.reader.forget(base)
        log.info("deleted %s", md.describe, extra={"fields": {"op": "delete", "segment": md.segment_id, "key": base}})
        return pb.DeleteSegmentResponse()


# -- copy sources ----------------------------------------------------------------------
def _check_allowed(path: str, allowed: list[str]) -> str:
    if not path:
        raise InvalidArgument("path transfer mode: a file path is empty")
    real = os.path.realpath(path)
    if allowed and not any(real == os.path.realpath(d) or real.startswith(os.path.realpath(d).rstrip("/") + "/")
                           for d in allowed):
        raise InvalidArgument(f"path {path} is outside copy.allowed_dirs")
    return real


class PathSource:
    """Path mode: the sidecar reads the broker's files and checks they did not change."""

    def __init__(self, files: pb.SegmentFiles, md: fkeys.SegmentMetadata, allowed: list[str]):
        self.md = md
        self.files = files
        self.allowed = allowed
        self.log_path = _check_allowed(files.log_path, allowed)
        try:
            self._fd = os.open(self.log_path, os.O_RDONLY)
        except OSError as e:
            raise FailedPrecondition(f"copy of {md.describe}: cannot open {files.log_path}: {e.strerror}") from None
        self._stat = os.fstat(self._fd)
        self.log_size = self._stat.st_size

    def log_pieces(self, size: int) -> Iterator[bytes]:
        try:
            total = 0
            while True:
                piece = os.read(self._fd, size)
                if not piece:
                    break
                total += len(piece)
                yield piece
            self._verify_unchanged(total)
        finally:
            os.close(self._fd)

    def _verify_unchanged(self, total: int) -> None:
        path = self.files.log_path
        try:
            now = os.stat(self.log_path)
        except FileNotFoundError:
            raise FailedPrecondition(f"copy of {self.md.describe}: {path} disappeared during the copy") from None
        before = self._stat
        if (now.st_ino, now.st_dev) != (before.st_ino, before.st_dev):
            raise FailedPrecondition(f"copy of {self.md.describe}: {path} was replaced during the copy")
        if now.st_size != before.st_size or now.st_mtime_ns != before.st_mtime_ns or total != before.st_size:
            raise FailedPrecondition(f"copy of {self.md.describe}: {path} changed during the copy "
                                     f"({before.st_size} bytes at start, {now.st_size} now, {total} read)")

    def index_files(self) -> dict[str, bytes | None]:
        f = self.files
        out: dict[str, bytes | None] = {}
        for name, path in (("offset", f.offset_index_path), ("timestamp", f.time_index_path),
                           ("producerSnapshot", f.producer_snapshot_path)):
            out[name] = self._read(path, name)
        out["transaction"] = self._read(f.transaction_index_path, "transaction") \
            if f.HasField("transaction_index_path") else None
        return out

    def _read(self, path: str, what: str) -> bytes:
        real = _check_allowed(path, self.allowed)
        try:
            with open(real, "rb") as fh:
                return fh.read()
        except OSError as e:
            raise FailedPrecondition(f"copy of {self.md.describe}: cannot read the {what} index {path}: "
                                     f"{e.strerror}") from None


class StreamSource:
    """Stream mode: file bytes arrive in CopyData messages in the contract's order."""

    def __init__(self, files: pb.SegmentFiles, messages: Iterator[pb.CopySegmentRequest]):
        self.messages = messages
        self.log_size = files.log_size
        self.sizes = {pb.LOG: files.log_size, pb.OFFSET_INDEX: files.offset_index_size,
                      pb.TIME_INDEX: files.time_index_size, pb.PRODUCER_SNAPSHOT_FILE: files.producer_snapshot_size,
                      pb.TRANSACTION_INDEX: files.transaction_index_size
                      if files.HasField("transaction_index_size") else None}
        for kind, size in self.sizes.items():
            if size is not None and size < 0:
                raise InvalidArgument(f"negative size for {pb.FileKind.Name(kind)}")
        self.received = {k: 0 for k in self.sizes}
        self._position = 0  # index into FILE_ORDER
        self._pending: pb.CopyData | None = None

    def _next(self) -> pb.CopyData | None:
        if self._pending is not None:
            m, self._pending = self._pending, None
            return m
        req = next(self.messages, None)
        if req is None:
            return None
        if req.WhichOneof("kind") != "data":
            raise InvalidArgument("only CopyData messages may follow CopyBegin")
        d = req.data
        if len(d.data) > MAX_MESSAGE_BYTES:
            raise InvalidArgument(f"CopyData message of {len(d.data)} bytes exceeds 1 MiB")
        if d.file not in self.sizes:
            raise InvalidArgument(f"unknown file kind {d.file}")
        order = FILE_ORDER.index(d.file)
        if order < self._position:
            raise InvalidArgument(f"{pb.FileKind.Name(d.file)} data after {pb.FileKind.Name(FILE_ORDER[self._position])}"
                                  f" (files must be sent in the contract's order)")
        if self.sizes[d.file] is None:
            raise InvalidArgument("TRANSACTION_INDEX data but no transaction index was declared")
        self._position = order
        self.received[d.file] += len(d.data)
        if self.received[d.file] > self.sizes[d.file]:
            raise InvalidArgument(f"{pb.FileKind.Name(d.file)}: more bytes than the declared {self.sizes[d.file]}")
        return d

    def log_pieces(self, size: int) -> Iterator[bytes]:
        while self.received[pb.LOG] < self.log_size:
            d = self._next()
            if d is None:
                raise FailedPrecondition(f"stream ended after {self.received[pb.LOG]} of {self.log_size} bytes of "
                                         f"the .log file")
            if d.file != pb.LOG:
                raise FailedPrecondition(f"{pb.FileKind.Name(d.file)} data before the .log file was complete "
                                         f"({self.received[pb.LOG]} of {self.log_size} bytes)")
            yield d.data

    def index_files(self) -> dict[str, bytes | None]:
        bufs = {k: bytearray() for k in INDEX_OF_FILE}
        while True:
            d = self._next()
            if d is None:
                break
            if d.file == pb.LOG:
                raise InvalidArgument("more .log bytes than declared")
            bufs[d.file] += d.data
        out: dict[str, bytes | None] = {}
        for kind, name in INDEX_OF_FILE.items():
            declared = self.sizes[kind]
            if declared is None:
                out[name] = None
                continue
            if len(bufs[kind]) != declared:
                raise FailedPrecondition(f"stream ended with {len(bufs[kind])} of {declared} bytes of "
                                         f"{pb.FileKind.Name(kind)}")
            out[name] = bytes(bufs[kind])
        return out
