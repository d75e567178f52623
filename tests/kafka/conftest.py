"""Fixtures for the Kafka log format tests: the committed fixtures' directory, and the broker
fixtures of ``devstack.pytest_plugin`` (used only by the ``e2e`` tests). ``devstack`` is a
top-level package of the repository that is not installed into the venv: it is importable
because ``tests`` is a package, so pytest puts the repository root on ``sys.path``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.pytest_plugin import (
    kafka_broker,
    kafka_broker_factory,
    kafka_distribution,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kafka"


@pytest.fixture(scope="session")
def kafka_fixtures_dir() -> Path:
    return FIXTURES
