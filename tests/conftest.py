"""Session-wide fixtures, and the test tiers.

Every test gets exactly one tier marker (``make test-unit`` runs ``pytest -m unit``):

* ``unit``: in-process only: no server process, nothing downloaded, no broker. Runs right
  after ``make setup`` on a fresh clone.
* ``integration``: real servers or tools other than the broker (SeaweedFS, fake-gcs-server,
  Azurite, Apicurio, the Iceberg REST fixture, Spark with its jars, a sidecar process, the shim jar,
  Java with BouncyCastle, the compose tools).
* ``e2e``: a real Kafka broker.

A test's tier is the highest one that applies: an explicit marker on the test (``e2e``,
``integration``), a fixture it uses (below), or its module (``TIER_OF_MODULE``, for tests
that start servers in their bodies); every other test is ``unit``. A ``unit`` test that
opens a connection off this machine fails, so a download cannot hide in the unit tier.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
from typing import Any

import pytest

from tests import podman_images
from tests.keys_fixture import rsa_keys

# Processes the tests start (Spark's Python workers, CLIs) import this checkout, whichever
# checkout the virtualenv's editable install points at.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, os.environ.get("PYTHONPATH")) if p)

TIERS = ("unit", "integration", "e2e")

#: fixtures that start a Kafka broker (devstack.pytest_plugin, the LocalStack of tests/e2e and tests/inspect)
BROKER_FIXTURES = frozenset({"kafka_distribution", "kafka_broker", "kafka_broker_factory", "stack"})

#: fixtures that start a server other than the broker, or need downloaded jars or tools
SERVER_FIXTURES = frozenset(
    {
        "seaweedfs",
        "s3_store",
        "s3_server_factory",
        "fake_gcs",
        "gcs_store",
        "gcs_server_factory",
        "azurite",
        "azurite_oauth",
        "azure_store",
        "azure_server_factory",
        "apicurio",
        "registry_url",
        "sr_client",
        "spark",
        "local_catalog",
        "spark_cluster",  # a Spark standalone cluster (tests/iceberg/conftest.py)
        "compose",
        "project",
        "services",
        "start_sidecar",  # the sidecar's gRPC server (tests/service/conftest.py)
    }
)

#: programs a unit test must not start: the JVM (broker, Apicurio, Spark, the Iceberg REST fixture,
#: the shim) and the storage servers
SERVER_PROGRAMS = frozenset({"java", "weed", "fake-gcs-server", "azurite-blob", "node", "npm"})

#: modules (path from the repository root) whose tests start servers, processes or Java in their
#: bodies rather than through a fixture
TIER_OF_MODULE = {
    "tests/compose/test_compose.py": "integration",  # docker compose + Dockerfile checker (downloaded)
    "tests/test_devstack_launchers.py": "integration",  # SeaweedFS, fake-gcs-server, Azurite
    "tests/test_devstack_s3server_low_disk.py": "integration",  # SeaweedFS on a loop-mounted disk
    "tests/shim/test_shim_jar.py": "integration",  # the shim jar (Maven) and Java
    "tests/service/test_processes.py": "integration",  # sidecar processes, SeaweedFS
    "tests/service/test_resources.py": "integration",  # sidecar processes, 1 GiB copies
    "tests/service/test_startup_config.py": "integration",  # `rsm-sidecar serve` processes
    "tests/service/test_same_segment_id.py": "integration",  # SeaweedFS
    "tests/iceberg/test_rest_s3.py": "integration",  # Iceberg REST fixture, SeaweedFS
    "tests/iceberg/test_gcs_warehouse.py": "integration",  # fake-gcs-server
    "tests/iceberg/test_spark_submit.py": "integration",  # spark-submit
    "tests/iceberg/test_planning.py": "integration",  # the embedded SQLite catalog through Spark
}


def _tier(item: pytest.Item) -> str:
    explicit = {m.name for m in item.iter_markers() if m.name in TIERS}
    fixtures = set(getattr(item, "fixturenames", ()))
    path = _module_path(item)
    if "e2e" in explicit or fixtures & BROKER_FIXTURES or path.startswith("tests/e2e/"):
        return "e2e"
    if "integration" in explicit or fixtures & SERVER_FIXTURES or TIER_OF_MODULE.get(path) == "integration":
        return "integration"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = _tier(item)
        for lower in TIERS[: TIERS.index(tier)]:
            if item.get_closest_marker(lower):
                raise pytest.UsageError(
                    f"{item.nodeid}: marked {lower} but it needs {tier} (tests/conftest.py)"
                )
        if not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))
    # the container tests last: their images build in the background meanwhile (tests/podman_images.py)
    items.sort(key=lambda item: _module_path(item) in podman_images.CONTAINER_MODULES)


def _module_path(item: pytest.Item) -> str:
    return item.path.relative_to(item.config.rootpath).as_posix()


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if any(_module_path(item) in podman_images.CONTAINER_MODULES for item in session.items):
        podman_images.start_build()


def pytest_sessionfinish(session: pytest.Session) -> None:
    podman_images.stop()


def pytest_report_header(config: pytest.Config) -> str:
    """Free disk where the tests write: the first thing to check when servers hang or fail."""
    import shutil
    import tempfile

    tmp = tempfile.gettempdir()
    usage = shutil.disk_usage(tmp)
    line = f"disk: {usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.0f} GiB at {tmp}"
    if usage.free < 8 * 2**30:
        line += " (below the 8 GiB a full run can use: downloads, images, 1 GiB segments)"
    return line


def _is_local(address: object) -> bool:
    host = address[0] if isinstance(address, tuple) else None
    if host is None:  # a Unix domain socket
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@pytest.fixture(autouse=True)
def _unit_tests_stay_on_this_machine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test needs no download and no server: a connection off this machine, or starting a
    JVM or a storage server, fails it."""
    if not request.node.get_closest_marker("unit"):
        return
    connect = socket.socket.connect

    def local_connect(sock: socket.socket, address: Any) -> None:
        if not _is_local(address):
            raise AssertionError(
                f"unit test {request.node.nodeid} connects to {address}: mark it integration"
            )
        connect(sock, address)

    popen_init = subprocess.Popen.__init__

    def no_server_popen(proc: subprocess.Popen, args: Any, *a: Any, **kw: Any) -> None:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = os.path.basename(os.fsdecode(argv[0]).split()[0]) if argv else ""
        if program in SERVER_PROGRAMS:
            raise AssertionError(f"unit test {request.node.nodeid} starts {program}: mark it integration")
        popen_init(proc, args, *a, **kw)

    monkeypatch.setattr(socket.socket, "connect", local_connect)
    monkeypatch.setattr(subprocess.Popen, "__init__", no_server_popen)
