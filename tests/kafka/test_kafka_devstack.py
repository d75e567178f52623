"""devstack.kafka without a broker: configuration, properties, idempotent jar gathering
(with a fake Maven), error reporting."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from devstack import kafka as dk
from devstack.common import REPO_ROOT
from devstack.kafka import (
    DevstackError,
    KafkaBroker,
    KafkaDistribution,
    format_properties,
    parse_version,
    random_cluster_id,
)


def test_defaults_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("KAFKA_VERSION", raising=False)
    monkeypatch.delenv("RSM_CACHE_DIR", raising=False)
    assert dk.default_kafka_version() == dk.DEFAULT_KAFKA_VERSION
    assert dk.default_cache_dir() == REPO_ROOT / ".cache"
    monkeypatch.setenv("KAFKA_VERSION", "3.9.2")
    monkeypatch.setenv("RSM_CACHE_DIR", str(tmp_path))
    assert dk.default_kafka_version() == "3.9.2"
    assert dk.default_cache_dir() == tmp_path


def test_parse_version():
    assert parse_version("4.3.1") == (4, 3, 1)
    for bad in ("4.3", "latest", "4.3.1-rc0", ""):
        with pytest.raises(ValueError):
            parse_version(bad)


def test_logging_binding_by_version(tmp_path):
    d4 = KafkaDistribution("4.3.1", tmp_path)
    d3 = KafkaDistribution("3.9.2", tmp_path)
    assert d4.uses_log4j2 and not d3.uses_log4j2
    cfg = tmp_path / "l.properties"
    assert d4.log_config_options(cfg) == [f"-Dlog4j2.configurationFile={cfg}"]
    assert d3.log_config_options(cfg) == [f"-Dlog4j.configuration={cfg.as_uri()}"]
    d4.write_log_config(cfg, tmp_path / "server.log")
    assert f"appender.file.fileName = {tmp_path / 'server.log'}" in cfg.read_text()
    d3.write_log_config(cfg, tmp_path / "server.log")
    assert f"log4j.appender.file.File={tmp_path / 'server.log'}" in cfg.read_text()


def test_cluster_id_is_a_kafka_uuid():
    for _ in range(200):
        cid = random_cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")
        assert set(cid) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_format_properties():
    text = format_properties({"a.b": 1, "flag": True, "path": "C:\\x", "list": "x,y"})
    assert text == "a.b=1\nflag=true\npath=C:\\\\x\nlist=x,y\n"
    with pytest.raises(ValueError, match="line break"):
        format_properties({"a": "x\ny"})
    with pytest.raises(ValueError, match="needs escaping"):
        format_properties({"a b": "x"})


def test_broker_properties_defaults_and_overrides(tmp_path):
    dist = KafkaDistribution("4.3.1", tmp_path / "dist")
    b = KafkaBroker(
        dist,
        tmp_path / "wd",
        ports={"broker": 19092, "controller": 19093},
        extra_properties={
            "remote.log.storage.system.enable": True,
            "num.partitions": 3,
            "group.initial.rebalance.delay.ms": None,
        },
    )
    props = b.properties()
    assert b.bootstrap_servers == "127.0.0.1:19092"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["process.roles"] == "broker,controller"
    assert props["remote.log.storage.system.enable"] is True
    assert props["num.partitions"] == 3
    assert "group.initial.rebalance.delay.ms" not in props
    assert props["share.coordinator.state.topic.replication.factor"] == 1
    assert b.log_dirs == [(tmp_path / "wd" / "data").resolve()]
    b3 = KafkaBroker(
        KafkaDistribution("3.9.2", tmp_path / "d3"),
        tmp_path / "wd3",
        extra_properties={"log.dirs": f"{tmp_path}/a,{tmp_path}/b"},
    )
    assert "share.coordinator.state.topic.replication.factor" not in b3.properties()
    assert b3.log_dirs == [tmp_path / "a", tmp_path / "b"]
    assert b3.broker_port != b3.controller_port
    with pytest.raises(ValueError, match="unknown port names"):
        KafkaBroker(dist, tmp_path, ports={"http": 1})


def fake_mvn(tmp_path: Path, *, fail: bool = False) -> Path:
    """A stand-in for Maven: logs its calls and writes the jars copy-dependencies would."""
    log = tmp_path / "mvn-calls.log"
    script = tmp_path / "mvn"
    missing = "Could not find artifact org.apache.kafka:kafka-tools-api:jar:9.9.9"
    failure = f'echo "[ERROR] Failed to execute goal: {missing}" ; exit 1' if fail else ""
    body = f"""#!/bin/sh
