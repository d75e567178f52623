"""`inspect` on a bucket written by Aiven's plugin (tests/aiven_format.py: every compression x
encryption x chunk size) with the configuration a migration uses
(``fetch.accept_unauthenticated_segments = true``, Aiven's prefix and key ids): `cat` gives
every segment's original bytes, `verify` passes them all, `ls` lists them; without the setting
they are refused, naming it. The commands run in-process through the CLI's entry point."""

from __future__ import annotations

import io
import json

import pytest

from rsm_sidecar.cli.main import main
from rsm_sidecar.inspect import cat
from rsm_sidecar.inspect.context import InspectContext
from rsm_sidecar.inspect.locate import locate
from rsm_sidecar.storage.local import LocalObjectStore
from tests.aiven_fixtures import aiven_keys, aiven_ring, sidecar_toml, write_aiven_bucket

__all__ = ["aiven_keys", "aiven_ring"]  # fixtures


@pytest.fixture(scope="module")
def bucket(tmp_path_factory, aiven_ring):
    root = tmp_path_factory.mktemp("aiven-bucket")
    return root, write_aiven_bucket(LocalObjectStore(root, fsync=False), aiven_ring)


def _inspect(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["inspect", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cat_and_verify_read_every_aiven_segment_under_the_migration_setting(
    bucket, aiven_keys, tmp_path, capsys
):
    root, written = bucket
    config = sidecar_toml(tmp_path / "sidecar.toml", root, aiven_keys)
    # the command for one segment of each encryption (key id loads cost 0.4 s a command) ...
    for seg, settings in {s.key_id: (seg, s) for seg, s in written}.values():
        out = tmp_path / f"{seg.segment_id}.log"
        code, _, err = _inspect(capsys, "cat", "-c", config, "-o", str(out), "-q", "--", seg.segment_id)
        assert code == 0, (settings, err)
        assert out.read_bytes() == seg.log, settings
    # ... and what it runs, with the context it builds from that file, for every segment
    ctx = InspectContext.load(config)
    try:
        for seg, settings in written:
            out_buffer = io.BytesIO()
            cat.run(ctx, locate(ctx, seg.segment_id), out_buffer)
            assert out_buffer.getvalue() == seg.log, settings
    finally:
        ctx.close()
    code, out, err = _inspect(capsys, "verify", "-c", config, "--json", "-q")
    doc = json.loads(out)
    assert code == 0, (err, [s for s in doc["segments"] if s["status"] != "ok"])
    assert doc["summary"]["segments"] == doc["summary"]["ok"] == len(written)
    by_id = {s["base"][-22:]: s for s in doc["segments"]}
    for seg, settings in written:
        report = by_id[seg.segment_id]
        assert (report["start_offset"], report["end_offset"], report["key_id"]) == (
            seg.start_offset,
            seg.end_offset,
            settings.key_id,
        )
    code, out, _ = _inspect(capsys, "ls", "-c", config, "--json", "-q")
    assert code == 0 and len(json.loads(out)["segments"]) == len(written)


def test_without_the_migration_setting_inspect_refuses_them_naming_it(bucket, aiven_keys, tmp_path, capsys):
    root, written = bucket
    config = sidecar_toml(tmp_path / "sidecar.toml", root, aiven_keys, accept=False)
    seg, _ = written[0]
    code, _, err = _inspect(
        capsys, "cat", "-c", config, "-o", str(tmp_path / "x"), "-q", "--", seg.segment_id
    )
    assert (
        code == 1
        and "fetch.accept_unauthenticated_segments" in err
        and "no rsm-sidecar integrity block" in err
    )
    code, out, _ = _inspect(capsys, "verify", "-c", config, "--json", "-q")
    doc = json.loads(out)
    assert code == 1 and doc["summary"]["failed"] == len(written)
    assert all("fetch.accept_unauthenticated_segments" in " ".join(s["problems"]) for s in doc["segments"])
