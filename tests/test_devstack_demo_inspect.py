"""After `make demo` the summary says how to look at what it stored: an `rsm-sidecar inspect`
command on a configuration file the demo writes from its sidecar's own settings (config/sidecar.toml
plus the launcher's RSM__ overrides), which works once the demo's sidecar is gone.

Checked here on a store of the demo's shape (the launcher's real settings and demo key, segments
written by the sidecar's copy code) without running the demo itself; tests/e2e/test_demo.py runs
the printed command after a real `make demo`."""

from __future__ import annotations

import json
import os

from devstack.cli import VENV_BIN, write_inspect_config
from devstack.stack import LocalStack
from rsm_sidecar.cli.main import main
from rsm_sidecar.config import Config
from rsm_sidecar.format.keys import KeyLayout
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch
from rsm_sidecar.segment.tiered_writer import TieredWriter
from rsm_sidecar.storage.local import LocalObjectStore
from rsm_sidecar.transform.keyring import Keyring


def test_the_printed_inspect_command_lists_and_verifies_the_demos_store(tmp_path, capsys, monkeypatch):
    workdir = tmp_path / "demo"
    config_file, environ = LocalStack(workdir).sidecar_config_env()
    cfg = Config.load(config_file, environ=environ)
    store = LocalObjectStore(cfg["storage.local.root"], fsync=False)
    writer = TieredWriter(
        store, KeyLayout(cfg["storage.key_prefix"]), Keyring.from_config(cfg), "demo-orders"
    )
    for start in (0, 3):
        batch = build_batch(
            [SimpleRecord(b"k%d" % i, b"v%d" % i, 1000 + i) for i in range(3)], base_offset=start
        )
        writer.write_segment(0, [batch])
    writer.close()

    command = write_inspect_config(config_file, environ, workdir / "inspect.toml")
    program, verb, listing, flag, path = command.split()
    assert (program, verb, listing, flag) == (f"{VENV_BIN}/rsm-sidecar", "inspect", "ls", "-c")
    monkeypatch.chdir(tmp_path)  # no RSM__ variables, another directory: the file alone says it all
    for name in [n for n in os.environ if n.startswith("RSM__")]:
        monkeypatch.delenv(name)
    assert main(["inspect", "ls", "-c", path, "--json", "-q"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(s["topic"], s["start_offset"]) for s in listed["segments"]] == [
        ("demo-orders", 0),
        ("demo-orders", 3),
    ]
    assert main(["inspect", "verify", "-c", path, "-q"]) == 0  # the demo's key files, named in the file
    assert "2 segments verified: 2 ok" in capsys.readouterr().out