echo "$@" >> {log}
{failure}
for a in "$@"; do
  case "$a" in
    -DoutputDirectory=*) out="${{a#-DoutputDirectory=}}";;
    -Dkafka.version=*) v="${{a#-Dkafka.version=}}";;
    -DincludeArtifactIds=*) only=1;;
  esac
done
mkdir -p "$out"
if [ -n "$only" ]; then touch "$out/log4j-slf4j-impl-2.25.4.jar"; exit 0; fi
touch "$out/kafka_2.13-$v.jar" "$out/kafka-clients-$v.jar" "$out/log4j-core-2.25.4.jar"
"""
    script.write_text(body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_ensure_is_idempotent(tmp_path):
    mvn = fake_mvn(tmp_path)
    dist = KafkaDistribution.ensure("4.3.1", tmp_path / "cache", mvn=str(mvn))
    assert dist.home == tmp_path / "cache" / "kafka-4.3.1"
    jars = sorted(p.name for p in dist.lib_dir.iterdir())
    assert jars == [
        "kafka-clients-4.3.1.jar",
        "kafka_2.13-4.3.1.jar",
        "log4j-core-2.25.4.jar",
        "log4j-slf4j-impl-2.25.4.jar",
    ]
    calls = (tmp_path / "mvn-calls.log").read_text().splitlines()
    assert len(calls) == 2  # the dependencies, then the binding matching log4j-core
    assert f"-Dmaven.repo.local={tmp_path / 'cache' / 'm2'}" in calls[0]
    assert "-Plog4j2 -Dlog4j2.version=2.25.4" in calls[1]
    stamp = json.loads((dist.home / ".devstack-complete.json").read_text())
    assert stamp["version"] == "4.3.1" and stamp["jars"] == jars
    KafkaDistribution.ensure("4.3.1", tmp_path / "cache", mvn=str(mvn))
    assert len((tmp_path / "mvn-calls.log").read_text().splitlines()) == 2  # nothing re-run
    # A missing jar invalidates the stamp.
    os.remove(dist.lib_dir / "kafka-clients-4.3.1.jar")
    KafkaDistribution.ensure("4.3.1", tmp_path / "cache", mvn=str(mvn))
    assert len((tmp_path / "mvn-calls.log").read_text().splitlines()) == 4


def test_ensure_3x_uses_reload4j_in_one_maven_run(tmp_path):
    mvn = fake_mvn(tmp_path)
    KafkaDistribution.ensure("3.9.2", tmp_path / "cache", mvn=str(mvn))
    (call,) = (tmp_path / "mvn-calls.log").read_text().splitlines()
    assert "-Preload4j" in call and "-Dkafka.version=3.9.2" in call


def test_ensure_reports_maven_failure(tmp_path):
    mvn = fake_mvn(tmp_path, fail=True)
    with pytest.raises(DevstackError, match="(?s)Maven failed .* Kafka 9.9.9.*kafka-tools-api"):
        KafkaDistribution.ensure("9.9.9", tmp_path / "cache", mvn=str(mvn))
    assert not (tmp_path / "cache" / "kafka-9.9.9" / ".devstack-complete.json").exists()
    with pytest.raises(DevstackError, match="not found on PATH"):
        KafkaDistribution.ensure("9.9.9", tmp_path / "cache", mvn="no-such-mvn-binary")


def test_controller_and_broker_roles_of_a_cluster(tmp_path):
    """A dedicated controller and a broker-only node (devstack/cluster.py): their listeners and
    quorum, and a broker's storage formatted without StorageTool's JVM."""
    dist = KafkaDistribution("4.4.0", tmp_path / "dist")
    c = KafkaBroker(dist, tmp_path / "c", role="controller", node_id=0, ports={"controller": 19093})
    props = c.properties()
    assert props["process.roles"] == "controller"
    assert props["listeners"] == "CONTROLLER://127.0.0.1:19093"
    assert props["controller.quorum.voters"] == c.controller_voter == "0@127.0.0.1:19093"
    assert "advertised.listeners" not in props and "inter.broker.listener.name" not in props
    assert c.broker_port is None
    with pytest.raises(DevstackError, match="controller: it has no broker listener"):
        c.bootstrap_servers  # noqa: B018
    b = KafkaBroker(
        dist,
        tmp_path / "b",
        role="broker",
        node_id=2,
        cluster_id="MkU3OEVBNTcwNTJENDM2Qk",
        quorum_voters=c.controller_voter,
        ports={"broker": 19094},
    )
    props = b.properties()
    assert props["process.roles"] == "broker" and props["node.id"] == 2
    assert props["listeners"] == props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19094"
    assert props["controller.quorum.voters"] == "0@127.0.0.1:19093"
    assert b.controller_port is None and b.bootstrap_servers == "127.0.0.1:19094"
    with pytest.raises(DevstackError, match="broker: it has no controller listener"):
        b.controller_voter  # noqa: B018
    b._format_storage()
    meta = dict(
        line.split("=", 1) for line in (tmp_path / "b" / "data" / "meta.properties").read_text().splitlines()
    )
    assert meta.keys() == {"version", "cluster.id", "node.id", "directory.id"}
    assert (meta["version"], meta["cluster.id"], meta["node.id"]) == ("1", "MkU3OEVBNTcwNTJENDM2Qk", "2")
    assert len(meta["directory.id"]) == 22
    with pytest.raises(ValueError, match="quorum_voters"):
        KafkaBroker(dist, tmp_path, role="broker")
    with pytest.raises(ValueError, match="quorum_voters"):
        KafkaBroker(dist, tmp_path, quorum_voters="0@127.0.0.1:1")
    with pytest.raises(ValueError, match="unknown role 'observer'"):
        KafkaBroker(dist, tmp_path, role="observer")


class _DroppingAdmin:
    """A stand-in AdminClient. A real broker cannot make librdkafka drop a request with its
    connection on demand (the ``_DESTROY_BROKER`` CI met right after a cluster started), so this
    one does: the first CreateTopics per topic fails as librdkafka reports it, the next answers
    as the broker would if the first request had reached the controller."""

    created: list[list[str]] = []

    def __init__(self, config):
        pass

    def list_topics(self, timeout):
        return None

    def create_topics(self, topics):
        from concurrent.futures import Future

        from confluent_kafka import KafkaError, KafkaException

        names = [t.topic for t in topics]
        first = not _DroppingAdmin.created
        _DroppingAdmin.created.append(names)
        futures = {}
        for name in names:
            f: Future = Future()
            code = KafkaError._DESTROY_BROKER if first else KafkaError.TOPIC_ALREADY_EXISTS
            f.set_exception(KafkaException(KafkaError(code, "Broker handle destroyed without termination")))
            futures[name] = f
        return futures


def test_create_topics_sends_a_dropped_request_again_and_takes_the_topic_it_created(monkeypatch):
    from confluent_kafka import admin
    from confluent_kafka.admin import NewTopic

    monkeypatch.setattr(admin, "AdminClient", _DroppingAdmin)
    _DroppingAdmin.created = []
    dk.create_topics("127.0.0.1:1", [NewTopic("a", 1, 1), NewTopic("b", 1, 1)])
    assert _DroppingAdmin.created == [["a", "b"], ["a", "b"]]


def test_tools_start_on_the_quick_start_options_but_the_perf_tools_keep_the_jvms_own(tmp_path):
    from devstack.kafka_tools import PERF_TOOLS, TOOLS, tool_command

    dist = KafkaDistribution("4.3.1", tmp_path)
    for name in TOOLS:
        argv = tool_command(dist, f"{name}.sh")
        options = argv[1 : argv.index("-cp")]
        quick = [o for o in options if o in dk.QUICK_START_JVM_OPTIONS]
        assert quick == ([] if name in PERF_TOOLS else list(dk.QUICK_START_JVM_OPTIONS)), name
    assert PERF_TOOLS <= set(TOOLS)
