"""The rolling-restart test's reading checks (:func:`cluster_helpers.check_passes`), on passes
made up here: no cluster. They must fail on every loss, gap or misplaced record, and let through
only what librdkafka's idempotent producer does at a leader change (a record sent again under a
new producer epoch, acknowledged at its later offset: confluentinc/librdkafka#4953)."""

from __future__ import annotations

import pytest

from tests.cluster.cluster_helpers import Written, check_passes
from tests.e2e.kafka_helpers import Rec


def written(offsets_by_record: dict[int, int]) -> dict[int, Written]:
    """Partition 0's records ``load-<i>`` at the offsets their delivery reports named."""
    recs = [Rec(b"load-%d" % i, b"v", (), 0, offset=o) for i, o in offsets_by_record.items()]
    return {0: Written(recs)}


#: records 0-3 acknowledged at offsets 0-3, record 4 at offset 5 (the producer's retry)
TOLD = {0: 0, 1: 1, 2: 2, 3: 3, 4: 5}


def test_a_record_sent_again_and_acknowledged_later_is_a_named_duplicate():
    log = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 4}  # record 4 at 4 (never acknowledged) and at 5
    total, dups = check_passes("reader", [{0: log}, {0: dict(list(log.items())[:5])}], written(TOLD))
    assert total == 11 and dups == {(0, 4, 4)}


@pytest.mark.parametrize(
    "log, says",
    [
        ({0: 0, 1: 1, 2: 2, 3: 3, 5: 4}, "a gap in"),  # offset 4 missing
        ({0: 0, 1: 1, 2: 3, 3: 2, 4: 4, 5: 4}, "offset 0/2 holds record 3"),  # two records swapped
        ({0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 4}, "offset 0/4 holds record 3"),  # a copy of an earlier record
        ({0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 0}, "offset 0/5 holds record 0"),  # an acknowledged offset lost
    ],
)
def test_losses_gaps_and_misplaced_records_fail(log, says):
    with pytest.raises(AssertionError, match=says):
        check_passes("reader", [{0: log}], written(TOLD))
