"""The disk chunk cache under a real local store and the real reader: what a consumer
re-reading a segment after a restart downloads, what the directory holds, and what
happens to damaged, stale and deleted entries."""

from __future__ import annotations

import collections
import concurrent.futures
import errno
import logging
import os
import stat
import threading

import pytest

from rsm_sidecar.config import Config
from rsm_sidecar.format import keys as fkeys
from rsm_sidecar.format.keys import KeyLayout, SegmentMetadata
from rsm_sidecar.segment import disk_cache
from rsm_sidecar.segment.copy import SegmentCopier
from rsm_sidecar.segment.reader import SegmentReader
from rsm_sidecar.segment.settings import CopySettings, ReaderSettings
from rsm_sidecar.segment.sources import BytesSource
from rsm_sidecar.storage.local import LocalObjectStore
from rsm_sidecar.transform.keyring import Keyring
from tests.keys_fixture import encryption_config

CHUNK = 16 * 1024
CHUNKS = 20
POOL = concurrent.futures.ThreadPoolExecutor(2)
LAYOUT = KeyLayout("dc/")


class CountingStore(LocalObjectStore):
    """A real local store that counts the bytes and requests of ranged reads per object
    suffix (what a remote store would bill and transfer)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.downloaded: collections.Counter[str] = collections.Counter()
        self.gets: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def get_range(self, key, start, end):
        data = super().get_range(key, start, end)
        with self._lock:
            self.downloaded[key.rsplit(".", 1)[1]] += len(data)
            self.gets[key.rsplit(".", 1)[1]] += 1
        return data


def md(n: int, size: int) -> SegmentMetadata:
    return SegmentMetadata(
        "MWJ6FHTfRYy67jzwZdeqSQ", "dc-topic", 0, f"D{n:021d}", n * 100, n * 100 + 99, segment_size=size
    )


def original(seed: int, size: int = CHUNKS * CHUNK) -> bytes:
    """Record-like lines, about half of them random (zstd saves about half)."""
    lines = (b"record %d-%06d %s\n" % (seed, i, os.urandom(12).hex().encode()) for i in range(size // 30 + 1))
    return b"".join(lines)[:size]


def indexes() -> dict[str, bytes | None]:
    return {"offset": b"\x00" * 8, "timestamp": b"\x01" * 12, "producerSnapshot": b"s", "transaction": None}


@pytest.fixture
def keyring(rsa_keys):
    return Keyring.from_config(
        Config({"storage": {"local": {"root": "/unused"}}, "encryption": encryption_config(rsa_keys)})
    )


def copy(store, keyring, m: SegmentMetadata, data: bytes) -> None:
    SegmentCopier(
        store,
        LAYOUT,
        keyring,
        CopySettings(chunk_size=CHUNK, compression=True, compression_heuristic=False),
        POOL,
    ).copy(m, BytesSource(data, indexes()), b"0\n1\n0 0\n")


class Events(collections.Counter[tuple[str, str]]):
    def __call__(self, cache: str, event: str) -> None:
        self[(cache, event)] += 1


def reader(store, keyring, path, capacity=10**9, events=None, chunk_cache=10**8) -> SegmentReader:
    return SegmentReader(
        store,
        LAYOUT,
        keyring,
        ReaderSettings(
            chunk_cache_bytes=chunk_cache,
            prefetch_bytes=0,
            max_range_bytes=4 * CHUNK,
            disk_cache_path=str(path),
            disk_cache_bytes=capacity,
        ),
        on_cache_event=events if events is not None else (lambda c, e: None),
    )


def read_all(r: SegmentReader, m: SegmentMetadata) -> bytes:
    return b"".join(r.read(r.open(m), 0, m.segment_size))


def cache_files(path) -> dict[str, int]:
    out = {}
    for d, _, names in os.walk(path):
        if os.path.basename(d) == disk_cache.TMP_DIR:
            continue
        for n in names:
            out[os.path.relpath(os.path.join(d, n), path)] = os.path.getsize(os.path.join(d, n))
    return out


def stored_chunk_sizes(store, keyring, m) -> list[int]:
    r = SegmentReader(store, LAYOUT, keyring)
    return [c.transformed_size for c in r.open(m).manifest.chunk_index.chunks()]


@pytest.mark.parametrize("encrypted", [True, False])
def test_a_restarted_reader_downloads_no_chunk_again(tmp_path, keyring, encrypted):
    keys = keyring if encrypted else None
    store = CountingStore(tmp_path / "remote", fsync=False)
    m = md(1, CHUNKS * CHUNK)
    data = original(1)
    copy(store, keys, m, data)
    assert read_all(reader(store, keys, tmp_path / "disk"), m) == data
    cold = store.downloaded[fkeys.LOG]
    files = cache_files(tmp_path / "disk")
    assert len(files) == CHUNKS and sum(files.values()) == cold  # the stored bytes, as downloaded
    if encrypted:  # never plaintext on disk
        for rel in files:
            assert b"record" not in (tmp_path / "disk" / rel).read_bytes()

    restarted = CountingStore(tmp_path / "remote", fsync=False)
    events = Events()
    r = reader(restarted, keys, tmp_path / "disk", events=events)
    assert len(r.disk) == CHUNKS and r.disk.size_bytes == cold
    assert read_all(r, m) == data
    assert restarted.downloaded[fkeys.LOG] == 0 and restarted.gets[fkeys.LOG] == 0
    assert events[("disk", "hit")] == CHUNKS and events[("disk", "miss")] == 0
    # a range in the middle, from the memory cache now, still nothing downloaded
    assert b"".join(r.read(r.open(m), 5 * CHUNK + 7, 9 * CHUNK)) == data[5 * CHUNK + 7 : 9 * CHUNK + 1]
    assert restarted.downloaded[fkeys.LOG] == 0


def test_capacity_is_respected_and_least_recently_used_chunks_are_evicted(tmp_path, keyring):
    store = CountingStore(tmp_path / "remote", fsync=False)
    m = md(2, CHUNKS * CHUNK)
    data = original(2)
    copy(store, keyring, m, data)
    sizes = stored_chunk_sizes(store, keyring, m)
    # the last six chunks, plus slack so that chunk 0 (compressed sizes vary with the random
    # data) fits in place of one evicted chunk; the slack is smaller than any chunk
    slack = max(sizes) - min(sizes)
    assert slack < min(sizes)
    capacity = sum(sizes[-6:]) + slack
    events = Events()
    r = reader(store, keyring, tmp_path / "disk", capacity=capacity, events=events, chunk_cache=0)
    assert read_all(r, m) == data
    files = cache_files(tmp_path / "disk")
    assert sum(files.values()) <= capacity and r.disk.size_bytes == sum(files.values())
    assert len(files) == 6 and events[("disk", "eviction")] == CHUNKS - 6
    # the first chunk was evicted: reading it downloads it again and evicts another
    before = store.downloaded[fkeys.LOG]
    assert b"".join(r.read(r.open(m), 0, 10)) == data[:11]
    assert store.downloaded[fkeys.LOG] - before == sizes[0]
    assert sum(cache_files(tmp_path / "disk").values()) <= capacity

    # across a restart the order is the files' mtimes: touch the oldest surviving chunk
    # by reading it, restart with room for three chunks: it survives, and the two newest
    r2 = reader(store, keyring, tmp_path / "disk", capacity=capacity, chunk_cache=0)
    survivor = 15
    before = store.downloaded[fkeys.LOG]
    assert b"".join(r2.read(r2.open(m), survivor * CHUNK, survivor * CHUNK)) == data[survivor * CHUNK :][:1]
    assert store.downloaded[fkeys.LOG] == before
    small = sizes[0] + sizes[survivor] + max(sizes[16:]) * 2
    events3 = Events()
    r3 = reader(store, keyring, tmp_path / "disk", capacity=small, events=events3, chunk_cache=0)
    assert r3.disk.size_bytes <= small and sum(cache_files(tmp_path / "disk").values()) <= small
    before = store.downloaded[fkeys.LOG]
    for cid in (0, survivor):
        assert b"".join(r3.read(r3.open(m), cid * CHUNK, cid * CHUNK + 99)) == data[cid * CHUNK :][:100]
    assert store.downloaded[fkeys.LOG] == before  # both were kept


@pytest.mark.parametrize("encrypted", [True, False])
@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "other_chunk"])
def test_a_damaged_cache_file_is_deleted_and_the_chunk_downloaded_again(
    tmp_path, keyring, damage, encrypted, caplog
):
    keyring = keyring if encrypted else None  # without encryption: the CRC32C of each chunk
    store = CountingStore(tmp_path / "remote", fsync=False)
    m = md(3, CHUNKS * CHUNK)
    data = original(3)
    copy(store, keyring, m, data)
    first = reader(store, keyring, tmp_path / "disk", chunk_cache=0)
    assert read_all(first, m) == data
    seg = first.open(m)
    chunks = seg.manifest.chunk_index.chunks()
    victim = first._disk_entry(seg, chunks[4])
    path = tmp_path / "disk" / victim
    good = path.read_bytes()
    if damage == "flip":
        path.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    elif damage == "truncate":
        path.write_bytes(good[:-1])
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # another chunk's stored bytes, padded to this chunk's size
        other = (tmp_path / "disk" / first._disk_entry(seg, chunks[5])).read_bytes()
        path.write_bytes((other * 2)[: len(good)])

    events = Events()
    r = reader(store, keyring, tmp_path / "disk", events=events, chunk_cache=0)
    before = store.downloaded[fkeys.LOG]
    with caplog.at_level(logging.WARNING):
        assert read_all(r, m) == data
    assert store.downloaded[fkeys.LOG] - before == chunks[4].transformed_size  # that chunk only
    assert events[("disk", "verification_failure")] == 1 and events[("disk", "hit")] == CHUNKS - 1
    assert path.read_bytes() == good  # written again from the download
    assert any("damaged" in rec.getMessage() for rec in caplog.records)


def test_a_recopy_of_the_same_segment_id_with_other_bytes_is_served_new(tmp_path, keyring):
    """Kafka retries copies with the same segment id; a copy that finds no complete
    manifest writes the segment anew. Another reader (a restarted sidecar) that cached the
    first copy's chunks on disk must serve the new bytes, whatever the sizes."""
    for keys in (keyring, None):
        store = CountingStore(tmp_path / f"remote-{keys is None}", fsync=False)
        m = md(4, CHUNKS * CHUNK)
        old = original(4)
        copy(store, keys, m, old)
        cache = tmp_path / f"disk-{keys is None}"
        assert read_all(reader(store, keys, cache), m) == old
        # the first copy's manifest is gone (an interrupted rewrite), the retry writes new bytes;
        # same size and, uncompressible-free, chunk sizes close to the old ones
        store.delete(LAYOUT.base(m) + "." + fkeys.MANIFEST)
        new = old.replace(b"record", b"RECORD")
        copy(store, keys, m, new)
        events = Events()
        r = reader(store, keys, cache, events=events)
        before = store.downloaded[fkeys.LOG]
        assert read_all(r, m) == new
        assert store.downloaded[fkeys.LOG] - before == store.size(LAYOUT.base(m) + "." + fkeys.LOG)
        assert events[("disk", "hit")] == 0 and events[("disk", "verification_failure")] == 0


