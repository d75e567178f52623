"""Object keys and KIP-917 custom metadata."""

from __future__ import annotations

import pytest

from rsm_sidecar.errors import InvalidArgument
from rsm_sidecar.format import custom_metadata as cm
from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata

MD = SegmentMetadata("MWJ6FHTfRYy67jzwZdeqSQ", "topic", 7, "tqimKeZwStOEOwRzT3L5oQ", 1234, 2000)


def test_aiven_key_layout():
    layout = KeyLayout("someprefix/")
    assert (
        layout.key(MD, "log")
        == "someprefix/topic-MWJ6FHTfRYy67jzwZdeqSQ/7/00000000000000001234-tqimKeZwStOEOwRzT3L5oQ.log"
    )
    parsed = layout.parse(layout.key(MD, "rsm-manifest"))
    assert (
        parsed.topic,
        parsed.topic_id,
        parsed.partition,
        parsed.start_offset,
        parsed.segment_id,
        parsed.suffix,
    ) == ("topic", "MWJ6FHTfRYy67jzwZdeqSQ", 7, 1234, "tqimKeZwStOEOwRzT3L5oQ", "rsm-manifest")
    assert parsed.base == layout.base(MD)


def test_topic_names_with_dashes_parse():
    md = SegmentMetadata("MWJ6FHTfRYy67jz-ZdeqSQ", "my-topic.v1", 0, "tqimKeZwStOE_wRzT3L5oQ", 0, 1)
    layout = KeyLayout("")
    p = layout.parse(layout.key(md, "log"))
    assert (p.topic, p.topic_id, p.segment_id) == (
        "my-topic.v1",
        "MWJ6FHTfRYy67jz-ZdeqSQ",
        "tqimKeZwStOE_wRzT3L5oQ",
    )


def test_hashed_prefix_is_derived_from_metadata_and_spreads_partitions():
    layout = KeyLayout("p/", hashed_prefix_chars=4)
    key = layout.key(MD, "log")
    assert key.startswith("p/") and key.split("/")[1] != "topic-MWJ6FHTfRYy67jzwZdeqSQ"
    assert layout.parse(key).base == layout.base(MD)
    prefixes = {layout.partition_prefix(MD.topic_id, p) for p in range(64)}
    assert len(prefixes) > 50
    assert KeyLayout("p/", 4).key(MD, "log") == key  # deterministic


def test_custom_metadata_prefix_wins_over_current_configuration():
    old = KeyLayout("old-prefix/")
    fields = cm.encode({cm.REMOTE_SIZE: 100, cm.OBJECT_PREFIX: "old-prefix/"})
    md = SegmentMetadata(**{**MD.__dict__, "custom_metadata": fields})
    assert KeyLayout("new-prefix/").key(md, "log") == old.key(MD, "log")


def test_custom_metadata_aiven_vector():
    data = cm.encode({cm.REMOTE_SIZE: 100, cm.OBJECT_KEY: "foo"})
    assert len(data) == 11  # Aiven's SegmentCustomMetadataSerdeTest
    assert cm.decode(data) == {0: 100, 2: "foo"}
    assert cm.encode({}) == b"" and cm.decode(b"") == {}


def test_custom_metadata_worst_case_fits_default_cap():
    assert cm.worst_case_size(["REMOTE_SIZE", "OBJECT_PREFIX"], "tiered/", 0) <= 128
    assert cm.worst_case_size(["REMOTE_SIZE", "OBJECT_PREFIX", "OBJECT_KEY"], "", 0) > 128


@pytest.mark.parametrize(
    "field, value",
    [
        ("topic_id", "short"),
        ("segment_id", "../../etc/passwd0000000"),
        ("topic_name", "a/b"),
        ("partition", -1),
        ("end_offset", 10),
    ],
)
def test_invalid_metadata_is_rejected(field, value):
    md = SegmentMetadata(**{**MD.__dict__, field: value})
    with pytest.raises(InvalidArgument):
        md.validate()


@pytest.mark.parametrize(
    "md",
    [
        MD,
        SegmentMetadata(
            "MWJ6FHTfRYy67jzwZdeqSQ",
            "orders.v2",
            3,
            "tqimKeZwStOEOwRzT3L5oQ",
            100,
            199,
            max_timestamp_ms=1_700_000_000_000,
            broker_id=2,
            event_timestamp_ms=1_700_000_000_001,
            leader_epochs={0: 100, 4: 150},
            segment_size=12345,
            custom_metadata=cm.encode({cm.OBJECT_PREFIX: "tiered/"}),
            txn_index_empty=True,
        ),
    ],
)
def test_segment_metadata_through_the_proto_message_and_back(md):
    from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb

    message = pb.SegmentMetadata()
    md.fill_proto(message)
    assert SegmentMetadata.from_proto(message) == md
    assert message.HasField("custom_metadata") == (md.custom_metadata is not None)
