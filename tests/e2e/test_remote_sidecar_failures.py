"""The sidecar reached over TCP with mutual TLS (where Strimzi puts it) when it goes away and
when TLS says no, with a real Kafka broker and the shim on its default settings:

* the sidecar restarted during a catch-up read of 12 partitions from remote storage, gracefully
  (SIGTERM: it drains and stops, then it is started again) and killed (kill -9, then started
  again), away for about 2.5 s each time (a container restarted by the kubelet: it notices, starts
  the process, which checks its bucket and keys before it answers), with the shim's read-ahead
  off so that every fetch needs the sidecar: no consumer sees an error and every record arrives
  once, in order. Before, reads failed when the sidecar was away longer than the shim's 0.3 s of
  retries, and consumers saw ``Unknown broker error``;
* each way TLS refuses (the shim does not trust the sidecar's certificate: another CA, expired,
  not yet valid, another name; the sidecar does not accept the shim's: another CA, expired, not
  yet valid, none; a key that is not its certificate's): the broker's log and the connectivity
  check (``java -jar rsm-sidecar-shim.jar``) each say in one line that TLS refused, why, and what
  to fix. Before, the broker logged ``UNAVAILABLE: Network closed for unknown reason`` (the words
  of a crashed sidecar) or ``General OpenSslEngine problem``, over two lines.

The TLS files change as renewals change them (``devstack.tls.SecretVolume``: the sidecar reads
its files before each handshake, the shim every ``tls.reload.interval.ms``); only "no client
certificate" needs the broker restarted, so it comes last.
"""

from __future__ import annotations

import datetime
import random
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from devstack.stack import TLS_AUTHORITY, LocalStack
from devstack.tls import EXPIRED, NOT_YET_VALID, Issued, TestCA
from tests.e2e import scenarios
from tests.e2e.kafka_helpers import (
    SEGMENT_BYTES,
    PassReader,
    Rec,
    create_topic,
    error_keeping_consumer,
    filler,
    produce,
    records,
    wait_for,
    wait_tiered,
)
from tests.helpers import BROKER_JVM_OPTIONS

#: what the broker logs when a remote read fails (RemoteLogReader), with the stack trace
READ_ERROR = "Error occurred while reading the remote data"
PARTITIONS = 12
RELOAD_MS = 200  # the shim's tls.reload.interval.ms here
AWAY_S = 2.5  # how long a restart keeps the sidecar away
CLIENT = "kafka-broker"  # the subject of the shim's certificate (devstack/stack.py)
TLS_TOPIC = "tls"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    st = LocalStack(
        tmp_path_factory.mktemp("remote-sidecar-failures"),
        transfer_mode="stream",
        sidecar_tls=True,
        broker_properties={
            "rsm.config.tls.reload.interval.ms": str(RELOAD_MS),
            # every remote read of the broker calls the sidecar (none is served from a window the
            # shim read ahead): the restarts below cannot fall between reads
            "rsm.config.fetch.readahead.bytes": "0",
        },
        broker_jvm_options=BROKER_JVM_OPTIONS,
    )
    st.start()
    yield st
    st.stop()


@pytest.fixture(scope="module")
def tiered(stack) -> dict[int, list[Rec]]:
    """12 partitions of known records, tiered and gone from the broker's disk."""
    topic = "failures"
    create_topic(stack.bootstrap_servers, topic, partitions=PARTITIONS)
    t0 = int(time.time() * 1000) - 3_600_000
    produced = {}
    for p in range(PARTITIONS):
        produced[p] = produce(stack.bootstrap_servers, topic, records(300, random.Random(p), t0), partition=p)
        filler(stack.bootstrap_servers, topic, size=SEGMENT_BYTES + 100_000, partition=p)
    for p in range(PARTITIONS):
        wait_tiered(stack, topic, produced[p][-1].offset + 1, partition=p)
    return produced


def broker_log(stack) -> str:
    return stack.broker.server_log.read_text(errors="replace")


def assert_one_line_statuses(log: str) -> None:
    """No gRPC status split over two lines (``io exception`` / ``Channel Pipeline: [...]``)."""
    split = [line for line in log.splitlines() if line.startswith("Channel Pipeline")]
    assert not split, split[:3]


