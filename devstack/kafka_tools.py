"""Kafka's own command-line tools on the devstack distribution (no Kafka tarball here: the
jars come from Maven Central, ``kafka-tools`` among them, see ``kafka-jars.pom.xml``).

``make up`` writes one wrapper script per tool into ``run/bin/`` (``kafka-topics.sh``,
``kafka-console-consumer.sh``, ``kafka-consumer-perf-test.sh``, ...), named as in Kafka's
``bin/`` so that commands from Kafka's documentation work unchanged::

    run/bin/kafka-topics.sh --bootstrap-server localhost:9092 --list

Benchmarks and tests run a tool through :func:`tool_command`. Tools log warnings and errors
to stderr, as Kafka's ``tools-log4j2.yaml`` does.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path

from devstack.kafka import QUICK_START_JVM_OPTIONS, KafkaDistribution

#: script name (without ``.sh``) -> main class on Kafka 4.x
TOOLS: dict[str, str] = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs": "org.apache.kafka.tools.ConfigCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-dump-log": "org.apache.kafka.tools.DumpLogSegments",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-jmx": "org.apache.kafka.tools.JmxTool",
    # a cluster's (make up BROKERS=3)
    "kafka-reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "kafka-leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "kafka-metadata-quorum": "org.apache.kafka.tools.MetadataQuorumCommand",
}

#: where 3.x keeps a tool elsewhere (moved to ``kafka-tools`` in 4.0)
_TOOLS_3X = {
    "kafka-configs": "kafka.admin.ConfigCommand",
    "kafka-dump-log": "kafka.tools.DumpLogSegments",
    "kafka-jmx": "kafka.tools.JmxTool",
}


def tool_class(dist: KafkaDistribution, name: str) -> str:
    """The main class of tool ``name`` (``kafka-topics`` or ``kafka-topics.sh``)."""
    name = name.removesuffix(".sh")
    if name not in TOOLS:
        raise ValueError(f"unknown Kafka tool {name!r}; known: {', '.join(sorted(TOOLS))}")
    if dist.version_tuple[0] < 4:
        return _TOOLS_3X.get(name, TOOLS[name])
    return TOOLS[name]


def tools_log_config(dist: KafkaDistribution) -> Path:
    """A logging config for the tools: WARN and above to stderr (written once per version)."""
    if dist.uses_log4j2:
        path = dist.home / "tools-log4j2.properties"
        text = (
            "status = warn\n"
            "appender.err.type = Console\n"
            "appender.err.name = STDERR\n"
            "appender.err.target = SYSTEM_ERR\n"
            "appender.err.layout.type = PatternLayout\n"
            "appender.err.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = WARN\n"
            "rootLogger.appenderRef.err.ref = STDERR\n"
        )
    else:
        path = dist.home / "tools-log4j.properties"
        text = (
            "log4j.rootLogger=WARN, stderr\n"
            "log4j.appender.stderr=org.apache.log4j.ConsoleAppender\n"
            "log4j.appender.stderr.Target=System.err\n"
            "log4j.appender.stderr.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
        )
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


#: the perf tools measure throughput: they keep the JVM's own compilers and collector
PERF_TOOLS = frozenset({"kafka-producer-perf-test", "kafka-consumer-perf-test"})


def tool_command(dist: KafkaDistribution, name: str, args: Iterable[str] = ()) -> list[str]:
    """The argv that runs tool ``name`` with ``args`` on ``dist``. Every tool but the perf tools
    runs for seconds and starts on the JVM's quick-start options (``QUICK_START_JVM_OPTIONS``)."""
    quick = () if name.removesuffix(".sh") in PERF_TOOLS else QUICK_START_JVM_OPTIONS
    return dist.java_command(
        tool_class(dist, name),
        args,
        jvm_options=["-Xmx512m", *quick, *dist.log_config_options(tools_log_config(dist))],
    )


def write_wrappers(dist: KafkaDistribution, bin_dir: Path) -> list[Path]:
    """One executable ``<tool>.sh`` per tool in ``bin_dir``; returns their paths."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for name in sorted(TOOLS):
        script = bin_dir / f"{name}.sh"
        argv = " ".join(shlex.quote(a) for a in tool_command(dist, name))
        script.write_text(
            f"#!/bin/sh\n# Kafka {dist.version}'s {name} (written by devstack/kafka_tools.py)\n"
            f'exec {argv} "$@"\n'
        )
        script.chmod(0o755)
        out.append(script)
    return out
