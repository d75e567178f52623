"""RPC handlers: translate proto messages, run the segment operations, map errors to
gRPC status codes (see the contract's comments), count metrics.

Requests are parsed leniently (``handlers``): a message that does not parse (bad UTF-8
in a string field, garbage) reaches the handler as ``Malformed`` and is answered
``INVALID_ARGUMENT`` instead of gRPC's own ``INTERNAL``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from prometheus_client import Counter

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NoSuchIndex,
    OutOfRange,
    RsmError,
)
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.segment import sources
from rsm_sidecar.segment.objects import delete_segment_objects
from rsm_sidecar.segment.reader import INDEX_BY_TYPE, OpenSegment
from rsm_sidecar.service import hooks
from rsm_sidecar.service.admission import IdleWatchdog, Slots, Watch
from rsm_sidecar.service.metrics import Metrics
from rsm_sidecar.service.sidecar import Sidecar

log = logging.getLogger(__name__)
M = TypeVar("M")
R = TypeVar("R")
B = TypeVar("B", bytes, memoryview)
MAX_MESSAGE_BYTES = 1024 * 1024
#: longest status message sent to a client (gRPC trailers are limited in size)
MAX_STATUS_CHARS = 2000
#: the contract's files: proto FileKind, manifest name, and the stem of the SegmentFiles fields
#: (``<stem>_path`` in path mode, ``<stem>_size`` in stream mode)
FILES = (
    (pb.LOG, sources.LOG, "log"),
    (pb.OFFSET_INDEX, "offset", "offset_index"),
    (pb.TIME_INDEX, "timestamp", "time_index"),
    (pb.PRODUCER_SNAPSHOT_FILE, "producerSnapshot", "producer_snapshot"),
    (pb.TRANSACTION_INDEX, "transaction", "transaction_index"),
)
FILE_NAMES = {kind: name for kind, name, _ in FILES}


def _per_file(files: pb.SegmentFiles, field: str) -> dict[str, Any]:
    """The ``<stem>_<field>`` values of the segment's files by name; ``transaction`` is
    None when the request leaves it out (the segment has no transaction index)."""
    out = {}
    for _, name, stem in FILES:
        key = f"{stem}_{field}"
        out[name] = None if name == "transaction" and not files.HasField(key) else getattr(files, key)
    return out


class Malformed:
    """A request message that did not parse."""

    def __init__(self, error: Exception):
        self.error = error


def _lenient(parse: Callable[[bytes], Message]) -> Callable[[bytes], Message | Malformed]:
    def deserialize(data: bytes) -> Message | Malformed:
        try:
            return parse(data)
        except Exception as e:
            return Malformed(e)

    return deserialize


def _well_formed(request: M | Malformed, what: str) -> M:
    if isinstance(request, Malformed):
        raise InvalidArgument(f"malformed {what} message: {str(request.error)[:200]}")
    return request


def _metadata(m: pb.SegmentMetadata) -> fkeys.SegmentMetadata:
    if not m.topic_id:
        raise InvalidArgument("request has no segment metadata")
    return fkeys.SegmentMetadata.from_proto(m)


def report_failure(op: str, metrics: Metrics, err: BaseException) -> tuple[grpc.StatusCode, str]:
    """Logs and counts a failed call of ``op``; the status and message the client gets (both
    transports of a fetch answer failures the same way)."""
    if isinstance(err, RsmError):
        code, msg = err.grpc_code, str(err)
        # routine answers (a segment without that index: most have no transaction index; a reader
        # that stopped reading) at DEBUG; a missing segment at INFO; the rest, a copy that did not
        # finish included, at WARNING
        if isinstance(err, NoSuchIndex) or (code == grpc.StatusCode.CANCELLED and op != "copy"):
            level = logging.DEBUG
        elif code == grpc.StatusCode.NOT_FOUND:
            level = logging.INFO
        else:
            level = logging.WARNING
        log.log(
            level, "%s failed: %s %s", op, code.name, msg, extra={"fields": {"op": op, "status": code.name}}
        )
    else:
        code, msg = grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}"
        log.error("%s failed with an unexpected error", op, exc_info=err, extra={"fields": {"op": op}})
    metrics.operations.labels(op, code.name).inc()
    if len(msg) > MAX_STATUS_CHARS:
        msg = msg[:MAX_STATUS_CHARS] + f"... ({len(msg)} characters)"
    return code, msg


def _abort(context: grpc.ServicerContext, op: str, metrics: Metrics, err: BaseException) -> None:
    code, msg = report_failure(op, metrics, err)
    context.abort(code, msg)


#: how long a copy whose request stream ended short waits for the call's cancellation before it
#: blames the client's stream (a killed broker's stream can end before its call is cancelled)
GONE_WAIT_SECONDS = 0.5


def _gone(context: grpc.ServicerContext) -> bool:
    """Whether the call has ended (the client went away or cancelled it), within ``GONE_WAIT_SECONDS``."""
    ended = threading.Event()
    if not context.add_callback(ended.set):  # the call has already ended
        return True
    return ended.wait(GONE_WAIT_SECONDS) or not context.is_active()


@contextlib.contextmanager
def measured(metrics: Metrics, op: str) -> Iterator[float]:
    """Counts ``op`` in flight and observes its latency; yields its start time."""
    metrics.in_flight.labels(op).inc()
    t0 = time.monotonic()
    try:
        yield t0
    finally:
        metrics.in_flight.labels(op).dec()
        metrics.latency.labels(op).observe(time.monotonic() - t0)


#: an RPC method: (servicer, request or request iterator, context) -> response or response stream
Method = Callable[["RemoteStorageServicer", Any, grpc.ServicerContext], R]


def unary(op: str) -> Callable[[Method[R]], Method[R]]:
    def wrap(fn: Method[R]) -> Method[R]:
        @functools.wraps(fn)
        def handler(self: RemoteStorageServicer, request: Any, context: grpc.ServicerContext) -> R:
            m = self.sidecar.metrics
            with measured(m, op):
                try:
                    result = fn(self, request, context)
                except Exception as e:  # every failure becomes a status
                    _abort(context, op, m, e)
                else:
                    m.operations.labels(op, "OK").inc()
                    return result
            raise AssertionError("unreachable: context.abort raises")

        return handler

    return wrap


def streaming(op: str) -> Callable[[Method[Iterator[R]]], Method[Iterator[R]]]:
    def wrap(fn: Method[Iterator[R]]) -> Method[Iterator[R]]:
        @functools.wraps(fn)
        def handler(self: RemoteStorageServicer, request: Any, context: grpc.ServicerContext) -> Iterator[R]:
            m = self.sidecar.metrics
            with measured(m, op) as t0:
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

        return handler

    return wrap


def _pieces(data: B) -> Iterator[B]:
    for i in range(0, len(data), MAX_MESSAGE_BYTES):
        yield data[i : i + MAX_MESSAGE_BYTES]


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_fetch_response(data: bytes | memoryview) -> bytes:
    """A serialized ``FetchSegmentResponse{data}``, built from a piece (bytes or a view into
    a cached chunk) with one copy; a message object and its serialization would copy it
    twice more per message."""
    return b"\x0a" + _varint(len(data)) + data if len(data) else b""


def _fetch_messages(piece: bytes | memoryview, served: Counter, watch: Watch) -> Iterator[bytes]:
    """The serialized fetch responses that carry ``piece``."""
    for msg in _pieces(memoryview(piece)):
        served.inc(len(msg))
        yield encode_fetch_response(msg)
        watch.touch()


def encode_next_segment_response(next_segment: fkeys.SegmentMetadata) -> bytes:
    """A serialized ``FetchSegmentResponse{next_segment}`` without data: the last message of a
    streamed range that reaches the segment's end, when the request asked ``want_next_segment``."""
    response = pb.FetchSegmentResponse()
    next_segment.fill_proto(response.next_segment)
    encoded: bytes = response.SerializeToString()
    return encoded


