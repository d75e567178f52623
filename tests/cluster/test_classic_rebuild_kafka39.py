"""The classic rebuild of a follower from remote storage on Kafka 3.9 (test_rebuild.py says
what is checked), on a cluster of its own: Kafka 3.9.2, stream transfer mode, local-directory
storage. Named to run first, so that this cluster is gone before the shared one starts."""

from __future__ import annotations

import pytest

from tests.cluster.conftest import start_cluster
from tests.cluster.scenarios import rebuild_then_lead


@pytest.fixture(scope="module")
def cluster39(tmp_path_factory):
    c = start_cluster(
        tmp_path_factory.mktemp("cluster39"), kafka_version="3.9.2", storage="local", transfer_mode="stream"
    )
    yield c
    c.stop(graceful=False)


def test_follower_rebuilt_the_classic_way_on_kafka_3_9(cluster39):
    assert cluster39.dist.version == "3.9.2" and cluster39.transfer_mode == "stream"
    rebuild_then_lead(cluster39, cluster39.object_store(), "rebuild-classic", kip1023=False)
