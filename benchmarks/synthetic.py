"""Synthetic Kafka segments for benchmarks: real v2 record batches (the project's Kafka
library builds them) with JSON-like values, as an order/event topic would carry."""

from __future__ import annotations

import argparse
import os
import random
import tempfile

from rsm_sidecar.kafka.batch import Compression
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
from rsm_sidecar.transform.keyring import write_key_pair

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


def segment_in_new_dir(prefix: str, total_bytes: int) -> tuple[str, str, int]:
    """A new temporary directory named ``prefix...`` holding ``segment.log``, a segment of about
    ``total_bytes`` (:func:`write_segment`): the directory, the segment's path and its size."""
    work = tempfile.mkdtemp(prefix=prefix)
    path = os.path.join(work, "segment.log")
    return work, path, write_segment(path, total_bytes)


def add_segment_options(ap: argparse.ArgumentParser, size_mib: int) -> None:
    """A benchmark's ``--size-mib`` (the synthetic segment's size, default ``size_mib``) and
    ``--chunk-mib`` (the sidecar's chunk size, default 4): :func:`segment_of_options` reads them."""
    ap.add_argument("--size-mib", type=int, default=size_mib)
    ap.add_argument("--chunk-mib", type=int, default=4)


def segment_of_options(prefix: str, args: argparse.Namespace) -> tuple[str, str, int, int]:
    """The segment of :func:`add_segment_options`' ``--size-mib`` in a new directory named
    ``prefix...`` (:func:`segment_in_new_dir`): the directory, the segment's path, its size and
    the chunk size in bytes."""
    work, path, size = segment_in_new_dir(prefix, args.size_mib * 1024 * 1024)
    return work, path, size, args.chunk_mib * 1024 * 1024


def encryption_key(work: str) -> dict[str, dict[str, str]]:
    """A new key pair ``k`` in ``work`` (``k.pub``, ``k.priv``): the ``[encryption.keys]`` of a
    sidecar that encrypts with it."""
    public, private = os.path.join(work, "k.pub"), os.path.join(work, "k.priv")
    write_key_pair(public, private, 2048)
    return {"k": {"public_key_file": public, "private_key_file": private}}


def encryption_toml(work: object, key_id: str = "k") -> str:
    """The ``[encryption]`` of a sidecar that encrypts with the key pair ``<work>/k.pub``,
    ``<work>/k.priv`` (:func:`encryption_key` writes one), named ``key_id``."""
    return f"""[encryption]
enabled = true
active_key_id = "{key_id}"
[encryption.keys.{key_id}]
public_key_file = "{work}/k.pub"
private_key_file = "{work}/k.priv"
"""
