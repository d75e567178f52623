"""Development and test helpers that run real servers on loopback (not shipped in rsm_sidecar).

``devstack.kafka`` gathers a Kafka broker from Maven Central jars and runs a single-node KRaft
broker; ``devstack.pytest_plugin`` wraps it in pytest fixtures.
"""
