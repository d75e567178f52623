"""devstack/remote_topology.py's diagnosis of a broker that does not become healthy: the log
lines it reports, and the line by which it knows the broker is stuck, checked against the
class of the Kafka the compose files run (if Kafka rewords it, the early stop would go silent)."""

from __future__ import annotations

import re
import zipfile

import yaml

from devstack.kafka import KafkaDistribution
from devstack.remote_topology import BROKER_STUCK, COMPOSE_FILE, log_problems

RLMM_CLASS = "org/apache/kafka/server/log/remote/metadata/storage/TopicBasedRemoteLogMetadataManager.class"

RLMM = "(org.apache.kafka.server.log.remote.metadata.storage.TopicBasedRemoteLogMetadataManager)"
CLIENT = "(org.apache.kafka.clients.NetworkClient)"
UNREACHABLE = (
    "[AdminClient clientId=a] Connection to node -1 (kafka/10.213.7.5:9092) could not be established. "
    "Node may not be available."
)
KAFKA_LOG = "".join(
    f"kafka-1  | [2026-11-29 {time}] {level} {message} {logger}\n"
    for time, level, message, logger in [
        ("01:44:50,100", "INFO", "Initializing topic-based RLMM resources", RLMM),
        ("01:44:50,300", "WARN", UNREACHABLE, CLIENT),
        ("01:44:51,300", "WARN", UNREACHABLE, CLIENT),
        ("01:46:50,900", "ERROR", "Timed out to initialize the resources within 120000 ms.", RLMM),
        ("01:46:50,910", "ERROR", BROKER_STUCK, RLMM),
        ("01:46:51,372", "INFO", "Closing topic-based RLMM resources", RLMM),
    ]
)


def test_log_problems_lists_each_warning_once_in_order():
    problems = log_problems(KAFKA_LOG, 30)
    assert [p.split("] ", 1)[1].split(" ", 1)[0] for p in problems] == ["WARN", "ERROR", "ERROR"]
    assert "could not be established" in problems[0]
    assert problems[2].endswith(RLMM)
    assert log_problems(KAFKA_LOG, 2) == problems[:2]
    assert BROKER_STUCK in problems[2]


def test_broker_stuck_is_what_the_composed_kafka_logs():
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    version = compose["services"]["kafka-base"]["build"]["args"]["KAFKA_VERSION"]
    dist = KafkaDistribution.ensure(version)
    (jar,) = [
        p
        for p in dist.lib_dir.glob("kafka-storage-*.jar")
        if re.fullmatch(r"kafka-storage-[\d.]+\.jar", p.name)
    ]
    with zipfile.ZipFile(jar) as z:
        assert BROKER_STUCK.encode() in z.read(RLMM_CLASS), f"{jar.name} no longer logs {BROKER_STUCK!r}"
