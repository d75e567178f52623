"""With a real broker (Maven Central jars, Java 17): the devstack launcher's lifecycle, and the
library against freshly regenerated fixtures. Run with ``pytest -m e2e tests/kafka``."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import kafka_fixture_checks as checks
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from devstack.kafka import KafkaBroker, KafkaDistribution, create_topics
from rsm_sidecar.kafka import read_batches

pytestmark = pytest.mark.e2e
REGENERATE = Path(__file__).resolve().parents[1] / "fixtures" / "kafka" / "regenerate.py"


def produce_and_consume(bootstrap: str, topic: str, n: int, start: int = 0) -> list[bytes]:
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(start, start + n):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
    assert p.flush(30) == 0
    return consume_all(bootstrap, topic)


def consume_all(bootstrap: str, topic: str) -> list[bytes]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g{time.monotonic_ns()}",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    values = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            m = c.poll(1)
            if m is None:
                continue
            if m.error():
                if m.error().code() == -191:  # partition EOF
                    return values
                raise AssertionError(m.error())
            values.append(m.value())
    finally:
        c.close()
    raise AssertionError("no partition EOF within 30 s")


def test_broker_lifecycle(kafka_broker_factory):
    t0 = time.monotonic()
    broker: KafkaBroker = kafka_broker_factory(
        extra_properties={"auto.create.topics.enable": False, "log.index.interval.bytes": 128}
    )
    startup = time.monotonic() - t0
    assert broker.is_running() and startup < 120
    create_topics(broker.bootstrap_servers, [NewTopic("life", 1, 1)])
    # a topic that existed before the first request is the broker's answer, not a retry's
    with pytest.raises(KafkaException, match="TOPIC_ALREADY_EXISTS"):
        create_topics(broker.bootstrap_servers, [NewTopic("life", 1, 1)])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    # extra properties reach the broker
    res = ConfigResource(ConfigResource.Type.BROKER, "1")
    cfg = admin.describe_configs([res])[res].result(30)
    assert cfg["auto.create.topics.enable"].value == "false"
    assert cfg["log.index.interval.bytes"].value == "128"

    assert produce_and_consume(broker.bootstrap_servers, "life", 5) == [b"v%d" % i for i in range(5)]
    seg = broker.partition_dir("life") / "00000000000000000000.log"
    # however librdkafka batched the 5 records (one batch, or more on a busy machine), the log
    # file parses and its batches hold offsets 0-4, each once, in order
    headers = [b.header for b in read_batches(seg)]
    assert [o for h in headers for o in range(h.base_offset, h.last_offset + 1)] == list(range(5)), headers
    assert sum(h.record_count for h in headers) == 5

    bootstrap = broker.bootstrap_servers
    broker.restart()  # same data dir, same ports
    assert broker.bootstrap_servers == bootstrap
    assert produce_and_consume(bootstrap, "life", 3, start=5) == [b"v%d" % i for i in range(8)]

    assert broker.kill() == -9 and not broker.is_running()
    broker.start()  # recovers after an unclean shutdown
    assert consume_all(bootstrap, "life") == [b"v%d" % i for i in range(8)]
    code = broker.stop()
    assert code in (0, 143) and not broker.is_running()
    assert "started" in broker.server_log.read_text().lower()


@pytest.mark.parametrize("version", ["3.9.2"])
def test_other_kafka_version(version, tmp_path):
    dist = KafkaDistribution.ensure(version)
    with KafkaBroker(dist, tmp_path / "broker") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic("v", 1, 1)])["v"].result(30)
        assert produce_and_consume(broker.bootstrap_servers, "v", 3) == [b"v0", b"v1", b"v2"]
    assert not broker.is_running()
    assert "reload4j" in " ".join(p.name for p in dist.lib_dir.iterdir())


def test_regenerated_fixtures_parse(tmp_path):
    spec = importlib.util.spec_from_file_location("kafka_fixture_regenerate", REGENERATE)
    regenerate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regenerate)
    done = regenerate.generate(tmp_path / "fixtures")
    assert len(done) == 11
    for case in done:
        checks.check_case(tmp_path / "fixtures" / case)


def test_port_taken_between_choice_and_bind_is_retried(kafka_distribution, tmp_path):
    """Another program listens on the broker's port, chosen but not yet bound (one that does not
    lease its ports: devstack/ports.py): the broker starts on new ports, and its log says why."""
    import socket

    broker = KafkaBroker(kafka_distribution, tmp_path / "b")
    taken = broker.broker_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with broker:
            assert broker.broker_port != taken
            AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10)
    log = broker.server_log.read_text()
    assert "Address already in use" in log
    assert f"devstack: Kafka node 1 (combined) start-up attempt 1 of 5 on ports broker {taken}, " in log


def test_a_broker_follows_its_controller_to_new_ports(kafka_distribution, tmp_path):
    """A cluster's controller and broker start at once (devstack/cluster.py); the controller's
    port is taken, so it starts again on another: the broker, which was given the first one,
    starts again with the new one and registers."""
    import socket
    import threading

    controller = KafkaBroker(
        kafka_distribution, tmp_path / "c", role="controller", node_id=0, heap_options=("-Xmx256m",)
    )
    broker = KafkaBroker(
        kafka_distribution,
        tmp_path / "b",
        role="broker",
        node_id=1,
        cluster_id=controller.cluster_id,
        quorum_voters=lambda: controller.controller_voter,
        heap_options=("-Xmx512m",),
    )
    taken = controller.controller_port
    failures: list[BaseException] = []
    try:
        with socket.socket() as other:
            other.bind(("127.0.0.1", taken))
            other.listen()
            thread = threading.Thread(target=lambda: _collect(failures, controller.start))
            thread.start()
            broker.start()  # registered and unfenced: its controller answered
            thread.join()
        assert not failures and controller.controller_port != taken
        assert (
            f"controller.quorum.voters={controller.controller_voter}\n" in broker.properties_file.read_text()
        )
        log = broker.server_log.read_text()
        assert (
            f"devstack: the controller moved from 0@127.0.0.1:{taken} to {controller.controller_voter}" in log
        )
    finally:
        broker.stop()
        controller.stop()


def _collect(failures: list[BaseException], call) -> None:
    try:
        call()
    except BaseException as e:  # the test asserts there was none
        failures.append(e)


def test_a_broker_starts_while_outgoing_connections_hold_every_ephemeral_port(kafka_distribution, tmp_path):
    """tests/test_devstack_ports.py's race, for the broker (a combined node, in a network
    namespace where outgoing connections hold every port of the ephemeral range)."""
    from tests import port_race

    port_race.assert_all_started(port_race.run(tmp_path, ["kafka"]))
