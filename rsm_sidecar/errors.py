"""The project's error hierarchy.

Every error a user can meet is an ``RsmError`` whose class says what went wrong and
whose ``grpc_code`` is the status the service answers with (see proto/rsm/v1/rsm.proto).
Messages name the object, segment or configuration key involved and never contain
key material.
"""

from __future__ import annotations

import grpc


class RsmError(Exception):
    """Base class. ``retriable`` tells callers whether the same call may succeed later."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retriable: bool = False


class NotFound(RsmError):
    """A segment, index or object does not exist."""

    grpc_code = grpc.StatusCode.NOT_FOUND


class NoSuchIndex(NotFound):
    """The segment has no index of the kind asked for: the normal answer for most segments'
    transaction index, not a failure."""


class InvalidArgument(RsmError):
    """The request itself is malformed."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class OutOfRange(RsmError):
    """A position lies beyond the end of the data."""

    grpc_code = grpc.StatusCode.OUT_OF_RANGE


class FailedPrecondition(RsmError):
    """The request is valid but cannot be served as things are (unknown key id, a file
    that changed during copy, sizes that do not match)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class DataLoss(RsmError):
    """Stored bytes failed verification: corrupt, truncated or tampered with."""

    grpc_code = grpc.StatusCode.DATA_LOSS


class Unavailable(RsmError):
    """A dependency (object storage) is unreachable or throttling; retry later."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    retriable = True


class DeadlineExceeded(RsmError):
    """An operation took longer than its deadline."""

    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    retriable = True


class ResourceExhausted(RsmError):
    """Every slot for this kind of call is busy (``copy.max_concurrent``,
    ``fetch.max_concurrent``); retry later."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retriable = True


class Cancelled(RsmError):
    """The caller went away (gRPC cancellation) or the service is shutting down."""

    grpc_code = grpc.StatusCode.CANCELLED


class ConfigError(RsmError):
    """A configuration value is missing or invalid. The message names the key and what is allowed."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
