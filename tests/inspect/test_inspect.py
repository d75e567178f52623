"""`rsm-sidecar inspect` against segments written by the real stack: a broker with the
Java shim and the sidecar on local-directory storage (one stack for the module).

Topics: ``plain`` (producer zstd, keys, null keys, headers, tombstones), ``txn``
(committed and aborted transactions), ``victim`` (segments the tests corrupt, re-key
under a foreign key, orphan and duplicate, each restored afterwards)."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time

import pytest

from devstack.kafka import KafkaDistribution
from rsm_sidecar.config import Config
from rsm_sidecar.format.manifest import EncryptionInfo, SegmentManifest
from rsm_sidecar.transform.keyring import KeyPair, Keyring, generate_key_pair
from tests.e2e.kafka_helpers import (
    SEGMENT_BYTES,
    Rec,
    create_topic,
    filler,
    produce,
    records,
    remote_segments,
    sealed_manifest,
)
from tests.inspect.tiering import (
    field_bytes,
    flip_byte,
    object_path,
    produce_transactions,
    restored,
    segment_bases,
    wait_all_tiered,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def data(stack, store):
    bootstrap = stack.bootstrap_servers
    t0 = int(time.time() * 1000) - 3_600_000
    for topic in ("plain", "txn", "victim"):
        create_topic(bootstrap, topic)
    plain = produce(bootstrap, "plain", records(300, random.Random(1), t0), "zstd")
    filler(bootstrap, "plain")
    committed, aborted = produce_transactions(bootstrap, "txn")
    filler(bootstrap, "txn")
    victim = produce(bootstrap, "victim", records(200, random.Random(2), t0), "lz4")
    filler(bootstrap, "victim", 4 * SEGMENT_BYTES)
    ends = {topic: wait_all_tiered(stack, store, topic) for topic in ("plain", "txn", "victim")}
    assert len(segment_bases(store, "victim")) >= 3
    return {"plain": plain, "committed": committed, "aborted": aborted, "victim": victim, "ends": ends}


def _manifest(store, base: str) -> SegmentManifest:
    return SegmentManifest.from_bytes(store.get(base + ".rsm-manifest"))


# -- ls ------------------------------------------------------------------------------
def test_ls_lists_every_tiered_segment_with_offsets_sizes_and_keys(inspect_cli, store, data):
    doc = inspect_cli("ls", "--json").expect(0).json()
    assert doc["errors"] == []
    by_topic: dict[str, list[dict]] = {}
    for s in doc["segments"]:
        by_topic.setdefault(s["topic"], []).append(s)
    assert {"plain", "txn", "victim"} <= set(by_topic)
    for topic in ("plain", "txn", "victim"):
        segs = by_topic[topic]
        assert [s["base"] for s in segs] == segment_bases(store, topic)
        assert segs[0]["start_offset"] == 0
        for a, b in zip(segs, segs[1:]):
            assert b["start_offset"] == a["end_offset"] + 1, f"{topic}: gap or overlap between {a} and {b}"
        assert segs[-1]["end_offset"] == data["ends"][topic] - 1
        for s in segs:
            m = _manifest(store, s["base"])
            assert s["key_id"] == "demo-key-1" == m.key_id
            assert s["chunks"] == m.chunk_index.chunk_count >= 1
            assert s["original_bytes"] == m.original_size > 0
            assert s["stored_log_bytes"] == m.stored_log_size
            assert s["stored_bytes"] == sum(o.size for o in store.list(s["base"] + "."))
            assert s["max_timestamp_ms"] == m.segment["maxTimestampMs"] > 0
            assert s["compression_ratio"] == pytest.approx(m.original_size / m.stored_log_size, rel=1e-3)
    # filters, and the table for people
    only = inspect_cli("ls", "--json", "--topic", "txn", "--partition", "0").expect(0).json()
    assert [s["base"] for s in only["segments"]] == [s["base"] for s in by_topic["txn"]]
    assert (
        inspect_cli("ls", "--json", "--topic", "txn", "--partition", "1").expect(0).json()["segments"] == []
    )
    text = inspect_cli("ls", "--topic", "plain").expect(0).stdout
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["TOPIC", "PART", "START", "END"]
    assert len(lines) == 1 + len(by_topic["plain"]) + 1
    assert all(s["segment_id"] in text for s in by_topic["plain"])


# -- show ----------------------------------------------------------------------------
def test_show_by_uuid_object_key_and_offset(inspect_cli, store, data):
    base = segment_bases(store, "txn")[0]
    m = _manifest(store, base)
    seg_id = base[-22:]
    docs = [
        inspect_cli("show", spec, "--json").expect(0).json()
        for spec in (
            seg_id,
            base + ".log",
            base + ".indexes",
            base + ".rsm-manifest",
            base[len("tiered/") :] + ".log",
            f"txn/0/{m.segment['endOffset']}",
            "txn/0/0",
        )
    ]
    assert all(d == docs[0] for d in docs[1:])
    doc = docs[0]
    assert doc["segment"]["segment_id"] == seg_id
    assert doc["manifest"]["remoteLogSegmentMetadata"]["endOffset"] == m.segment["endOffset"]
    assert doc["manifest_verified"] is True
    ci = doc["chunk_index"]
    sizes = [c.transformed_size for c in m.chunk_index.chunks()]
    assert ci["chunks"] == len(sizes) and ci["type"] == m.chunk_index.kind
    assert ci["stored_chunk_min"] == min(sizes) and ci["stored_chunk_max"] == max(sizes)
    assert ci["stored_chunk_min"] <= ci["stored_chunk_median"] <= ci["stored_chunk_max"]
    assert ci["compression_ratio"] == pytest.approx(m.original_size / m.stored_log_size, rel=1e-3)
    if ci["type"] == "variable":
        assert (
            0
            < ci["encoded_bytes_per_chunk"]
            == pytest.approx(ci["encoded_index_bytes"] / len(sizes), rel=1e-3)
        )
    assert {k: (v["size"] if v else None) for k, v in doc["objects"].items()} == {
        s: store.size(f"{base}.{s}") for s in ("log", "indexes", "rsm-manifest")
    }
    text = inspect_cli("show", seg_id).expect(0).stdout
    assert "chunk index" in text and f"offsets 0..{m.segment['endOffset']}" in text and '"chunkIndex"' in text


def test_show_offset_held_by_two_copies_lists_them(inspect_cli, stack, store, data):
    """The broker re-uploads the same offsets under a new segment id after a failed copy;
    topic/partition/offset is then ambiguous and the copies are listed."""
    base = segment_bases(store, "victim")[1]
    m = _manifest(store, base)
    copy_base = base[:-22] + "AAAAAAAAAAAAAAAAAAAAAA"
    copies = [f"{copy_base}.{s}" for s in ("log", "indexes", "rsm-manifest")]
    with restored(stack, *copies):
        for s in ("log", "indexes", "rsm-manifest"):
            store.put(f"{copy_base}.{s}", store.get(f"{base}.{s}"))
        r = inspect_cli("show", f"victim/0/{m.segment['startOffset'] + 1}").expect(2)
        assert "2 stored copies" in r.stderr
        assert base[-22:] in r.stderr and "AAAAAAAAAAAAAAAAAAAAAA" in r.stderr
        # a UUID still names one copy
        assert (
            inspect_cli("show", "AAAAAAAAAAAAAAAAAAAAAA", "--json").expect(0).json()["segment"]["base"]
            == copy_base
        )


def test_segment_argument_errors_and_usage_exit_codes(inspect_cli, data):
    assert "is not a segment UUID" in inspect_cli("show", "no such thing!").expect(2).stderr
    r = inspect_cli("show", "txn/0/999999999").expect(1)
    assert "no tiered segment of txn-0 holds offset 999999999" in r.stderr
    assert "no segment with id" in inspect_cli("show", "BBBBBBBBBBBBBBBBBBBBBB").expect(1).stderr
    inspect_cli("rekey").expect(2)  # --topic or --all is required
    inspect_cli("orphans", "--older-than", "soon").expect(2)
    assert "--json needs --output" in inspect_cli("cat", "txn/0/0", "--json").expect(2).stderr
    assert "before --start" in inspect_cli("cat", "txn/0/0", "--start", "10", "--end", "5").expect(2).stderr


# -- dump ----------------------------------------------------------------------------
def _dump_all(inspect_cli, store, topic: str, *extra: str) -> list[dict]:
    batches = []
    for base in segment_bases(store, topic):
        doc = inspect_cli("dump", base[-22:], "--json", "--max-bytes", "0", *extra).expect(0).json()
        assert doc["summary"]["error"] is None
        batches += doc["batches"]
    return batches


def test_dump_shows_the_records_as_produced(inspect_cli, store, data):
    produced = {r.offset: r for r in data["plain"]}
    batches = _dump_all(inspect_cli, store, "plain")
    seen = {}
    for b in batches:
        assert b["compression"] == "zstd" or b["base_offset"] > max(produced)
        for rec in b["records"]:
            seen[rec["offset"]] = rec
    assert set(produced) <= set(seen)
    for offset, want in produced.items():
        got = seen[offset]
        assert field_bytes(got["key"]) == want.key, offset
        assert field_bytes(got["value"]) == want.value, offset
        assert got["timestamp"] == want.timestamp
        assert [(h["key"], field_bytes(h["value"])) for h in got["headers"]] == list(want.headers)
    offsets = sorted(seen)
    assert offsets == list(range(offsets[0], offsets[-1] + 1))

    # --from-offset (through the offset index) and --limit, in the text form too
    base = segment_bases(store, "plain")[0]
    start = produced[max(produced) // 2].offset
    doc = (
        inspect_cli("dump", base[-22:], "--json", "--from-offset", str(start), "--limit", "7")
        .expect(0)
        .json()
    )
    assert [r["offset"] for b in doc["batches"] for r in b["records"]] == list(range(start, start + 7))
    assert doc["summary"]["limited"] is True and doc["summary"]["records"] == 7
    text = inspect_cli("dump", base[-22:], "--limit", "3").expect(0).stdout
    first = data["plain"][0]
    assert "batch 0.." in text and "zstd" in text
    assert "| offset 0 " in text and f"({first.timestamp})" in text
    assert text.count("| offset ") == 3 and "3 records (--limit reached)" in text


def test_dump_shows_transaction_markers(inspect_cli, store, data):
    committed, aborted = data["committed"], data["aborted"]
    batches = _dump_all(inspect_cli, store, "txn")
    markers = {r["offset"]: r["control"] for b in batches if b["control"] for r in b["records"]}
    values = {r["offset"]: field_bytes(r["value"]) for b in batches if not b["control"] for r in b["records"]}
    assert set(markers.values()) == {"COMMIT", "ABORT"}
    assert sum(1 for v in markers.values() if v == "ABORT") == 3
    for offsets, outcome in ((committed, "COMMIT"), (aborted, "ABORT")):
        for offset, value in offsets.items():
            assert values[offset] == value
            marker = min(o for o in markers if o > offset)  # the transaction's end marker
            assert markers[marker] == outcome, f"record {offset} ends with {markers[marker]}"
    txn_batches = [b for b in batches if b["transactional"]]
    assert txn_batches and all(b["producer_id"] >= 0 for b in txn_batches)
    text = inspect_cli("dump", segment_bases(store, "txn")[0][-22:]).expect(0).stdout
    assert re.search(r"\| offset \d+ .* ABORT coordinatorEpoch \d+", text)
    assert re.search(r"\| offset \d+ .* COMMIT coordinatorEpoch \d+", text)


# -- cat -----------------------------------------------------------------------------
def _dump_log_segments(path) -> str:
    """Kafka's own DumpLogSegments. Kafka 4.x moved it out of the broker jars (kafka-tools,
    which devstack does not download); the 3.9 distribution still has kafka.tools.DumpLogSegments."""
    dist = KafkaDistribution.ensure("3.9.2")
    p = subprocess.run(
        dist.java_command(
            "kafka.tools.DumpLogSegments", ["--files", str(path), "--print-data-log", "--deep-iteration"]
        ),
        capture_output=True,
        text=True,
        timeout=300,
        errors="replace",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


_BATCH_LINE = re.compile(
    r"^baseOffset: (\d+) lastOffset: (\d+) count: (\d+) .* position: (\d+) .* size: (\d+) "
    r"magic: 2 compresscodec: (\w+) crc: (\d+) isvalid: (\w+)$"
)


@pytest.mark.parametrize("topic", ["txn", "plain"])
def test_cat_output_is_read_by_kafka_dump_log_segments(inspect_cli, store, data, tmp_path, topic):
    base = segment_bases(store, topic)[0]
    m = _manifest(store, base)
    out = tmp_path / f"{m.segment['startOffset']:020d}.log"
    inspect_cli("cat", base[-22:], "--output", str(out)).expect(0)
    raw = out.read_bytes()
    assert len(raw) == m.original_size
    piped = inspect_cli("cat", f"{topic}/0/0")
    assert piped.returncode == 0 and piped.stdout_bytes == raw
    # a byte range is the same slice, end inclusive
    part = inspect_cli("cat", base[-22:], "--start", "1000", "--end", "70000").expect(0)
    assert part.stdout_bytes == raw[1000:70001]
    summary = inspect_cli("cat", base[-22:], "--output", str(tmp_path / "x.log"), "--json").expect(0).json()
    assert summary["bytes"] == len(raw) and summary["segment_bytes"] == len(raw)

    dumped = _dump_log_segments(out)
    assert "isvalid: false" not in dumped and "Found" not in dumped, dumped[-2000:]
    kafka_batches = [
        tuple(int(g) if g.isdigit() else g for g in m_.groups())
        for m_ in map(_BATCH_LINE.match, dumped.splitlines())
        if m_
    ]
    ours = [
        b for b in inspect_cli("dump", base[-22:], "--json", "--max-bytes", "1").expect(0).json()["batches"]
    ]
    assert [
        (b["base_offset"], b["last_offset"], b["count"], b["position"], b["size"], int(b["crc"], 16))
        for b in ours
    ] == [(k[0], k[1], k[2], k[3], k[4], k[6]) for k in kafka_batches]
    assert all(k[7] == "true" for k in kafka_batches)
    assert kafka_batches[-1][3] + kafka_batches[-1][4] == len(raw)  # every byte is in a valid batch
    if topic == "txn":
        assert "endTxnMarker: ABORT" in dumped and "endTxnMarker: COMMIT" in dumped
    else:
        assert {k[5] for k in kafka_batches if k[0] <= max(r.offset for r in data["plain"])} == {"zstd"}


# -- verify --------------------------------------------------------------------------
def test_verify_every_segment_is_healthy(inspect_cli, store, data):
    doc = inspect_cli("verify", "--json", "--deep").expect(0).json()
    segs = doc["segments"]
    assert doc["summary"]["failed"] == 0 and doc["summary"]["segments"] == len(segs)
    assert {s["base"] for s in segs} == set(remote_segments(store))
    assert all(s["status"] == "ok" and not s["problems"] for s in segs)
    txn = [s for s in segs if s["segment"].startswith("txn-")]
    assert sum(s["aborted_txns"] for s in txn) == 3
    assert sum(s["control_records"] for s in txn) == 9  # one marker per transaction
    plain = [s for s in segs if s["segment"].startswith("plain-")]
    assert sum(s["records"] for s in plain) == data["ends"]["plain"]
    assert all(s["batches"] > 0 for s in segs)
    text = inspect_cli("verify", "--topic", "txn").expect(0).stdout
    assert text.count("\nOK ") + text.startswith("OK ") == len(txn)
    assert f"{len(txn)} segments verified: {len(txn)} ok, 0 with problems" in text


def _victim_report(doc, base):
    return next(s for s in doc["segments"] if s["base"] == base)


@pytest.mark.parametrize("where", ["log", "indexes"])
def test_verify_names_a_corrupted_segment_and_reports_the_healthy_ones(
    inspect_cli, stack, store, data, where
):
    bases = segment_bases(store, "victim")
    bad = bases[1]
    key = f"{bad}.{where}"
    if where == "log":
        position = store.size(key) // 2  # inside a chunk's ciphertext
    else:
        r = _manifest(store, bad).indexes["timestamp"]
        position = r.position + r.size // 2
    with restored(stack, key):
        flip_byte(stack, key, position)
        r = inspect_cli("verify", "--topic", "victim", "--json")
        r.expect(1)
        doc = r.json()
        assert doc["summary"] == {**doc["summary"], "segments": len(bases), "ok": len(bases) - 1, "failed": 1}
        report = _victim_report(doc, bad)
        assert report["status"] == "failed"
        problems = " ".join(report["problems"])
        if where == "log":
            assert f"{bad}.log chunk" in problems and "authentication failed" in problems
        else:
            assert "timestamp index" in problems and "authentication failed" in problems
            assert report["batches"] > 0  # the data was still checked
        assert all(s["status"] == "ok" for s in doc["segments"] if s["base"] != bad)
        text = inspect_cli("verify", "--topic", "victim").expect(1).stdout
        assert f"FAILED  {_describe(bad)}" in text and text.count("OK      victim-0@") == len(bases) - 1
        assert inspect_cli("verify", bad[-22:]).expect(1).stdout.startswith("FAILED")
    inspect_cli("verify", bad[-22:]).expect(0)


def _describe(base: str) -> str:
    """``topic-partition@start (segment id)``, as the commands name segments."""
    m = re.fullmatch(r"tiered/(.+)-.{22}/(\d+)/(\d{20})-(.{22})", base)
    return f"{m[1]}-{int(m[2])}@{int(m[3])} ({m[4]})"


def test_verify_checks_indexes_against_the_data(inspect_cli, stack, store, data):
    """Indexes that parse and verify but disagree with the data, re-encrypted with the
    segment's own key (so only the cross-checks can catch them): an offset index entry
    inside a batch, a time index entry with the wrong timestamp, a leader-epoch checkpoint
    that starts with another epoch, a transaction index naming an abort that is not there."""
    from rsm_sidecar.format.manifest import INDEX_NAMES, IndexRange
    from rsm_sidecar.kafka.checkpoint import EpochEntry, format_leader_epoch_checkpoint
    from rsm_sidecar.kafka.indexes import (
        OffsetPosition,
        TimestampOffset,
        encode_offset_index,
        encode_time_index,
    )
    from rsm_sidecar.kafka.txnindex import AbortedTxn, encode_txn_index
    from rsm_sidecar.transform.chunks import ChunkCodec

    base = segment_bases(store, "victim")[0]
    m = _manifest(store, base)
    cfg, env = stack.sidecar_config_env()
    keyring = Keyring.from_config(Config.load(cfg, environ=env))
    codec = ChunkCodec(False, keyring.unwrap(m.encryption.key_id, m.encryption.wrapped_key), m.encryption.aad)
    start = m.segment["startOffset"]
    assert m.indexes["transaction"] is None
    pieces = {
        "offset": encode_offset_index([OffsetPosition(start + 3, 17)], start),
        "timestamp": encode_time_index([TimestampOffset(12345, start + 1)], start),
        "leaderEpoch": format_leader_epoch_checkpoint([EpochEntry(5, 0)]).encode(),
        "transaction": encode_txn_index([AbortedTxn(4242, start, start + 2, start + 3)]),
    }
    old = store.get(base + ".indexes")
    stored = bytearray()
    ranges = {}
    tags = {}
    for name in INDEX_NAMES:
        r = m.indexes[name]
        piece = codec.encrypt_only(pieces[name]) if name in pieces else old[r.position : r.position + r.size]
        ranges[name] = IndexRange(len(stored), len(piece))
        tags[name] = bytes(piece[-16:])
        stored += piece
    with restored(stack, base + ".indexes", base + ".rsm-manifest"):
        store.put(base + ".indexes", bytes(stored))
        m.indexes = ranges
        m.index_tags = tags  # written by a key holder: authentic, but the indexes are wrong
        store.put(base + ".rsm-manifest", sealed_manifest(stack, m))
        report = inspect_cli("verify", base[-22:], "--json").expect(1).json()["segments"][0]
        problems = "\n".join(report["problems"])
        assert f"offset index entry {start + 3} @ 17 does not point at a batch start" in problems
        assert f"time index entry 12345 -> {start + 1} disagrees with batch [{start}.." in problems
        assert (
            f"batch [{start}.." in problems
            and "has leader epoch 0, the leader-epoch checkpoint says 5" in problems
        )
        assert (
            f"transaction index entry of producer 4242 ending at offset {start + 2} has no ABORT marker"
            in problems
        )
        assert report["batches"] > 0 and report["chunks"] >= 1
    inspect_cli("verify", base[-22:]).expect(0)


# -- foreign key id ---------------------------------------------------------------------
def test_segment_under_a_foreign_key_id_is_an_error_line_and_the_rest_is_processed(
    inspect_cli, stack, store, data
):
    from Crypto.PublicKey import RSA

    bases = segment_bases(store, "victim")
    foreign = bases[-1]
    m = _manifest(store, foreign)
    cfg, env = stack.sidecar_config_env()
    keyring = Keyring.from_config(Config.load(cfg, environ=env))
    data_key = keyring.unwrap(m.encryption.key_id, m.encryption.wrapped_key)
    public, private = generate_key_pair(2048)
    other = Keyring(
        {"foreign-key": KeyPair("foreign-key", RSA.import_key(public), RSA.import_key(private))},
        "foreign-key",
    )
    key_id, wrapped = other.wrap(data_key)
    m.encryption = EncryptionInfo(key_id, wrapped, m.encryption.aad)
    with restored(stack, foreign + ".rsm-manifest"):
        store.put(foreign + ".rsm-manifest", m.to_bytes())

        ls = inspect_cli("ls", "--topic", "victim", "--json").expect(0).json()
        assert {s["base"]: s["key_id"] for s in ls["segments"]}[foreign] == "foreign-key"

        r = inspect_cli("verify", "--topic", "victim", "--json").expect(1)
        doc = r.json()
        report = _victim_report(doc, foreign)
        assert report["status"] == "failed"
        assert "key id 'foreign-key', which is not in the keyring" in " ".join(report["problems"])
        assert doc["summary"]["ok"] == len(bases) - 1

        r = inspect_cli("rekey", "--topic", "victim").expect(1)
        assert re.search(
            rf"error: {re.escape(_describe(foreign))}: .*'foreign-key', which is not in the keyring", r.stderr
        )
        assert sum(line.startswith("skipped ") for line in r.stdout.splitlines()) == len(bases) - 1
        assert f"{len(bases)} segments: 0 re-keyed, {len(bases) - 1} skipped, 1 errors" in r.stdout
        assert store.get(foreign + ".rsm-manifest") == m.to_bytes()  # left as is

        r = inspect_cli("dump", foreign[-22:], "--limit", "1").expect(1)
        assert "foreign-key" in r.stderr


# -- orphans and du -----------------------------------------------------------------------
def test_orphans_lists_uploads_without_manifest_and_deletes_only_old_ones(inspect_cli, stack, store, data):
    assert inspect_cli("orphans", "--json").expect(0).json()["orphans"] == []
    bases = segment_bases(store, "victim")
    interrupted = bases[2]  # as if a copy died before its manifest
    stray = bases[0][:-22] + "StrayStrayStrayStray00"  # the .log of an upload nobody finished
    junk = "tiered/not-a-segment.txt"
    try:
        with restored(stack, interrupted + ".rsm-manifest", stray + ".log"):
            store.delete(interrupted + ".rsm-manifest")
            for suffix in ("log", "indexes"):
                os.utime(object_path(stack, f"{interrupted}.{suffix}"))  # written just now
            store.put(stray + ".log", b"partial upload")
            store.put(junk, b"hello")
            two_hours_ago = time.time() - 7200
            os.utime(object_path(stack, stray + ".log"), (two_hours_ago, two_hours_ago))

            doc = inspect_cli("orphans", "--json").expect(1).json()
            found = {o["key"]: o for o in doc["orphans"]}
            assert set(found) == {interrupted + ".log", interrupted + ".indexes", stray + ".log", junk}
            assert found[junk]["reason"] == "outside-layout"
            assert found[stray + ".log"]["reason"] == found[interrupted + ".log"]["reason"] == "no-manifest"
            assert found[stray + ".log"]["age_seconds"] > 7000
            assert all(o["action"] == "listed" for o in found.values())
            assert all(store.exists(k) for k in found)

            du = inspect_cli("du", "--json").expect(0).json()
            assert du["outside_layout"] == {"objects": 1, "bytes": 5}
            victim = next(p for p in du["partitions"] if p["topic"] == "victim")
            assert victim["incomplete"] == 2 and victim["segments"] == len(bases) - 1

            # the default age guard (1 hour) protects the young ones: they may be copies in progress
            r = inspect_cli("orphans", "--delete").expect(1)
            assert "1 deleted" in r.stdout and "kept" in r.stdout
            assert not store.exists(stray + ".log")
            assert store.exists(interrupted + ".log") and store.exists(interrupted + ".indexes")
            assert store.exists(junk)
            doc = inspect_cli("orphans", "--json", "--older-than", "10m", "--delete").expect(1).json()
            assert {o["action"] for o in doc["orphans"]} == {"kept-too-young"}
            assert len(doc["orphans"]) == 3
        # the interrupted segment has its manifest back; only the junk is left, and it goes
        doc = inspect_cli("orphans", "--json", "--older-than", "0", "--delete").expect(0).json()
        assert [(o["key"], o["action"]) for o in doc["orphans"]] == [(junk, "deleted")]
        assert not store.exists(junk)
    finally:
        store.delete(junk)
    assert inspect_cli("orphans").expect(0).stdout.strip() == "no orphaned objects"
    inspect_cli("verify", "--topic", "victim").expect(0)


def test_du_counts_every_object_per_topic_and_partition(inspect_cli, store, data):
    doc = inspect_cli("du", "--json").expect(0).json()
    for p in doc["partitions"]:
        objects = [o for o in store.list(f"tiered/{p['topic']}-{p['topic_id']}/{p['partition']}/")]
        assert p["objects"] == len(objects) == 3 * p["segments"]
        assert p["total_bytes"] == sum(o.size for o in objects)
        assert p["log_bytes"] == sum(o.size for o in objects if o.key.endswith(".log"))
        assert p["manifest_bytes"] == sum(o.size for o in objects if o.key.endswith(".rsm-manifest"))
    assert {t["topic"] for t in doc["topics"]} == {s["topic"] for s in remote_segments(store).values()}
    assert doc["total"]["total_bytes"] == sum(o.size for o in store.list("tiered/"))
    text = inspect_cli("du", "--topic", "txn").expect(0).stdout
    assert text.splitlines()[0].split()[:3] == ["TOPIC", "TOPIC_ID", "PART"] and "plain" not in text


def test_rekey_dry_run_and_idempotence_under_the_same_active_key(inspect_cli, store, data):
    before = {b: store.get(b + ".rsm-manifest") for t in ("plain", "txn") for b in segment_bases(store, t)}
    for args in (("--all", "--dry-run"), ("--topic", "txn")):
        doc = inspect_cli("rekey", *args, "--json").expect(0).json()
        assert {o["action"] for o in doc["segments"]} == {"skipped"}
        assert doc["summary"]["rekeyed"] == doc["summary"]["would_rekey"] == 0
    assert {b: store.get(b + ".rsm-manifest") for b in before} == before


# -- schema-registry decoding ---------------------------------------------------------------
ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "inspect.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "price", "type": "double"},
    ],
}


@pytest.fixture(scope="module")
def registry_url(tmp_path_factory):
    from devstack.registry import ApicurioDistribution, ApicurioRegistry

    reg = ApicurioRegistry(ApicurioDistribution.ensure(), tmp_path_factory.mktemp("apicurio"))
    reg.start()
    try:
        yield reg.ccompat_url
    finally:
        reg.stop()


def test_dump_decodes_avro_values_through_the_schema_registry(inspect_cli, stack, store, registry_url):
    import io

    import fastavro
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from rsm_sidecar.iceberg.decoding.framing import encode_preamble

    schema_id = SchemaRegistryClient({"url": registry_url}).register_schema(
        "orders-value", Schema(json.dumps(ORDER_SCHEMA), "AVRO")
    )
    parsed = fastavro.parse_schema(ORDER_SCHEMA)
    orders = [
        {"id": i, "item": f"item-{i}", "tags": ["a", "b"][: i % 3], "price": i * 1.5} for i in range(150)
    ]

    def framed(order) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, order)
        return encode_preamble(schema_id) + buf.getvalue()

    bootstrap = stack.bootstrap_servers
    create_topic(bootstrap, "orders")
    recs = [Rec(b"%d" % o["id"], framed(o), (), int(time.time() * 1000)) for o in orders]
    recs.append(Rec(b"plain", b"not framed", (), int(time.time() * 1000)))
    produced = produce(bootstrap, "orders", recs)
    filler(bootstrap, "orders")
    wait_all_tiered(stack, store, "orders")
    seg = segment_bases(store, "orders")[0][-22:]

    doc = inspect_cli(
        "dump", seg, "--json", "--limit", str(len(recs)), "--schema-registry", registry_url
    ).expect(0)
    values = {r["offset"]: r["value"] for b in doc.json()["batches"] for r in b["records"]}
    for rec, order in zip(produced, orders):
        assert values[rec.offset] == {"schema_id": schema_id, "schema_type": "AVRO", "decoded": order}
    assert values[produced[-1].offset] == {"utf8": "not framed"}

    text = inspect_cli("dump", seg, "--limit", "1", "--schema-registry", registry_url).expect(0).stdout
    assert f'value avro#{schema_id} {{"id": 0, "item": "item-0", "tags": [], "price": 0.0}}' in text
    plain = inspect_cli("dump", seg, "--json", "--limit", "1").expect(0).json()
    assert plain["batches"][0]["records"][0]["value"] == {"hex": framed(orders[0]).hex()}

    # the registry of the sidecar's configuration (iceberg.registry.url) is used unless --plain
    configured = {"RSM__ICEBERG__REGISTRY__URL": registry_url}
    doc = inspect_cli("dump", seg, "--json", "--limit", "1", env=configured).expect(0).json()
    assert doc["batches"][0]["records"][0]["value"]["decoded"] == orders[0]
    doc = inspect_cli("dump", seg, "--json", "--limit", "1", "--plain", env=configured).expect(0).json()
    assert doc["batches"][0]["records"][0]["value"] == {"hex": framed(orders[0]).hex()}