def test_forgetting_a_segment_removes_its_entries(tmp_path, keyring):
    store = CountingStore(tmp_path / "remote", fsync=False)
    a, b = md(5, CHUNKS * CHUNK), md(6, CHUNKS * CHUNK)
    copy(store, keyring, a, original(5))
    copy(store, keyring, b, original(6))
    r = reader(store, keyring, tmp_path / "disk")
    read_all(r, a)
    read_all(r, b)
    assert len(cache_files(tmp_path / "disk")) == 2 * CHUNKS
    r.forget(LAYOUT.base(a))  # what DeleteSegment does after deleting the objects
    left = cache_files(tmp_path / "disk")
    assert len(left) == CHUNKS and len(r.disk) == CHUNKS and r.disk.size_bytes == sum(left.values())
    assert not (tmp_path / "disk" / disk_cache.segment_dir(LAYOUT.base(a))).exists()
    assert (tmp_path / "disk" / disk_cache.segment_dir(LAYOUT.base(b))).is_dir()


def test_files_are_0600_and_directories_0700_whatever_the_umask(tmp_path, keyring):
    store = CountingStore(tmp_path / "remote", fsync=False)
    m = md(7, CHUNKS * CHUNK)
    copy(store, keyring, m, original(7))
    old = os.umask(0)
    try:
        read_all(reader(store, keyring, tmp_path / "cache" / "disk"), m)
    finally:
        os.umask(old)
    root = tmp_path / "cache" / "disk"
    dirs = [root, root / disk_cache.TMP_DIR] + [p for p in root.iterdir() if p.name != disk_cache.TMP_DIR]
    assert len(dirs) == 3
    for d in dirs:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    files = cache_files(root)
    assert len(files) == CHUNKS
    for rel in files:
        assert stat.S_IMODE((root / rel).stat().st_mode) == 0o600, rel


