"""What the inspect tests need besides tests/e2e/kafka_helpers: transactions with known
outcomes, waiting until a whole topic (all but the active segment) is tiered, and
tampering with stored objects (restored afterwards)."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

from confluent_kafka import Producer

from rsm_sidecar.format.manifest import SegmentManifest
from tests.e2e.kafka_helpers import KEY_PREFIX, local_segment_offsets, remote_segments, wait_for


def produce_transactions(
    bootstrap: str, topic: str, rounds: int = 9, abort_every: int = 3, seed: int = 11
) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """Transactions of 20-50 records; every ``abort_every``-th one (from the second) is
    aborted after its records are on disk. Returns {offset: value} of the committed and of
    the aborted records."""
    rng = random.Random(seed)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"inspect-{topic}", "linger.ms": 5})
    p.init_transactions(30)
    committed: dict[int, bytes] = {}
    aborted: dict[int, bytes] = {}
    for round_ in range(rounds):
        p.begin_transaction()
        sent: dict[int, bytes] = {}
        for i in range(rng.randrange(20, 50)):
            value = b"txn-%d-%d " % (round_, i) + b"x" * rng.randrange(100, 2000)
            p.produce(
                topic,
                key=b"k%d" % i,
                value=value,
                on_delivery=lambda err, msg, v=value, sent=sent: (
                    err is None and sent.__setitem__(msg.offset(), v)
                ),
            )
        assert p.flush(30) == 0  # on disk before the outcome: aborted data really is in the log
        if round_ % abort_every == 1:
            p.abort_transaction(30)
            aborted.update(sent)
        else:
            p.commit_transaction(30)
            committed.update(sent)
    return committed, aborted


def _tiered_up_to(stack, store, topic: str) -> int | None:
    """The active segment's base offset once every older segment is in remote storage
    (manifest written) and gone from the broker's disk; else None."""
    local = local_segment_offsets(stack.broker, topic)
    if len(local) != 1 or local[0] == 0:
        return None
    active = local[0]
    segments = remote_segments(store, topic)
    if not segments or any(s["suffixes"] != {"log", "indexes", "rsm-manifest"} for s in segments.values()):
        return None
    last = max(segments, key=lambda b: segments[b]["start_offset"])
    m = SegmentManifest.from_bytes(store.get(last + ".rsm-manifest"))
    return active if m.segment["endOffset"] == active - 1 else None


def wait_all_tiered(stack, store, topic: str, after: int = 0, timeout: float = 240) -> int:
    """Wait until all but the active segment are tiered and deleted locally, and the active
    segment starts beyond ``after``; return its base offset (the end of the remote data)."""

    def done():
        end = _tiered_up_to(stack, store, topic)
        return end if end is not None and end > after else None

    return wait_for(f"every closed segment of {topic} tiered", done, timeout)


def object_path(stack, key: str) -> Path:
    return stack.remote_root / key


def segment_bases(store, topic: str) -> list[str]:
    """Remote segment bases of a topic, by start offset."""
    segs = remote_segments(store, topic)
    return sorted(segs, key=lambda b: segs[b]["start_offset"])


@contextlib.contextmanager
def restored(stack, *keys: str):
    """Put the listed objects back exactly as they were (or remove them if they did not
    exist) when the block ends."""
    saved = {}
    for k in keys:
        p = object_path(stack, k)
        saved[k] = p.read_bytes() if p.exists() else None
    try:
        yield
    finally:
        for k, data in saved.items():
            p = object_path(stack, k)
            if data is None:
                p.unlink(missing_ok=True)
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)


def flip_byte(stack, key: str, position: int) -> None:
    p = object_path(stack, key)
    data = bytearray(p.read_bytes())
    data[position] ^= 0x5A
    p.write_bytes(bytes(data))


def field_bytes(rendered) -> bytes | None:
    """The bytes behind a `dump --json` key/value/header rendering (shown in full)."""
    if rendered is None:
        return None
    assert not rendered.get("truncated"), rendered
    return rendered["utf8"].encode() if "utf8" in rendered else bytes.fromhex(rendered["hex"])


__all__ = [
    "KEY_PREFIX",
    "field_bytes",
    "flip_byte",
    "object_path",
    "produce_transactions",
    "restored",
    "segment_bases",
    "wait_all_tiered",
]
