"""What a topic's KIP-1241 copy-lag settings mean for the table's freshness (the cases of
Kafka's own ``RemoteLogManagerTest.testCandidateLogSegments*``): either check at 0 means no
delay, ``-1`` takes the effective local retention, both checks off means never uploaded, a
broker before 4.4 has no such settings. The broker itself is read in
``test_convert_e2e.py::test_copy_lag_is_read_from_the_broker_reported_and_warned_once``."""

from __future__ import annotations

import math

import pytest

from rsm_sidecar.iceberg.copy_lag import CopyLag, client_config


def lag(**settings) -> CopyLag:
    return CopyLag("orders", {k.replace("_", "."): v for k, v in settings.items()})


def test_the_default_and_a_zero_check_delay_nothing():
    assert not lag(remote_copy_lag_ms=0, remote_copy_lag_bytes=0).delays_uploads
    zero_ms = lag(remote_copy_lag_ms=0, remote_copy_lag_bytes=60, retention_ms=10_000)
    assert not zero_ms.delays_uploads and zero_ms.bytes == 60
    assert "uploads are not delayed" in zero_ms.describe()
    assert not lag(remote_copy_lag_ms=100, remote_copy_lag_bytes=0).delays_uploads


def test_a_positive_lag_and_minus_one_from_local_retention():
    # ms 100, bytes -1 with unlimited retention.bytes (local -2): only the time check applies
    a = lag(remote_copy_lag_ms=100, remote_copy_lag_bytes=-1, local_retention_bytes=-2, retention_bytes=-1)
    assert (a.ms, a.bytes, a.delays_uploads, a.never_uploads) == (100, math.inf, True, False)
    assert "only once its newest record is 0.1 s old (KIP-1241)" in a.describe()
    # ms -1 with local.retention.ms -2 and retention.ms -1: off; bytes 60
    b = lag(remote_copy_lag_ms=-1, local_retention_ms=-2, retention_ms=-1, remote_copy_lag_bytes=60)
    assert (b.ms, b.bytes, b.delays_uploads) == (math.inf, 60, True)
    assert "once 60 bytes of newer log follow it" in b.describe()
    # -1 from a limited local retention, on both checks
    c = lag(
        remote_copy_lag_ms=-1,
        local_retention_ms=300_000,
        remote_copy_lag_bytes=-1,
        local_retention_bytes=-2,
        retention_bytes=1 << 20,
    )
    assert (c.ms, c.bytes) == (300_000, 1 << 20)
    assert "300 s old or 1,048,576 bytes" in c.describe()
    assert c.as_dict()["time_threshold_ms"] == 300_000 and c.as_dict()["delays_uploads"]


def test_both_checks_off_means_never_uploaded():
    d = lag(
        remote_copy_lag_ms=-1,
        local_retention_ms=-1,
        remote_copy_lag_bytes=-1,
        local_retention_bytes=-1,
        retention_ms=-1,
        retention_bytes=-1,
    )
    assert d.never_uploads and d.delays_uploads and "never uploads" in d.describe()
    assert d.as_dict()["time_threshold_ms"] is None and d.as_dict()["size_threshold_bytes"] is None


def test_a_broker_before_kafka_4_4_has_no_copy_lag():
    old = lag(remote_copy_lag_ms=None, remote_copy_lag_bytes=None, retention_ms=604_800_000)
    assert not old.delays_uploads and "Kafka before 4.4" in old.describe()


@pytest.mark.parametrize(
    ("client", "expected"),
    [
        ({}, {}),
        (
            {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"},
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"},
        ),
    ],
)
def test_client_settings_use_dots(client, expected):
    assert client_config("k:9092", client) == {"bootstrap.servers": "k:9092", **expected}
