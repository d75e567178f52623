"""The alert rules and the Grafana dashboard shipped with the chart
(deploy/helm/rsm-sidecar/files/): promtool checks and unit-tests the rules
(tests/deploy/alerts_test.yaml), the documented alerts of docs/operations.md §5 are the shipped
ones, and every dashboard query is valid PromQL. That every metric they name exists on a real
sidecar and a real broker is checked in tests/deploy/test_topology.py, which runs both."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import CHART, REPO

pytestmark = pytest.mark.integration

ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
#: Grafana's variables, replaced by what a Prometheus query needs to parse
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__range": "6h",
    "$job": ".*",
    "$instance": ".*",
    "$broker": ".*",
}


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            queries.append(re.fullmatch(r"label_values\((.*), \w+\)", var["definition"]).group(1))
    return queries


def metric_names(expr: str) -> set[str]:
    """The metrics a query selects: every name of the sidecar's (rsm_) and the broker's (kafka_)."""
    return set(re.findall(r"\b((?:rsm|kafka)_[a-z0-9_]+)\b", expr))


def test_promtool_checks_the_rules(promtool):
    proc = subprocess.run(
        [str(promtool), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


def test_promtool_unit_tests_every_alert(promtool):
    tests = Path(__file__).with_name("alerts_test.yaml")
    proc = subprocess.run(
        [str(promtool), "test", "rules", str(tests)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tests.parent,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = {
        t["alertname"] for case in yaml.safe_load(tests.read_text())["tests"] for t in case["alert_rule_test"]
    }
    fired = {
        t["alertname"]
        for case in yaml.safe_load(tests.read_text())["tests"]
        for t in case["alert_rule_test"]
        if t.get("exp_alerts")
    }
    names = {r["alert"] for r in rules()}
    assert names == tested == fired, f"alerts never tested firing: {names - fired}"


def test_promtool_catches_a_broken_rule(promtool, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(ALERTS.read_text().replace("> 0.25", "> > 0.25", 1))
    proc = subprocess.run(
        [str(promtool), "check", "rules", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and "RsmSlowRemoteReads" in proc.stdout + proc.stderr


def _documented_alerts() -> dict[str, str]:
    """The example rules of docs/operations.md §5: alert -> expr."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text[text.index("## 5. Metrics") : text.index("## 6.")]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return {r["alert"]: r["expr"] for r in yaml.safe_load(block)}


def _normal(expr: str) -> str:
    return " ".join(expr.split())


def test_the_documented_alerts_are_the_shipped_rules():
    documented = _documented_alerts()
    shipped = {r["alert"]: r["expr"] for r in rules()}
    assert len(documented) == 5
    for name, expr in documented.items():
        assert name in shipped, f"docs/operations.md §5 documents {name}; alerts.yaml lacks it"
        assert _normal(shipped[name]) == _normal(expr), name


def test_every_dashboard_query_is_valid_promql(promtool, tmp_path):
    """Every query, its Grafana variables replaced, parsed by Prometheus's own parser: as the
    recording rules of one rules file for `promtool check rules`."""

    def check(queries: list[str]) -> subprocess.CompletedProcess[str]:
        rules = [{"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(queries)]
        path = tmp_path / "dashboard-queries.yaml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
        return subprocess.run(
            [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )

    queries = []
    for query in dashboard_queries():
        for var, value in GRAFANA_VARIABLES.items():
            query = query.replace(var, value)
        queries.append(query)
    assert "$" not in " ".join(queries), "a Grafana variable this test does not replace"
    proc = check(queries)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(queries)} rules found" in proc.stdout
    broken = check(["sum by (op (rate(rsm_operations_total[5m]))"])
    assert broken.returncode != 0, "promtool accepts a broken query: this test checks nothing"


def test_dashboard_covers_what_operators_watch():
    """Copy/fetch rates and errors, remote-read latency, cache hit ratio, storage bytes, copy lag."""
    names = set().union(*(metric_names(q) for q in dashboard_queries()))
    assert {
        "rsm_operations_total",
        "rsm_fetch_first_byte_seconds_bucket",
        "rsm_bytes_total",
        "rsm_cache_events_total",
        "rsm_storage_requests_total",
        "kafka_server_brokertopicmetrics_remotecopylagsegments",
        "kafka_server_brokertopicmetrics_remotecopylagbytes",
        "kafka_server_brokertopicmetrics_remotelogsizebytes",
        "kafka_server_brokertopicmetrics_remotecopyerrors_total",
    } <= names
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in board["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["description"], p["title"]
