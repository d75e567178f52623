"""Measured resource bounds: what a cancelled fetch reads from storage, and the
sidecar's memory while it copies a 1 GiB segment."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import grpc
import psutil
import pytest

from rsm_sidecar.storage.local import LocalObjectStore
from tests.service.rsm_client import Client, SegmentFilesOnDisk, metadata, seg_id

MiB = 1024 * 1024


class CountingStore(LocalObjectStore):
    """Counts the bytes ranged reads return (what a remote store would bill and transfer)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.bytes_read = 0
        self._lock = threading.Lock()

    def get_range(self, key, start, end):
        data = super().get_range(key, start, end)
        with self._lock:
            self.bytes_read += len(data)
        return data


def test_cancelled_fetch_reads_at_most_the_run_in_flight_plus_the_prefetch_window(start_sidecar, tmp_path):
    store = CountingStore(tmp_path / "remote", fsync=False)
    chunk, prefetch, max_range = 4 * MiB, 16 * MiB, 8 * MiB
    sc = start_sidecar(store=store, encryption=True, segment__chunk_size=chunk, segment__compression=False,
                       cache__prefetch_bytes=prefetch, fetch__max_range_bytes=max_range)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), log_size=64 * MiB)
    md = metadata(seg_id(1), size=files.log_size)
    sc.client.copy(files.path_request(md))
    store.bytes_read = 0
    stream = sc.client.fetch_stream(md)
    first = next(stream)
    assert len(first.data) == MiB
    stream.cancel()
    time.sleep(2)  # prefetches already submitted finish
    read = store.bytes_read
    overhead = 28 * (64 * MiB // chunk)
    bound = max_range + prefetch + overhead
    print(f"\ncancelled after 1 MiB of a 64 MiB segment: read {read / MiB:.1f} MiB from storage "
          f"(bound {bound / MiB:.1f} MiB: one run of {max_range // MiB} MiB + prefetch {prefetch // MiB} MiB)")
    assert read <= bound
    time.sleep(1)
    assert store.bytes_read == read, "storage reads continued after the cancel"
    full = sc.client.fetch(md)  # the rest still reads correctly
    assert len(full) == 64 * MiB


def _rss_tree(proc: psutil.Process) -> int:
    return proc.memory_info().rss


@pytest.mark.slow
def test_copying_a_1_gib_segment_keeps_memory_bounded(tmp_path):
    """The sidecar runs as its own process (as in production); its RSS is sampled every
    20 ms while a 1 GiB segment is copied in path mode and in stream mode."""
    root = tmp_path / "remote"
    cfg = tmp_path / "sidecar.toml"
    cfg.write_text(f"""
[server]
listen = "127.0.0.1:0"
[metrics]
listen = ""
[storage.local]
root = "{root}"
fsync = false
[segment]
chunk_size = "4MiB"
compression_heuristic = false
[copy]
parallelism = 2
allowed_dirs = ["{tmp_path}"]
""")
    # Port 0: learn the port from the log line.
    proc = subprocess.Popen([sys.executable, "-m", "rsm_sidecar.cli.main", "serve", "--config", str(cfg)],
                            stderr=subprocess.PIPE, text=True)
    try:
        address = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and address is None:
            line = proc.stderr.readline()
            if '"listen"' in line:
                import json
                address = json.loads(line)["listen"]
        assert address, "sidecar did not start"
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
        client = Client(address)
        ps = psutil.Process(proc.pid)
        files = SegmentFilesOnDisk(str(tmp_path / "seg"), log_size=1024 * MiB, txn=False)
        results = {}
        for mode in ("path", "stream"):
            md = metadata(seg_id(1 if mode == "path" else 2), size=files.log_size)
            baseline = _rss_tree(ps)
            peak = [baseline]
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    peak[0] = max(peak[0], _rss_tree(ps))
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample)
            sampler.start()
            t0 = time.monotonic()
            reqs = files.path_request(md) if mode == "path" else files.stream_requests(md)
            resp = client.copy(reqs, timeout=600)
            elapsed = time.monotonic() - t0
            stop.set()
            sampler.join()
            results[mode] = (peak[0] - baseline, elapsed, resp.stored_bytes, baseline)
        for mode, (growth, elapsed, stored, baseline) in results.items():
            print(f"\n1 GiB copy ({mode} mode): RSS +{growth / MiB:.1f} MiB over a {baseline / MiB:.0f} MiB baseline, "
                  f"{1024 / elapsed:.0f} MiB/s, {stored / MiB:.0f} MiB stored")
        for mode, (growth, _, _, _) in results.items():
            assert growth <= 64 * MiB, f"{mode} mode grew RSS by {growth / MiB:.1f} MiB"
        client.close()
    finally:
        proc.terminate()
        proc.wait(30)
