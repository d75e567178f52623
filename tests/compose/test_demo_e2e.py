"""The compose cluster's one-shot jobs without Docker: the demo producer and the Iceberg job
run with the environment and command docker-compose.yml gives them (as `docker compose
config` normalizes it), with only the service addresses, credentials and mount paths
mapped onto local servers: the local stack (a real Kafka broker with the shim, the sidecar
on SeaweedFS configured from config/sidecar.toml), a real Apicurio registry, and Apache
Iceberg's REST catalog server with its warehouse in the same SeaweedFS (devstack.iceberg_rest,
the server the apache/iceberg-rest-fixture image runs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SIDECAR_MOUNT = "/etc/rsm-sidecar/sidecar.toml"
DEMO_MOUNT = "/opt/rsm-demo"
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
def rest(stack, services, tmp_path_factory):
    from devstack.iceberg_rest import IcebergRestServer

    env = services["iceberg-rest"]["environment"]
    bucket = env["CATALOG_WAREHOUSE"].removeprefix("s3://").split("/")[0]
    s3 = stack.storage_server
    s3.create_bucket(bucket)
    srv = IcebergRestServer(
        tmp_path_factory.mktemp("rest"),
        env["CATALOG_WAREHOUSE"],
        s3={"endpoint": s3.endpoint_url, "access_key_id": s3.access_key, "secret_access_key": s3.secret_key},
    ).start()
    yield srv
    srv.stop()


def _local(services, stack, registry, rest=None) -> tuple[dict[str, str], dict[str, str]]:
    """(substring replacements, whole-value replacements): compose addresses, mount paths and
    credentials -> the local servers'."""
    weed = services["seaweedfs"]
    port = next(a.split("=", 1)[1] for a in weed["command"] if a.startswith("-s3.port="))
    s3 = stack.storage_server
    subst = {
        f"http://seaweedfs:{port}": s3.endpoint_url,
        "http://registry:8080/apis/ccompat/v7": registry.ccompat_url,
        "kafka:9092": stack.bootstrap_servers,
        "/etc/rsm-sidecar/keys": str(stack.keys_dir),
        SIDECAR_MOUNT: str(REPO / "config" / "sidecar.toml"),
        DEMO_MOUNT: str(REPO / "docker" / "demo"),
        "http://sidecar:9096/metrics": "",
    }  # the local stack's sidecar serves no metrics
    if rest is not None:
        subst["http://iceberg-rest:8181"] = rest.uri
    exact = {
        weed["environment"]["AWS_ACCESS_KEY_ID"]: s3.access_key,
        weed["environment"]["AWS_SECRET_ACCESS_KEY"]: s3.secret_key,
    }
    return subst, exact


def _mapped(values, mapping):
    subst, exact = mapping

    def one(v: str) -> str:
        v = exact.get(v, v)
        for a, b in subst.items():
            v = v.replace(a, b)
        return v

    if isinstance(values, dict):
        out = {k: one(str(v)) for k, v in values.items()}
        leftover = [
            f"{k}={v}"
            for k, v in out.items()
            if re.search(r"//(seaweedfs|registry|iceberg-rest|sidecar|kafka)\b", v)
            or v.startswith(("/etc/rsm-sidecar", DEMO_MOUNT))
            or v in exact
        ]
        assert not leftover, f"not mapped to a local server: {leftover}"
        return out
    return [one(v) for v in values]


@pytest.fixture(scope="module")
def produced(services, stack, registry):
    svc = services["demo-producer"]
    mapping = _local(services, stack, registry)
    env = _mapped(svc["environment"], mapping)
    # fewer records than the compose file asks for, and one tiered segment per topic: faster
    env.update({"DEMO_RECORDS": "15000"})
    argv = _mapped(svc["command"], mapping)
    assert argv[0] == "python"
    proc = subprocess.run(
        [sys.executable, *argv[1:], "--min-segments", "1", "--timeout", "240"],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("RSM__")}, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc


def test_demo_producer_tiers_and_reads_back(produced):
    out = produced.stdout + produced.stderr
    assert produced.returncode == 0, out
    assert "demo OK" in produced.stdout
    for topic in ("demo-orders", "demo-clicks", "demo-raw"):
        assert f"{topic}: 15,000 of 15,000 records read back, identical" in produced.stdout, out
    print(produced.stdout)


def test_iceberg_convert_into_the_rest_catalog(produced, services, stack, registry, rest):
    """The compose job's command and [iceberg] settings: REST catalog, S3 warehouse, registry."""
    assert produced.returncode == 0
    svc = services["iceberg-convert"]
    mapping = _local(services, stack, registry, rest)
    env = _mapped(svc["environment"], mapping)
    argv = _mapped(svc["command"], mapping)
    assert argv[:3] == ["rsm-sidecar", "iceberg", "convert"]
    proc = subprocess.run(
        [sys.executable, "-m", "rsm_sidecar.cli.main", *argv[1:], "--json"],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("RSM__")}, **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["committed"] and result["table"].endswith("demo_orders"), result
    (part,) = result["partitions"]
    # every record of the tiered segments, from offset 0, in one commit
    assert part["segments"] >= 1 and part["first_offset"] == 0 and part["records"] == part["next_offset"] > 0
    # the table is in the REST catalog, its files in the warehouse bucket
    bucket = env["RSM__ICEBERG__WAREHOUSE"].removeprefix("s3://").split("/")[0]
    keys = [
        o["Key"] for o in stack.storage_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    ]
    assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".metadata.json") for k in keys)
    import urllib.request

    with urllib.request.urlopen(f"{rest.uri}/v1/namespaces/kafka/tables") as r:
        tables = json.load(r)["identifiers"]
    assert {"namespace": ["kafka"], "name": "demo_orders"} in tables
