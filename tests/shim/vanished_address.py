"""The inside of tests/shim/test_shim_jar.py's vanished-address test, run in a network namespace
of its own (``unshare --user --map-root-user --net``), where it may change the firewall: a real
``rsm-sidecar serve`` on 127.0.0.1, and VanishedAddress.java (the shim as a broker loads it)
calling it over TCP. When the program asks, the packets of its open connection are dropped
(iptables, both directions): to the shim the sidecar's address has vanished, with no reset and no
answer, as when the sidecar's pod is replaced or its node lost; later new connections are
dropped too. Prints the program's result lines, then one JSON object of them.

    python -m tests.shim.vanished_address <shim jar> <work dir> <class path entry>...

(the class path: the broker's API jars and the compiled BrokerPlugin.java)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from devstack.common import free_port
from devstack.sidecar import SidecarProcess

PROGRAM = Path(__file__).with_name("VanishedAddress.java")


def iptables(*args: str) -> None:
    binary = shutil.which("iptables") or "/usr/sbin/iptables"
    proc = subprocess.run([binary, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(args)}: {proc.stderr.strip()}")


def client_ports(server_port: int) -> list[int]:
    """Local ports of this namespace's established TCP connections to ``server_port``."""
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # Java connects through IPv6 sockets
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if state == "01" and int(remote.split(":")[1], 16) == server_port:
                ports.append(int(local.split(":")[1], 16))
    return ports


def black_hole(server_port: int) -> list[int]:
    """Drop every packet of the open connections to the sidecar, both ways."""
    ports = client_ports(server_port)
    if not ports:
        raise RuntimeError(f"no open connection to port {server_port} to drop")
    for p in ports:
        iptables("-A", "INPUT", "-p", "tcp", "--sport", str(p), "-j", "DROP")
        iptables("-A", "INPUT", "-p", "tcp", "--dport", str(p), "-j", "DROP")
    return ports


def main(argv: list[str]) -> int:
    jar, work, api_jars = Path(argv[0]), Path(argv[1]), argv[2:]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    port = free_port()
    config = work / "sidecar.toml"
    config.write_text(
        # the streams of the dropped connections never end: no grace for them at the end
        f'[server]\nlisten = "127.0.0.1:{port}"\nshutdown_grace_seconds = 0\n[metrics]\nlisten = ""\n'
        f'[storage.local]\nroot = "{work / "remote"}"\nfsync = false\n'
        "[segment]\ncompression = false\n"
    )
    t0 = time.monotonic()
    segments = work / "segments"
    segments.mkdir()
    java = shutil.which("java") or "java"
    # C1 only and the serial collector: this short program starts faster so
    proc = subprocess.Popen(
        [java, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", ":".join(api_jars), str(PROGRAM),
         str(jar), f"127.0.0.1:{port}", str(segments)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    sidecar = SidecarProcess(config, work / "sidecar", {}, f"127.0.0.1:{port}")
    results: dict[str, str] = {}
    try:
        sidecar.start()
        print(f"{time.monotonic() - t0:6.1f}s sidecar serving", flush=True)
        assert proc.stdin is not None and proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            print(f"{time.monotonic() - t0:6.1f}s {line}", flush=True)
            word, _, rest = line.partition(" ")
            if line == "READY?":
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif word == "BLACKHOLE":
                if rest in ("READING?", "IDLE?"):
                    print(f"  dropped the connection from port(s) {black_hole(port)}", flush=True)
                elif rest == "CONNECT?":
                    iptables("-A", "INPUT", "-p", "tcp", "--dport", str(port), "--syn", "-j", "DROP")
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif word in ("COPIED", "INFLIGHT", "FRESH", "DEADCONN", "CONNECT"):
                results[word] = rest
        results["exit"] = str(proc.wait(timeout=120))
    finally:
        if proc.poll() is None:
            proc.kill()
        sidecar.stop()
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
