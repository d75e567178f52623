"""What the data files hold and what the table declares about them, read from the Parquet files
themselves: the sort order ``kafka.partition, kafka.offset`` (declared on new tables, on old
tables without one, kept through schema evolution and compaction, a sort order of one's own
left alone), Protobuf enums as Parquet strings (PyArrow writes no ENUM annotation), and error
rows' list-of-record columns null in the files although PyIceberg 0.12 reads them as ``[]``
(apache/iceberg-python#3833). Values are unframed Protobuf from a descriptor set (no registry)."""

from __future__ import annotations

import pyarrow.parquet as pq
from pyiceberg.table.sorting import NullOrder, SortDirection
from pyiceberg.transforms import IdentityTransform

from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
from tests.iceberg.conftest import descriptor_set as compile_descriptor_set
from tests.iceberg.convert_helpers import T0, SyntheticTopic

PROTO = """syntax = "proto3";
package lay.v1;
enum Kind { KIND_UNSPECIFIED = 0; SMALL = 1; LARGE = 2; }
message Line { string sku = 1; int32 qty = 2; }
message Order { string id = 1; Kind kind = 2; repeated Line lines = 3; repeated Kind history = 4; }
"""
PROTO_V2 = PROTO.replace("repeated Kind history = 4; }", "repeated Kind history = 4; string note = 5; }")
BAD = b"\x0a\xff\xff\xff\xff\x0f"  # field 1 with a length running past the end: not an Order


def descriptor_set(tmp_path, text: str, name: str):
    src = tmp_path / f"{name}-proto"
    src.mkdir()
    (src / "order.proto").write_text(text)
    return compile_descriptor_set(tmp_path / f"{name}.pb", "order.proto", src)


