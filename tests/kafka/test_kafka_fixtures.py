"""The library against segment files written by a real Kafka broker (committed fixtures).

Each case directory under ``tests/fixtures/kafka/`` holds rolled segments and an
``expected.json`` written by ``regenerate.py`` from what was produced and consumed.
"""

from __future__ import annotations

import json
from pathlib import Path

import kafka_fixture_checks as checks
import pytest

from rsm_sidecar.kafka import read_offset_index, read_time_index

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kafka"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.json").exists())
EXPECTED_CASES = {
    "producer-none",
    "producer-gzip",
    "producer-snappy",
    "producer-lz4",
    "producer-zstd",
    "broker-gzip",
    "broker-snappy",
    "broker-lz4",
    "broker-zstd",
    "log-append-time",
    "transactions",
}


def test_all_cases_present():
    assert set(CASES) == EXPECTED_CASES


@pytest.fixture(scope="module", params=CASES)
def case(request):
    return checks.load_case(FIXTURES / request.param)


@pytest.mark.parametrize("check", checks.ALL_CHECKS, ids=lambda f: f.__name__)
def test_fixture(case, check):
    check(case)


def test_fixtures_have_the_interesting_content():
    """Guard against a regeneration that silently loses what the fixtures are for."""
    all_records = []
    for name in CASES:
        all_records += json.loads((FIXTURES / name / "expected.json").read_text())["records"]
    assert any(r["key"] is None for r in all_records)
    assert any(r["value"] is None for r in all_records)  # tombstones
    assert any(r["value"] == "" for r in all_records)  # empty, not null
    assert any(v is None for r in all_records for _, v in r["headers"])  # null header value
    assert any(r["timestamp_type"] == "LogAppendTime" for r in all_records)
    txn = json.loads((FIXTURES / "transactions" / "expected.json").read_text())
    outcomes = {t["outcome"] for t in txn["transactions"]}
    assert outcomes == {"commit", "abort"}
    assert len(txn["segments"]) >= 2
    assert any(not r["read_committed_visible"] for r in txn["records"])
    # one aborted transaction straddles the segment boundary (data before, marker after)
    assert (FIXTURES / "transactions" / f"{txn['segments'][1]['base_offset']:020d}.txnindex").exists()
    total = sum(f.stat().st_size for f in FIXTURES.rglob("*") if f.is_file())
    assert total < 1024 * 1024, f"fixtures grew to {total} bytes"


def test_active_segment_preallocated_indexes():
    """The active segment's index files, copied from a running broker, are zero-padded to
    segment.index.bytes; only the real entries are returned."""
    exp = json.loads((FIXTURES / "transactions" / "expected.json").read_text())
    base = exp["active_segment_base_offset"]
    raw = (FIXTURES / "transactions" / "active.index").read_bytes()
    assert len(raw) == 4096 and raw.endswith(b"\0" * 1024)
    entries = read_offset_index(FIXTURES / "transactions" / "active.index", base)
    assert 0 < len(entries) < 4096 // 8
    assert all(base < e.offset < base + 16 and e.position > 0 for e in entries)
    times = read_time_index(FIXTURES / "transactions" / "active.timeindex", base)
    assert 0 < len(times) < 4092 // 12
    assert all(base <= t.offset < base + 16 for t in times)
