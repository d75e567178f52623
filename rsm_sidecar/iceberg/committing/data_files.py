"""Executors write the table's Parquet data files themselves; the driver commits them.

The rows a convert task decodes are already Arrow batches of the table's schema. Writing them
with PyArrow's Parquet writer on the executor (columnar, field ids from the table's schema,
one file per partition value) avoids shipping every row back into the JVM, turning columns
into rows there and writing them again with Iceberg's row-based writer - which cost more than
the whole decode (docs/iceberg.md "Performance"). Spark still schedules the tasks; each task
returns the descriptions of the files it wrote (:class:`WrittenFile`), and the driver adds them
to the table in one conditional commit (:func:`rsm_sidecar.iceberg.committing.markers.commit_files`).

Memory per task (bounded, whatever the segment size): for each open file (at most
:data:`MAX_OPEN_FILES`, one per partition value), the batches not yet written, at most
:attr:`FileTarget.row_group_bytes` of Arrow data (then they become one Parquet row group), plus
PyArrow's writer buffers for that row group: ≤ 2 × 32 MiB of Arrow data. A task writes one file
per partition value it meets (``day(kafka.ingest_timestamp)`` by default: one or two per
segment); a file is closed once it reaches ``iceberg.target_file_size`` on disk.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:  # pragma: no cover
    from pyiceberg.io import FileIO, OutputStream
    from pyiceberg.manifest import DataFile
    from pyiceberg.partitioning import PartitionKey
    from pyiceberg.schema import Schema
    from pyiceberg.table.metadata import TableMetadata


#: Files one task keeps open. ``kafka.ingest_timestamp`` never decreases within a partition,
#: so a task meets its time partitions one after the other: a file is finished when the task
#: moves on (anything else would still be written, to a further file for the same partition).
MAX_OPEN_FILES = 2


@dataclasses.dataclass(frozen=True)
class FileTarget:
    """Where and how a task writes (picklable: sent to every executor)."""

    metadata_json: str  # the table's metadata as loaded by the driver after schema evolution
    io_properties: Mapping[str, str] = dataclasses.field(repr=False)
    target_file_size: int = 512 * 1024 * 1024
    row_group_bytes: int = 32 * 1024 * 1024
    write_id: str = ""  # names the files: <write_id>-<task>-<attempt>-<n>.parquet

    @classmethod
    def for_table(cls, table, *, target_file_size: int, write_id: str) -> FileTarget:
        return cls(
            metadata_json=table.metadata.model_dump_json(),
            io_properties=dict(table.io.properties),
            target_file_size=target_file_size,
            write_id=write_id,
        )


@dataclasses.dataclass(frozen=True)
class WrittenFile:
    """One data file a task wrote, as the driver commits it."""

    path: str
    records: int
    data_file: DataFile = dataclasses.field(repr=False)


class _OpenFile:
    """One Parquet file being written for one partition value."""

    def __init__(
        self,
        values: tuple,
        path: str,
        stream: OutputStream,
        writer: pq.ParquetWriter,
        key: PartitionKey | None,
    ):
        self.values = values  # the partition values (the task's key for this file)
        self.path = path
        self.stream = stream
        self.writer = writer
        self.key = key
        self.pending: list[pa.RecordBatch] = []
        self.pending_bytes = 0
        self.records = 0

    def size(self) -> int:
        """Bytes written so far (whole row groups)."""
        return self.stream.tell()


class TaskFileWriter:
    """The data files of one task: :meth:`write` batches of the table's Arrow schema, then
    :meth:`close` for their descriptions (or :meth:`abort` to delete what was written)."""

    def __init__(self, target: FileTarget, task_index: int):
        from pyiceberg.io import load_file_io
        from pyiceberg.io.pyarrow import schema_to_pyarrow
        from pyiceberg.table.locations import load_location_provider
        from pyiceberg.table.metadata import TableMetadataUtil

        self.target = target
        self.task_index = task_index
        self.metadata: TableMetadata = TableMetadataUtil.parse_raw(target.metadata_json)
        self.schema: Schema = self.metadata.schema()
        self.spec = self.metadata.spec()
        self.io: FileIO = load_file_io(dict(target.io_properties), self.metadata.location)
        self.locations = load_location_provider(self.metadata.location, self.metadata.properties)
        self.arrow_schema = schema_to_pyarrow(self.schema, include_field_ids=True)
        self._dictionary_columns = dictionary_columns(self.arrow_schema)
        self._partition_sources = [
            (f, self.schema.find_field(f.source_id), self.schema.find_column_name(f.source_id) or "")
            for f in self.spec.fields
        ]
        # a task's rows are one Kafka partition in offset order: its files are in the table's
        # sort order when that is kafka.partition, kafka.offset (mapping/evolution.py)
        order = self.metadata.sort_order_by_id(self.metadata.default_sort_order_id)
        self._sort_order_id = (
            order.order_id
            if order is not None and not order.is_unsorted and _offset_order(order, self.schema)
            else None
        )
        self._open: dict[tuple, _OpenFile] = {}
        self._done: list[WrittenFile] = []
        self._written_paths: list[str] = []
        self._seq = 0
        # Spark may run a task twice (a retry, a speculative copy, an executor thought lost but
        # still running): each attempt writes its own files, so one can never overwrite the
        # files another attempt reported (only the reported attempt's files are committed).
        self._attempt = uuid.uuid4().hex[:12]

    # ------------------------------------------------------------------ writing
    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        batch = pa.RecordBatch.from_arrays(batch.columns, schema=self.arrow_schema)
        for key_values, part in self._split(batch):
            f = self._open.pop(key_values, None)
            if f is None:
                if len(self._open) >= MAX_OPEN_FILES:  # the least recently written one
                    self._finish(next(iter(self._open.values())))
                f = self._new_file(key_values)
            self._open[key_values] = f  # dict order = least recently written first
            f.pending.append(part)
            f.pending_bytes += part.nbytes
            f.records += part.num_rows
            if f.pending_bytes >= self.target.row_group_bytes:
                self._flush(f)

    def close(self) -> list[WrittenFile]:
        for f in list(self._open.values()):
            self._finish(f)
        return list(self._done)

    def abort(self) -> None:
        """Delete every file this task wrote (best effort: an orphan is harmless, see
        ``maintain --remove-orphans``)."""
        for f in self._open.values():
            try:
                f.writer.close()
                f.stream.close()
            except Exception:  # aborting anyway
                pass
        self._open.clear()
        for path in self._written_paths:
            try:
                self.io.delete(path)
            except Exception:  # orphans are removed by maintenance
                pass

    # ------------------------------------------------------------------ internals
    def _split(self, batch: pa.RecordBatch) -> Iterable[tuple[tuple, pa.RecordBatch]]:
        """``(partition values, rows)`` pairs: the whole batch when it holds one value."""
        if not self._partition_sources:
            yield (), batch
            return
        import pyarrow.compute as pc

        columns = []
        for field, source, name in self._partition_sources:
            values = _column(batch, name)
            columns.append(field.transform.pyarrow_transform(source.field_type)(values))
        if len(columns) == 1:
            uniques = pc.unique(columns[0]).to_pylist()
            if len(uniques) == 1:
                yield (uniques[0],), batch
                return
        keys = pa.table({str(i): c for i, c in enumerate(columns)})
        for row in keys.group_by(list(keys.column_names)).aggregate([]).to_pylist():
            mask = None
            for i, c in enumerate(columns):
                v = row[str(i)]
                m = pc.is_null(c) if v is None else pc.equal(c, v)
                mask = m if mask is None else pc.and_(mask, m)
            yield tuple(row[str(i)] for i in range(len(columns))), batch.filter(mask)

    def _new_file(self, key_values: tuple) -> _OpenFile:
        from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs

        key = self._partition_key(key_values)
        name = f"{self.target.write_id}-{self.task_index:05d}-{self._attempt}-{self._seq:05d}.parquet"
        self._seq += 1
        path = self.locations.new_data_location(data_file_name=name, partition_key=key)
        self._written_paths.append(path)
        stream = self.io.new_output(path).create(overwrite=True)
        try:
            writer = pq.ParquetWriter(
                stream,
                schema=self.arrow_schema,
                store_decimal_as_integer=True,
                use_dictionary=self._dictionary_columns,
                **_get_parquet_writer_kwargs(self.metadata.properties),
            )
        except Exception:
            stream.close()
            raise
        return _OpenFile(key_values, path, stream, writer, key)

    def _partition_key(self, key_values: tuple) -> PartitionKey | None:
        if not self._partition_sources:
            return None
        from pyiceberg.partitioning import PartitionFieldValue, PartitionKey

        return PartitionKey(
            field_values=[
                PartitionFieldValue(field=field, value=v)
                for (field, _, _), v in zip(self._partition_sources, key_values, strict=True)
            ],
            partition_spec=self.spec,
            schema=self.schema,
        )

    def _flush(self, f: _OpenFile) -> None:
        """The pending batches of ``f`` become one row group; the file is finished once it has
        reached the target size."""
        self._write_row_group(f)
        if f.size() >= self.target.target_file_size:
            self._finish(f)

    def _write_row_group(self, f: _OpenFile) -> None:
        if f.pending:
            table = pa.Table.from_batches(f.pending, schema=self.arrow_schema)
            f.pending, f.pending_bytes = [], 0
            f.writer.write_table(table, row_group_size=max(table.num_rows, 1))

    def _finish(self, f: _OpenFile) -> None:
        from pyiceberg.io.pyarrow import (
            compute_statistics_plan,
            data_file_statistics_from_parquet_metadata,
            parquet_path_to_id_mapping,
        )
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        del self._open[f.values]
        self._write_row_group(f)
        f.writer.close()
        size = f.size()
        f.stream.close()
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=f.writer.writer.metadata,
            stats_columns=compute_statistics_plan(self.schema, self.metadata.properties),
            parquet_column_mapping=parquet_path_to_id_mapping(self.schema),
        )
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=f.path,
            file_format=FileFormat.PARQUET,
            partition=f.key.partition if f.key else Record(),
            file_size_in_bytes=size,
            sort_order_id=self._sort_order_id,
            spec_id=self.metadata.default_spec_id,
            equality_ids=None,
            key_metadata=None,
            **stats.to_serialized_dict(),
        )
        self._done.append(WrittenFile(f.path, f.records, data_file))


def _offset_order(order, schema: Schema) -> bool:
    """Whether ``order`` is ``kafka.partition ASC, kafka.offset ASC`` (identity transforms)."""
    from pyiceberg.table.sorting import SortDirection

    want = [schema.find_field(name).field_id for name in ("kafka.partition", "kafka.offset")]
    return [
        f.source_id
        for f in order.fields
        if str(f.transform) == "identity" and f.direction == SortDirection.ASC
    ] == want and len(order.fields) == 2


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The Parquet columns worth dictionary-encoding: strings (enum names, header keys,
    ``__err__`` messages repeat) and ``kafka.partition``. Offsets, timestamps, ids and bytes are
    mostly distinct: on the benchmark's rows, dictionary-encoding every column cost 1.0 µs per
    record against 0.65 without, and made the file 39 % larger (the dictionary pages are
    written before PyArrow falls back to plain encoding)."""
    out: list[str] = []

    def walk(path: list[str], typ: pa.DataType) -> None:
        if pa.types.is_struct(typ):
            for f in typ:
                walk([*path, f.name], f.type)
        elif pa.types.is_list(typ) or pa.types.is_large_list(typ):
            walk([*path, "list", "element"], typ.value_type)
        elif pa.types.is_map(typ):
            walk([*path, "key_value", "key"], typ.key_type)
            walk([*path, "key_value", "value"], typ.item_type)
        elif pa.types.is_string(typ) or pa.types.is_large_string(typ):
            out.append(".".join(path))

    for field in schema:
        walk([field.name], field.type)
    if "kafka" in schema.names and "partition" in [f.name for f in schema.field("kafka").type]:
        out.append("kafka.partition")
    return out


def _column(batch: pa.RecordBatch, dotted: str) -> pa.Array:
    """A (possibly nested, ``a.b``) column of ``batch``."""
    import pyarrow.compute as pc

    head, *rest = dotted.split(".")
    arr: Any = batch.column(head)
    for name in rest:
        arr = pc.struct_field(arr, name)
    return arr
