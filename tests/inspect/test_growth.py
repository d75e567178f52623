"""Costs of `inspect` that must grow with the bucket no faster than linearly
(benchmarks/many_segments.py measures the rest)."""

from __future__ import annotations

import builtins
import contextlib
import io

from rsm_sidecar.inspect import du


def test_du_table_groups_partitions_by_topic_once(monkeypatch):
    result = du.DuResult({(f"t{t}", f"id{t}", p): du.Usage(segments=p) for t in range(300) for p in range(5)})
    calls = []

    def counting_sorted(*args, **kwargs):
        calls.append(1)
        return builtins.sorted(*args, **kwargs)

    monkeypatch.setattr(du, "sorted", counting_sorted, raising=False)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        du.print_table(result)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + 300 * 6 + 1
    assert lines[1].split()[:4] == ["t0", "id0", "0", "0"] and lines[6].split()[:3] == ["t0", "id0", "all"]
    assert len(calls) <= 3, f"{len(calls)} sorts of the partitions for 300 topics (one per topic before)"
