"""`inspect dump`: the record batches and records of a stored segment, decoded.

Bytes stream through :class:`~rsm_sidecar.segment.log_file.StoredLogFile` into the Kafka
log library, one batch at a time. ``--from-offset`` starts at the offset index's entry for
that offset (as a broker fetch does) and skips what lies before it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, TextIO

from rsm_sidecar.errors import DataLoss
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.decoders import Decoder, plain, render_text
from rsm_sidecar.inspect.output import iso_ms
from rsm_sidecar.kafka import RecordBatch, read_batches
from rsm_sidecar.kafka.batch import TimestampType
from rsm_sidecar.segment.listing import StoredSegment
from rsm_sidecar.segment.log_file import StoredLogFile, offset_position
from rsm_sidecar.segment.reader import OpenSegment


@dataclasses.dataclass
class DumpStats:
    batches: int = 0
    records: int = 0
    start_position: int = 0
    limited: bool = False


def start_position(
    ctx: InspectContext, opened: OpenSegment, base_offset: int, from_offset: int | None
) -> int:
    """Where to start reading for ``from_offset``: the offset index's floor entry, or 0
    when there is none (or the index is unreadable: then the whole segment is scanned)."""
    if from_offset is None:
        return 0
    try:
        return offset_position(ctx.reader, opened, base_offset, from_offset)
    except DataLoss:
        return 0


def batch_header_json(batch: RecordBatch) -> dict[str, Any]:
    h = batch.header
    return {
        "base_offset": h.base_offset,
        "last_offset": h.last_offset,
        "position": h.position,
        "size": h.size_in_bytes,
        "count": h.record_count,
        "compression": h.compression.name.lower(),
        "timestamp_type": "LogAppendTime"
        if h.timestamp_type is TimestampType.LOG_APPEND_TIME
        else "CreateTime",
        "base_timestamp": h.base_timestamp,
        "max_timestamp": h.max_timestamp,
        "max_time": iso_ms(h.max_timestamp),
        "partition_leader_epoch": h.partition_leader_epoch,
        "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch,
        "base_sequence": h.base_sequence,
        "transactional": h.is_transactional,
        "control": h.is_control,
        "crc": f"0x{h.crc:08x}",
    }


def records_json(
    batch: RecordBatch, topic: str, decoder: Decoder, max_bytes: int
) -> Iterator[dict[str, Any]]:
    if batch.header.is_control:
        for c in batch.control_records():
            ctype = c.control_type
            yield {
                "offset": c.offset,
                "timestamp": c.timestamp,
                "time": iso_ms(c.timestamp),
                "control": ctype.name if ctype is not None else f"UNKNOWN({c.type_id})",
                "key_version": c.key_version,
                "coordinator_epoch": c.coordinator_epoch,
            }
        return
    for r in batch.records():
        yield {
            "offset": r.offset,
            "timestamp": r.timestamp,
            "time": iso_ms(r.timestamp),
            "key": decoder.decode(topic, True, r.key),
            "value": decoder.decode(topic, False, r.value),
            "headers": [{"key": hd.key, "value": plain(hd.value, max_bytes)} for hd in r.headers],
            "sequence": r.sequence,
        }


def run(
    ctx: InspectContext,
    seg: StoredSegment,
    decoder: Decoder,
    *,
    from_offset: int | None = None,
    limit: int | None = None,
    max_bytes: int = 0,
    stats: DumpStats | None = None,
) -> Iterator[dict[str, Any]]:
    """Batches (header fields plus ``records``) from ``from_offset``, at most ``limit``
    records in all. ``stats`` is filled as the iteration proceeds."""
    stats = stats if stats is not None else DumpStats()
    opened = ctx.reader.open_base(seg.base, seg.describe)
    pos = start_position(ctx, opened, seg.start_offset, from_offset)
    stats.start_position = pos
    with StoredLogFile(ctx.reader, opened) as f:
        for batch in read_batches(f, start_position=pos, name=f.name):
            if from_offset is not None and batch.header.last_offset < from_offset:
                continue
            records = []
            for rec in records_json(batch, seg.topic, decoder, max_bytes):
                if from_offset is not None and rec["offset"] < from_offset:
                    continue
                if limit is not None and stats.records >= limit:
                    stats.limited = True  # there is more than --limit shows
                    break
                records.append(rec)
                stats.records += 1
            if records or not stats.limited:
                doc = batch_header_json(batch)
                doc["records"] = records
                stats.batches += 1
                yield doc
            if stats.limited:
                return


def print_batch(doc: dict[str, Any], out: TextIO) -> None:
    flags = [doc["compression"], doc["timestamp_type"]]
    if doc["transactional"]:
        flags.append("transactional")
    if doc["control"]:
        flags.append("control")
    print(
        f"batch {doc['base_offset']}..{doc['last_offset']} position {doc['position']} size {doc['size']} "
        f"records {doc['count']} {' '.join(flags)} maxTime {doc['max_time'] or doc['max_timestamp']} "
        f"leaderEpoch {doc['partition_leader_epoch']} producer {doc['producer_id']}/{doc['producer_epoch']} "
        f"baseSequence {doc['base_sequence']} crc {doc['crc']}",
        file=out,
    )
    for r in doc["records"]:
        when = f"{r['time'] or '-'} ({r['timestamp']})"
        if "control" in r:
            print(
                f"  | offset {r['offset']} {when} {r['control']} coordinatorEpoch {r['coordinator_epoch']}",
                file=out,
            )
            continue
        headers = ""
        if r["headers"]:
            headers = (
                " headers [" + ", ".join(f"{h['key']}={render_text(h['value'])}" for h in r["headers"]) + "]"
            )
        print(
            f"  | offset {r['offset']} {when} key {render_text(r['key'])} value {render_text(r['value'])}"
            f"{headers}",
            file=out,
        )
