"""docs/operations.md against the code: every metric, sidecar configuration key, RSM__
variable, shim key and relative link it names exists, and its metrics table lists every
metric of rsm_sidecar/service/metrics.py with the right type and labels."""

from __future__ import annotations

import re
from pathlib import Path

import prometheus_client as prom
import pytest

from rsm_sidecar.config import ENV_PREFIX, Config, all_keys
from rsm_sidecar.service.metrics import Metrics

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "operations.md"
#: names in the doc that start like a sidecar section but are not sidecar keys: Kafka
#: broker/topic/consumer settings and a file name
NOT_SIDECAR_KEYS = {
    "log.retention.check.interval.ms",
    "log.initial.task.delay.ms",
    "log.segment.bytes",
    "fetch.max.wait.ms",
    "segment.bytes",
    "segment.ms",
    "server.properties",
}
SAMPLE_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")


@pytest.fixture(scope="module")
def text() -> str:
    return DOC.read_text()


def _code_spans(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks are checked separately
    return re.findall(r"`([^`\n]+)`", text)


def _tokens(spans: list[str]) -> set[str]:
    out = set()
    for span in spans:
        for tok in re.split(r"[\s,=()/]+", span):
            tok = tok.strip(".:;")
            if re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z0-9_<>*-]+)+", tok):
                out.add(tok)
    return out


def _families() -> dict[str, tuple[str, set[str]]]:
    """name -> (type, label names) of every metric the sidecar exports."""
    m = Metrics()
    for attr in vars(m).values():
        if isinstance(attr, prom.metrics.MetricWrapperBase) and attr._labelnames:
            attr.labels(*["x"] * len(attr._labelnames))

    class Cache:
        size_bytes = 1

    class Store:
        name = "s3"
        requests = {"GET": 1}

    class Journal:
        def pending(self):
            return []

    m.track_cache("chunk", Cache())
    m.track_store(Store())
    m.track_journal(Journal())
    out = {}
    for fam in m.registry.collect():
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        out[fam.name] = (fam.type, labels)
    return out


def test_metrics_named_in_the_doc_exist(text):
    families = _families()
    names = set(families) | {f + s for f in families for s in SAMPLE_SUFFIXES}
    mentioned = {m for m in re.findall(r"\brsm_[a-z_]+", text) if not m.startswith("rsm_sidecar")}
    assert mentioned, "no metric mentioned"
    assert mentioned <= names, f"not exported by the sidecar: {sorted(mentioned - names)}"


def test_metrics_table_lists_every_metric_with_its_type_and_labels(text):
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `(rsm_[a-z_]+)` \| (\w+) \| ([^|]*) \|", line)
        if m:
            labels = set(re.findall(r"`([a-z_]+)`", m.group(3)))
            rows[m.group(1)] = (m.group(2), labels)
    families = _families()
    assert set(rows) == set(families), (
        f"missing: {set(families) - set(rows)}, unknown: {set(rows) - set(families)}"
    )
    for name, (typ, labels) in families.items():
        assert rows[name] == (typ, labels), name


def test_sidecar_configuration_keys_named_in_the_doc_exist(text):
    keys = all_keys()
    paths = {k.path for k in keys}
    sections = {p.split(".")[0] for p in paths}
    checked = 0
    # (an error message quoted with a deliberately misspelt key is not a key)
    spans = [s for s in _code_spans(text) if "unknown configuration key" not in s]
    for tok in sorted(_tokens(spans)):
        if tok.split(".")[0] not in sections or tok in NOT_SIDECAR_KEYS or "*" in tok:
            continue
        checked += 1
        assert tok in paths, f"not a sidecar configuration key: {tok}"
    assert checked > 40


def test_rsm_environment_variables_in_the_doc_name_keys(text):
    cfg = Config({"storage": {"local": {"root": "/tmp"}}}, environ={})
    names = set(re.findall(r"\bRSM__[A-Za-z0-9_\-]+", text))
    assert names
    for name in names:
        cfg._find(cfg._env_to_path(name), from_env=True)
        assert name.startswith(ENV_PREFIX)


def test_shim_keys_named_in_the_doc_exist(text):
    """rsm.config.* keys outside the Aiven migration section are the shim's (docs/shim.md)."""
    shim = (REPO / "docs" / "shim.md").read_text()
    shim_keys = set(re.findall(r"^\| `([a-z.]+)` \|", shim, flags=re.M))
    assert "sidecar.target" in shim_keys
    before, _, rest = text.partition("## 7. Migrating")
    _, _, after = rest.partition("## 8. Troubleshooting")
    for tok in _tokens(_code_spans(before + after)):
        if tok.startswith("rsm.config.") and "*" not in tok and "<" not in tok:
            assert tok.removeprefix("rsm.config.") in shim_keys, f"not a shim key: {tok}"


def test_relative_links_resolve(text):
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (DOC.parent / target).exists(), target


def test_config_examples_in_the_doc_are_the_shipped_ones(text):
    """The broker block quoted in §2.1 is config/broker-tiered.properties (placeholders filled)."""
    block = re.search(r"```properties\n(.*?)```", text, flags=re.S).group(1)
    quoted = dict(line.split("=", 1) for line in block.splitlines() if line and not line.startswith("#"))
    shipped = {}
    for line in (REPO / "config" / "broker-tiered.properties").read_text().splitlines():
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            shipped[k] = v
    assert quoted.keys() == shipped.keys()
    for k, v in shipped.items():
        if "${" not in v:
            assert quoted[k] == v, k
