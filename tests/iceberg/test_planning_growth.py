"""How the Iceberg planning grows with the segments in storage (benchmarks/many_segments.py
measures it; docs/operations.md "How costs grow"): the chain of a partition is chosen in
O(n log n), the same chain the quadratic scan it replaced chose."""

from __future__ import annotations

import random

from rsm_sidecar.iceberg.planning.chains import choose_chain
from rsm_sidecar.iceberg.planning.listing import RemoteSegment


def seg(start: int, end: int, sid: str) -> RemoteSegment:
    return RemoteSegment(f"b-{start}-{sid}", "t", "X" * 22, 0, start, sid, end)


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


class Counted(RemoteSegment):
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
