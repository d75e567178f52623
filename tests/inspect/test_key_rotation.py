"""Key rotation end to end on the real stack: segments written under key A, the sidecar
restarted with B active (A kept), more segments, `inspect rekey --all` (after a dry run
and after a run killed half-way), A removed from the keyring, and a consumer still reads
every record from offset 0 through the broker, served from remote storage."""

from __future__ import annotations

import random
import signal
import subprocess
import time

import pytest

from rsm_sidecar.format.manifest import SegmentManifest
from tests.e2e.kafka_helpers import consume, create_topic, filler, produce, records
from tests.e2e.scenarios import assert_same_records
from tests.inspect.conftest import REPO
from tests.inspect.tiering import segment_bases, wait_all_tiered
from tests.keys_fixture import key_pairs

pytestmark = pytest.mark.e2e

TOPICS = ("rot-a", "rot-b")


@pytest.fixture(scope="module")
def key_files(tmp_path_factory) -> dict[str, dict[str, str]]:
    """RSM__ settings of two fresh key pairs, by key id."""
    pairs = key_pairs(tmp_path_factory.mktemp("rotation-keys"), ("keyA", "keyB"))
    return {
        key_id: {
            f"RSM__ENCRYPTION__KEYS__{key_id}__PUBLIC_KEY_FILE": public,
            f"RSM__ENCRYPTION__KEYS__{key_id}__PRIVATE_KEY_FILE": private,
        }
        for key_id, (public, private) in pairs.items()
    }


@pytest.fixture(scope="module")
def stack_env(key_files):
    return {**key_files["keyA"], "RSM__ENCRYPTION__ACTIVE_KEY_ID": "keyA"}


def _key_ids(store) -> dict[str, str]:
    return {
        b: SegmentManifest.from_bytes(store.get(b + ".rsm-manifest")).key_id
        for t in TOPICS
        for b in segment_bases(store, t)
    }


def test_rotate_rekey_remove_old_key_and_consume_from_zero(stack, store, inspect_cli, key_files):
    bootstrap = stack.bootstrap_servers
    t0 = int(time.time() * 1000) - 7_200_000
    produced: dict[str, list] = {}
    for i, topic in enumerate(TOPICS):
        create_topic(bootstrap, topic)
        produced[topic] = produce(bootstrap, topic, records(250, random.Random(i), t0), "snappy")
        filler(bootstrap, topic)
    first_end = {t: wait_all_tiered(stack, store, t) for t in TOPICS}
    under_a = _key_ids(store)
    assert set(under_a.values()) == {"keyA"}

    # rotate: B becomes active, A stays readable
    stack.restart_sidecar({**key_files["keyB"], "RSM__ENCRYPTION__ACTIVE_KEY_ID": "keyB"})
    for i, topic in enumerate(TOPICS):
        produced[topic] += produce(
            bootstrap, topic, records(250, random.Random(10 + i), t0 + 3_600_000), "none"
        )
        filler(bootstrap, topic)
    ends = {t: wait_all_tiered(stack, store, t, after=first_end[t]) for t in TOPICS}
    keys = _key_ids(store)
    assert {b: k for b, k in keys.items() if b in under_a} == under_a
    assert set(k for b, k in keys.items() if b not in under_a) == {"keyB"}
    ls = inspect_cli("ls", "--json").expect(0).json()
    assert {s["base"]: s["key_id"] for s in ls["segments"]} == keys

    # dry run: reports, writes nothing
    before = {b: store.get(b + ".rsm-manifest") for b in keys}
    doc = inspect_cli("rekey", "--all", "--dry-run", "--json").expect(0).json()
    assert doc["summary"]["would_rekey"] == len(under_a) and doc["summary"]["rekeyed"] == 0
    assert {o["base"] for o in doc["segments"] if o["action"] == "would-rekey"} == set(under_a)
    assert all(
        o["from_key"] == "keyA" and o["to_key"] == "keyB"
        for o in doc["segments"]
        if o["action"] == "would-rekey"
    )
    assert {b: store.get(b + ".rsm-manifest") for b in keys} == before

    # a run killed after its first rewrite leaves every manifest valid, under A or B
    proc = subprocess.Popen(
        inspect_cli.popen_args("rekey", "--topic", TOPICS[0], "--parallel", "1"),
        cwd=REPO,
        env=inspect_cli.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for line in proc.stdout:
            if line.startswith("rekeyed"):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.stdout.close()
        proc.wait(30)
    partial = _key_ids(store)
    assert set(partial.values()) <= {"keyA", "keyB"}
    done_before = sum(1 for b in under_a if partial[b] == "keyB")
    assert done_before >= 1
    for b in keys:  # nothing else changed in a manifest that was rewritten
        old, new = (
            SegmentManifest.from_bytes(before[b]),
            SegmentManifest.from_bytes(store.get(b + ".rsm-manifest")),
        )
        assert (old.chunk_index, old.indexes, old.segment, old.encryption.aad) == (
            new.chunk_index,
            new.indexes,
            new.segment,
            new.encryption.aad,
        )

    # the rerun finishes the job; a third run has nothing to do
    doc = inspect_cli("rekey", "--all", "--json").expect(0).json()
    assert doc["summary"]["rekeyed"] == len(under_a) - done_before
    assert doc["summary"]["skipped"] == len(keys) - doc["summary"]["rekeyed"]
    assert set(_key_ids(store).values()) == {"keyB"}
    doc = inspect_cli("rekey", "--all", "--json").expect(0).json()
    assert doc["summary"]["rekeyed"] == 0 and doc["summary"]["skipped"] == len(keys)

    # remove A from the keyring: the sidecar restarts without it
    stack.restart_sidecar(unset=key_files["keyA"])
    assert not any("keyA" in k for k in inspect_cli.env())
    verify = inspect_cli("verify", "--json").expect(0).json()
    assert verify["summary"]["ok"] == len(keys)

    # every record from offset 0, through the broker, from remote segments only
    for topic in TOPICS:
        got = consume(bootstrap, topic, 0, ends[topic])
        assert [r.offset for r in got] == list(range(ends[topic]))
        by_offset = {r.offset: r for r in got}
        assert_same_records([by_offset[r.offset] for r in produced[topic]], produced[topic])
