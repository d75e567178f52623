"""Executors: one :class:`~rsm_sidecar.iceberg.planning.tasks.SegmentTask` -> raw record batches.

:func:`read_task` streams the task's segment from storage (verified, decrypted, decompressed by
:class:`~rsm_sidecar.segment.reader.SegmentReader`) from the offset-index position of its first
offset, batch by batch, into raw record batches
(:class:`~rsm_sidecar.iceberg.reading.raw_records.SegmentRowReader`), and checks at the end that
a piece of a split segment reached the ``ingest_timestamp`` maximum the next piece was given.
:func:`executor_context` opens the store like the sidecar does, once per Python worker (the
driver uses it too, to plan).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from rsm_sidecar.config import Config
from rsm_sidecar.errors import DataLoss, RsmError
from rsm_sidecar.iceberg.planning.tasks import SegmentTask
from rsm_sidecar.iceberg.reading.raw_records import SegmentRowReader
from rsm_sidecar.kafka import read_batches
from rsm_sidecar.segment.access import SegmentAccess
from rsm_sidecar.segment.log_file import StoredLogFile, offset_position
from rsm_sidecar.segment.settings import ReaderSettings


@dataclasses.dataclass(frozen=True)
class StorageParams:
    """What an executor needs to open the store like the sidecar: the sidecar's configuration
    (parsed TOML file + ``RSM__`` environment overrides) and the reader settings."""

    values: Mapping[str, Any] = dataclasses.field(repr=False)
    environ: Mapping[str, str] = dataclasses.field(repr=False)
    chunk_cache_bytes: int = 24 * 1024 * 1024
    prefetch_bytes: int = 8 * 1024 * 1024

    def cache_key(self) -> str:
        return hashlib.sha256(
            json.dumps(
                [self.values, self.environ, self.chunk_cache_bytes, self.prefetch_bytes],
                sort_keys=True,
                default=str,
            ).encode()
        ).hexdigest()


class ExecutorContext(SegmentAccess):
    """Store, key layout, keyring and segment reader of one executor process."""

    def __init__(self, params: StorageParams):
        cfg = Config(params.values, environ=params.environ, source="the job's sidecar configuration")
        # the sidecar's reader settings (e.g. fetch.accept_unauthenticated_segments) with the job's caches
        settings = ReaderSettings.from_config(cfg).with_caches(
            manifest_cache_bytes=4 * 1024 * 1024,
            index_cache_bytes=8 * 1024 * 1024,
            chunk_cache_bytes=params.chunk_cache_bytes,
            prefetch_bytes=params.prefetch_bytes,
            disk_cache_path="",
            prefetch_next_segment=False,
        )
        prefetch = (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rsm-prefetch")
            if params.prefetch_bytes
            else None
        )
        super().__init__(cfg, settings, prefetch=prefetch)


_CONTEXTS: dict[str, ExecutorContext] = {}
_CONTEXT_LOCK = threading.Lock()


def executor_context(params: StorageParams) -> ExecutorContext:
    key = params.cache_key()
    with _CONTEXT_LOCK:
        ctx = _CONTEXTS.get(key)
        if ctx is None:
            ctx = _CONTEXTS[key] = ExecutorContext(params)
        return ctx


def read_task(
    ctx: ExecutorContext, task: SegmentTask, *, max_records: int, max_bytes: int
) -> Iterator[pa.RecordBatch]:
    """Raw record batches of one task (bounded: one Kafka batch + one window at a time)."""
    seg = ctx.reader.open_base(task.base, task.describe)
    size = seg.manifest.original_size
    rows = SegmentRowReader(
        task.partition,
        task.lo,
        task.hi,
        task.aborted_txns(),
        task.ingest_state,
        ingest_bound=task.ingest_bound,
        max_records=max_records,
        max_bytes=max_bytes,
        source=f"{task.base}.log",
    )
    if size == 0:
        return
    pos = offset_position(ctx.reader, seg, task.start_offset, task.lo)
    with StoredLogFile(ctx.reader, seg) as log_file:
        yield from rows.batches(read_batches(log_file, start_position=pos, name=log_file.name))
    if task.end_state is not None and rows.state != task.end_state:
        # the next task of this segment started from the maximum the driver took from the time
        # index; the records disagree: fail the run (nothing is committed) rather than write
        # rows with a wrong ingest_timestamp
        raise DataLoss(
            f"{task.base}: the running maximum of the record times at offset {task.hi} is "
            f"{rows.state}, but the segment's time index gave {task.end_state} to the task "
            f"starting at {task.hi + 1}; convert with iceberg.task_bytes = 0 (no split segments)"
        )


def describe_error(task: SegmentTask, exc: BaseException) -> str:
    return f"segment {task.describe} ({task.base}): {type(exc).__name__}: {exc}"


class SegmentFailed(RsmError):
    """Converting one segment failed; the message names the segment."""
