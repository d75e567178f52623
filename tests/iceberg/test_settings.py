"""The ``[iceberg]`` keys: declared once (``JobSettings`` and its groups), read from the file and
the environment, the catalog's keys arriving as one object that configures the Spark and the
PyIceberg side alike."""

from __future__ import annotations

import pytest

from rsm_sidecar.config import Config
from rsm_sidecar.errors import ConfigError
from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
from rsm_sidecar.iceberg.settings import CONFIG_KEYS, CatalogSettings, JobSettings

STORAGE = {"backend": "local", "local": {"root": "/r"}}


def _settings(iceberg: dict, environ: dict[str, str] | None = None) -> JobSettings:
    return JobSettings.from_config(Config({"storage": STORAGE, "iceberg": iceberg}, environ=environ or {}))


def test_every_field_is_a_documented_key_and_every_key_is_read():
    paths = [k.path for k in CONFIG_KEYS]
    assert len(paths) == len(set(paths))
    for must in (
        "iceberg.catalog.type",
        "iceberg.catalog.local.root",
        "iceberg.catalog.rest.uri",
        "iceberg.warehouse",
        "iceberg.s3.path_style_access",
        "iceberg.gcs.no_auth",
        "iceberg.key.descriptor_set",
        "iceberg.value.unframed",
        "iceberg.spark.scratch_dir",
        "iceberg.kafka.client.<name>",
        "iceberg.follow.metrics_listen",
    ):
        assert must in paths
    # one class serves both sides; each side's docs name its own keys
    docs = {k.path: k.doc for k in CONFIG_KEYS}
    assert "`iceberg.value.message`" in docs["iceberg.value.descriptor_set"]
    assert "`iceberg.key.message`" in docs["iceberg.key.descriptor_set"]
    assert "the `val` struct" in docs["iceberg.value.raw"]
    # a non-default value of every key reaches the settings
    s = _settings(
        {
            "catalog": {"type": "rest", "name": "c", "rest": {"uri": "http://h:8181", "token": "t"}},
            "warehouse": "s3://b/w",
            "s3": {"endpoint": "http://s3:8333", "path_style_access": True},
            "gcs": {"project_id": "p"},
            "value": {"subject": "v-subject", "unframed": "latest"},
            "registry": {"url": "http://reg:8081", "bearer_token": "b", "bearer_logical_cluster": "lc"},
            "proto": {"uint32_as_long": True},
            "spark": {"master": "spark://m:7077", "scratch_dir": "/scratch"},
            "read": {"prefetch_bytes": "1MiB"},
            "kafka": {"bootstrap_servers": "k:9092", "client": {"security_protocol": "SSL"}},
            "follow": {"interval": "1m", "drop_deleted_offsets": False},
        }
    )
    assert (s.catalog.type, s.catalog.name, s.catalog.rest.uri, s.catalog.rest.token) == (
        "rest",
        "c",
        "http://h:8181",
        "t",
    )
    assert (s.catalog.warehouse, s.catalog.s3.endpoint, s.catalog.s3.path_style_access) == (
        "s3://b/w",
        "http://s3:8333",
        True,
    )
    assert s.catalog.gcs.project_id == "p" and s.catalog.s3.region == "us-east-1"
    assert (s.value.subject, s.value.unframed, s.key.unframed) == ("v-subject", "latest", "error")
    assert s.registry.client_config() == {
        "url": "http://reg:8081",
        "timeout": 10.0,
        "bearer.auth.credentials.source": "STATIC_TOKEN",
        "bearer.auth.token": "b",
        "bearer.auth.logical.cluster": "lc",
    }
    assert s.proto.uint32_as_long and s.proto.well_known_types
    assert s.spark.master == "spark://m:7077" and str(s.spark.scratch_path) == "/scratch"
    assert s.read.prefetch_bytes == 1 << 20
    assert s.kafka.bootstrap_servers == "k:9092" and s.kafka.client == {"security_protocol": "SSL"}
    assert s.follow.interval == 60.0 and s.follow.drop_deleted_offsets is False
    assert repr(s.catalog.rest) == "RestCatalogSettings(uri='http://h:8181')"  # no secret in logs


def test_a_rest_catalog_without_its_uri_is_refused_naming_the_key():
    with pytest.raises(
        ConfigError, match=r"iceberg.catalog.rest.uri: missing when iceberg.catalog.type = 'rest'"
    ):
        _settings({"catalog": {"type": "rest"}})


