"""`rsm-sidecar config check` checks what `serve` would meet at start-up without touching storage:
the files the configuration names (key files, certificates) and the directories it needs, each
problem on stderr naming the key and the path, exit 1 when there is one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rsm_sidecar.cli.main import main

REPO = Path(__file__).resolve().parents[1]


def _config(tmp_path: Path, root: Path, public: str, private: str, encryption: bool = True) -> Path:
    path = tmp_path / "sidecar.toml"
    path.write_text(
        f'[storage]\nbackend = "local"\n[storage.local]\nroot = "{root}"\n'
        f'[encryption]\nenabled = {"true" if encryption else "false"}\nactive_key_id = "k1"\n'
        f'[encryption.keys.k1]\npublic_key_file = "{public}"\nprivate_key_file = "{private}"\n'
    )
    return path


def _check(config: Path, capsys) -> tuple[int, dict, list[str]]:
    code = main(["config", "check", "--config", str(config)])
    out, err = capsys.readouterr()
    return code, json.loads(out), err.splitlines()


def test_a_complete_configuration_passes(tmp_path, rsa_keys, capsys):
    root = tmp_path / "remote"
    root.mkdir()
    code, values, err = _check(_config(tmp_path, root, *rsa_keys["A"]), capsys)
    assert (code, err) == (0, [])
    assert values["storage.local.root"] == str(root)


def test_missing_key_files_and_an_uncreatable_root_are_each_named(tmp_path, capsys):
    """The shipped example's paths on a machine without them (what a newcomer runs first): one
    line per problem, exit 1. The root's parent is a file here, which no user can create in."""
    (tmp_path / "a-file").write_text("")
    root = tmp_path / "a-file" / "remote"
    public, private = tmp_path / "keys" / "k1.public.pem", tmp_path / "keys" / "k1.private.pem"
    code, _, err = _check(_config(tmp_path, root, str(public), str(private)), capsys)
    assert code == 1
    assert err == [
        f"rsm-sidecar: error: encryption.keys.k1.private_key_file: {private} does not exist",
        f"rsm-sidecar: error: encryption.keys.k1.public_key_file: {public} does not exist",
        f"rsm-sidecar: error: storage.local.root: {root} does not exist, and this user cannot create it "
        f"(its parent {tmp_path / 'a-file'} is not a writable directory)",
    ]


def test_a_root_the_sidecar_will_create_is_a_note(tmp_path, rsa_keys, capsys):
    """`serve` creates a missing root (its start-up write check), so a creatable one is no error."""
    root = tmp_path / "not-yet" / "remote"
    code, _, err = _check(_config(tmp_path, root, *rsa_keys["A"]), capsys)
    assert code == 0
    assert err == [
        f"rsm-sidecar: note: storage.local.root: {root} does not exist yet; the sidecar creates it"
    ]


def test_key_files_are_not_read_while_encryption_is_off(tmp_path, capsys):
    root = tmp_path / "remote"
    root.mkdir()
    code, _, err = _check(
        _config(tmp_path, root, "/nowhere/p.pem", "/nowhere/k.pem", encryption=False), capsys
    )
    assert (code, err) == (0, [])


def test_key_files_that_are_not_a_pair_are_refused_as_serve_refuses_them(tmp_path, rsa_keys, capsys):
    root = tmp_path / "remote"
    root.mkdir()
    code, _, err = _check(_config(tmp_path, root, rsa_keys["A"][0], rsa_keys["B"][1]), capsys)
    assert code == 1
    assert err == ["rsm-sidecar: error: encryption.keys.k1: the public and private key files are not a pair"]


def test_the_shipped_example_says_what_it_lacks(tmp_path, capsys):
    """config/sidecar.toml names /etc/rsm-sidecar/keys/... for its keys: on a machine without
    them the check names both files (and passes once they are there)."""
    config = tmp_path / "sidecar.toml"
    shutil.copy(REPO / "config" / "sidecar.toml", config)
    keys = Path("/etc/rsm-sidecar/keys")
    if keys.exists():  # pragma: no cover - a machine set up as the docs say
        return
    code, _, err = _check(config, capsys)
    assert code == 1
    public = keys / "demo-key-1.public.pem"
    assert f"rsm-sidecar: error: encryption.keys.demo-key-1.public_key_file: {public} does not exist" in err
