"""The rules of `inspect orphans --bootstrap-server` (rsm_sidecar/inspect/orphans.py
cross_check) on a local-directory store written by the sidecar's writer and Kafka metadata
records built by hand: what each finding means, what is deleted and what never is.
tests/e2e/test_orphans_kafka.py runs it against a real broker's metadata topic."""

from __future__ import annotations

import datetime
import time

import pytest

from rsm_sidecar.config import Config
from rsm_sidecar.format.keys import KeyLayout
from rsm_sidecar.inspect import orphans
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.kafka_metadata import fold
from rsm_sidecar.kafka import remote_log_metadata as rlm
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
from rsm_sidecar.storage.local import LocalObjectStore
from tests.tiered_writer import TieredWriter, new_uuid

TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"
NOW_MS = int(time.time() * 1000)
HOUR = 3600.0


@pytest.fixture
def world(tmp_path):
    store = LocalObjectStore(tmp_path / "remote", fsync=False)
    layout = KeyLayout("tiered/")
    writer = TieredWriter(store, layout, None, "orders", TOPIC_ID)
    stranger = TieredWriter(store, layout, None, "orders", "Qm9vbXRvd25Gb3JldmVyMQ")

    def segment(w: TieredWriter, partition: int, start: int):
        return w.write_segment(partition, [build_batch([SimpleRecord(b"k", b"v", 1)], base_offset=start)])

    segs = {
        "finished": segment(writer, 0, 0),
        "started": segment(writer, 0, 1),
        "unknown": segment(writer, 0, 2),
        "deleted": segment(writer, 0, 3),
        "deleting": segment(writer, 0, 4),
        "partition-gone": segment(writer, 8, 0),
        "foreign-1": segment(stranger, 0, 0),
        "foreign-2": segment(stranger, 0, 1),
    }
    writer.close()
    stranger.close()
    lost = new_uuid()

    def rec(key: str | None, state: str, update: bool = False, **kw) -> rlm.SegmentRecord:
        md = segs[key] if key else None
        return rlm.SegmentRecord(
            "orders", TOPIC_ID, md.partition if md else 0, md.segment_id if md else lost, state, 1,
            NOW_MS - 2 * 3_600_000, update=update,
            **({} if update else {"start_offset": md.start_offset if md else 5,
                                  "end_offset": md.end_offset if md else 5}),
            **kw,
        )  # fmt: skip

    values = [
        rec("finished", rlm.COPY_SEGMENT_STARTED),
        rec("finished", rlm.COPY_SEGMENT_FINISHED, update=True),
        rec("started", rlm.COPY_SEGMENT_STARTED),
        rec("deleted", rlm.COPY_SEGMENT_STARTED),
        rec("deleted", rlm.DELETE_SEGMENT_FINISHED, update=True),
        rec("deleting", rlm.COPY_SEGMENT_STARTED),
        rec("deleting", rlm.DELETE_SEGMENT_STARTED, update=True),
        rec(None, rlm.COPY_SEGMENT_STARTED),  # "lost": finished in Kafka, never in storage
        rec(None, rlm.COPY_SEGMENT_FINISHED, update=True),
        rlm.PartitionDeleteRecord("orders", TOPIC_ID, 8, "DELETE_PARTITION_FINISHED", 1, NOW_MS),
    ]
    kafka = fold(rlm.encode(v) for v in values)
    cfg = Config(
        {
            "storage.backend": "local",
            "storage.local.root": str(tmp_path / "remote"),
            "storage.key_prefix": "tiered/",
            "encryption.enabled": False,
        }
    )
    ctx = InspectContext(cfg, store=store)
    return ctx, store, layout, segs, kafka, lost


def check(world, hours_later: float, min_age: float = HOUR, delete: bool = False):
    ctx, store, layout, segs, kafka, lost = world
    stored: list[orphans.CompleteSegment] = []
    orphans.run(ctx, stored=stored)
    now = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=hours_later)
    return orphans.cross_check(ctx, stored, kafka, min_age, delete, now)


