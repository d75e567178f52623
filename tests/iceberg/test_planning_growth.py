"""How the Iceberg planning grows with the segments in storage (benchmarks/many_segments.py
measures it; docs/operations.md "How costs grow"): the chain of a partition is chosen in
O(n log n), the same chain the quadratic scan it replaced chose."""

from __future__ import annotations

import random

from rsm_sidecar.iceberg.planning.chains import choose_chain
from rsm_sidecar.segment.listing import StoredSegment


def seg(start: int, end: int, sid: str) -> StoredSegment:
    return StoredSegment(f"b-{start}-{sid}", "t", "X" * 22, 0, start, sid, end)


def reference_chain(segments, next_offset, limit=0, earliest=None):
    """The scan choose_chain used to be: at each step, every segment covering the offset."""
    chain, ranges, skipped = [], [], []
    if not segments:
        return chain, ranges, skipped, None
    if earliest is None:
        earliest = min(s.start_offset for s in segments)
    cur, waiting = next_offset, None
    while not limit or len(chain) < limit:
        covering = [s for s in segments if s.start_offset <= cur <= s.end_offset]
        if not covering:
            later = [s for s in segments if s.start_offset > cur]
            if not later:
                break
            nxt = min(s.start_offset for s in later)
            if cur < earliest:
                skipped.append((cur, nxt - 1))
                cur = nxt
                continue
            waiting = f"offsets {cur}..{nxt - 1} are not in remote storage (yet)"
            break
        best = max(covering, key=lambda s: (s.end_offset, [-ord(c) for c in s.segment_id]))
        chain.append(best)
        ranges.append((cur, best.end_offset))
        cur = best.end_offset + 1
    return chain, ranges, skipped, waiting


def test_the_same_chain_as_the_scan_it_replaced():
    rng = random.Random(31)
    for _ in range(400):
        segs, start = [], rng.randrange(0, 50)
        for _ in range(rng.randrange(0, 25)):
            length = rng.randrange(1, 40)
            segs.append(seg(start, start + length - 1, "".join(rng.choice("ABCD") for _ in range(22))))
            if rng.random() < 0.3:  # a re-upload: the same or overlapping offsets, another id
                s2 = max(0, start - rng.randrange(0, 20))
                segs.append(
                    seg(s2, start + rng.randrange(0, 60), "".join(rng.choice("ABCD") for _ in range(22)))
                )
            start += length + (rng.randrange(1, 30) if rng.random() < 0.1 else 0)  # a hole
        rng.shuffle(segs)
        nxt = rng.randrange(0, start + 10)
        limit = rng.choice([0, 0, 1, 3])
        earliest = rng.choice([None, rng.randrange(0, 60)])
        assert choose_chain(segs, nxt, limit, earliest) == reference_chain(segs, nxt, limit, earliest)


class Counted(StoredSegment):
    """Counts reads of ``start_offset``, the work a chain choice does per segment."""

    reads = 0

    def __getattribute__(self, name):
        if name == "start_offset":
            Counted.reads += 1
        return super().__getattribute__(name)


def test_a_partition_of_many_segments_is_planned_in_n_log_n():
    n = 3_000
    segs = [Counted(f"b{i}", "t", "X" * 22, 0, i * 10, f"{i:022d}", i * 10 + 9) for i in range(n)]
    Counted.reads = 0
    chain, ranges, _, waiting = choose_chain(segs, 0)
    assert len(chain) == n and waiting is None and ranges[-1] == ((n - 1) * 10, n * 10 - 1)
    # the scan read every segment's start offset at every step: n * n = 9 million reads
    assert Counted.reads < 20 * n, Counted.reads


# -- a follow-mode round lists what is new --------------------------------------------------------
def _write_topic(tmp_path, name: str, per_partition: int, partitions: int = 3, close: bool = True):
    from rsm_sidecar.format.keys import KeyLayout
    from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
    from rsm_sidecar.storage.local import LocalObjectStore
    from tests.tiered_writer import TieredWriter

    store = LocalObjectStore(tmp_path / "remote", fsync=False)
    writer = TieredWriter(store, KeyLayout("tiered/"), None, name)
    for p in range(partitions):
        for i in range(per_partition):
            recs = [SimpleRecord(b"k", b"v%d" % j, 1000 + i * 10 + j) for j in range(10)]
            writer.write_segment(p, [build_batch(recs, base_offset=i * 10)])
    if close:
        writer.close()
    return writer


def _job(tmp_path, topic: str, monkeypatch):
    """A convert job on the local store and the keys its planning lists (counted)."""
    from rsm_sidecar.iceberg.job import ConvertJob, load_config
    from rsm_sidecar.iceberg.reading.segment_tasks import executor_context

    cfg_file = tmp_path / "sidecar.toml"
    cfg_file.write_text(
        f'[storage]\nbackend = "local"\nkey_prefix = "tiered/"\n[storage.local]\nfsync = false\n'
        f'root = "{tmp_path / "remote"}"\n[encryption]\nenabled = false\n'
    )
    cfg, storage = load_config(cfg_file, environ={})
    job = ConvertJob(cfg, storage, topic, log=lambda line: None)
    store = executor_context(storage).store
    listed: list[str] = []
    inner = store.list

    def counting(prefix="", start_after=None):
        for o in inner(prefix, start_after):
            listed.append(o.key)
            yield o

    monkeypatch.setattr(store, "list", counting)
    return job, store, listed