def test_reads_ride_out_sidecar_restarts(stack, tiered):
    log_before = len(broker_log(stack))
    # a catch-up consumer: 32 KiB per partition and fetch, many small remote reads
    reader = PassReader(
        stack.bootstrap_servers,
        "failures",
        tiered,
        group="restarts",
        **{"max.partition.fetch.bytes": 32 * 1024},
    )
    reader.start()
    wait_for("the first records", lambda: reader.received > 0, 60, 0.05)
    gaps = {}
    for how in ("SIGTERM", "kill -9"):
        before = reader.received
        t0 = time.monotonic()
        if how == "SIGTERM":
            stack.sidecar.stop()  # drains its calls in flight, then stops
        else:
            stack.sidecar.kill()
        time.sleep(max(0.0, AWAY_S - (time.monotonic() - t0) - 0.8))  # its start-up takes about 0.8 s here
        stack.sidecar.start()  # returns once it answers its health check
        gaps[how] = time.monotonic() - t0
        wait_for(
            f"reads going on after the {how} restart", lambda b=before: reader.received > b + 500, 60, 0.05
        )
    reader.stop_after.set()
    reader.join(180)
    assert not reader.is_alive(), "the consumer did not finish"
    log = broker_log(stack)[log_before:]
    missed = log.count("is not reachable (fetch")
    back = [line.split("reachable again, ")[1] for line in log.splitlines() if "is reachable again" in line]
    print(
        "\nrestarts (stopped until answering again): "
        f"{', '.join(f'{k} {v:.2f} s' for k, v in gaps.items())}; "
        f"passes read: {len(reader.passes)}; the consumer's longest wait for a record: "
        f"{reader.longest_wait:.2f} s; the shim's outages: {back}"
    )
    # on a failure, what the shim said: the sidecar's outages, the errors and the reads' waits
    said = [line for line in log.splitlines() if " WARN " in line or " ERROR " in line or "reachable" in line]
    assert reader.errors == [], (
        f"restarts took {', '.join(f'{k} {v:.2f} s' for k, v in gaps.items())}; the broker's log said:\n"
        + "\n".join(said[:40])
    )
    for got in reader.passes:
        for p in range(PARTITIONS):
            scenarios.assert_same_records(got[p], tiered[p])
    assert READ_ERROR not in log
    assert_one_line_statuses(log)
    # remote reads met the sidecar away in both restarts (the test tested something)
    assert missed >= 2, f"remote reads missed the sidecar {missed} times:\n{log[-3000:]}"


# -- when TLS refuses ---------------------------------------------------------------------------


def _when(dt: datetime.datetime) -> str:
    """A certificate's date as the shim prints it (java.time.Instant)."""
    return dt.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        pytest.fail("java is not on PATH (Java 17 runs the shim's connectivity check)", pytrace=False)
    return java


def diagnose(stack, **files: Path | None) -> subprocess.CompletedProcess[str]:
    """The connectivity check, as an operator runs it on the broker's host: the shim's jar with
    the broker's TLS settings (``files`` overrides ``ca``, ``cert``, ``key``; None drops one)."""
    paths = {
        n: stack.broker_secret.file(f) for n, f in (("ca", "ca.crt"), ("cert", "tls.crt"), ("key", "tls.key"))
    }
    paths.update(files)
    args = [f"{stack.sidecar_target}", "tls.enabled=true", f"tls.authority.override={TLS_AUTHORITY}"]
    for name, key in (("ca", "tls.ca.file"), ("cert", "tls.cert.file"), ("key", "tls.key.file")):
        if paths[name] is not None:
            args.append(f"{key}={paths[name]}")
    return subprocess.run(
        [_java(), "-jar", str(stack.shim_jar), *args], capture_output=True, text=True, timeout=120
    )


