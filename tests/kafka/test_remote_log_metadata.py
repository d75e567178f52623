"""The reader of `__remote_log_metadata` records (rsm_sidecar/kafka/remote_log_metadata.py) on
hand-built values: every record type in versions 0 and 1, unknown tags, and corrupt or foreign
values. tests/e2e/test_orphans_kafka.py compares it with Kafka's own serde on records a real
broker wrote."""

from __future__ import annotations

import pytest

from rsm_sidecar.errors import DataLoss, InvalidArgument
from rsm_sidecar.format.varint import encode_unsigned_varint
from rsm_sidecar.inspect.kafka_metadata import fold
from rsm_sidecar.kafka import remote_log_metadata as rlm

TOPIC_ID = "MWJ6FHTfRYy67jzwZdeqSQ"
SEG = "xtXqgqf_TfGZsNwa65OeAw"


def started(**kw) -> rlm.SegmentRecord:
    fields = dict(
        topic="orders", topic_id=TOPIC_ID, partition=7, segment_id=SEG, state=rlm.COPY_SEGMENT_STARTED,
        broker_id=2, event_timestamp_ms=1_795_000_000_123, start_offset=1234, end_offset=5678,
        max_timestamp_ms=1_795_000_000_000, leader_epochs=((0, 0), (3, 2000)), segment_size=1 << 20,
    )  # fmt: skip
    fields.update(kw)
    return rlm.SegmentRecord(**fields)  # type: ignore[arg-type]


def update(state: str, **kw) -> rlm.SegmentRecord:
    fields = dict(
        topic="orders", topic_id=TOPIC_ID, partition=7, segment_id=SEG, state=state, broker_id=2,
        event_timestamp_ms=1_795_000_000_500, update=True,
    )  # fmt: skip
    fields.update(kw)
    return rlm.SegmentRecord(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [0, 1])
def test_every_record_type_round_trips(version):
    recs = [
        started(),
        started(
            custom_metadata=b"\x01\x00\x02\x01",
            txn_index_empty=True,
            broker_leader_epoch=3 if version else -1,
        ),
        update(rlm.COPY_SEGMENT_FINISHED, custom_metadata=b"\x00"),
        update(
            rlm.DELETE_SEGMENT_FINISHED,
            end_offset=5678 if version else -1,
            broker_leader_epoch=4 if version else -1,
        ),
        rlm.PartitionDeleteRecord("orders", TOPIC_ID, 7, "DELETE_PARTITION_FINISHED", 1, 1_795_000_001_000),
    ]
    for r in recs:
        assert rlm.decode(rlm.encode(r, version)) == r


def test_the_layout_is_kafkas():
    """The first bytes as Kafka's serde writes them: frame version 1, api key, version, then the
    compact string topic name (length + 1), the topic id's 16 bytes, the partition."""
    raw = rlm.encode(started())
    assert raw[:3] == b"\x01\x00\x00"
    assert raw[3] == len("orders") + 1 and raw[4:10] == b"orders"
    assert rlm.uuid_string(raw[10:26]) == TOPIC_ID
    assert raw[26:30] == (7).to_bytes(4, "big")
    assert raw[30] == 0  # the topic-id-partition struct's tagged fields
    assert rlm.decode(raw).segment_id == SEG


def test_unknown_tags_are_skipped():
    raw = rlm.encode(update(rlm.COPY_SEGMENT_FINISHED))
    assert raw[-1] == 0  # no tagged fields
    tagged = raw[:-1] + encode_unsigned_varint(1) + encode_unsigned_varint(9) + b"\x03abc"
    assert rlm.decode(tagged) == update(rlm.COPY_SEGMENT_FINISHED)


def test_foreign_and_corrupt_values_are_refused_with_their_reason():
    raw = rlm.encode(started())
    with pytest.raises(InvalidArgument, match="newer than this reader"):
        rlm.decode(b"\x01\x00\x02" + raw[3:])
    with pytest.raises(InvalidArgument, match="api key 3"):
        rlm.decode(b"\x01\x03\x00" + raw[3:])
    with pytest.raises(InvalidArgument, match="frame version 0"):
        rlm.decode(b"\x00" + raw[1:])
    for cut in (1, 5, 29, len(raw) - 1):
        with pytest.raises(DataLoss, match="ends inside"):
            rlm.decode(raw[:cut])
    with pytest.raises(DataLoss, match="1 bytes after the message"):
        rlm.decode(raw + b"\x00")
    bad_state = bytearray(rlm.encode(update(rlm.COPY_SEGMENT_FINISHED)))
    bad_state[-2] = 9
    with pytest.raises(DataLoss, match="unknown state 9"):
        rlm.decode(bytes(bad_state))


def test_folding_keeps_each_segments_latest_state_and_its_offsets():
    other = started(segment_id="Qm9vbXRvd25Gb3JldmVyMQ", start_offset=5679, end_offset=6000)
    md = fold(
        rlm.encode(r)
        for r in (
            started(),
            other,
            update(rlm.COPY_SEGMENT_FINISHED, custom_metadata=b"\x01"),
            update(rlm.DELETE_SEGMENT_STARTED, segment_id=other.segment_id),
            rlm.PartitionDeleteRecord("orders", TOPIC_ID, 8, "DELETE_PARTITION_FINISHED", 1, 1),
        )
    )
    assert md.records == 5 and md.topic_ids == {TOPIC_ID}
    seg = md.segments[SEG]
    assert (seg.state, seg.start_offset, seg.end_offset) == (rlm.COPY_SEGMENT_FINISHED, 1234, 5678)
    assert seg.started_ms == 1_795_000_000_123 and seg.updated_ms == 1_795_000_000_500
    assert seg.custom_metadata == b"\x01"
    assert md.segments[other.segment_id].state == rlm.DELETE_SEGMENT_STARTED
    assert md.partition_deleted(TOPIC_ID, 8) and not md.partition_deleted(TOPIC_ID, 7)
