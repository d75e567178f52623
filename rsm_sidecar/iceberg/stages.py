"""The job's Spark stages as the executors run them, and how their errors come back.

One stage per run, over a DataFrame with one row per segment task (one task per Spark
partition): :func:`write_files_fn` (``iceberg.writer = arrow``: read, decode and write Parquet
data files, return their descriptions) or :func:`convert_fn` (``spark``: read and decode, rows
back to the JVM). A task's failure travels as ``RSM_TASK_ERROR<<class|message>>`` inside Spark's
error, and :func:`task_error` raises it again on the driver with its own class.

:func:`pause_point` is the test hook of :mod:`~rsm_sidecar.iceberg.job` (its docstring lists the
points).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import re
import sys
import tempfile
import time
import zipimport
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rsm_sidecar.errors import RsmError
from rsm_sidecar.iceberg.planning.tasks import SegmentTask
from rsm_sidecar.iceberg.reading.segment_tasks import (
    SegmentFailed,
    StorageParams,
    describe_error,
    executor_context,
    read_task,
)

PAUSE_ENV = "RSM_ICEBERG_PAUSE_AT"
PAUSE_DIR_ENV = "RSM_ICEBERG_PAUSE_DIR"
TASK_ERROR = re.compile(r"RSM_TASK_ERROR<<(?P<cls>[A-Za-z_]+)\|(?P<msg>.*?)>>", re.S)


def pause_point(name: str) -> None:
    """Test hook (see the module docstring). Does nothing unless ``$RSM_ICEBERG_PAUSE_AT``
    names ``name``."""
    points = [p.strip() for p in os.environ.get(PAUSE_ENV, "").split(",") if p.strip()]
    if name not in points:
        return
    d = Path(os.environ.get(PAUSE_DIR_ENV) or tempfile.gettempdir())
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.paused").write_text(str(os.getpid()))
    while not (d / f"{name}.resume").exists():
        time.sleep(0.05)


def static_archive_imports() -> int:
    """Stop the zip archives on this Python worker's ``sys.path`` from being re-read before
    every task; returns how many importers were changed.

    PySpark's worker calls ``importlib.invalidate_caches()`` before each task (for files added
    with ``addPyFile``). Its ``sys.path`` holds ``pyspark.zip``, py4j's zip and Spark's core jar,
    and an invalidated ``zipimporter`` re-reads its archive's whole directory in pure Python:
    measured 0.1-0.25 s of CPU per task here, about 1.4 µs per record of a million-record run
    in six tasks. Those archives do not change while a worker lives, so their importers keep
    the directory they read; directories, and archives added later, are untouched (an archive
    appearing later is read when its importer is made, and made static at the next task).
    """
    changed = 0
    for finder in list(sys.path_importer_cache.values()):
        if isinstance(finder, zipimport.zipimporter) and "invalidate_caches" not in vars(finder):
            finder.invalidate_caches = _keep_directory  # type: ignore[method-assign]
            changed += 1
    return changed


def freeze_worker_heap() -> None:
    """Take the objects this Python worker holds between tasks out of the cyclic garbage
    collector's reach (``gc.freeze``).

    A reused PySpark worker runs ``gc.collect()`` after every task (``pyspark/daemon.py``). A
    full collection walks every object the worker holds: the modules of PySpark, PyIceberg,
    PyArrow, protobuf and the job, ~140 000 objects and 60 ms at least, and 14 % of the
    workers' CPU in a profile of the convert benchmark. Called at the start of each task, just
    after that collection, it freezes only what survived it (modules, caches); what a task
    allocates is still collected. Frozen objects are never freed: that is the imported modules
    and the registry cache, which live as long as the worker anyway.
    """
    gc.freeze()


def with_static_archive_imports(rows: Iterator[Any]) -> Iterator[Any]:
    """An RDD partition's rows, unchanged, after :func:`static_archive_imports` and
    :func:`freeze_worker_heap` (for the Python workers of the task DataFrame, which run none of
    the job's own functions)."""
    static_archive_imports()
    freeze_worker_heap()
    return rows


def _keep_directory() -> None:
    """A static archive's ``invalidate_caches``: its directory stays as read."""


@dataclasses.dataclass(frozen=True)
class ExecutorParams:
    storage: StorageParams
    encoder: Any  # mapping.rows.EncoderSpec
    batch_records: int
    batch_bytes: int
    last_task_index: int
    files: Any = (
        None  # committing.data_files.FileTarget: the executors write Parquet (iceberg.writer = arrow)
    )


def _tasks(batches: Iterator, params: ExecutorParams) -> Iterator[SegmentTask]:
    """The segment tasks of one ``mapInArrow`` input (the test hook pauses at the last one)."""
    static_archive_imports()
    freeze_worker_heap()
    for b in batches:
        for text in b.column("task").to_pylist():
            task = SegmentTask.from_json(text)
            if task.index == params.last_task_index:
                pause_point("write")
            yield task


def encoded_batches(params: ExecutorParams, task: SegmentTask) -> Iterator[Any]:
    """Arrow batches of the table's schema: one task's records, read and decoded."""
    from rsm_sidecar.iceberg.mapping.rows import encoder_for

    ctx = executor_context(params.storage)
    enc = encoder_for(params.encoder)
    for raw in read_task(ctx, task, max_records=params.batch_records, max_bytes=params.batch_bytes):
        yield enc.encode(raw)


def _executor_error(task: SegmentTask, exc: BaseException) -> RuntimeError:
    """A task's failure in the form :func:`task_error` finds again on the driver."""
    return RuntimeError(f"RSM_TASK_ERROR<<{type(exc).__name__}|{describe_error(task, exc)}>>")


def convert_fn(params: ExecutorParams, accumulator) -> Callable[[Iterator], Iterator]:
    """The ``mapInArrow`` function: segment task rows in, table rows out."""

    def fn(batches):
        for task in _tasks(batches, params):
            records = 0
            try:
                for out in encoded_batches(params, task):
                    records += out.num_rows
                    yield out
            except Exception as exc:
                raise _executor_error(task, exc) from exc
            if accumulator is not None:
                accumulator.add({task.partition: [1, records]})

    return fn


FILES_DDL = "task INT, partition INT, records LONG, files ARRAY<BINARY>"


def write_files_fn(params: ExecutorParams) -> Callable[[Iterator], Iterator]:
    """The ``mapInArrow`` function of ``iceberg.writer = arrow``: segment task rows in, one row
    per task out with the data files it wrote (:class:`~.data_files.WrittenFile`, pickled)."""

    def fn(batches):
        import pickle

        import pyarrow as pa

        from rsm_sidecar.iceberg.committing.data_files import TaskFileWriter

        schema = pa.schema(
            [
                ("task", pa.int32()),
                ("partition", pa.int32()),
                ("records", pa.int64()),
                ("files", pa.list_(pa.binary())),
            ]
        )
        for task in _tasks(batches, params):
            writer = TaskFileWriter(params.files, task.index)
            try:
                for out in encoded_batches(params, task):
                    writer.write(out)
                written = writer.close()
            except Exception as exc:
                writer.abort()
                raise _executor_error(task, exc) from exc
            yield pa.RecordBatch.from_pydict(
                {
                    "task": [task.index],
                    "partition": [task.partition],
                    "records": [sum(w.records for w in written)],
                    "files": [[pickle.dumps(w) for w in written]],
                },
                schema=schema,
            )

    return fn


def counts_param():
    """Accumulator of ``{partition: [segments, records]}`` (progress; Spark retries may count a
    segment twice - the committed snapshot's ``added-records`` is the exact total)."""
    from pyspark import AccumulatorParam

    class CountsParam(AccumulatorParam):
        def zero(self, value):
            return {}

        def addInPlace(self, a, b):
            for k, (segs, recs) in b.items():
                cur = a.setdefault(k, [0, 0])
                cur[0] += segs
                cur[1] += recs
            return a

    return CountsParam()


def task_error(exc: BaseException) -> RsmError | None:
    """The executor's error, re-raised on the driver with its own class where it is ours."""
    m = TASK_ERROR.search(str(exc))
    if not m:
        return None
    cls, msg = m.group("cls"), m.group("msg")
    from rsm_sidecar import errors
    from rsm_sidecar.iceberg.decoding.schema_registry import RegistryAuthError, RegistryUnavailable

    known = {"RegistryUnavailable": RegistryUnavailable, "RegistryAuthError": RegistryAuthError}
    for name in (
        "DataLoss",
        "NotFound",
        "Unavailable",
        "FailedPrecondition",
        "ConfigError",
        "DeadlineExceeded",
        "InvalidArgument",
    ):
        known[name] = getattr(errors, name)
    target = known.get(cls)
    if target is None:
        from rsm_sidecar.kafka import errors as kerrors

        kcls = getattr(kerrors, cls, None)
        target = (
            errors.DataLoss if (kcls is not None and issubclass(kcls, errors.DataLoss)) else SegmentFailed
        )
    return target(f"converting {msg}")