class Tls:
    """The stack's TLS files and what changing them does: the sidecar's (read before each TLS
    handshake) and the shim's (read every RELOAD_MS)."""

    def __init__(self, stack):
        self.stack = stack
        self.ca: TestCA = stack.tls_ca
        self.other = TestCA("another CA")

    @property
    def client_cert(self) -> Path:
        return self.stack.broker_secret.file("tls.crt")

    def sidecar_uses(self, server: Issued) -> None:
        self.stack.sidecar_secret.update(
            {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": self.ca.cert_pem}
        )

    def shim_uses(self, client: Issued, key_pem: bytes | None = None) -> int:
        """The shim's certificate (and key) renewed in place; returns the broker log's length before."""
        before = len(broker_log(self.stack))
        files = {"tls.crt": client.cert_pem, "tls.key": key_pem or client.key_pem, "ca.crt": self.ca.cert_pem}
        self.stack.broker_secret.update(files)
        return before

    def shim_reloaded(self, before: int) -> None:
        """Until the shim loaded its renewed files: its next calls go over a new connection."""
        wait_for(
            "the shim to load its renewed TLS files",
            lambda: "TLS files changed: new connections" in broker_log(self.stack)[before:],
            30,
            0.1,
        )

    def good(self) -> None:
        """Both sides' files as the stack made them (a new client certificate: a new connection)."""
        self.sidecar_uses(self.ca.server(TLS_AUTHORITY, ips=[self.stack.sidecar_host]))
        self.shim_reloaded(self.shim_uses(self.ca.issue(CLIENT)))


@pytest.fixture(scope="module")
def tls(stack, tiered):
    """The TLS files, and a topic of tiered records that nothing has read yet: the shim keeps no
    read-ahead window of it, so each read of it calls the sidecar."""
    create_topic(stack.bootstrap_servers, TLS_TOPIC)
    recs = produce(
        stack.bootstrap_servers, TLS_TOPIC, records(200, random.Random(99), int(time.time() * 1000))
    )
    filler(stack.bootstrap_servers, TLS_TOPIC, size=SEGMENT_BYTES + 100_000)
    wait_tiered(stack, TLS_TOPIC, recs[-1].offset + 1)
    return Tls(stack)


def read_once(stack, until: Callable[[], bool] = lambda: False) -> list[str]:
    """One consumer reading the TLS topic from offset 0 (remote storage) for 4 s, or until
    ``until()``; its errors."""
    errors: list[str] = []
    c = error_keeping_consumer(stack.bootstrap_servers, "tls", errors)
    try:
        c.assign([TopicPartition(TLS_TOPIC, 0, 0)])
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline and not until():
            for m in c.consume(100, 0.5):
                if m.error():
                    errors.append(str(m.error()))
    finally:
        c.close()
    return errors


def assert_refused(
    stack, before: int, reason: str, check: Callable[[], subprocess.CompletedProcess[str]]
) -> None:
    """A remote read fails with ``reason`` in its exception (the line after the broker's ERROR),
    and the shim says it in one WARN line (this read's or a copy's: one per reason and minute);
    the connectivity check prints it, one line, exit 2."""
    assert reason.startswith("TLS refused: ")

    def failed_read(text: str) -> bool:
        return any(
            "RemoteStorageException: " in line and "failed: sidecar status UNAVAILABLE: " + reason in line
            for line in text.splitlines()
        )

    read_once(stack, until=lambda: failed_read(broker_log(stack)[before:]))
    log = wait_for(
        "the failed read in the broker's log",
        lambda: (lambda text: text if failed_read(text) else None)(broker_log(stack)[before:]),
        30,
        0.2,
    )
    warned = f": {reason} (io.github.rsmsidecar.shim.Retrier)"
    assert any(" WARN " in line and line.endswith(warned) for line in log.splitlines()), log[-3000:]
    assert_one_line_statuses(log)
    run = check()
    assert (
        run.stdout
        == f"FetchIndex to the sidecar at {stack.sidecar_target} ended with UNAVAILABLE: {reason}\n"
    ), run.stdout + run.stderr
    assert run.returncode == 2


def _server_refused(cert: Issued, why: str) -> str:
    c = cert.cert
    return (
        f"TLS refused: the shim refused the sidecar's certificate ({c.subject.rfc4514_string()}, "
        f"issued by {c.issuer.rfc4514_string()}): {why}"
    )


@pytest.mark.parametrize("kind", ["another CA", "expired", "not yet valid", "another name"])
def test_the_shim_says_why_it_does_not_trust_the_sidecar(stack, tls, kind):
    ca = tls.other if kind == "another CA" else tls.ca
    if kind == "another name":
        server = ca.server("other.test", ips=["10.0.0.9"])
    else:
        valid = {"expired": EXPIRED, "not yet valid": NOT_YET_VALID}.get(kind, "current")
        server = ca.server(TLS_AUTHORITY, ips=[stack.sidecar_host], valid=valid)
    ca_file = stack.broker_secret.file("ca.crt")
    why = {
        "another CA": f"no CA it trusts issued it; rsm.config.tls.ca.file={ca_file} holds "
        "CN=rsm-sidecar stack CA: add the CA that issued the sidecar's certificate",
        "expired": f"it expired at {_when(server.cert.not_valid_after_utc)}: renew the sidecar's "
        "certificate (its server.tls.cert_file)",
        "not yet valid": f"it is not valid before {_when(server.cert.not_valid_before_utc)} (or the "
        "clock of this host is behind): reissue the sidecar's certificate (its server.tls.cert_file)",
        "another name": f"it is for DNS:other.test, IP:10.0.0.9, not for '{TLS_AUTHORITY}', the name the "
        "shim checks (rsm.config.tls.authority.override, or the host of rsm.config.sidecar.target when it "
        "is not set): set rsm.config.tls.authority.override to one of its names, or reissue it for that name",
    }[kind]
    tls.sidecar_uses(server)
    before = tls.shim_uses(tls.ca.issue(CLIENT))  # a new connection: a handshake with the new certificate
    tls.shim_reloaded(before)
    try:
        assert_refused(stack, before, _server_refused(server, why), lambda: diagnose(stack))
    finally:
        tls.good()


@pytest.mark.parametrize("kind", ["another CA", "expired", "not yet valid"])
def test_the_shim_says_why_the_sidecar_refused_its_certificate(stack, tls, kind):
    valid = {"expired": EXPIRED, "not yet valid": NOT_YET_VALID}.get(kind, "current")
    client = (tls.other if kind == "another CA" else tls.ca).issue(CLIENT, valid=valid)
    c = client.cert
    # the sidecar's listener (OpenSSL) says why with a TLS alert
    alert = {
        "another CA": "unknown_ca",
        "expired": "certificate_expired",
        "not yet valid": "bad_certificate",
    }[kind]
    what = (
        f"refused the shim's client certificate rsm.config.tls.cert.file={tls.client_cert} "
        f"(CN={CLIENT}, issued by {c.issuer.rfc4514_string()}) (alert {alert})"
    )
    dates = {
        "expired": f"it expired at {_when(c.not_valid_after_utc)}",
        "not yet valid": f"it is not valid before {_when(c.not_valid_before_utc)} "
        "(or the clock of this host is behind)",
    }.get(kind)
    why = {
        "another CA": "the sidecar's server.tls.client_ca_file must hold the CA that issued it",
        "expired": f"{dates}: renew rsm.config.tls.cert.file and rsm.config.tls.key.file",
        "not yet valid": f"{dates}: reissue rsm.config.tls.cert.file and rsm.config.tls.key.file",
    }[kind]
    before = tls.shim_uses(client)
    tls.shim_reloaded(before)
    try:
        if dates:  # said when the files are loaded, before any call
            warned = (
                f"WARN TLS files: rsm.config.tls.cert.file={tls.client_cert} (CN={CLIENT}): {dates}; "
                "the sidecar will refuse it"
            )
            assert warned in broker_log(stack)[before:]
        assert_refused(
            stack,
            before,
            f"TLS refused: the sidecar at {stack.sidecar_target} {what}: {why}",
            lambda: diagnose(stack),
        )
    finally:
        tls.good()


def test_a_key_that_is_not_the_certificates_is_not_used(stack, tls):
    key_file, cert_file = stack.broker_secret.file("tls.key"), tls.client_cert
    reason = (
        f"rsm.config.tls.key.file={key_file} is not the key of the certificate in "
        f"rsm.config.tls.cert.file={cert_file} (CN={CLIENT})"
    )
    before = tls.shim_uses(tls.ca.issue(CLIENT), key_pem=tls.ca.issue(CLIENT).key_pem)
    try:
        line = (
            f"WARN TLS files changed but are not usable yet ({reason}); keeping the ones in use and "
            f"checking again in {RELOAD_MS} ms"
        )
        wait_for("the shim's warning", lambda: line in broker_log(stack)[before:], 30, 0.1)
        assert read_once(stack) == [], "the files in use stay in use"
        run = diagnose(stack)
        assert (run.returncode, run.stdout, run.stderr) == (64, "", reason + "\n")
    finally:
        tls.good()


def test_no_client_certificate(stack, tls):
    """Last: the shim's settings are read at start-up only, so the broker restarts without them."""
    stack.broker.extra_properties.update({"rsm.config.tls.cert.file": None, "rsm.config.tls.key.file": None})
    before = len(broker_log(stack))  # the restarted broker appends to the same log
    stack.broker.restart()
    reason = (
        f"TLS refused: the sidecar at {stack.sidecar_target} requires a client certificate and the shim "
        "has none (alert certificate_required): set rsm.config.tls.cert.file "
        "and rsm.config.tls.key.file"
    )
    assert_refused(stack, before, reason, lambda: diagnose(stack, cert=None, key=None))
