"""pytest fixtures for a real Kafka broker (opt-in: import them into a conftest).

    from devstack.pytest_plugin import kafka_distribution, kafka_broker, kafka_broker_factory

* ``kafka_distribution`` (session): the jars, downloaded once into the cache dir.
* ``kafka_broker`` (session): one plain broker shared by a session's tests.
* ``kafka_broker_factory`` (function): ``factory(extra_properties=..., **kwargs)`` starts a fresh
  broker in a temporary directory; every broker it started is stopped at teardown. Use it for
  brokers with special configuration (e.g. tiered storage).

Tests that use these need Java and Maven Central; mark them ``@pytest.mark.e2e``.
"""

from __future__ import annotations

import pytest

from devstack.kafka import KafkaBroker, KafkaDistribution


@pytest.fixture(scope="session")
def kafka_distribution() -> KafkaDistribution:
    return KafkaDistribution.ensure()


@pytest.fixture(scope="session")
def kafka_broker(kafka_distribution, tmp_path_factory):
    with KafkaBroker(kafka_distribution, tmp_path_factory.mktemp("kafka-broker")) as broker:
        yield broker


@pytest.fixture
def kafka_broker_factory(kafka_distribution, tmp_path_factory):
    started: list[KafkaBroker] = []

    def factory(extra_properties=None, **kwargs) -> KafkaBroker:
        broker = KafkaBroker(
            kafka_distribution,
            tmp_path_factory.mktemp("kafka-broker"),
            extra_properties=extra_properties,
            **kwargs,
        )
        started.append(broker)
        return broker.start()

    try:
        yield factory
    finally:
        for broker in started:
            broker.stop()
