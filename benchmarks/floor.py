"""The floor of a remote read on this machine: what the sidecar must spend per MiB served, measured
in the same run as the read it is compared with (this machine is shared and its speed varies).

    .venv/bin/python -m benchmarks.floor [--mib 64] [--payload FILE]

The same kind of bytes as a tiered segment of the benchmark's records (``--payload``: the record
values, one per line; by default ``benchmarks.synthetic`` lines) in Kafka record batches of 80
records (what a producer's 16 KiB batches hold), cut into 4 MiB chunks, compressed with zstd
(level 3, as the sidecar stores them) and encrypted with AES-256-GCM, are then, on one thread: decrypted,
decompressed (python-zstandard, the library the sidecar uses) and written to a TLS socket (Python's
``ssl``, OpenSSL) read by another process. Printed: milliseconds of that thread's CPU per MiB of
original bytes, for each step and in all. A sidecar that costs this much per MiB served spends
nothing but the work itself: no interpreter per message, no framework, no copy beyond the socket's.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import zstandard
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devstack.tls import TestCA

MiB = 1024 * 1024
CHUNK = 4 * MiB
#: records per batch: what a producer's default 16 KiB batches hold of 200-byte values
RECORDS_PER_BATCH = 80


@dataclass
class Floor:
    decrypt_ms_per_mib: float
    decompress_ms_per_mib: float
    tls_send_ms_per_mib: float

    @property
    def total_ms_per_mib(self) -> float:
        return self.decrypt_ms_per_mib + self.decompress_ms_per_mib + self.tls_send_ms_per_mib

    def line(self) -> str:
        return (
            f"floor on one core: {self.total_ms_per_mib:.2f} ms per MiB (AES-GCM decryption "
            f"{self.decrypt_ms_per_mib:.2f}, zstd decompression {self.decompress_ms_per_mib:.2f}, "
            f"TLS send {self.tls_send_ms_per_mib:.2f})"
        )


def _chunks(payload: bytes, mib: int) -> list[bytes]:
    """``mib`` MiB of a segment's bytes: the payload's lines as the values of records in batches
    of ``RECORDS_PER_BATCH``, in 4 MiB chunks."""
    from rsm_sidecar.kafka.builder import SimpleRecord, build_batch

    lines = payload.split(b"\n")
    log = bytearray()
    offset = 0
    while len(log) < max(1, mib) * MiB:
        recs = [
            SimpleRecord(None, lines[(offset + i) % len(lines)], 1_700_000_000_000)
            for i in range(RECORDS_PER_BATCH)
        ]
        log += build_batch(recs, base_offset=offset)
        offset += RECORDS_PER_BATCH
    return [bytes(log[i : i + CHUNK]) for i in range(0, len(log) - CHUNK + 1, CHUNK)]


def _receiver(sock: socket.socket, ctx: ssl.SSLContext) -> None:
    conn, _ = sock.accept()
    tls = ctx.wrap_socket(conn, server_side=True)
    buf = bytearray(1 << 20)
    while tls.recv_into(buf):
        pass
    os._exit(0)


def measure(payload: bytes, mib: int = 64) -> Floor:
    chunks = _chunks(payload, mib)
    zc = zstandard.ZstdCompressor(level=3, write_content_size=True)
    aes = AESGCM(AESGCM.generate_key(256))
    stored = []
    for c in chunks:
        iv = os.urandom(12)
        stored.append((iv, aes.encrypt(iv, zc.compress(c), b"segment")))
    ca = TestCA("floor")
    issued = ca.issue("localhost", dns=["localhost"])
    with tempfile.TemporaryDirectory() as d:
        cert, key = Path(d, "c.pem"), Path(d, "k.pem")
        cert.write_bytes(issued.cert_pem)
        key.write_bytes(issued.key_pem)
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(cert, key)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        pid = os.fork()
        if pid == 0:
            _receiver(listener, server_ctx)
        client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client_ctx.load_verify_locations(cadata=ca.cert_pem.decode())
        tls = client_ctx.wrap_socket(
            socket.create_connection(listener.getsockname()), server_hostname="localhost"
        )
        d = zstandard.ZstdDecompressor()
        t_dec = t_zstd = t_tls = 0.0
        for iv, ct in stored:
            t0 = time.thread_time()
            frame = aes.decrypt(iv, ct, b"segment")
            t1 = time.thread_time()
            data = d.decompress(frame, max_output_size=CHUNK)
            t2 = time.thread_time()
            tls.sendall(data)
            t3 = time.thread_time()
            t_dec, t_zstd, t_tls = t_dec + t1 - t0, t_zstd + t2 - t1, t_tls + t3 - t2
        tls.close()
        os.waitpid(pid, 0)
        listener.close()
    n = len(chunks) * CHUNK / MiB
    return Floor(1000 * t_dec / n, 1000 * t_zstd / n, 1000 * t_tls / n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--payload", type=Path)
    args = ap.parse_args()
    if args.payload:
        payload = args.payload.read_bytes()
    else:
        import random

        from benchmarks.synthetic import value

        rng = random.Random(405)
        payload = b"\n".join(value(rng, 200) for _ in range(10_000))
    print(measure(payload, args.mib).line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
