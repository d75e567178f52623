"""Decoding options of the job without a registry (a descriptor-set file, the embedded
default) and the ``iceberg status`` command."""

from __future__ import annotations

import contextlib
import io
import json

from rsm_sidecar.cli.main import main
from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
from tests.iceberg.conftest import descriptor_set
from tests.iceberg.convert_helpers import T0, SyntheticTopic

PROTO = """syntax = "proto3";
package dev.v1;
import "google/protobuf/timestamp.proto";
message Reading { string sensor = 1; double value = 2; google.protobuf.Timestamp at = 3; }
message Other { string x = 1; }
"""


def _descriptor_set(tmp_path):
    src = tmp_path / "proto"
    src.mkdir()
    (src / "reading.proto").write_text(PROTO)
    return descriptor_set(tmp_path / "reading.pb", "reading.proto", src)


def test_descriptor_set_values_without_a_registry_and_status(spark, tmp_path):
    desc = _descriptor_set(tmp_path)
    cls = ProtoSchema.message_class(
        ProtoSchema.from_descriptor_set_file(desc).message_by_name("dev.v1.Reading")
    )
    t = SyntheticTopic(tmp_path / "t", "readings")
    values = []
    for i in range(20):
        m = cls(sensor=f"s{i % 3}", value=i / 4)
        m.at.seconds = 1_700_000_000 + i
        values.append(m.SerializeToString())
    values[7] = b"\x0a\xff\xff\xff\xff\x0f"  # not a Reading
    values[9] = None  # tombstone
    t.segment(
        0, [build_batch([SimpleRecord(b"k%d" % i, v, T0 + i) for i, v in enumerate(values)], base_offset=0)]
    )
    res = t.convert(
        spark, **{"iceberg.value.descriptor_set": str(desc), "iceberg.value.message": "dev.v1.Reading"}
    )
    assert res.records == 20
    got = {r["kafka"]["offset"]: r for r in t.table().scan().to_arrow().to_pylist()}
    for i in range(20):
        val = got[i]["val"]
        assert got[i]["key"]["__raw__"] == b"k%d" % i
        if i == 9:
            assert val is None
        elif i == 7:
            assert "invalid Protobuf for dev.v1.Reading" in val["__err__"] and val["__raw__"] == values[7]
        else:
            assert (val["sensor"], val["value"], val["__prefix__"], val["__raw__"], val["__err__"]) == (
                f"s{i % 3}",
                i / 4,
                None,
                None,
                None,
            )
            assert int(val["at"].timestamp()) == 1_700_000_000 + i

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["iceberg", "status", "--config", str(t.config_file), "--topic", t.topic]) == 0
    status = json.loads(out.getvalue())
    assert status["exists"] and status["next_offsets"] == {"0": 20} and status["source"] == "ancestry"
    assert status["job_id"] == res.job_id
