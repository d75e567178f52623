"""Configuration: validation messages, environment overrides, and docs/configuration.md
kept equal to the keys the code declares."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from rsm_sidecar.config import Config, all_keys, docs_markdown
from rsm_sidecar.errors import ConfigError
from tests.helpers import REPO

BASE = {"storage": {"local": {"root": "/tmp/remote"}}}

BEGIN, END = "<!-- BEGIN GENERATED: rsm-sidecar config docs -->", "<!-- END GENERATED -->"


def test_docs_configuration_md_matches_the_code():
    text = (REPO / "docs" / "configuration.md").read_text()
    assert BEGIN in text and END in text, "docs/configuration.md lost its generated section markers"
    generated = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert generated == docs_markdown().strip(), (
        "docs/configuration.md is out of date: run `make docs` (rsm-sidecar config docs) and commit"
    )
    documented = set(re.findall(r"^\| `([^`]+)` \|", generated, re.M))
    assert documented == {k.path for k in all_keys()}


def test_the_reference_has_a_table_per_toml_table():
    """One section per top-level table, and one per storage backend's table: ``[cache]`` holds
    its four keys, ``[storage]`` its own three, ``[storage.s3]`` the S3 backend's."""
    sections = re.findall(r"^### `\[([^\]]+)\]`$", docs_markdown(), re.M)
    assert len(sections) == len(set(sections))
    assert {"server", "cache", "fetch", "storage", "storage.local", "storage.s3", "iceberg"} <= set(sections)
    assert not [s for s in sections if s.count(".") > 1 or (s.count(".") and not s.startswith("storage."))]


def test_every_key_has_a_meaningful_doc():
    for k in all_keys():
        assert len(k.doc) > 15, k.path


def test_shipped_sidecar_config_is_valid():
    cfg = Config.load(REPO / "config" / "sidecar.toml", environ={})
    assert cfg["storage.backend"] == "local"


