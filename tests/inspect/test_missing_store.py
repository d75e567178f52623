"""Every `inspect` verb reads what a sidecar stored: a local root that does not exist is a wrong
path (a typo, the shipped example's /var/lib/... on a laptop), not an empty store, so the verbs
fail naming the path and the setting instead of reporting "0 segments"."""

from __future__ import annotations

import pytest

from rsm_sidecar.cli.main import EXIT_ERROR, main

VERBS = [
    ["ls"],
    ["du"],
    ["orphans"],
    ["verify"],
    ["show", "orders/0/0"],
    ["dump", "orders/0/0"],
    ["cat", "orders/0/0", "-o", "out.log"],
    ["rekey", "--all", "--dry-run"],
    ["seal", "--all", "--dry-run"],
]


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "sidecar.toml"
    path.write_text(f'[storage]\nbackend = "local"\n[storage.local]\nroot = "{tmp_path / "remote"}"\n')
    return path


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v[0])
def test_a_missing_local_root_is_an_error_naming_it(tmp_path, config, verb, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["inspect", *verb, "-c", str(config), "-q"])
    out, err = capsys.readouterr()
    assert code == EXIT_ERROR, out + err
    assert err.startswith(
        f"rsm-sidecar: error: storage.local.root: {tmp_path / 'remote'} does not exist, so there is "
        f"nothing to inspect"
    ), err
    assert "RSM__STORAGE__LOCAL__ROOT" in err
    assert out == ""
    assert not (tmp_path / "remote").exists()  # reading never creates it


def test_a_root_that_is_a_file_is_named_too(tmp_path, config, capsys):
    (tmp_path / "remote").write_text("")
    assert main(["inspect", "ls", "-c", str(config)]) == EXIT_ERROR
    assert f"storage.local.root: {tmp_path / 'remote'} is not a directory" in capsys.readouterr().err


def test_an_empty_root_is_an_empty_store(tmp_path, config, capsys):
    (tmp_path / "remote").mkdir()
    assert main(["inspect", "ls", "-c", str(config), "-q"]) == 0
    assert "0 segments" in capsys.readouterr().out
