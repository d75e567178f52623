"""Synthetic Kafka segments for benchmarks: real v2 record batches (the project's Kafka
library builds them) with JSON-like values, as an order/event topic would carry."""

from __future__ import annotations

import os
import random

from rsm_sidecar.kafka.batch import Compression
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch

WORDS = [
    b"order",
    b"created",
    b"shipped",
    b"eu-west-1",
    b"customer",
    b"item",
    b"price",
    b"EUR",
    b"USD",
    b"warehouse",
    b"priority",
    b"standard",
    b"express",
    b"status",
    b"pending",
    b"delivered",
]


def value(rng: random.Random, size: int) -> bytes:
    parts = []
    while sum(map(len, parts)) < size:
        parts.append(b'"%s":"%s%d",' % (rng.choice(WORDS), rng.choice(WORDS), rng.randrange(10**6)))
    return (b"{" + b"".join(parts))[: size - 1] + b"}"


def batches(
    total_bytes: int,
    *,
    records_per_batch: int = 100,
    value_size: int = 300,
    compressed_share: float = 0.0,
    codec: Compression = Compression.LZ4,
    seed: int = 1,
):
    """Yield batches until ``total_bytes``; a ``compressed_share`` of the batches (by
    count) is producer-compressed with ``codec``."""
    rng = random.Random(seed)
    offset = 0
    written = 0
    ts = 1_700_000_000_000
    while written < total_bytes:
        recs = [
            SimpleRecord(b"key-%d" % rng.randrange(10**5), value(rng, value_size), ts + i)
            for i in range(records_per_batch)
        ]
        comp = codec if rng.random() < compressed_share else Compression.NONE
        b = build_batch(recs, base_offset=offset, compression=comp)
        offset += records_per_batch
        ts += records_per_batch
        written += len(b)
        yield b


def write_segment(path: str, total_bytes: int, **kw) -> int:
    """Write a segment file of about ``total_bytes`` (a template of 8 MiB of distinct
    batches repeated, so that building it stays fast); returns its size."""
    template = b"".join(batches(min(total_bytes, 8 * 1024 * 1024), **kw))
    with open(path, "wb") as f:
        n = 0
        while n < total_bytes:
            f.write(template)
            n += len(template)
    return os.path.getsize(path)
