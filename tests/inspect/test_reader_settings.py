"""`inspect` (and the Iceberg job's executors) read segments with the sidecar's own reader
settings: only the cache and read-ahead sizes are theirs. A reader setting added to the
sidecar (a field of ``ReaderSettings``) reaches them without another change, and one
that does not fails here."""

from __future__ import annotations

import dataclasses

import pytest

from rsm_sidecar.config import Config, all_keys
from rsm_sidecar.inspect.context import InspectContext, reader_settings
from rsm_sidecar.segment.settings import CACHE_FIELDS, ReaderSettings


def _keys_read_by_the_sidecar_reader() -> list[str]:
    """The keys ``ReaderSettings`` declares: what ``from_config`` reads."""
    return [k.path for k in ReaderSettings.keys()]


def _other_than_default(path: str):
    key = next(k for k in all_keys() if k.path == path)
    if key.type == "bool":
        return not key.default
    if key.type in ("size", "int"):
        return int(key.default or 0) * 2 + 4096
    if key.type == "seconds":
        return float(key.default or 0) * 2 + 1
    if key.type in ("str", "path"):
        return "/elsewhere/reader-settings-test"
    raise AssertionError(f"{path}: no non-default value for a {key.type} key in this test")


def _nested(values: dict[str, object]) -> dict:
    out: dict = {"storage": {"local": {"root": "/unused"}}}
    for path, value in values.items():
        *sections, leaf = path.split(".")
        node = out
        for s in sections:
            node = node.setdefault(s, {})
        node[leaf] = value
    return out


def test_every_reader_setting_of_the_sidecar_reaches_inspect():
    read = _keys_read_by_the_sidecar_reader()
    assert "fetch.accept_unauthenticated_segments" in read and "fetch.max_range_bytes" in read
    cfg = Config(_nested({path: _other_than_default(path) for path in read}), environ={})
    sidecar = ReaderSettings.from_config(cfg)
    defaults = ReaderSettings.from_config(Config(_nested({}), environ={}))
    for ours in (reader_settings(cfg), InspectContext(cfg).reader_settings):
        for f in dataclasses.fields(ReaderSettings):
            if f.name in CACHE_FIELDS:
                continue
            # a reading setting: the configuration reached the sidecar's reader, and inspect's
            assert getattr(sidecar, f.name) != getattr(defaults, f.name), f.name
            assert getattr(ours, f.name) == getattr(sidecar, f.name), f.name


def test_only_cache_sizes_are_a_readers_own_choice():
    assert CACHE_FIELDS < {f.name for f in dataclasses.fields(ReaderSettings)}
    assert all("cache" in name or "prefetch" in name for name in CACHE_FIELDS), CACHE_FIELDS
    with pytest.raises(TypeError, match="accept_unauthenticated"):
        ReaderSettings().with_caches(accept_unauthenticated=True)
    # inspect keeps memory to one ranged GET: no cache, no read-ahead, no disk cache
    ours = reader_settings(Config(_nested({"fetch.disk_cache.path": "/var/cache/x"}), environ={}))
    assert (ours.chunk_cache_bytes, ours.index_cache_bytes, ours.prefetch_bytes, ours.disk_cache_path) == (
        0,
        0,
        0,
        "",
    )


def test_the_iceberg_executors_read_with_the_sidecar_reader_settings():
    from rsm_sidecar.iceberg.reading.segment_tasks import ExecutorContext, StorageParams

    values = _nested(
        {"fetch.accept_unauthenticated_segments": True, "fetch.max_range_bytes": 3 * 1024 * 1024}
    )
    ctx = ExecutorContext(StorageParams(values, {}))
    try:
        assert ctx.reader_settings.accept_unauthenticated
        assert ctx.reader_settings.max_range_bytes == 3 * 1024 * 1024
    finally:
        ctx.close()
