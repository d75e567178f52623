"""devstack/cluster.py and `make up BROKERS=N` without starting anything (tests/cluster/ runs
the real cluster): what a cluster is given, and what is refused."""

from __future__ import annotations

import threading
import time

import pytest

from devstack import cli
from devstack.cluster import CONTROLLER_PROPERTIES, ClusterStack
from devstack.stack import CONFIG_DIR, read_properties


def test_a_cluster_has_at_least_three_brokers(tmp_path):
    with pytest.raises(ValueError, match="at least 3 brokers, not 2"):
        ClusterStack(tmp_path, brokers=2)
    with pytest.raises(ValueError, match="2 broker ports for 3 brokers"):
        ClusterStack(tmp_path, brokers=3, broker_ports=[9092, 9093])


def test_the_controller_takes_the_cluster_settings_and_knows_tiered_storage_is_on(tmp_path):
    cluster = ClusterStack(tmp_path, controller_properties={"broker.session.timeout.ms": 6000})
    cluster_wide = read_properties(CONFIG_DIR / "cluster.properties", {})
    assert cluster_wide["default.replication.factor"] == "3"
    assert cluster.controller_properties == {
        **cluster_wide,
        **CONTROLLER_PROPERTIES,
        "broker.session.timeout.ms": 6000,
    }
    assert cluster.controller_properties["remote.log.storage.system.enable"] == "true"


def test_cluster_settings_replace_the_single_broker_ones():
    values = {"SHIM_DIR": "/s", "SIDECAR_TARGET": "t", "TRANSFER_MODE": "path"}
    tiered = read_properties(CONFIG_DIR / "broker-tiered.properties", values)
    cluster_wide = read_properties(CONFIG_DIR / "cluster.properties", {})
    replaced = set(tiered) & set(cluster_wide)
    assert replaced == {
        "rlmm.config.remote.log.metadata.topic.replication.factor",
        "rlmm.config.remote.log.metadata.topic.min.isr",
    }
    assert {k: cluster_wide[k] for k in replaced} != {k: tiered[k] for k in replaced}


def test_the_cluster_keeps_the_id_its_data_was_formatted_with(tmp_path):
    """`make up BROKERS=3` keeps run/cluster between runs: every node must use the id the
    controller's data directory was formatted with."""
    meta = tmp_path / "controller" / "data" / "meta.properties"
    meta.parent.mkdir(parents=True)
    meta.write_text(
        "#\nnode.id=0\ndirectory.id=RO9iLkJhzNuCq0aYXOShiQ\nversion=1\ncluster.id=AztvPgYgRhKtJp954Zj_Sg\n"
    )
    assert ClusterStack(tmp_path).cluster_id == "AztvPgYgRhKtJp954Zj_Sg"
    assert ClusterStack(tmp_path / "fresh").cluster_id != "AztvPgYgRhKtJp954Zj_Sg"


@pytest.mark.parametrize("brokers", ["0", "2"])
def test_make_up_refuses_two_brokers(brokers, capsys):
    assert cli.main(["up", "--brokers", brokers]) == 1
    assert f"BROKERS={brokers}: use 1 (one broker) or 3 and more (a cluster)" in capsys.readouterr().out


def test_a_broker_being_added_is_not_in_bootstrap_servers_until_it_has_started(tmp_path, monkeypatch):
    """`add_broker` on another thread while a test produces (tests/cluster/test_reassign.py):
    `bootstrap_servers` must not reach the new node before its broker exists (CI once read it in
    that window and failed on the node's missing broker). Node starts are replaced by a start
    that waits for the test: the window is a race a real start leaves to chance."""
    from types import SimpleNamespace

    from devstack.cluster import ClusterNode

    release = threading.Event()

    def start(node):
        if node.node_id == 4:
            assert release.wait(30)
        node.broker = SimpleNamespace(bootstrap_servers=f"127.0.0.1:{9090 + node.node_id}")
        return node

    monkeypatch.setattr(ClusterNode, "start", start)
    cluster = ClusterStack(tmp_path)
    cluster.controller = SimpleNamespace(controller_voter="0@127.0.0.1:9999")
    for i in (1, 2, 3):
        cluster.nodes[i] = ClusterNode(cluster, i).start()
    added: list = []
    adding = threading.Thread(target=lambda: added.append(cluster.add_broker()))
    adding.start()
    try:
        time.sleep(0.2)  # add_broker is now inside the new node's start
        assert adding.is_alive()
        assert cluster.bootstrap_servers == "127.0.0.1:9091,127.0.0.1:9092,127.0.0.1:9093"
        assert 4 not in cluster.nodes
    finally:
        release.set()
        adding.join(30)
    assert added and added[0].node_id == 4
    assert cluster.bootstrap_servers.endswith(",127.0.0.1:9094")