def _plans(plans):
    return [(p.partition, [s.segment_id for s in p.chain], p.ranges, p.skipped, p.waiting) for p in plans]


def test_an_incremental_round_plans_what_a_full_one_does_and_lists_only_the_new(tmp_path, monkeypatch):
    from rsm_sidecar.iceberg.committing.markers import MarkerState

    costs = {}
    for existing in (10, 40):
        d = tmp_path / f"n{existing}"
        writer = _write_topic(d, "orders", existing + 2)
        job, store, listed = _job(d, "orders", monkeypatch)
        state = MarkerState(
            topic="orders", topic_id=writer.topic_id, next_offsets=dict.fromkeys(range(3), existing * 10)
        )
        _, full = job.plan(state)
        listed.clear()
        r0 = store.requests
        _, incremental = job.plan(state, incremental=True)
        assert _plans(incremental) == _plans(full)
        assert all(len(p.chain) == 2 for p in incremental)
        r1 = store.requests
        costs[existing] = (len(listed), {k: r1[k] - r0.get(k, 0) for k in r1 if r1[k] != r0.get(k, 0)})
    # 2 new segments of 3 objects in each of 3 partitions, one LIST each: whatever is stored
    assert costs[10] == costs[40] and costs[10][0] == 18 and costs[10][1]["LIST"] == 3, costs


def test_an_incremental_round_lists_a_partition_whole_when_its_new_segments_leave_a_gap(
    tmp_path, monkeypatch
):
    from rsm_sidecar.iceberg.committing.markers import MarkerState
    from rsm_sidecar.kafka.builder import SimpleRecord, build_batch

    writer = _write_topic(tmp_path, "orders", 3, partitions=1, close=False)  # offsets 0..29
    # a new leader re-uploaded 15..29 under another id (KAFKA-15168), then tiered 30..39
    recs = [SimpleRecord(b"k", b"v", 2000 + j) for j in range(15)]
    writer.write_segment(0, [build_batch(recs, base_offset=15)], track=False)
    job, store, listed = _job(tmp_path, "orders", monkeypatch)
    state = MarkerState(topic="orders", topic_id=writer.topic_id, next_offsets={0: 25})
    # nothing starts at or after 25 yet: the incremental round sees nothing new (a full round,
    # one in FULL_LISTING_EVERY, plans the straddling 25..29)
    assert _plans(job.plan(state, incremental=True)[1]) == [(0, [], [], [], None)]
    assert [r for p in job.plan(state)[1] for r in p.ranges] == [(25, 29)]
    recs = [SimpleRecord(b"k", b"v", 3000 + j) for j in range(10)]
    writer.write_segment(0, [build_batch(recs, base_offset=30)])
    writer.close()
    _, full = job.plan(state)
    _, incremental = job.plan(state, incremental=True)
    assert _plans(incremental) == _plans(full) and full[0].ranges == [(25, 29), (30, 39)]


def test_the_follower_lists_the_topic_whole_once_every_full_listing_every_rounds(monkeypatch):
    from rsm_sidecar.config import Config
    from rsm_sidecar.iceberg import follow

    seen = []

    class Job:
        incremental_listing = False

        def prepare(self):
            seen.append(self.incremental_listing)
            return type("Prepared", (), {"tasks": [], "plans": []})()

    cfg = Config({"storage.local.root": "/nonexistent", "encryption.enabled": False})
    f = follow.Follower(cfg, None, "orders", spark=object())  # type: ignore[arg-type]
    monkeypatch.setattr(f, "_job", Job)
    for _ in range(2 * follow.FULL_LISTING_EVERY + 1):
        assert f.round() == follow.NOTHING_NEW
    full = [i for i, incremental in enumerate(seen) if not incremental]
    assert full == [0, follow.FULL_LISTING_EVERY, 2 * follow.FULL_LISTING_EVERY]


def test_a_first_run_opens_each_new_segment_once_whatever_the_manifest_cache_holds(tmp_path):
    """The plan reads each new segment's transaction index and producer snapshot while its
    manifest is at hand: with more new segments than the manifest cache holds, reading them
    after the chain was chosen loaded every manifest again (a GET and an RSA unwrap each)."""
    from rsm_sidecar.format.keys import KeyLayout
    from rsm_sidecar.iceberg.planning.chains import plan_partition
    from rsm_sidecar.segment.listing import list_topic_segments
    from rsm_sidecar.segment.reader import SegmentReader
    from rsm_sidecar.segment.settings import ReaderSettings

    writer = _write_topic(tmp_path, "orders", 30, partitions=1)
    store = writer.store
    layout = KeyLayout("tiered/")
    segs = list_topic_segments(store, layout, "orders")[writer.topic_id][0]
    settings = ReaderSettings(
        manifest_cache_bytes=1, index_cache_bytes=0, chunk_cache_bytes=0, prefetch_bytes=0
    )
    reader = SegmentReader(store, layout, None, settings)
    r0 = store.requests.get("GET", 0)
    plan = plan_partition(reader, segs, 0, -1)
    assert len(plan.chain) == 30
    # one manifest and one producer snapshot per segment (no transaction index: no aborts)
    assert store.requests["GET"] - r0 == 2 * 30