def test_environment_overrides_reach_the_catalog_object():
    s = _settings(
        {"catalog": {"local": {"root": "/file-root"}}},
        {"RSM__ICEBERG__CATALOG__LOCAL__ROOT": "/env-root", "RSM__ICEBERG__CATALOG__NAME": "envcat"},
    )
    spec = CatalogSpec(s.catalog)
    assert spec.local is not None and str(spec.local.root) == "/env-root"
    assert (
        spec.spark_conf()["spark.sql.catalog.envcat.uri"]
        == "jdbc:sqlite:/env-root/catalog.db?journal_mode=WAL"
    )


def test_the_catalog_settings_configure_spark_and_pyiceberg_alike():
    """An ``s3://`` warehouse of a REST catalog: the same endpoint, region, credentials and
    addressing on both sides, read from the one ``CatalogSettings``."""
    cfg = Config(
        {
            "storage": STORAGE,
            "iceberg": {
                "catalog": {"type": "rest", "name": "lake", "rest": {"uri": "http://rest:8181"}},
                "warehouse": "s3://bucket/wh",
                "s3": {
                    "endpoint": "http://s3:8333",
                    "access_key_id": "ak",
                    "secret_access_key": "sk",
                    "path_style_access": True,
                },
            },
        },
        environ={},
    )
    spec = CatalogSpec(CatalogSettings.from_config(cfg))
    assert spec.local is None and spec.cloud() == ("aws",)
    conf = spec.spark_conf()
    p = "spark.sql.catalog.lake"
    assert conf[f"{p}.type"] == "rest" and conf[f"{p}.uri"] == "http://rest:8181"
    assert conf[f"{p}.warehouse"] == "s3://bucket/wh"
    assert (conf[f"{p}.s3.endpoint"], conf[f"{p}.client.region"]) == ("http://s3:8333", "us-east-1")
    assert (conf[f"{p}.s3.access-key-id"], conf[f"{p}.s3.secret-access-key"]) == ("ak", "sk")
    assert conf[f"{p}.s3.path-style-access"] == "true"
    assert spec.pyiceberg_properties() == {
        "s3.region": "us-east-1",
        "s3.endpoint": "http://s3:8333",
        "s3.access-key-id": "ak",
        "s3.secret-access-key": "sk",
        "s3.force-virtual-addressing": "false",
    }
    assert "sk" not in repr(spec)


def test_side_settings_that_cannot_apply_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="set iceberg.registry.url"):
        _settings({"value": {"unframed": "latest"}})
    with pytest.raises(ConfigError, match=r"iceberg.key.message: required with iceberg.key.descriptor_set"):
        _settings({"key": {"descriptor_set": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"iceberg.value.descriptor_set: .* is not a file"):
        _settings({"value": {"descriptor_set": str(tmp_path / "nope.pb"), "message": "a.B"}})
    with pytest.raises(
        ConfigError, match=r"iceberg.value.raw and iceberg.value.json_infer are different ways"
    ):
        _settings({"value": {"raw": True, "json_infer": 100}})
    with pytest.raises(ConfigError, match=r"iceberg.key.json_schema: .* is not a file"):
        _settings({"key": {"json_schema": str(tmp_path / "nope.json")}})
    with pytest.raises(ConfigError, match="it cannot go with iceberg.value.json_infer"):
        _settings({"value": {"json_infer": 10, "unframed": "latest"}, "registry": {"url": "http://r"}})
    with pytest.raises(ConfigError, match="iceberg.registry.bearer_logical_cluster: required"):
        _settings({"registry": {"url": "http://r", "bearer_token": "t"}})


def test_the_embedded_catalog_defaults_to_the_users_data_directory_not_the_checkout(tmp_path, monkeypatch):
    """Unset ``iceberg.catalog.local.root``: ``$RSM_ICEBERG_DIR``, else the XDG data directory; never
    a path inside the source tree that rsm-sidecar happens to be installed from."""
    monkeypatch.delenv("RSM_ICEBERG_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    spec = CatalogSpec(CatalogSettings())
    assert spec.local is not None and spec.local.root == (tmp_path / "data" / "rsm-sidecar" / "iceberg")
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    spec = CatalogSpec(CatalogSettings())
    assert spec.local is not None
    assert spec.local.root == tmp_path / "home" / ".local" / "share" / "rsm-sidecar" / "iceberg"
    monkeypatch.setenv("RSM_ICEBERG_DIR", str(tmp_path / "env"))
    spec = CatalogSpec(CatalogSettings())
    assert spec.local is not None and spec.local.root == tmp_path / "env"
    spec = CatalogSpec(_settings({"catalog": {"local": {"root": str(tmp_path / "explicit")}}}).catalog)
    assert spec.local is not None and spec.local.root == tmp_path / "explicit"
