"""`rsm-sidecar inspect seal` killed with SIGKILL at random points, then resumed: every run is
a real process on an Aiven-written bucket, killed a random number of segments (and a random
fraction of a segment) into its work, at least 20 times while segments are left to seal; a last
run finishes. Every segment ends sealed, reads byte for byte as before through the sidecar's
reader with ``fetch.accept_unauthenticated_segments`` off and through Aiven's reader, and nothing
else in the bucket changed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata
from rsm_sidecar.format.manifest import SegmentManifest
from rsm_sidecar.inspect.seal import WRITER, missing_block
from rsm_sidecar.segment.reader import SegmentReader
from rsm_sidecar.segment.settings import ReaderSettings
from rsm_sidecar.storage.local import LocalObjectStore
from tests import aiven_format as aiven
from tests.aiven_fixtures import PREFIX, aiven_keys, aiven_ring, our_ring, sidecar_toml, write_aiven_bucket
from tests.helpers import REPO

__all__ = ["aiven_keys", "aiven_ring", "our_ring"]  # fixtures
pytestmark = pytest.mark.integration  # processes of the CLI

KILLS = 20


def _sealed(store, segments) -> int:
    n = 0
    for seg in segments:
        key = aiven.object_key(PREFIX, seg, aiven.MANIFEST)
        n += missing_block(SegmentManifest.from_bytes(store.get(key), key)) is None
    return n


def test_seal_killed_at_random_points_resumes_to_every_segment_sealed(
    tmp_path, aiven_keys, aiven_ring, our_ring
):
    seed = int(os.environ.get("RSM_TEST_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    root = tmp_path / "bucket"
    store = LocalObjectStore(root, fsync=False)
    written = [
        w
        for topic in ("k1", "k2", "k3", "k4", "k5", "k6")
        for w in write_aiven_bucket(store, aiven_ring, topic)
    ]
    segments = [seg for seg, _ in written]
    before = {o.key: store.get(o.key) for o in store.list("")}
    config = sidecar_toml(tmp_path / "sidecar.toml", root, aiven_keys, accept=False)
    argv = [sys.executable, "-m", "rsm_sidecar.cli.main", "inspect", "seal", "--all", "-c", config]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSM__")}
    env["PYTHONUNBUFFERED"] = "1"  # each "sealed" line as it happens, not a pipe buffer at a time

    kills = 0
    progress = []
    while kills < KILLS:
        sealed = _sealed(store, segments)
        assert sealed < len(segments), f"seed {seed}: everything sealed after {kills} kills; add segments"
        progress.append(sealed)
        parallel = rng.choice(["1", "2"])
        proc = subprocess.Popen(
            [*argv, "--parallel", parallel],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        try:
            # one segment sealed by this run (skipping sealed ones is quick: not counted), then a
            # random part of the next ones
            wanted = 1
            done = 0
            while done < wanted:
                line = proc.stdout.readline()
                if not line:
                    break
                done += line.startswith(b"sealed ")
            # a random fraction of the next segment: sealing one takes a few ms on a quiet machine
            # (with 50 ms here a run sealed about 9 segments per kill on CI, and every segment was
            # sealed before the 20th kill)
            time.sleep(rng.uniform(0, 0.003))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        finally:
            proc.stdout.close()
            proc.wait(60)
    # the run that finishes the job, then one that has nothing left to do
    for expect_sealed in (True, False):
        done = subprocess.run([*argv, "--json", "-q"], cwd=REPO, env=env, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        if not expect_sealed:
            assert b'"sealed": 0' in done.stdout
    assert _sealed(store, segments) == len(segments)
    progress.append(len(segments))
    assert progress == sorted(progress), f"seed {seed}: sealed segments went down: {progress}"

    after = {o.key: store.get(o.key) for o in store.list("")}
    assert after.keys() == before.keys()
    assert all(after[k] == v for k, v in before.items() if not k.endswith(".rsm-manifest"))
    layout = KeyLayout(PREFIX)
    readers = {
        True: SegmentReader(store, layout, our_ring, ReaderSettings()),
        False: SegmentReader(store, layout, None, ReaderSettings()),
    }
    for seg, settings in written:
        key = aiven.object_key(PREFIX, seg, aiven.MANIFEST)
        assert SegmentManifest.from_bytes(after[key], key).writer == WRITER
        reader = readers[settings.key_id is not None]
        opened = reader.open(
            SegmentMetadata(
                seg.topic_id, seg.topic, seg.partition, seg.segment_id, seg.start_offset, seg.end_offset
            )
        )
        assert b"".join(reader.read(opened, 0, len(seg.log))) == seg.log, (seed, settings)
        back = aiven.read_segment(store.get, PREFIX, seg, aiven_ring)
        assert (back.log, back.indexes) == (seg.log, seg.indexes), (seed, settings)
    print(f"seed {seed}: sealed after each of {KILLS} kills: {progress}")
