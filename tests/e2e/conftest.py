"""A tiered-storage stack (real broker + shim + sidecar + storage) shared by a test module."""

from __future__ import annotations

import pytest

from devstack.stack import LocalStack
from tests.helpers import BROKER_JVM_OPTIONS


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, request):
    """The module's stack: its ``TRANSFER_MODE`` (default path), ``STORAGE`` (default local),
    ``KAFKA_VERSION`` (default the devstack's) and ``METRICS`` (default on)."""
    st = LocalStack(
        tmp_path_factory.mktemp("stack"),
        storage=getattr(request.module, "STORAGE", "local"),
        transfer_mode=getattr(request.module, "TRANSFER_MODE", "path"),
        kafka_version=getattr(request.module, "KAFKA_VERSION", None),
        metrics=getattr(request.module, "METRICS", True),
        broker_jvm_options=BROKER_JVM_OPTIONS,
    )
    st.start()
    yield st
    st.stop()


@pytest.fixture(scope="module")
def store(stack):
    return stack.object_store()
