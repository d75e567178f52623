"""Kafka's own command-line tools, as `make up` writes them into run/bin/, against the tiered
stack: a tiered topic created by kafka-topics.sh, records written by kafka-console-producer.sh,
tiered through the shim and the sidecar, then read back from offset 0 by
kafka-console-consumer.sh (a remote read), with kafka-get-offsets.sh's view of what is tiered
and what is local (KIP-1005's -4 earliest-local and -5 latest-tiered)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from devstack.kafka_tools import TOOLS, tool_class, write_wrappers
from tests.e2e.kafka_helpers import (
    filler,
    local_segment_offsets,
    remote_segments,
    tiered_topic_config,
    wait_all_closed_tiered,
)

N = 3000


def sh(bin_dir: Path, tool: str, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
    run = subprocess.run(
        [str(bin_dir / f"{tool}.sh"), *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )
    assert run.returncode == 0, f"{tool} {' '.join(args)} -> {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run.stdout


@pytest.fixture(scope="module")
def bin_dir(stack, tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bin")


def test_every_wrapper_names_a_class_of_the_distribution(stack, bin_dir):
    import zipfile

    scripts = write_wrappers(stack.broker.dist, bin_dir)
    assert sorted(p.name for p in scripts) == sorted(f"{t}.sh" for t in TOOLS)
    classes = set()
    for jar in stack.broker.dist.lib_dir.glob("*.jar"):
        with zipfile.ZipFile(jar) as z:
            classes.update(n for n in z.namelist() if n.endswith(".class"))
    for t in TOOLS:
        assert tool_class(stack.broker.dist, t).replace(".", "/") + ".class" in classes, t


def test_console_tools_round_trip_through_tiered_storage(stack, store, bin_dir):
    write_wrappers(stack.broker.dist, bin_dir)
    bs = stack.bootstrap_servers
    topic = "cli-tools"
    create = ["--bootstrap-server", bs, "--create", "--topic", topic, "--partitions", "1"]
    for k, v in tiered_topic_config().items():
        create += ["--config", f"{k}={v}"]
    sh(bin_dir, "kafka-topics", *create)
    described = sh(bin_dir, "kafka-configs", "--bootstrap-server", bs, "--describe", "--topic", topic)
    assert "remote.storage.enable=true" in described

    lines = [f"key-{i}\tvalue-{i}-" + "x" * (i % 700) for i in range(N)]
    sh(
        bin_dir,
        "kafka-console-producer",
        "--bootstrap-server", bs, "--topic", topic,
        "--reader-property", "parse.key=true", "--reader-property", "key.separator=\t",
        stdin="\n".join(lines) + "\n",
    )  # fmt: skip
    filler(bs, topic)
    wait_all_closed_tiered(stack, topic)  # then nothing moves while the offsets are compared
    assert remote_segments(store, topic), "nothing tiered"
    assert local_segment_offsets(stack.broker, topic)[0] >= N  # offsets < N are only remote now

    out = sh(
        bin_dir,
        "kafka-console-consumer",
        "--bootstrap-server", bs, "--topic", topic, "--from-beginning", "--max-messages", str(N),
        "--formatter-property", "print.key=true", "--formatter-property", "key.separator=\t",
        "--timeout-ms", "60000",
        timeout=180,
    )  # fmt: skip
    assert out.splitlines() == lines

    def offset(time_spec: str) -> int:
        args = ("--bootstrap-server", bs, "--topic", topic, "--time", time_spec)
        got = sh(bin_dir, "kafka-get-offsets", *args)

        (line,) = got.split()
        name, partition, off = line.rsplit(":", 2)
        assert (name, partition) == (topic, "0")
        return int(off)

    assert offset("-2") == 0  # earliest: the log starts in remote storage
    (active,) = local_segment_offsets(stack.broker, topic)
    assert offset("-4") == active  # earliest local (KIP-1005): the active segment
    assert offset("-5") == active - 1  # latest tiered: everything before it
