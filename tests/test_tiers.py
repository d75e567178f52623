"""The test tiers of tests/conftest.py: every test has exactly one of unit, integration, e2e,
chosen from its markers, fixtures and module."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO


def _collected(marker: str, *paths: str) -> set[str]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marker,
            *paths,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode in (0, 5), out.stdout + out.stderr  # 5: nothing selected
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_each_test_has_exactly_one_tier():
    paths = ("tests/transform", "tests/kafka/test_kafka_e2e.py")
    assert _collected("not (unit or integration or e2e)", *paths) == set()
    unit, integration, e2e = (_collected(m, *paths) for m in ("unit", "integration", "e2e"))
    assert not (unit & integration or unit & e2e or integration & e2e)
    every = unit | integration | e2e
    # by explicit marker: the BouncyCastle interop needs Java and a downloaded jar
    assert "tests/transform/test_keyring.py::test_java_aes_gcm_chunks_match_ours" in integration
    assert "tests/transform/test_keyring.py::test_keyring_repr_has_no_key_material" in unit
    # by fixture: the broker (kafka_broker, kafka_broker_factory)
    assert {t for t in every if "test_heuristic_broker.py" in t} <= e2e
    assert "tests/kafka/test_kafka_e2e.py::test_broker_lifecycle" in e2e
