"""The Helm chart's ``values.schema.json`` (deploy/helm/rsm-sidecar/), generated: the chart's own
values are described here, and its ``config`` (the sidecar's settings) from the configuration
code's ``Key`` declarations, so ``helm install`` refuses an unknown key, a wrong type, a value
outside its range or choices exactly where the sidecar would refuse to start (docs/configuration.md
is generated from the same declarations). The keys the chart sets itself are refused in
``config``. tests/deploy/test_helm_chart.py fails when the file is not what this writes.

    python -m devstack.helm_schema          # rewrite values.schema.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rsm_sidecar.config import Key, all_keys

REPO = Path(__file__).resolve().parents[1]
SCHEMA_FILE = REPO / "deploy" / "helm" / "rsm-sidecar" / "values.schema.json"

#: the chart's own settings: configuring them in `config` would be overwritten or contradict the pod
CHART_MANAGED = (
    "server.listen",
    "server.tls",
    "server.allow_plaintext_non_loopback",
    "metrics.listen",
    "copy.journal_dir",
    "fetch.disk_cache",
    "encryption",
)
#: a size as rsm_sidecar.config.parse_size reads it
SIZE_PATTERN = r"^\s*[0-9]+\s*(?i:b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$"


def _leaf(key: Key) -> dict[str, Any]:
    t = key.type
    out: dict[str, Any]
    if t in ("str", "path"):
        out = {"type": "string"}
    elif t == "bool":
        out = {"type": "boolean"}
    elif t == "int":
        out = {"type": "integer"}
    elif t == "float":
        out = {"type": "number"}
    elif t == "seconds":
        out = {"type": ["number", "string"]}
    elif t == "size":
        out = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": SIZE_PATTERN}]}
    elif t == "list":
        out = {"type": "array", "items": {"type": "string"}}
    else:  # pragma: no cover - a new key type needs a schema here
        raise ValueError(f"{key.path}: no schema for key type {t}")
    if key.choices is not None:
        if t == "list":
            out["items"]["enum"] = list(key.choices)
        else:
            out["enum"] = list(key.choices)
    if t in ("int", "float") or (t == "seconds"):
        bounds = {"minimum": key.min, "maximum": key.max}
        target = out
        for name, value in bounds.items():
            if value is not None:
                target[name] = int(value) if t == "int" else value
    out["description"] = key.doc
    return out


def _managed(path: str) -> bool:
    return any(path == m or path.startswith(m + ".") for m in CHART_MANAGED)


def config_schema(keys: list[Key] | None = None) -> dict[str, Any]:
    """The nested object schema of every configuration key but the chart-managed ones."""
    root: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": {}}
    for key in keys if keys is not None else all_keys():
        if "<" in key.path:
            continue  # families (encryption.keys.<id>) are chart-managed
        parts = key.path.split(".")
        node = root
        for part in parts[:-1]:
            node = node["properties"].setdefault(
                part, {"type": "object", "additionalProperties": False, "properties": {}}
            )
        node["properties"][parts[-1]] = _leaf(key)
    for path in CHART_MANAGED:
        parts = path.split(".")
        node = root
        for part in parts[:-1]:
            node = node["properties"][part]
        node["properties"][parts[-1]] = {
            "not": {},
            "description": f"set by the chart ({path}): see values.yaml",
        }
    return root


def _obj(properties: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        out["required"] = required
    out.update(extra)
    return out


STR: dict[str, Any] = {"type": "string"}
BOOL: dict[str, Any] = {"type": "boolean"}
MAP: dict[str, Any] = {"type": "object"}
STR_MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
LIST: dict[str, Any] = {"type": "array"}
PORT: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": 65535}
DURATION: dict[str, Any] = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"}
QUANTITY: dict[str, Any] = {"type": "string", "pattern": r"^[0-9]+(k|M|G|T|Ki|Mi|Gi|Ti)?$"}
NAME: dict[str, Any] = {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}
LABEL_SELECTOR: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": STR_MAP, "matchExpressions": LIST},
}
PROBE: dict[str, Any] = _obj(
    {
        "periodSeconds": {"type": "integer", "minimum": 1},
        "failureThreshold": {"type": "integer", "minimum": 1},
    },
    ["periodSeconds", "failureThreshold"],
)


def values_schema() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "rsm-sidecar Helm chart values (generated by devstack/helm_schema.py)",
        **_obj(
            {
                "global": MAP,
                "nameOverride": STR,
                "fullnameOverride": STR,
                "workload": _obj(
                    {
                        "kind": {"enum": ["DaemonSet", "Deployment"]},
                        "replicas": {"type": "integer", "minimum": 1},
                        "maxSurge": {"type": "integer", "minimum": 0, "maximum": 1},
                    },
                    ["kind"],
                ),
                "image": _obj(
                    {
                        "repository": {"type": "string", "minLength": 1},
                        "tag": STR,
                        "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                    },
                    ["repository"],
                ),
                "imagePullSecrets": LIST,
                "brokers": _obj(
                    {"podSelector": LABEL_SELECTOR, "namespaceSelector": LABEL_SELECTOR},
                    ["podSelector"],
                    description="the broker pods: the only clients the NetworkPolicy admits",
                ),
                "nodeSelector": STR_MAP,
                "tolerations": LIST,
                "affinity": MAP,
                "priorityClassName": STR,
                "podLabels": STR_MAP,
                "podAnnotations": STR_MAP,
                "service": _obj(
                    {
                        "port": PORT,
                        "internalTrafficPolicy": {
                            "enum": ["Local", "Cluster"],
                            "description": "Local: a broker reaches the sidecar on its own node only",
                        },
                    }
                ),
                "clusterDomain": STR,
                "tls": _obj(
                    {
                        "certManager": _obj(
                            {
                                "enabled": BOOL,
                                "issuerRef": _obj(
                                    {"name": {"type": "string", "minLength": 1}, "kind": STR, "group": STR},
                                    ["name"],
                                ),
                                "duration": DURATION,
                                "renewBefore": DURATION,
                                "extraDnsNames": {"type": "array", "items": STR},
                            }
                        ),
                        "existingSecret": STR,
                        "disabled": BOOL,
                    }
                ),
                "encryption": _obj(
                    {
                        "enabled": BOOL,
                        "activeKeyId": STR,
                        "keyIds": {
                            "type": "array",
                            "items": {"type": "string", "pattern": r"^[A-Za-z0-9_\-]+$"},
                            "uniqueItems": True,
                        },
                        "existingSecret": STR,
                    }
                ),
                "serviceAccount": _obj(
                    {
                        "create": BOOL,
                        "name": STR,
                        "annotations": STR_MAP,
                        "automountServiceAccountToken": BOOL,
                    }
                ),
                "credentialsSecret": STR,
                "extraEnv": LIST,
                "config": config_schema(),
                "diskCache": _obj({"enabled": BOOL, "size": QUANTITY, "volume": MAP}),
                "resources": _obj(
                    {
                        "memoryHeadroomPercent": {"type": "integer", "minimum": 0, "maximum": 400},
                        "requests": MAP,
                        "limits": MAP,
                    }
                ),
                "probes": _obj(
                    {
                        "startup": PROBE,
                        "readiness": PROBE,
                        "liveness": PROBE,
                        "timeoutSeconds": {"type": "integer", "minimum": 2},
                    }
                ),
                "podDisruptionBudget": _obj(
                    {"enabled": BOOL, "maxUnavailable": {"type": ["integer", "string"]}}
                ),
                "networkPolicy": _obj({"enabled": BOOL, "metricsFrom": LIST}),
                "metrics": _obj(
                    {
                        "port": PORT,
                        "serviceMonitor": _obj({"enabled": BOOL, "interval": DURATION, "labels": STR_MAP}),
                        "prometheusRule": _obj({"enabled": BOOL, "labels": STR_MAP}),
                        "grafanaDashboard": _obj({"enabled": BOOL, "labels": STR_MAP}),
                    }
                ),
            },
            ["workload", "image", "brokers", "service", "tls", "encryption", "config", "metrics"],
        ),
    }


def render() -> str:
    return json.dumps(values_schema(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    SCHEMA_FILE.write_text(render())
    print(f"wrote {SCHEMA_FILE.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