def by_id(result) -> dict[str, tuple[str, str]]:
    return {f.segment_id: (f.finding, f.action) for f in result.findings}


def test_each_finding_and_what_delete_removes(world):
    ctx, store, layout, segs, kafka, lost = world
    result = check(world, 2)
    assert by_id(result) == {
        segs["started"].segment_id: ("copy-not-finished", "kept"),
        segs["unknown"].segment_id: ("not-in-kafka", "listed"),
        segs["deleted"].segment_id: ("deleted-in-kafka", "listed"),
        segs["deleting"].segment_id: ("delete-not-finished", "kept"),
        segs["partition-gone"].segment_id: ("deleted-in-kafka", "listed"),
        "2 segments": ("topic-not-in-kafka", "kept"),
        lost: ("missing-in-storage", "listed"),
    }
    started = next(f for f in result.findings if f.finding == "copy-not-finished")
    assert (
        started.note == "no finished copy of these offsets"
        and started.kafka_state == rlm.COPY_SEGMENT_STARTED
    )
    # "unknown" holds offset 2 of partition 0; nothing else of Kafka's finished segments does
    assert next(f for f in result.findings if f.finding == "not-in-kafka").note == ""

    deletable = {k: layout.base(segs[k]) for k in ("unknown", "deleted", "partition-gone")}
    result = check(world, 2, delete=True)
    assert {sid for sid, (_, action) in by_id(result).items() if action == "deleted"} == {
        segs[k].segment_id for k in deletable
    }
    for base in deletable.values():
        assert not any(store.exists(f"{base}.{s}") for s in ("log", "indexes", "rsm-manifest"))
    for k in ("finished", "started", "deleting", "foreign-1"):  # Kafka lists them, or another cluster's
        assert store.exists(layout.base(segs[k]) + ".rsm-manifest")


def test_young_copies_are_not_reported_and_young_strays_not_deleted(world):
    ctx, store, layout, segs, kafka, lost = world
    result = check(world, 0, min_age=HOUR, delete=True)
    found = by_id(result)
    assert segs["started"].segment_id not in found  # a copy that may be in flight
    assert found[segs["unknown"].segment_id] == ("not-in-kafka", "kept-too-young")
    assert store.exists(layout.base(segs["unknown"]) + ".rsm-manifest")


def test_nothing_is_deleted_when_the_metadata_topic_lost_records(world):
    ctx, store, layout, segs, kafka, lost = world
    kafka.incomplete[3] = 120
    result = check(world, 2, delete=True)
    assert not [f for f in result.findings if f.action == "deleted"]
    assert all(
        "metadata topic incomplete" in f.note for f in result.findings if f.finding in orphans.DELETABLE
    )


def test_a_client_config_needs_a_bootstrap_server(tmp_path, capsys):
    from rsm_sidecar.cli.main import main

    cfg = tmp_path / "sidecar.toml"
    cfg.write_text(
        f'[storage]\nbackend = "local"\n[storage.local]\nroot = "{tmp_path}"\n[encryption]\nenabled = false\n'
    )
    conf = tmp_path / "client.properties"
    conf.write_text("security.protocol=PLAINTEXT\n")
    assert main(["inspect", "orphans", "-c", str(cfg), "--command-config", str(conf)]) == 2
    assert "--command-config needs --bootstrap-server" in capsys.readouterr().err


def test_client_properties_are_read_as_key_value_lines(tmp_path):
    from rsm_sidecar.errors import ConfigError
    from rsm_sidecar.inspect.kafka_metadata import load_client_config

    f = tmp_path / "client.properties"
    f.write_text("# comment\n\nsecurity.protocol = SASL_SSL\nsasl.password=a=b\n! also a comment\n")
    assert load_client_config(str(f)) == {"security.protocol": "SASL_SSL", "sasl.password": "a=b"}
    f.write_text("security.protocol\n")
    with pytest.raises(ConfigError, match="line 1: expected key=value"):
        load_client_config(str(f))
    assert load_client_config(None) == {}
