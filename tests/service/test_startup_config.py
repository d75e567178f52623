"""Settings a sidecar must refuse at start-up with a message naming the key, and the
transport defaults that keep the port private (issue 10, items 7 and 18). Each case
runs the real `rsm-sidecar serve` and reads what an operator reads: its exit status and
its error output."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO

EMPTY_CONFIG = REPO / "tests" / "service" / "empty.toml"


SERVE = [sys.executable, "-m", "rsm_sidecar.cli.main", "serve", "--config", str(EMPTY_CONFIG)]


def _serve(tmp_path, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess:
    (tmp_path / "remote").mkdir(exist_ok=True)
    base = {
        "RSM__STORAGE__LOCAL__ROOT": str(tmp_path / "remote"),
        "RSM__METRICS__LISTEN": "",
        "RSM__SERVER__LISTEN": "127.0.0.1:0",
    }
    return subprocess.run(
        SERVE, env={**os.environ, **base, **env}, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def _start(root, server_listen: str, metrics_listen: str, **env: str) -> subprocess.Popen[str]:
    """``rsm-sidecar serve`` on local storage at ``root``, its error output piped."""
    env = {
        **os.environ,
        "RSM__STORAGE__LOCAL__ROOT": str(root),
        "RSM__SERVER__LISTEN": server_listen,
        "RSM__METRICS__LISTEN": metrics_listen,
        **env,
    }
    return subprocess.Popen(SERVE, env=env, stderr=subprocess.PIPE, text=True, cwd=REPO)


@pytest.mark.parametrize(
    "env, key, words",
    [
        ({"RSM__SERVER__LISTEN": "127.0.0.1:99999"}, "server.listen", "port"),
        ({"RSM__METRICS__LISTEN": "127.0.0.1:70000"}, "metrics.listen", "port"),
        ({"RSM__SERVER__LISTEN": "unix://relative/rsm.sock"}, "server.listen", "absolute"),
        ({"RSM__COPY__ALLOWED_DIRS": "/does/not/exist"}, "copy.allowed_dirs", "does not exist"),
        ({"RSM__COPY__ALLOWED_DIRS": "relative/dir"}, "copy.allowed_dirs", "absolute"),
        ({"RSM__COPY__ALLOWED_DIRS": "/"}, "copy.allowed_dirs", "root directory"),
        ({"RSM__STORAGE__KEY_PREFIX": "../"}, "storage.key_prefix", ".."),
        ({"RSM__STORAGE__KEY_PREFIX": "/abs/"}, "storage.key_prefix", "/"),
        ({"RSM__COPY__JOURNAL_DIR": "/proc/version/journal"}, "copy.journal_dir", "cannot use"),
        (
            {"RSM__SERVER__TLS__CERT_FILE": "/etc/hostname", "RSM__SERVER__TLS__KEY_FILE": "/etc/hostname"},
            "server.tls.key_file",
            "private key",
        ),
        ({"RSM__SERVER__LISTEN": "0.0.0.0:0"}, "server.listen", "not a loopback address"),
        ({"RSM__STORAGE__BACKEND": "azure"}, "storage.azure.container", "missing"),
        (
            {
                "RSM__STORAGE__BACKEND": "azure",
                "RSM__STORAGE__AZURE__CONTAINER": "tiered",
                "RSM__STORAGE__AZURE__ACCOUNT_NAME": "acct",
                "RSM__STORAGE__AZURE__ACCOUNT_KEY": "a2V5",
                "RSM__STORAGE__AZURE__SAS_TOKEN": "sv=1&sig=x",
            },
            "storage.azure.account_key and storage.azure.sas_token",
            "exclusive",
        ),
    ],
)
def test_bad_settings_stop_the_sidecar_with_a_message_naming_the_key(tmp_path, env, key, words):
    r = _serve(tmp_path, env)
    assert r.returncode != 0
    assert key in r.stderr and words in r.stderr, r.stderr[-1500:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_plaintext_beyond_loopback_needs_an_explicit_opt_in(tmp_path):
    proc = _start(tmp_path, "0.0.0.0:0", ":0", RSM__SERVER__ALLOW_PLAINTEXT_NON_LOOPBACK="true")
    try:
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if '"listen"' in line or proc.poll() is not None:
                break
        assert proc.poll() is None, "".join(lines)
        # metrics.listen without a host binds loopback only
        import psutil

        listening = {
            (c.laddr.ip, c.laddr.port)
            for c in psutil.Process(proc.pid).net_connections("tcp")
            if c.status == psutil.CONN_LISTEN
        }
        hosts = {ip for ip, _ in listening}
        assert "0.0.0.0" in hosts or "::" in hosts  # the opted-in gRPC port
        metrics = [(ip, port) for ip, port in listening if ip not in ("0.0.0.0", "::")]
        assert metrics and all(ip == "127.0.0.1" for ip, _ in metrics), listening
        with socket.create_connection(metrics[0], timeout=5):
            pass
    finally:
        proc.terminate()
        proc.wait(30)


def test_sigterm_stops_the_sidecar_promptly_after_a_metrics_scrape(tmp_path):
    """SIGTERM may be delivered to any thread (gRPC's, the metrics server's); the sidecar
    must still drain and exit. Before the fix, 7 of 8 runs that had served a connection on
    the metrics port ignored SIGTERM until SIGKILL."""
    for run in range(5):
        proc = _start(tmp_path, "127.0.0.1:0", "127.0.0.1:0")
        try:
            while True:
                line = proc.stderr.readline()
                assert line, f"run {run}: the sidecar exited before serving"
                if '"listen"' in line:
                    break
            import psutil

            ports = [
                c.laddr.port
                for c in psutil.Process(proc.pid).net_connections("tcp")
                if c.status == psutil.CONN_LISTEN
            ]
            for port in ports:  # a scrape (or any client) that connects and goes away
                with socket.create_connection(("127.0.0.1", port), timeout=5):
                    pass
            t0 = time.monotonic()
            proc.terminate()
            proc.communicate(timeout=15)
            assert proc.returncode == 0 and time.monotonic() - t0 < 10, f"run {run}: exit {proc.returncode}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
