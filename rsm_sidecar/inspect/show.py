"""`inspect show`: one segment's manifest, its objects and chunk-index statistics."""

from __future__ import annotations

import base64
import json
import statistics
from typing import Any

from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.chunk_index import ChunkIndex, FixedChunkIndex, VariableChunkIndex, encode_sizes
from rsm_sidecar.inspect import manifests
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.output import fmt_ratio, human_bytes, iso_ms, ratio
from rsm_sidecar.inspect.summary import summarize
from rsm_sidecar.segment.listing import StoredSegment


def chunk_index_stats(index: ChunkIndex) -> dict[str, Any]:
    """Chunk count, stored chunk sizes (min/median/max), the size of the encoded index
    (variable indexes: the zstd-compressed binary list, per chunk) and the ratio."""
    sizes: list[int]
    if isinstance(index, FixedChunkIndex):
        # all but the last chunk have one size (and a fixed index may claim billions of them):
        # at most two of those and the last give the same min, median and max
        n = index.chunk_count
        sizes = (
            [index.transformed_chunk_size] * min(n - 1, 2) + [index.final_transformed_chunk_size] if n else []
        )
    else:
        sizes = list(index.transformed_sizes_iter())
    stats: dict[str, Any] = {
        "type": index.kind,
        "chunks": index.chunk_count,
        "original_chunk_size": index.original_chunk_size,
        "original_bytes": index.original_file_size,
        "stored_bytes": index.transformed_file_size,
        "stored_chunk_min": min(sizes) if sizes else None,
        "stored_chunk_median": statistics.median(sizes) if sizes else None,
        "stored_chunk_max": max(sizes) if sizes else None,
        "compression_ratio": ratio(index.original_file_size, index.transformed_file_size),
    }
    if isinstance(index, VariableChunkIndex):
        encoded = len(base64.b64decode(index.to_json()["transformedChunks"]))
        raw = len(encode_sizes(index.transformed_sizes))
        stats.update(
            encoded_index_bytes=encoded,
            binary_index_bytes=raw,
            encoded_bytes_per_chunk=round(encoded / index.chunk_count, 3) if index.chunk_count else None,
        )
    else:
        stats.update(encoded_index_bytes=0, binary_index_bytes=0, encoded_bytes_per_chunk=0)
    return stats


def run(ctx: InspectContext, seg: StoredSegment) -> dict[str, Any]:
    raw, manifest = manifests.read_manifest(ctx.store, seg.base)
    summary = summarize(seg, manifest)
    return {
        "segment": summary.to_json(),
        "objects": {
            s: (
                {"key": o.key, "size": o.size, "last_modified": o.last_modified.isoformat()}
                if (o := seg.objects.get(s))
                else None
            )
            for s in fkeys.SUFFIXES
        },
        "manifest_verified": manifest.verified_digest,
        "chunk_index": chunk_index_stats(manifest.chunk_index),
        "manifest": json.loads(raw),
    }


def print_text(doc: dict[str, Any]) -> None:
    s, ci = doc["segment"], doc["chunk_index"]
    print(f"segment       {s['topic']}-{s['partition']}  offsets {s['start_offset']}..{s['end_offset']}")
    print(f"segment id    {s['segment_id']}  (topic id {s['topic_id']})")
    print(
        f"max timestamp {iso_ms(s['max_timestamp_ms']) or '-'}  "
        f"(copied {iso_ms(s['event_timestamp_ms']) or '-'} "
        f"by broker {s['broker_id'] if s['broker_id'] is not None else '-'})"
    )
    print(f"encryption    {('key id ' + s['key_id']) if s['key_id'] else 'none'}")
    print(
        f"compression   {'zstd' if s['compression'] else 'none'}  (writer {s['writer'] or 'unknown'}, "
        f"manifest digest {'verified' if doc['manifest_verified'] else 'absent'})"
    )
    print("objects")
    for suffix, o in doc["objects"].items():
        print(
            f"  .{suffix:<13}{human_bytes(o['size']):>12}  {o['key']}"
            if o
            else f"  .{suffix:<13}{'MISSING':>12}"
        )
    print("chunk index")
    print(f"  type {ci['type']}, {ci['chunks']} chunks of {human_bytes(ci['original_chunk_size'])} original")
    if ci["chunks"]:
        print(
            f"  stored chunk size min {human_bytes(ci['stored_chunk_min'])}, median "
            f"{human_bytes(ci['stored_chunk_median'])}, max {human_bytes(ci['stored_chunk_max'])}"
        )
    print(
        f"  {human_bytes(ci['original_bytes'])} original -> {human_bytes(ci['stored_bytes'])} stored "
        f"({fmt_ratio(ci['compression_ratio'])})"
    )
    if ci["type"] == "variable":
        print(
            f"  encoded index {ci['encoded_index_bytes']} bytes ({ci['binary_index_bytes']} before zstd), "
            f"{ci['encoded_bytes_per_chunk']} bytes per chunk"
        )
    print("manifest")
    print(json.dumps(doc["manifest"], indent=2))
