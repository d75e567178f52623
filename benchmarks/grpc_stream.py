"""What Python's gRPC server costs per byte it streams: the wire part of the sidecar's fetch path
(``FetchSegment`` sends a range as messages of at most 1 MiB), apart from reading and decoding.

    .venv/bin/python benchmarks/grpc_stream.py [--mib 512] [--streams 1,12] [--message-kib 256,1024,4096]
        [--raw-tls] [--aio]

A server process (grpcio, a thread pool as the sidecar's) streams ``--mib`` MiB of random bytes,
in messages of each ``--message-kib`` size, to a client process over loopback TCP, plaintext and
with TLS (a certificate from devstack's throwaway test CA), over 1 and 12 concurrent streams (12: the
partitions of one consumer fetch read at once). Printed per case: MiB/s and the server's CPU
milliseconds per MiB sent (``/proc/<pid>/stat``), next to the raw cost of the work TLS adds
(AES-256-GCM encryption of the same bytes, one core) measured in the same run. The client runs on
the same cores: compare the server's CPU per MiB, not the MiB/s.

``--raw-tls`` adds the floor under any TLS data plane written in Python: the same bytes sent by a
server process over plain TLS sockets (Python's ``ssl``, OpenSSL; one connection and thread per
stream, ``sendall`` of one message-sized buffer at a time, no framing), so the gRPC rows can be
read against what TLS itself costs from Python. ``--aio`` adds each gRPC row again with the server
on ``grpc.aio`` (one asyncio loop instead of the thread pool the sidecar uses).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devstack.tls import TestCA

MiB = 1024 * 1024
METHOD = "/bench.Stream/Send"


def write_certificate(directory: Path) -> None:
    """``ca.pem``, and ``cert.pem`` / ``key.pem`` for ``localhost`` signed by it (devstack's test CA)."""
    ca = TestCA("grpc-stream-bench")
    issued = ca.issue("localhost", dns=["localhost"])
    (directory / "ca.pem").write_bytes(ca.cert_pem)
    (directory / "cert.pem").write_bytes(issued.cert_pem)
    (directory / "key.pem").write_bytes(issued.key_pem)


def add_port(server: grpc.Server | grpc.aio.Server, tls_dir: str | None) -> int:
    """A loopback port the kernel picks on ``server`` (returned: the server holds it from now on),
    with TLS from ``write_certificate``'s files if ``tls_dir``."""
    if tls_dir:
        d = Path(tls_dir)
        key_and_cert = ((d / "key.pem").read_bytes(), (d / "cert.pem").read_bytes())
        return server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([key_and_cert]))
    return server.add_insecure_port("127.0.0.1:0")


def serve(tls_dir: str | None, message_bytes: int) -> None:
    """The server process: answers a request naming a byte count with that many bytes in messages."""
    payload = os.urandom(message_bytes)

    def send(request: bytes, context: grpc.ServicerContext):
        for _ in range(int(request) // message_bytes):
            yield payload

    handler = grpc.method_handlers_generic_handler(
        "bench.Stream", {"Send": grpc.unary_stream_rpc_method_handler(send, lambda b: b, lambda b: b)}
    )
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=32),
        options=[("grpc.max_send_message_length", 64 * MiB)],
    )
    server.add_generic_rpc_handlers((handler,))
    port = add_port(server, tls_dir)
    server.start()
    print(f"ready {port}", flush=True)
    sys.stdin.read()  # until the parent closes it
    server.stop(0)