def orders(t: SyntheticTopic, desc, partition: int, n: int, bad_at: int | None = None) -> None:
    cls = ProtoSchema.message_class(
        ProtoSchema.from_descriptor_set_file(desc).message_by_name("lay.v1.Order")
    )
    base = t.next_offset.get(partition, 0)
    values = []
    for i in range(n):
        m = cls(id=f"o-{partition}-{base + i}", kind=1 + i % 2, history=[1, 2])
        m.lines.add(sku="a", qty=i)
        values.append(BAD if i == bad_at else m.SerializeToString())
    recs = [SimpleRecord(b"k", v, T0 + base + i) for i, v in enumerate(values)]
    t.segment(
        partition,
        [
            build_batch(recs[: n // 2], base_offset=base),
            build_batch(recs[n // 2 :], base_offset=base + n // 2),
        ],
    )
    t.next_offset[partition] = base + n


def parquet_column(pf: pq.ParquetFile, path: str):
    columns = [pf.schema.column(i) for i in range(len(pf.schema))]
    return next(c for c in columns if c.path == path)


def sorted_keys(kafka) -> bool:
    keys = list(zip(kafka.field("partition").to_pylist(), kafka.field("offset").to_pylist()))
    return keys == sorted(keys)


def files_of(table) -> list[dict]:
    return table.inspect.files().select(["file_path", "sort_order_id", "record_count"]).to_pylist()


def local(path: str) -> str:
    return path.removeprefix("file://")


def test_sort_order_enums_and_error_rows_in_the_data_files(spark, tmp_path):
    desc = descriptor_set(tmp_path, PROTO, "v1")
    t = SyntheticTopic(tmp_path / "t", "layout")
    orders(t, desc, 0, 30, bad_at=4)
    orders(t, desc, 1, 20)
    side = {"iceberg.value.descriptor_set": str(desc), "iceberg.value.message": "lay.v1.Order"}
    assert t.convert(spark, **side).records == 50
    table = t.table()
    order = table.sort_order()
    schema = table.schema()
    assert [
        (schema.find_column_name(f.source_id), f.transform, f.direction, f.null_order) for f in order.fields
    ] == [
        ("kafka.partition", IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST),
        ("kafka.offset", IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST),
    ]
    files = files_of(table)
    assert files and all(f["sort_order_id"] == order.order_id for f in files)
    bad_rows = []
    for f in files:
        pf = pq.ParquetFile(local(f["file_path"]))
        data = pf.read()
        assert sorted_keys(data.column("kafka").combine_chunks()), f"{f['file_path']} is out of order"
        # enums: Parquet strings (UTF8), no ENUM annotation - PyArrow cannot write one
        for path in ("val.kind", "val.history.list.element"):
            column = parquet_column(pf, path)
            assert (column.physical_type, str(column.logical_type)) == ("BYTE_ARRAY", "String")
        val = data.column("val").combine_chunks()
        for i, err in enumerate(val.field("__err__").to_pylist()):
            if err is not None:
                bad_rows.append(
                    (
                        val.field("lines")[i].as_py(),
                        val.field("history")[i].as_py(),
                        val.field("__raw__")[i].as_py(),
                    )
                )
    # the error row's list columns are null in the file ...
    assert bad_rows == [(None, None, BAD)]
    # ... PyIceberg 0.12 reads the list of records as [] (apache/iceberg-python#3833; the list of
    # enum strings stays null), Spark reads both as null
    (row,) = [
        r for r in table.scan(row_filter="kafka.offset == 4 and kafka.partition == 0").to_arrow().to_pylist()
    ]
    assert row["val"]["__err__"] is not None and row["val"]["lines"] == [] and row["val"]["history"] is None
    name = f"{t.catalog_name}.kafka.layout"
    got = spark.sql(
        f"SELECT val.lines, val.history FROM {name} WHERE kafka.partition = 0 AND kafka.offset = 4"
    ).collect()
    assert (got[0].lines, got[0].history) == (None, None)

    # schema evolution keeps the order; compaction rewrites the files in it
    desc2 = descriptor_set(tmp_path, PROTO_V2, "v2")
    orders(t, desc2, 0, 10)
    side2 = {"iceberg.value.descriptor_set": str(desc2), "iceberg.value.message": "lay.v1.Order"}
    assert t.convert(spark, **side2).records == 10
    table = t.table()
    assert "note" in [f.name for f in table.schema().find_field("val").field_type.fields]
    assert (
        table.sort_order().order_id == order.order_id
        and table.metadata.default_sort_order_id == order.order_id
    )
    res = t.maintain(spark, {}, compact=True)
    assert res.compacted["rewritten_data_files_count"] >= 2
    table = t.table()
    for f in files_of(table):
        kafka = pq.read_table(local(f["file_path"]), columns=["kafka"]).column("kafka").combine_chunks()
        assert sorted_keys(kafka) and f["sort_order_id"] == order.order_id
    assert sum(f["record_count"] for f in files_of(table)) == 60


def test_a_table_without_a_sort_order_gets_it_and_one_of_its_own_is_kept(spark, tmp_path):
    desc = descriptor_set(tmp_path, PROTO, "v1")
    side = {"iceberg.value.descriptor_set": str(desc), "iceberg.value.message": "lay.v1.Order"}
    t = SyntheticTopic(tmp_path / "t", "older")
    orders(t, desc, 0, 10)
    t.convert(spark, **side)
    name = f"{t.catalog_name}.kafka.older"
    spark.sql(f"ALTER TABLE {name} WRITE UNORDERED")  # as tables made before they declared one
    assert t.table().sort_order().is_unsorted
    orders(t, desc, 0, 10)
    t.convert(spark, **side)
    order = t.table().sort_order()
    assert [t.table().schema().find_column_name(f.source_id) for f in order.fields] == [
        "kafka.partition",
        "kafka.offset",
    ]
    # a sort order declared on purpose stays; files then claim none
    spark.sql(f"ALTER TABLE {name} WRITE ORDERED BY val.id DESC")
    own = t.table().sort_order().order_id
    orders(t, desc, 0, 10)
    t.convert(spark, **side)
    table = t.table()
    assert table.sort_order().order_id == own
    newest = max(table.inspect.entries().to_pylist(), key=lambda e: e["sequence_number"])
    assert newest["data_file"]["sort_order_id"] is None
