"""The compose demo's producer and Iceberg job, run against the local stack instead of
containers: a real Kafka broker with the shim, the sidecar on SeaweedFS (S3) configured
from config/sidecar.toml plus RSM__ environment, and a real Apicurio registry. The same
script (docker/demo/produce.py) and the same CLI command as the compose services; only the
addresses differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from devstack.stack import LocalStack

    st = LocalStack(tmp_path_factory.mktemp("compose-demo"), storage="s3", transfer_mode="path")
    st.start()
    yield st
    st.stop()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    from devstack.registry import ApicurioDistribution, ApicurioRegistry

    reg = ApicurioRegistry(ApicurioDistribution.ensure(), tmp_path_factory.mktemp("apicurio"))
    reg.start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def produced(stack, registry):
    config, env = stack.sidecar_config_env()
    proc = subprocess.run(
        [sys.executable, str(REPO / "docker/demo/produce.py"), "--bootstrap", stack.bootstrap_servers,
         "--registry", registry.ccompat_url, "--config", str(config), "--records", "15000", "--min-segments", "1",
         "--timeout", "240"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    return proc


def test_demo_producer_tiers_and_reads_back(produced):
    out = produced.stdout + produced.stderr
    assert produced.returncode == 0, out
    assert "demo OK" in produced.stdout
    print(produced.stdout)
    for topic in ("demo-orders", "demo-clicks", "demo-raw"):
        assert f"{topic}: 15,000 of 15,000 records read back, identical" in produced.stdout, out


def test_iceberg_convert_of_the_demo_topic(produced, stack, registry, tmp_path):
    """The compose job's command line, with the embedded catalog instead of the REST one."""
    from rsm_sidecar.cli.main import build_parser

    if "iceberg" not in build_parser()._subparsers._group_actions[0].choices:
        pytest.skip("`rsm-sidecar iceberg` is not in the CLI yet")
    assert produced.returncode == 0
    config, env = stack.sidecar_config_env()
    env = {**os.environ, **env, "RSM__ICEBERG__CATALOG__TYPE": "local",
           "RSM__ICEBERG__CATALOG__LOCAL__ROOT": str(tmp_path / "catalog"),
           "RSM__ICEBERG__REGISTRY__URL": registry.ccompat_url}
    proc = subprocess.run([sys.executable, "-m", "rsm_sidecar.cli.main", "iceberg", "convert", "--config", str(config),
                           "--topic", "demo-orders", "--json"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["committed"] and result["table"].endswith("demo_orders"), result
    (part,) = result["partitions"]
    # every record of the tiered segments, from offset 0, in one commit
    assert part["segments"] >= 1 and part["first_offset"] == 0 and part["records"] == part["next_offset"] > 0
