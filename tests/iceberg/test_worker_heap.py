"""A reused PySpark worker runs a full ``gc.collect()`` after every task (pyspark/daemon.py),
which walks every object the worker holds. :func:`freeze_worker_heap` (called at each task's
start) takes what survived that collection out of the collector's reach; what a task leaves as
cyclic garbage must still be collected. Run in a fresh interpreter so that the test process's own
heap is not frozen."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import gc, json, time
import pyarrow, pyiceberg.io.pyarrow
import rsm_sidecar.iceberg.mapping.rows, rsm_sidecar.iceberg.committing.data_files
from rsm_sidecar.iceberg.stages import freeze_worker_heap, with_static_archive_imports

gc.collect()
tracked_before = len(gc.get_objects())
list(with_static_archive_imports(iter([(0, 0, "{}")])))  # a task's start
frozen = gc.get_freeze_count()

class Node:
    pass

def task_garbage(n):
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it

gc.disable()  # no automatic collection in between: count them all below
task_garbage(1000)
gc.enable()
collected = gc.collect()
t0 = time.process_time()
for _ in range(5):
    gc.collect()
per_collect = (time.process_time() - t0) / 5
print(json.dumps({"tracked_before": tracked_before, "frozen": frozen,
                  "tracked_after": len(gc.get_objects()), "collected": collected,
                  "per_collect_s": per_collect}))
"""


def test_task_start_freezes_the_live_heap_and_task_garbage_is_still_collected():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["tracked_before"] > 50_000  # the modules a convert worker imports
    assert r["frozen"] >= r["tracked_before"] * 0.9  # all of that is out of the collector's reach
    assert r["tracked_after"] < r["tracked_before"] / 10
    assert r["collected"] >= 2000  # the task's 1000 cycles (2000 objects) were still freed
