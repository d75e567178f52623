"""Aiven-written segments (tests/aiven_format.py) through a real sidecar with
``fetch.accept_unauthenticated_segments`` off: refused before `inspect seal` (DATA_LOSS naming the
setting), served byte for byte after it (FetchSegment and FetchIndex): encrypted ones by a sidecar
with Aiven's key ids, plaintext ones by a sidecar without encryption, which one with encryption
enabled still refuses."""

from __future__ import annotations

import grpc
import pytest

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from rsm_sidecar.cli.main import main
from rsm_sidecar.storage.local import LocalObjectStore
from tests.aiven_fixtures import PREFIX, aiven_keys, aiven_ring, sidecar_toml, write_aiven_bucket
from tests.service.rsm_client import metadata

__all__ = ["aiven_keys", "aiven_ring"]  # fixtures
INDEX_TYPES = {pb.OFFSET: "offset", pb.TIMESTAMP: "timestamp", pb.PRODUCER_SNAPSHOT: "producerSnapshot"}


def _md(seg):
    return metadata(
        seg.segment_id,
        start=seg.start_offset,
        end=seg.end_offset,
        size=len(seg.log),
        topic=seg.topic,
        topic_id=seg.topic_id,
        partition=seg.partition,
    )


def _sidecar(start_sidecar, aiven_keys, encrypted: bool):
    overrides = {"storage__key_prefix": PREFIX, "fetch__accept_unauthenticated_segments": False}
    if encrypted:
        overrides.update(
            encryption__enabled=True,
            encryption__active_key_id="aiven-key-1",
            encryption__keys={
                k: {"public_key_file": p, "private_key_file": q} for k, (p, q) in aiven_keys.items()
            },
        )
    return start_sidecar(**overrides)


def _served(sc, seg) -> bool:
    """Whether the sidecar serves the segment, checking the bytes when it does."""
    try:
        data = sc.client.fetch(_md(seg))
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.DATA_LOSS and seg.segment_id in e.details(), e.details()
        return False
    assert data == seg.log
    for index_type, name in INDEX_TYPES.items():
        assert sc.client.index(_md(seg), index_type) == seg.indexes[name]
    return True


def test_sealed_aiven_segments_are_served_with_the_migration_setting_off(
    start_sidecar, tmp_path, aiven_keys, aiven_ring, capsys
):
    root = tmp_path / "remote"  # the sidecars' storage.local.root
    written = write_aiven_bucket(LocalObjectStore(root, fsync=False), aiven_ring)
    encrypted = [seg for seg, s in written if s.key_id is not None]
    plaintext = [seg for seg, s in written if s.key_id is None]

    before = _sidecar(start_sidecar, aiven_keys, encrypted=True)
    with pytest.raises(grpc.RpcError) as e:
        before.client.fetch(_md(encrypted[0]))
    assert e.value.code() == grpc.StatusCode.DATA_LOSS
    assert "fetch.accept_unauthenticated_segments" in e.value.details()

    config = sidecar_toml(tmp_path / "sidecar.toml", root, aiven_keys, accept=False)
    assert main(["inspect", "seal", "--all", "-c", config, "-q"]) == 0
    capsys.readouterr()

    with_keys = _sidecar(start_sidecar, aiven_keys, encrypted=True)
    without = _sidecar(start_sidecar, aiven_keys, encrypted=False)
    assert all(_served(with_keys, seg) for seg in encrypted)
    assert all(_served(without, seg) for seg in plaintext)
    # a sidecar with encryption enabled refuses every plaintext segment, sealed or not
    assert not any(_served(with_keys, seg) for seg in plaintext)