@pytest.mark.parametrize(
    "values, message",
    [
        ({"segment": {"chunk_size": 100}}, "segment.chunk_size: 100 is below the minimum 1024"),
        ({"segment": {"chunk_size": "4 lots"}}, "segment.chunk_size: expected a size in bytes"),
        (
            {"storage": {"backend": "ftp", "local": {"root": "/x"}}},
            "storage.backend: 'ftp' is not allowed; allowed: local, s3, gcs, azure",
        ),
        (
            {"storage": {"local": {"rot": "/x"}}},
            "storage.local.rot: unknown configuration key in <dict> (did you mean storage.local.root?)",
        ),
        ({"storage": {"backend": "local"}}, "storage.local.root: missing when storage.backend = 'local'"),
        ({"copy": {"parallelism": "two"}}, "copy.parallelism: expected an integer, got 'two'"),
        ({"segment": {"compression": "yes"}}, "segment.compression: expected true or false, got 'yes'"),
        ({"log": {"level": "LOUD"}}, "log.level: 'LOUD' is not allowed"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(values, message):
    merged = {**BASE, **values}
    if "storage" in values:
        merged["storage"] = values["storage"]
    with pytest.raises(ConfigError) as e:
        Config(merged, environ={})
    assert message in str(e.value)


def test_environment_overrides_the_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[segment]\nchunk_size = "1MiB"\n[storage.local]\nroot = "/a"\n')
    cfg = Config.load(
        f,
        environ={
            "RSM__SEGMENT__CHUNK_SIZE": "2MiB",
            "RSM__STORAGE__LOCAL__FSYNC": "false",
            "RSM__ENCRYPTION__KEYS__Key-1__PUBLIC_KEY_FILE": "/k.pem",
        },
    )
    assert cfg["segment.chunk_size"] == 2 * 1024 * 1024
    assert cfg["storage.local.fsync"] is False
    assert cfg.family("encryption.keys") == {"Key-1": {"public_key_file": "/k.pem"}}
    with pytest.raises(ConfigError, match="RSM__SEGMENT__CHUNK_SIZ"):
        Config.load(f, environ={"RSM__SEGMENT__CHUNK_SIZ": "1"})


def test_missing_or_invalid_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        Config.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[segment\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.load(bad)


def test_redacted_hides_secrets():
    secret_keys = [k for k in all_keys() if k.secret]
    for k in secret_keys:
        if "<" not in k.path and k.type == "str":
            values = _nest(k.path, "s3cr3t")
            values.setdefault("storage", {}).setdefault("local", {})["root"] = "/tmp/remote"
            cfg = Config(values, environ={})
            assert "s3cr3t" not in str(cfg.redacted())


def _nest(path: str, value):
    out: dict = {}
    cur = out
    parts = path.split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


# -- light settings, lazy cloud SDKs ----------------------------------------------------------
HEAVY_MODULES = ("boto3", "botocore", "google.cloud.storage", "azure", "pyspark", "pyiceberg")


def _run_python(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter (nothing imported yet) and return the JSON it prints."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_local_config_and_inspect_ls_import_no_cloud_sdk_spark_or_iceberg(tmp_path):
    from benchmarks.inspect_startup import make_store

    config = make_store(tmp_path, segments=2)
    code = f"""
import contextlib, io, json, sys
from rsm_sidecar.config import Config
Config.load(sys.argv[1], environ={{}})
after_config = sorted(sys.modules)
from rsm_sidecar.cli.main import main
listing = io.StringIO()
with contextlib.redirect_stdout(listing):
    code = main(["inspect", "ls", "--quiet", "--json", "--config", sys.argv[1]])
heavy = {HEAVY_MODULES!r}
loaded = lambda names: sorted(m for m in names if any(m == h or m.startswith(h + ".") for h in heavy))
print(json.dumps({{"code": code, "listing": json.loads(listing.getvalue()),
                  "after_config": loaded(after_config), "after_ls": loaded(sys.modules)}}))
"""
    got = _run_python(code, str(config))
    assert got["code"] == 0
    assert got["listing"]["summary"]["segments"] == 2  # ls really read the store
    assert got["after_config"] == []
    assert got["after_ls"] == []


# Blocks the import of the given top-level modules, as if their package were not installed.
_BLOCK_IMPORTS = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED or name in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
"""


@pytest.mark.parametrize(
    "backend, blocked, needle",
    [
        (
            "s3",
            ("boto3",),
            "storage.backend = 's3' needs boto3, which is not installed (no module 'boto3'): "
            "pip install 'rsm-sidecar[s3]'",
        ),
        (
            "gcs",
            ("google.auth", "google.cloud"),
            "storage.backend = 'gcs' needs google-cloud-storage, which is "
            "not installed (no module 'google.auth'): pip install 'rsm-sidecar[gcs]'",
        ),
        (
            "azure",
            ("azure",),
            "storage.backend = 'azure' needs azure-storage-blob, which is "
            "not installed (no module 'azure'): pip install 'rsm-sidecar[azure]'",
        ),
    ],
)
def test_a_missing_cloud_sdk_is_an_error_naming_the_pip_extra(backend, blocked, needle):
    """The SDK's absence is simulated: a meta-path finder in a fresh interpreter refuses to
    import it (the test environment has every extra installed)."""
    code = f"""
import json
BLOCKED = {blocked!r}
{_BLOCK_IMPORTS}
from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.storage.factory import open_store
table = {{"container": "c01", "account_name": "acct"}} if "{backend}" == "azure" else {{"bucket": "b"}}
cfg = Config({{"storage": {{"backend": "{backend}", "{backend}": table}}}}, environ={{}})
try:
    open_store(cfg)
    print(json.dumps({{"error": None}}))
except ConfigError as e:
    print(json.dumps({{"error": str(e)}}))
"""
    got = _run_python(code)
    assert got["error"] == needle


def test_the_iceberg_job_reads_the_file_as_the_sidecar_does(tmp_path):
    from rsm_sidecar.iceberg.job import load_config

    with pytest.raises(ConfigError, match="configuration file not found: .*nope.toml"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[segment\n")
    with pytest.raises(ConfigError, match="bad.toml is not valid TOML"):
        load_config(bad)
    good = tmp_path / "good.toml"
    good.write_text('[storage.local]\nroot = "/r"\n[fetch]\nidle_timeout_seconds = "1h30m"\n')
    cfg, _ = load_config(good, environ={})
    assert cfg["fetch.idle_timeout_seconds"] == 5400
