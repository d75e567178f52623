"""Fixtures for the Kafka log format tests.

``devstack`` is a top-level package of the repository that is not installed into the venv, so
the repository root is put on ``sys.path`` here; the broker fixtures are then imported from
``devstack.pytest_plugin`` (used only by the ``e2e`` tests).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from devstack.pytest_plugin import (
    kafka_broker,
    kafka_broker_factory,
    kafka_distribution,
)

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "kafka"


@pytest.fixture(scope="session")
def kafka_fixtures_dir() -> Path:
    return FIXTURES
