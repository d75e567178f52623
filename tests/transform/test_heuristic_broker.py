"""The compression heuristic's decision on segments a real broker wrote.

The rule (docs/design.md "Compression heuristic", after Aiven's design: "double compression of
Kafka-compressed log segments should be avoided"): the copier skips zstd when at least half of
the record-batch bytes of the segment's first chunk are producer-compressed. Here a real broker
writes segments with each producer compression and segments that mix compressed and plain
batches; the copier, with the heuristic on (the default), copies each rolled segment from the
broker's own files, and the test reads back what it stored: the manifest's ``compression`` member
(the raw JSON object in the store), the stored ``.log`` size (smaller than the original exactly
when zstd ran: the data compresses), and every byte of the segment.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import os
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from rsm_sidecar.format.keys import MANIFEST, KeyLayout, SegmentMetadata
from rsm_sidecar.kafka import read_batches
from rsm_sidecar.kafka.batch import Compression
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.reader import SegmentReader
from rsm_sidecar.segment.settings import CopySettings, ReaderSettings
from rsm_sidecar.segment.sources import PathSource
from rsm_sidecar.storage.local import LocalObjectStore

pytestmark = pytest.mark.e2e

SEGMENT_BYTES = 1024 * 1024  # the smallest topic segment.bytes Kafka accepts: the broker rolls at 1 MiB
RECORDS_PER_BATCH = 20
SETTINGS = CopySettings()  # the defaults: zstd on, heuristic on, 4 MiB chunks
POOL = concurrent.futures.ThreadPoolExecutor(2)


def kafka_uuid() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def value(i: int) -> bytes:
    """About 520 bytes that compress about 2:1 (hex of random bytes), so that a producer keeps
    its compressed batches and zstd shrinks plain ones."""
    return b'{"id": %d, "blob": "%s"}' % (i, os.urandom(250).hex().encode())


def create_topic(broker, topic: str) -> Path:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1, config={"segment.bytes": str(SEGMENT_BYTES)})])[topic].result(
        30
    )
    return broker.partition_dir(topic)


def producer(broker, codec: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "compression.type": codec,
            "linger.ms": 1000,  # batches end at the flush below
            "batch.num.messages": RECORDS_PER_BATCH,
        }
    )


def produce_batches(topic: str, plan: list[Producer], records: int = RECORDS_PER_BATCH) -> None:
    """One batch per entry of ``plan``, in order, each from that producer."""
    for n, p in enumerate(plan):
        for i in range(records):
            p.produce(topic, value=value(n * records + i))
        assert p.flush(30) == 0


def first_rolled_segment(partition_dir: Path) -> Path:
    logs = sorted(partition_dir.glob("*.log"))
    assert len(logs) >= 2, f"the broker has not rolled {partition_dir.name} yet: {logs}"
    return logs[0]


def batch_bytes_by_codec(log: Path) -> tuple[list[Compression], dict[Compression, int]]:
    codecs, sizes = [], {}
    for batch in read_batches(log):
        codec = batch.header.compression
        codecs.append(codec)
        sizes[codec] = sizes.get(codec, 0) + batch.header.size_in_bytes
    return codecs, sizes


def copy_and_read_back(tmp_path: Path, topic: str, log: Path) -> tuple[dict, int]:
    """Copy the broker's segment files (path mode) with the default settings; return the
    manifest JSON read back from the store and the stored .log size, after checking that every
    byte reads back."""
    directory = log.parent
    base = log.name.removesuffix(".log")
    batches = list(read_batches(log))
    next_base = batches[-1].header.last_offset + 1
    paths = {
        "log": str(log),
        "offset": str(directory / f"{base}.index"),
        "timestamp": str(directory / f"{base}.timeindex"),
        "producerSnapshot": str(directory / f"{next_base:020d}.snapshot"),
        "transaction": None,
    }
    size = log.stat().st_size
    assert size <= SETTINGS.chunk_size  # the whole segment is the heuristic's first chunk
    md = SegmentMetadata(kafka_uuid(), topic, 0, kafka_uuid(), int(base), next_base - 1, segment_size=size)
    store = LocalObjectStore(tmp_path / "store", fsync=False)
    layout = KeyLayout("heuristic/")
    copier = SegmentCopier(store, layout, None, SETTINGS, POOL)
    source = PathSource(paths, md.describe, [str(directory)], 64 * 1024 * 1024)
    leader_epochs = (directory / "leader-epoch-checkpoint").read_bytes()
    result = copier.copy(md, source, leader_epochs)

    manifest = json.loads(store.get(layout.key(md, MANIFEST)))
    reader = SegmentReader(store, layout, None, ReaderSettings(prefetch_bytes=0))
    assert b"".join(reader.read(reader.open(md), 0, size - 1)) == log.read_bytes()
    assert result.manifest.compression == manifest["compression"]
    return manifest, result.manifest.stored_log_size


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_a_segment_is_zstd_compressed_only_when_the_producer_did_not_compress_it(
    kafka_broker, tmp_path, codec
):
    topic = f"heuristic-{codec}"
    partition_dir = create_topic(kafka_broker, topic)
    p = producer(kafka_broker, codec)
    while len(list(partition_dir.glob("*.log"))) < 2:
        produce_batches(topic, [p] * 20)
    log = first_rolled_segment(partition_dir)
    codecs, _ = batch_bytes_by_codec(log)
    assert set(codecs) == {Compression[codec.upper()]}, "the broker kept the producer's batches"

    manifest, stored = copy_and_read_back(tmp_path, topic, log)

    producer_compressed = codec != "none"
    assert manifest["compression"] is not producer_compressed
    if producer_compressed:
        assert stored == log.stat().st_size  # stored as is (no encryption here)
    else:
        assert stored < 0.7 * log.stat().st_size  # zstd ran on the plain batches


@pytest.mark.parametrize(
    ("name", "plan", "compress"),
    [
        # the first batch is plain (a first-batch rule would compress); most bytes are lz4: skip zstd
        ("mostly-lz4", ["none"] + ["lz4"] * 4, False),
        # the first batch is lz4 (a first-batch rule, Aiven's, would skip); most bytes are plain: zstd
        ("mostly-plain", ["lz4"] + ["none"] * 3, True),
    ],
)
def test_a_mixed_segment_is_decided_by_the_share_of_compressed_bytes(
    kafka_broker, tmp_path, name, plan, compress
):
    topic = f"heuristic-mixed-{name}"
    partition_dir = create_topic(kafka_broker, topic)
    producers = {codec: producer(kafka_broker, codec) for codec in set(plan)}
    while len(list(partition_dir.glob("*.log"))) < 2:
        produce_batches(topic, [producers[c] for c in plan])
    log = first_rolled_segment(partition_dir)
    codecs, sizes = batch_bytes_by_codec(log)
    assert codecs[0] == Compression[plan[0].upper()] and set(codecs) == {Compression.NONE, Compression.LZ4}
    compressed_share = sizes[Compression.LZ4] / sum(sizes.values())
    # the segments are built to sit clearly on one side of the 50% line
    assert (compressed_share < 0.4) if compress else (compressed_share > 0.6), compressed_share

    manifest, stored = copy_and_read_back(tmp_path, topic, log)

    assert manifest["compression"] is compress
    if compress:
        assert stored < log.stat().st_size
    else:
        assert stored == log.stat().st_size