def test_an_unusable_directory_turns_the_cache_off_and_fetches_go_on(tmp_path, keyring, caplog):
    store = CountingStore(tmp_path / "remote", fsync=False)
    m = md(8, CHUNKS * CHUNK)
    data = original(8)
    copy(store, keyring, m, data)
    (tmp_path / "a-file").write_bytes(b"not a directory")
    events = Events()
    with caplog.at_level(logging.WARNING):
        r = reader(store, keyring, tmp_path / "a-file" / "disk", events=events)
        assert read_all(r, m) == data
        assert read_all(r, m) == data
    assert r.disk is not None and not r.disk.enabled
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1 and "turned off" in warnings[0] and "a-file" in warnings[0]
    assert not any(e[0] == "disk" for e in events)


def test_a_full_disk_turns_the_cache_off_with_one_warning(tmp_path, keyring, caplog, monkeypatch):
    # A full disk cannot be produced without a small filesystem (root and a mount); the
    # write fails as it would: ENOSPC from the file write. This is the one fault injected.
    store = CountingStore(tmp_path / "remote", fsync=False)
    m = md(9, CHUNKS * CHUNK)
    data = original(9)
    copy(store, keyring, m, data)
    r = reader(store, keyring, tmp_path / "disk", chunk_cache=0)
    writes = 0

    def full_after_three(fd, buf):
        nonlocal writes
        writes += 1
        if writes > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        os.write(fd, buf)

    monkeypatch.setattr(disk_cache, "_write_all", full_after_three)
    with caplog.at_level(logging.WARNING):
        assert read_all(r, m) == data
        assert read_all(r, m) == data
    assert not r.disk.enabled
    warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1 and "disk full" in warnings[0]
    assert len(cache_files(tmp_path / "disk")) == 3  # what was written before; no temp file left
    assert os.listdir(tmp_path / "disk" / disk_cache.TMP_DIR) == []


def test_two_readers_sharing_a_directory_serve_correct_bytes(tmp_path, keyring):
    """Two sidecars on one directory: each writes whole files by rename and verifies what
    it reads; concurrent reads and writes of the same chunks give the right bytes."""
    store = CountingStore(tmp_path / "remote", fsync=False)
    m = md(10, CHUNKS * CHUNK)
    data = original(10)
    copy(store, keyring, m, data)
    sizes = stored_chunk_sizes(store, keyring, m)
    readers = [
        reader(store, keyring, tmp_path / "disk", capacity=sum(sizes) // 2, chunk_cache=0) for _ in range(2)
    ]
    errors = []

    def work(r, seed):
        import random

        rnd = random.Random(seed)
        for _ in range(60):
            start = rnd.randrange(len(data))
            end = min(len(data) - 1, start + rnd.randrange(3 * CHUNK))
            if b"".join(r.read(r.open(m), start, end)) != data[start : end + 1]:
                errors.append((start, end))

    threads = [threading.Thread(target=work, args=(readers[i % 2], i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    restarted = reader(store, keyring, tmp_path / "disk", capacity=sum(sizes))
    assert read_all(restarted, m) == data
