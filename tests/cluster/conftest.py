"""A real three-broker cluster shared by every test of tests/cluster (devstack/cluster.py),
started once (its nodes in parallel) and stopped after the last of them (package scope: the
rest of the suite does not carry its four JVMs): Kafka 4.4, one controller, three brokers with a
sidecar each, path transfer mode, one S3 bucket (SeaweedFS), encryption on; every topic at
replication factor 3 and min ISR 2. The Kafka 3.9 cluster of the classic rebuild (stream mode,
local-directory storage) is test_classic_rebuild_kafka39.py's own.

Tests share the cluster: each uses topics of its own, leaves every broker and sidecar running
and the cluster's settings as it found them."""

from __future__ import annotations

import pytest

from devstack.cluster import ClusterStack
from tests.helpers import BROKER_JVM_OPTIONS

#: test timings: a broker that stops heartbeating is fenced after 6 s (not 9), a restarted
#: broker deletes tiered segments from its disk 1 s after start (not 30), and leaders move
#: only when a test moves them
BROKER_PROPERTIES = {
    "broker.heartbeat.interval.ms": 1000,
    "log.initial.task.delay.ms": 1000,
    "auto.leader.rebalance.enable": "false",
}
CONTROLLER_PROPERTIES = {"broker.session.timeout.ms": 6000}


def pytest_collection_modifyitems(items):
    for item in items:
        if "/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


def start_cluster(workdir, **kwargs) -> ClusterStack:
    cluster = ClusterStack(
        workdir,
        brokers=3,
        metrics=True,
        broker_properties=BROKER_PROPERTIES,
        controller_properties=CONTROLLER_PROPERTIES,
        jvm_options=BROKER_JVM_OPTIONS,
        **kwargs,
    )
    cluster.start()
    print(
        f"\nKafka {cluster.dist.version}: 3 brokers and a controller started in {cluster.start_seconds:.1f}s"
    )
    return cluster


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("cluster"), storage="s3", transfer_mode="path")
    yield c
    c.stop(graceful=False)  # its data is thrown away: no controlled shutdowns to wait for


@pytest.fixture(scope="package")
def store(cluster):
    return cluster.object_store()
