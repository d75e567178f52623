"""The real Kafka broker of devstack, for the compression heuristic on real segments."""

from devstack.pytest_plugin import kafka_broker, kafka_distribution