def serve_aio(tls_dir: str | None, message_bytes: int) -> None:
    """The ``--aio`` server process: ``serve`` on ``grpc.aio`` (one asyncio loop, no thread pool)."""
    import asyncio

    payload = os.urandom(message_bytes)

    async def send(request: bytes, context: grpc.aio.ServicerContext):
        for _ in range(int(request) // message_bytes):
            yield payload

    async def run() -> None:
        handler = grpc.method_handlers_generic_handler(
            "bench.Stream", {"Send": grpc.unary_stream_rpc_method_handler(send, lambda b: b, lambda b: b)}
        )
        server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 * MiB)])
        server.add_generic_rpc_handlers((handler,))
        port = add_port(server, tls_dir)
        await server.start()
        print(f"ready {port}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop(0)

    asyncio.run(run())


def serve_raw_tls(tls_dir: str, message_bytes: int) -> None:
    """The ``--raw-tls`` server process: each connection sends a byte count, gets that many bytes."""
    import socket
    import ssl
    import threading

    payload = os.urandom(message_bytes)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(Path(tls_dir) / "cert.pem", Path(tls_dir) / "key.pem")

    def answer(conn: socket.socket) -> None:
        with context.wrap_socket(conn, server_side=True) as tls, tls.makefile("rb") as request:
            for _ in range(int(request.readline()) // message_bytes):
                tls.sendall(payload)

    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=lambda: [sys.stdin.read(), os._exit(0)], daemon=True).start()
    print(f"ready {listener.getsockname()[1]}", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=answer, args=(conn,), daemon=True).start()


def raw_tls_case(tls_dir: str, message_bytes: int, streams: int, total: int) -> tuple[float, float]:
    """As ``one_case``, over ``--raw-tls``'s plain TLS sockets."""
    import socket
    import ssl

    argv = [sys.executable, __file__, "--serve-raw-tls", str(message_bytes), tls_dir]
    with server_process(argv) as (server, port):
        context = ssl.create_default_context(cafile=str(Path(tls_dir) / "ca.pem"))
        per_stream = total // streams

        def read_one(_: int) -> int:
            with socket.create_connection(("127.0.0.1", port)) as raw:
                with context.wrap_socket(raw, server_hostname="localhost") as tls:
                    tls.sendall(f"{per_stream}\n".encode())
                    buf, got = bytearray(MiB), 0
                    while n := tls.recv_into(buf):
                        got += n
                    return got

        return timed_streams(
            server.pid, streams, read_one, (per_stream // message_bytes) * message_bytes * streams
        )


@contextlib.contextmanager
def server_process(argv: list[str]) -> Iterator[tuple[subprocess.Popen, int]]:
    """A server process of this script and its port, once it printed ``ready <port>`` (it bound a
    port the kernel picked, and holds it); stopped by closing its stdin."""
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready = server.stdout.readline().split() if server.stdout is not None else []
        if len(ready) != 2 or ready[0] != "ready":
            raise RuntimeError("the server did not start")
        yield server, int(ready[1])
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(30)


def timed_streams(
    server_pid: int, streams: int, read_one: Callable[[int], int], expected: int
) -> tuple[float, float]:
    """(MiB/s, server CPU ms per MiB) of ``streams`` concurrent ``read_one`` calls, which must
    receive ``expected`` bytes in all."""
    cpu0, t0 = cpu_seconds(server_pid), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        received = sum(pool.map(read_one, range(streams)))
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds(server_pid) - cpu0
    if received != expected:
        raise RuntimeError(f"received {received} bytes, expected {expected}")
    return received / MiB / elapsed, 1000 * cpu / (received / MiB)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_case(
    tls_dir: str | None, message_bytes: int, streams: int, total: int, serve_flag: str = "--serve"
) -> tuple[float, float]:
    """(MiB/s, server CPU ms per MiB) of ``total`` bytes over ``streams`` concurrent calls."""
    argv = [sys.executable, __file__, serve_flag, str(message_bytes)] + ([tls_dir] if tls_dir else [])
    with server_process(argv) as (server, port):
        options = [("grpc.max_receive_message_length", 64 * MiB)]
        if tls_dir:
            creds = grpc.ssl_channel_credentials((Path(tls_dir) / "ca.pem").read_bytes())
            channel = grpc.secure_channel(f"localhost:{port}", creds, options)
        else:
            channel = grpc.insecure_channel(f"127.0.0.1:{port}", options)
        call = channel.unary_stream(METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        per_stream = total // streams

        def read_one(_: int) -> int:
            return sum(len(m) for m in call(str(per_stream).encode()))

        try:
            return timed_streams(
                server.pid, streams, read_one, (per_stream // message_bytes) * message_bytes * streams
            )
        finally:
            channel.close()


def aes_gcm_ms_per_mib(total: int) -> float:
    aead, nonce, data = AESGCM(os.urandom(32)), os.urandom(12), os.urandom(MiB)
    t0 = time.perf_counter()
    for _ in range(total // MiB):
        aead.encrypt(nonce, data, None)
    return 1000 * (time.perf_counter() - t0) / (total // MiB)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--serve":
        serve(argv[2] if len(argv) > 2 else None, int(argv[1]))
        return 0
    if argv and argv[0] == "--serve-aio":
        serve_aio(argv[2] if len(argv) > 2 else None, int(argv[1]))
        return 0
    if argv and argv[0] == "--serve-raw-tls":
        serve_raw_tls(argv[2], int(argv[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=512, help="MiB streamed per case")
    ap.add_argument("--streams", default="1,12")
    ap.add_argument("--message-kib", default="256,1024,4096")
    ap.add_argument("--raw-tls", action="store_true", help="also plain TLS sockets from Python (no gRPC)")
    ap.add_argument("--aio", action="store_true", help="also the server on grpc.aio (asyncio), not threads")
    args = ap.parse_args(argv)
    total = args.mib * MiB
    print(f"raw AES-256-GCM encryption, one core: {aes_gcm_ms_per_mib(total):.2f} ms per MiB")
    print()
    print("| transport | message | streams | MiB/s | server CPU ms per MiB |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="grpc-stream-") as tmp:
        write_certificate(Path(tmp))
        for tls_dir in (None, tmp):
            for kib in (int(k) for k in args.message_kib.split(",")):
                for streams in (int(s) for s in args.streams.split(",")):
                    rate, ms = one_case(tls_dir, kib * 1024, streams, total)
                    name = "TLS" if tls_dir else "plaintext"
                    print(f"| {name} | {kib} KiB | {streams} | {rate:.0f} | {ms:.2f} |", flush=True)
                    if args.aio:
                        rate, ms = one_case(tls_dir, kib * 1024, streams, total, "--serve-aio")
                        row = f"| {name}, grpc.aio | {kib} KiB | {streams} | {rate:.0f} | {ms:.2f} |"
                        print(row, flush=True)
        if args.raw_tls:
            for kib in (int(k) for k in args.message_kib.split(",")):
                for streams in (int(s) for s in args.streams.split(",")):
                    rate, ms = raw_tls_case(tmp, kib * 1024, streams, total)
                    row = f"| TLS socket, no gRPC | {kib} KiB | {streams} | {rate:.0f} | {ms:.2f} |"
                    print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
