"""The migration runbook of docs/operations.md section 7, run as written against a real broker,
on local-directory storage (Aiven's segments encrypted) and on S3 (SeaweedFS; Aiven's segments
plaintext):

0. Aiven's era. A topic is tiered, and its segments are then in Aiven's on-remote format under
   the keys the broker knows them by: the broker tiers them through the shim (so that its remote
   log metadata lists them, as it lists Aiven's), and every stored segment is rewritten in place by
   the tests' Aiven-format writer (tests/aiven_format.py, which shares no code with the sidecar):
   Aiven's key layout (the writer computes the keys itself; they must be the broker's), zstd per
   chunk or not, Aiven's chunk sizes, AES-GCM with Aiven's key id. That is how a bucket written by
   Aiven's plugin presents itself to a migration.
1. The sidecar is configured as the runbook says (Aiven's key ids and PEM files, the active key,
   the prefix) with ``fetch.accept_unauthenticated_segments = true`` and restarted; `inspect verify`
   passes; a consumer reads every record from offset 0, record by record, from remote storage.
2. `inspect seal` seals the topic while a consumer keeps reading it from offset 0.
3. The setting is turned off (the sidecar restarted with the new configuration); every record is
   read again, and new segments are tiered.
4. The way back: every segment of the topic (Aiven's, sealed, and the sidecar's new ones) is read by
   the Aiven-format reader, whose records are exactly those produced.

Both runs share one broker: between them its sidecar is switched from local storage to S3 (the
first topic is not read again)."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rsm_sidecar.kafka import read_batches
from rsm_sidecar.transform.keyring import write_key_pair
from tests import aiven_format as aiven
from tests.e2e.kafka_helpers import (
    KEY_PREFIX,
    Rec,
    consume,
    create_topic,
    filler,
    produce,
    records,
    remote_segments,
    wait_all_closed_tiered,
)
from tests.e2e.scenarios import assert_same_records
from tests.helpers import REPO

AIVEN_KEY = "aiven-key-1"
#: (chunk.size, compression.enabled, compression.heuristic.enabled) of Aiven's plugin, per segment
AIVEN_SETTINGS = ((64 * 1024, True, False), (1024 * 1024, False, False), (4 * 1024 * 1024, True, True))


@pytest.fixture(scope="module")
def aiven_key_files(tmp_path_factory) -> dict[str, tuple[str, str]]:
    d = tmp_path_factory.mktemp("aiven-keys")
    write_key_pair(d / "public.pem", d / "private.pem", 2048)
    return {AIVEN_KEY: (str(d / "public.pem"), str(d / "private.pem"))}


def _key_env(keys: dict[str, tuple[str, str]]) -> dict[str, str]:
    out = {}
    for key_id, (public, private) in keys.items():
        out[f"RSM__ENCRYPTION__KEYS__{key_id}__PUBLIC_KEY_FILE"] = public
        out[f"RSM__ENCRYPTION__KEYS__{key_id}__PRIVATE_KEY_FILE"] = private
    return out


def _segments(store, topic: str) -> list[tuple[str, dict]]:
    """(base key, the manifest's segment metadata without our extension) of the topic's stored
    segments, by start offset (read as plain JSON: nothing of the sidecar's format code)."""
    out = []
    for base in remote_segments(store, topic):
        doc = json.loads(store.get(f"{base}.{aiven.MANIFEST}"))["remoteLogSegmentMetadata"]
        doc.pop("rsmSidecar", None)
        out.append((base, doc))
    return sorted(out, key=lambda s: s[1]["startOffset"])


def _info(metadata: dict) -> aiven.SegmentInfo:
    rid = metadata["remoteLogSegmentId"]
    tip = rid["topicIdPartition"]
    return aiven.SegmentInfo(
        tip["topicPartition"]["topic"],
        tip["topicId"],
        tip["topicPartition"]["partition"],
        rid["id"],
        metadata["startOffset"],
        metadata["endOffset"],
        metadata["maxTimestampMs"],
        b"",
        {},
        metadata["brokerId"],
        metadata["eventTimestampMs"],
        {int(k): v for k, v in metadata["segmentLeaderEpochs"].items()},
    )


def rewrite_as_aiven(store, topic: str, ring: aiven.KeyRing, key_id: str | None) -> int:
    """Step 0: every stored segment of ``topic`` read with the Aiven-format reader and written again
    by the Aiven-format writer under the same keys; returns how many."""
    segments = _segments(store, topic)
    for i, (base, metadata) in enumerate(segments):
        info = _info(metadata)
        back = aiven.read_segment(store.get, KEY_PREFIX, info, ring)
        info.log, info.indexes = back.log, back.indexes
        chunk, compression, heuristic = AIVEN_SETTINGS[i % len(AIVEN_SETTINGS)]
        manifest_key = aiven.write_segment(
            store.put, info, aiven.WriterSettings(chunk, compression, heuristic, key_id, KEY_PREFIX), ring
        )
        assert manifest_key == f"{base}.{aiven.MANIFEST}", "Aiven's key layout is not the sidecar's"
        assert "rsmSidecar" not in store.get(manifest_key).decode()
    return len(segments)


def read_back_as_aiven(store, topic: str, ring: aiven.KeyRing) -> dict[int, Rec]:
    """Step 4: every record of the topic's stored segments, through the Aiven-format reader."""
    out: dict[int, Rec] = {}
    for _, metadata in _segments(store, topic):
        log = aiven.read_segment(store.get, KEY_PREFIX, _info(metadata), ring).log
        for batch in read_batches(io.BytesIO(log)):
            for r in batch.records():
                headers = tuple((h.key, h.value) for h in r.headers)
                out[r.offset] = Rec(r.key, r.value, headers, r.timestamp, r.offset)
    return out


class Reading:
    """A consumer reading the topic from offset 0 to ``end`` again and again (step 2), checking
    every pass, until stopped."""

    def __init__(self, bootstrap: str, topic: str, produced: list[Rec], end: int):
        self.args = (bootstrap, topic, produced, end)
        self.passes = 0
        self.errors: list[BaseException] = []
        self.started = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        bootstrap, topic, produced, end = self.args
        while not self._stop.is_set():
            try:
                self.started.set()
                got = {r.offset: r for r in consume(bootstrap, topic, 0, end, timeout=120)}
                assert_same_records(
                    [got.get(r.offset, Rec(None, None, (), -1, -1)) for r in produced], produced
                )
                self.passes += 1
            except BaseException as e:  # reported by stop()
                self.errors.append(e)
                return

    def __enter__(self) -> Reading:
        self._thread.start()
        self.started.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(180)


def _inspect(stack, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    config, sidecar_env = stack.sidecar_config_env()
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rsm_sidecar.cli.main",
            "inspect",
            args[0],
            "--config",
            str(config),
            *args[1:],
        ],
        cwd=REPO,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("RSM__")},
            **sidecar_env,
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_the_runbook(stack, topic: str, key_id: str | None, ring: aiven.KeyRing, migration_env: dict) -> None:
    store = stack.object_store()
    bootstrap = stack.bootstrap_servers
    t0 = int(time.time() * 1000) - 3_600_000
    rng = random.Random(topic)

    # 0. Aiven's era
    create_topic(bootstrap, topic)
    produced = produce(bootstrap, topic, records(150, rng, t0), "none")
    produced += produce(bootstrap, topic, records(150, rng, t0 + 10_000), "zstd")
    filler(bootstrap, topic)
    wait_all_closed_tiered(stack, topic)
    end = produced[-1].offset + 1
    assert rewrite_as_aiven(stack.object_store(), topic, ring, key_id) >= 2

    # 1. the sidecar with the runbook's configuration and the migration setting on
    stack.restart_sidecar({**migration_env, "RSM__FETCH__ACCEPT_UNAUTHENTICATED_SEGMENTS": "true"})
    verified = _inspect(stack, "verify", "--topic", topic, "-q")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    got = consume(bootstrap, topic, 0, end)
    assert_same_records(got[: len(produced)], produced)  # record by record, from offset 0

    # 2. sealed while the broker serves reads
    with Reading(bootstrap, topic, produced, end) as reading:
        sealed = _inspect(stack, "seal", "--topic", topic, "--json", "-q")
        while reading.passes < 1 and not reading.errors:
            time.sleep(0.2)
    assert not reading.errors, reading.errors
    assert sealed.returncode == 0, sealed.stdout + sealed.stderr
    summary = json.loads(sealed.stdout)["summary"]
    assert summary["sealed"] == len(_segments(store, topic)) and summary["refused"] == 0, summary

    # 3. the setting off; new segments tiered by the sidecar itself
    stack.restart_sidecar({"RSM__FETCH__ACCEPT_UNAUTHENTICATED_SEGMENTS": "false"})
    assert_same_records(consume(bootstrap, topic, 0, end)[: len(produced)], produced)
    more = produce(bootstrap, topic, records(100, rng, t0 + 20_000), "lz4")
    filler(bootstrap, topic)
    wait_all_closed_tiered(stack, topic)
    got = {r.offset: r for r in consume(bootstrap, topic, 0, more[-1].offset + 1)}
    assert_same_records([got[r.offset] for r in produced + more], produced + more)

    # 4. the way back: Aiven's reader reads every segment, old and new
    back = read_back_as_aiven(store, topic, ring)
    assert_same_records([back[r.offset] for r in produced + more], produced + more)


def test_migration_from_aiven_on_local_storage_then_on_s3(stack, aiven_key_files):
    keys_dir = Path(stack.keys_dir)
    demo = ("demo-key-1", (str(keys_dir / "demo-key-1.public.pem"), str(keys_dir / "demo-key-1.private.pem")))
    # Aiven's reader may read what the sidecar wrote before the migration too (the demo key)
    ring = aiven.KeyRing({**aiven_key_files, demo[0]: demo[1]})
    run_the_runbook(
        stack,
        "migrated-local",
        AIVEN_KEY,
        ring,
        {**_key_env(aiven_key_files), "RSM__ENCRYPTION__ACTIVE_KEY_ID": AIVEN_KEY},
    )

    from devstack.s3server import SeaweedS3Server

    s3 = SeaweedS3Server(stack.workdir / "s3", access_key="mig-access", secret_key="mig-secret-key").start()
    try:
        s3.create_bucket("migration")
        s3_env = {
            "RSM__STORAGE__BACKEND": "s3",
            "RSM__STORAGE__S3__BUCKET": "migration",
            "RSM__STORAGE__S3__ENDPOINT_URL": s3.endpoint_url,
            "RSM__STORAGE__S3__REGION": "us-east-1",
            "RSM__STORAGE__S3__ADDRESSING_STYLE": "path",
            "RSM__STORAGE__S3__ACCESS_KEY_ID": s3.access_key,
            "RSM__STORAGE__S3__SECRET_ACCESS_KEY": s3.secret_key,
            "RSM__ENCRYPTION__ENABLED": "false",
            "RSM__FETCH__ACCEPT_UNAUTHENTICATED_SEGMENTS": "false",
        }
        stack.restart_sidecar(s3_env, unset=[*_key_env(aiven_key_files), "RSM__ENCRYPTION__ACTIVE_KEY_ID"])
        assert stack.object_store().name == "s3"
        run_the_runbook(stack, "migrated-s3", None, ring, {})
    finally:
        stack.sidecar.stop()
        s3.stop()
