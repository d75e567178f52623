"""The broker scenario on S3 (SeaweedFS), GCS (fake-gcs-server) and Azure Blob (Azurite):
offload, local deletion, consume from offset 0, and topic deletion removing every remote object."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient

from devstack.stack import LocalStack
from rsm_sidecar.format.keys import KeyLayout
from tests.e2e import scenarios
from tests.e2e.kafka_helpers import (
    consume,
    produce_and_tier,
    remote_segments,
    wait_all_closed_tiered,
    wait_for,
)
from tests.helpers import BROKER_JVM_OPTIONS


@pytest.fixture(scope="module", params=["s3", "gcs", "azure"])
def object_stack(request, tmp_path_factory):
    st = LocalStack(
        tmp_path_factory.mktemp(f"stack-{request.param}"),
        storage=request.param,
        broker_jvm_options=BROKER_JVM_OPTIONS,
    )
    st.start()
    yield st
    st.stop()


def test_offload_consume_and_delete_topic(object_stack):
    stack = object_stack
    store = stack.object_store()
    assert store.name == stack.storage
    topic = f"orders-{stack.storage}"
    recs = produce_and_tier(stack, {topic: "zstd"}, n=300, seed=5, age_ms=60_000, big_every=100)[topic]
    # the listings below are compared: no segment may be tiered between them
    wait_all_closed_tiered(stack, topic)
    segments = remote_segments(store, topic)
    assert segments and all(s["suffixes"] == {"log", "indexes", "rsm-manifest"} for s in segments.values())
    scenarios.assert_same_records(consume(stack.bootstrap_servers, topic, 0, len(recs)), recs)
    assert sum(store.requests.values()) > 0
    # the inspection CLI works on this backend with the sidecar's own configuration
    config, env = stack.sidecar_config_env()
    cli = [sys.executable, "-m", "rsm_sidecar.cli.main", "inspect"]
    listed = subprocess.run(
        cli + ["ls", "--config", str(config), "--topic", topic, "--json", "-q"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    layout = KeyLayout("tiered/")
    assert {s["segment_id"] for s in json.loads(listed.stdout)["segments"]} == {
        layout.parse(base + ".log").segment_id for base in remote_segments(store, topic)
    }
    verified = subprocess.run(
        cli + ["verify", "--config", str(config), "--topic", topic, "-q"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    admin = AdminClient(
        {"bootstrap.servers": stack.bootstrap_servers}
    )  # kept alive until the futures resolve
    for f in admin.delete_topics([topic]).values():
        f.result(30)
    wait_for(
        f"no {stack.storage} object of the topic left",
        lambda: not [o for o in store.list("tiered/") if o.key.startswith(f"tiered/{topic}-")],
        timeout=120,
    )