def _pre_encoded(message: bytes) -> bytes:
    return message


@dataclasses.dataclass(frozen=True)
class FetchRange:
    """Bytes ``[start, end]`` (inclusive, clamped to the segment) of an open segment of ``size`` bytes."""

    seg: OpenSegment
    start: int
    end: int
    size: int
    want_next_segment: bool

    @property
    def length(self) -> int:
        return self.end - self.start + 1


class RemoteStorageServicer:
    def __init__(self, sidecar: Sidecar):
        self.sidecar = sidecar
        cfg = sidecar.cfg
        self.copy_slots = Slots("copy", cfg["copy.max_concurrent"], "copy.max_concurrent")
        self.fetch_slots = Slots("fetch", cfg["fetch.max_concurrent"], "fetch.max_concurrent")
        self.watchdog = IdleWatchdog()
        self.copy_idle = cfg["copy.idle_timeout_seconds"]
        self.fetch_idle = cfg["fetch.idle_timeout_seconds"]
        self.allowed_dirs = sources.allowed_dirs(cfg["copy.allowed_dirs"])
        self.max_index_bytes = cfg["copy.max_index_file_bytes"]

    def handlers(self) -> grpc.GenericRpcHandler:
        """The service's method handlers, with lenient request parsing."""
        methods = {
            "CopySegment": grpc.stream_unary_rpc_method_handler(
                self.CopySegment,
                _lenient(pb.CopySegmentRequest.FromString),
                pb.CopySegmentResponse.SerializeToString,
            ),
            "FetchSegment": grpc.unary_stream_rpc_method_handler(
                self.FetchSegment, _lenient(pb.FetchSegmentRequest.FromString), _pre_encoded
            ),
            "FetchIndex": grpc.unary_stream_rpc_method_handler(
                self.FetchIndex,
                _lenient(pb.FetchIndexRequest.FromString),
                pb.FetchIndexResponse.SerializeToString,
            ),
            "DeleteSegment": grpc.unary_unary_rpc_method_handler(
                self.DeleteSegment,
                _lenient(pb.DeleteSegmentRequest.FromString),
                pb.DeleteSegmentResponse.SerializeToString,
            ),
        }
        return grpc.method_handlers_generic_handler("rsm.v1.RemoteStorage", methods)

    def close(self) -> None:
        self.watchdog.close()

    # -- copy ------------------------------------------------------------------
    @unary("copy")
    def CopySegment(
        self, request_iterator: Iterator[pb.CopySegmentRequest | Malformed], context: grpc.ServicerContext
    ) -> pb.CopySegmentResponse:
        with self.copy_slots.take(), self.watchdog.watch(context, self.copy_idle) as watch:
            md: fkeys.SegmentMetadata | None = None
            try:
                messages = self._copy_messages(request_iterator, watch)
                first = next(messages, None)
                if first is None or first.WhichOneof("kind") != "begin":
                    raise InvalidArgument("a copy must start with a CopyBegin message")
                begin = first.begin
                md = _metadata(begin.metadata)
                return self._copy(md, begin, messages, context, watch)
            except Exception as e:
                what = f"copy of {md.describe}" if md else "copy"
                if watch.expired:
                    raise DeadlineExceeded(
                        f"{what}: no progress for {self.copy_idle:g} s "
                        f"(copy.idle_timeout_seconds); the copy was abandoned"
                    ) from None
                # a broker that died or cancelled the call reads the same whatever the transfer
                # mode noticed first: the call cancelled, or its request stream cut short
                if isinstance(e, Cancelled) or (isinstance(e, sources.StreamEnded) and _gone(context)):
                    raise Cancelled(
                        f"{what}: the broker went away (the call was cancelled before the copy finished)"
                    ) from None
                raise

    @staticmethod
    def _copy_messages(
        request_iterator: Iterator[pb.CopySegmentRequest | Malformed], watch: Watch
    ) -> Iterator[pb.CopySegmentRequest]:
        """The client's messages; the client going away is ``Cancelled``, not an unexpected error."""
        while True:
            try:
                req = next(request_iterator)
            except StopIteration:
                return
            except grpc.RpcError:
                raise Cancelled("the client went away during the copy") from None
            watch.touch()
            yield _well_formed(req, "CopySegmentRequest")

    def _copy(
        self,
        md: fkeys.SegmentMetadata,
        begin: pb.CopyBegin,
        messages: Iterator[pb.CopySegmentRequest],
        context: grpc.ServicerContext,
        watch: Watch,
    ) -> pb.CopySegmentResponse:
        s = self.sidecar
        source: sources.SegmentSource
        if begin.mode == pb.PATH:
            paths = _per_file(begin.files, "path")
            source = sources.PathSource(paths, md.describe, self.allowed_dirs, self.max_index_bytes)
        elif begin.mode == pb.STREAM:
            sizes = _per_file(begin.files, "size")
            source = sources.StreamSource(
                sizes, self._stream_data(messages, md), md.describe, MAX_MESSAGE_BYTES, self.max_index_bytes
            )
        else:
            raise InvalidArgument(f"copy of {md.describe}: unknown transfer mode {begin.mode}")
        log_size = source.log_size
        if md.segment_size and md.segment_size != log_size:
            raise FailedPrecondition(
                f"copy of {md.describe}: segment_size_in_bytes is {md.segment_size} but the "
                f".log file has {log_size} bytes"
            )
        stored = s.metrics.bytes.labels("copy_stored")

        def on_stored(n: int) -> None:
            stored.inc(n)
            watch.touch()

        t0 = time.monotonic()
        result = s.copier.copy(
            md,
            source,
            bytes(begin.leader_epoch_checkpoint),
            is_cancelled=lambda: not context.is_active(),
            on_stored_bytes=on_stored,
        )
        s.metrics.bytes.labels("copy_original").inc(log_size)
        s.metrics.segments.labels(str(result.manifest.compression).lower()).inc()
        log.info(
            "copied %s: %d bytes -> %d stored in %.2fs",
            md.describe,
            log_size,
            result.stored_bytes,
            time.monotonic() - t0,
            extra={
                "fields": {
                    "op": "copy",
                    "segment": md.segment_id,
                    "key": result.base_key,
                    "compressed": result.manifest.compression,
                    "encrypted": result.manifest.encryption is not None,
                }
            },
        )
        hooks.after_copy(md.segment_id, context.is_active, watch.touch)
        resp = pb.CopySegmentResponse(stored_bytes=result.stored_bytes, object_key_base=result.base_key)
        if result.custom_metadata is not None:
            resp.custom_metadata = result.custom_metadata
        return resp

    @staticmethod
    def _stream_data(
        messages: Iterator[pb.CopySegmentRequest], md: fkeys.SegmentMetadata
    ) -> Iterator[tuple[str, bytes]]:
        for req in messages:
            if req.WhichOneof("kind") != "data":
                raise InvalidArgument(f"copy of {md.describe}: only CopyData messages may follow CopyBegin")
            name = FILE_NAMES.get(req.data.file)
            if name is None:
                raise InvalidArgument(f"copy of {md.describe}: unknown file kind {req.data.file}")
            yield name, req.data.data

    # -- fetch -----------------------------------------------------------------
    @streaming("fetch")
    def FetchSegment(
        self, message: pb.FetchSegmentRequest | Malformed, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        request: pb.FetchSegmentRequest = _well_formed(message, "FetchSegmentRequest")
        with self.fetch_slots.take(), self.watchdog.watch(context, self.fetch_idle) as watch:
            hooks.before_fetch()
            rng = self.fetch_range(request)
            seg, start, end = rng.seg, rng.start, rng.end
            reader = self.sidecar.reader
            served = self.sidecar.metrics.bytes.labels("fetch_served")
            for piece in reader.read(seg, start, end, views=True):
                yield from _fetch_messages(piece, served, watch)
                del piece  # not held while the reader fetches the next chunk
            following = self.next_segment_hint(rng)
            if following is not None:  # streamed: the name comes in a last message of its own
                yield encode_next_segment_response(following)

    def fetch_range(self, request: pb.FetchSegmentRequest) -> FetchRange:
        """The range a fetch asks for, checked, in its segment (opened: manifest, identity,
        authenticity); what both transports of a fetch serve (gRPC's ``FetchSegment`` and the
        fetch channel)."""
        md = _metadata(request.metadata)
        start = request.start_position
        if start < 0:
            raise InvalidArgument(f"start position {start} is negative")
        if request.HasField("end_position") and request.end_position < start:
            raise InvalidArgument(f"end position {request.end_position} is before start position {start}")
        seg = self.sidecar.reader.open(md)
        size = seg.manifest.original_size
        if start > size:
            raise OutOfRange(
                f"start position {start} is beyond the end of segment {md.describe} ({size} bytes)"
            )
        end = min(request.end_position if request.HasField("end_position") else size - 1, size - 1)
        return FetchRange(seg, start, end, size, request.want_next_segment)

    def next_segment_hint(self, rng: FetchRange) -> fkeys.SegmentMetadata | None:
        """``next_segment`` for a range that asked for it and ends at its segment's end; None otherwise."""
        if not rng.want_next_segment or rng.end != rng.size - 1:
            return None
        return self._next_segment_hint(rng.seg)

    def _next_segment_hint(self, seg: OpenSegment) -> fkeys.SegmentMetadata | None:
        """``FetchSegmentResponse.next_segment`` for a range that ends at ``seg``'s end; None
        when the sidecar finds no single next segment, or finding it fails (only read-ahead
        depends on it)."""
        try:
            return self.sidecar.reader.next_segment_metadata(seg)
        except Exception as e:  # a hint: any failure means none
            log.debug("no next segment for %s: %s", seg.base, e)
            return None

    @streaming("fetch_index")
    def FetchIndex(
        self, message: pb.FetchIndexRequest | Malformed, context: grpc.ServicerContext
    ) -> Iterator[pb.FetchIndexResponse]:
        request: pb.FetchIndexRequest = _well_formed(message, "FetchIndexRequest")
        with self.fetch_slots.take(), self.watchdog.watch(context, self.fetch_idle) as watch:
            hooks.before_fetch()
            data = self.index_bytes(request)
            for msg in _pieces(data):
                yield pb.FetchIndexResponse(data=msg)
                watch.touch()

    def index_bytes(self, request: pb.FetchIndexRequest) -> bytes:
        """The index a ``FetchIndexRequest`` asks for, checked and counted; what both transports of
        an index fetch serve (gRPC's ``FetchIndex`` and the fetch channel)."""
        md = _metadata(request.metadata)
        known = request.index_type in pb.IndexType.values()
        type_name = pb.IndexType.Name(request.index_type) if known else None
        if type_name not in INDEX_BY_TYPE:
            raise InvalidArgument(f"unknown index type {request.index_type}")
        reader = self.sidecar.reader
        data = reader.read_index(reader.open(md), INDEX_BY_TYPE[type_name])
        self.sidecar.metrics.bytes.labels("index_served").inc(len(data))
        return data

    # -- delete ----------------------------------------------------------------
    @unary("delete")
    def DeleteSegment(
        self, message: pb.DeleteSegmentRequest | Malformed, context: grpc.ServicerContext
    ) -> pb.DeleteSegmentResponse:
        request: pb.DeleteSegmentRequest = _well_formed(message, "DeleteSegmentRequest")
        md = _metadata(request.metadata)
        s = self.sidecar
        base = s.layout.base(md)
        with s.copier.locks.hold(base, lambda: not context.is_active(), f"delete of {md.describe}"):
            delete_segment_objects(s.store, base)
            s.reader.forget(base)
        log.info(
            "deleted %s",
            md.describe,
            extra={"fields": {"op": "delete", "segment": md.segment_id, "key": base}},
        )
        return pb.DeleteSegmentResponse()
