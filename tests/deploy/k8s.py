"""Validation of Kubernetes objects as an API server would do it, without one:

* built-in kinds against the JSON schemas of the Kubernetes API of each release the chart
  supports (the ``kubernetes-validate`` package's strict schemas: an unknown field is an
  error, as with ``kubectl apply``'s default server-side field validation);
* custom resources against the ``openAPIV3Schema`` of their CustomResourceDefinition
  (devstack/k8s_tools.py fetches Strimzi's, cert-manager's and the Prometheus operator's),
  made strict the same way: an object with ``properties`` admits no other field unless the
  schema preserves unknown fields.

``helm`` renders a chart with the binary devstack/k8s_tools.py builds.
"""

from __future__ import annotations

import copy
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

#: the oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas known
KUBERNETES_VERSIONS = ("1.26.0", "1.37.0")
#: what `helm template` renders for (a helm built with `go install` assumes 1.20 otherwise)
HELM_KUBE_VERSION = "1.33.0"
BUILTIN_GROUPS = {
    "v1",
    "apps/v1",
    "policy/v1",
    "networking.k8s.io/v1",
    "batch/v1",
    "rbac.authorization.k8s.io/v1",
}


class Invalid(AssertionError):
    pass


def load_all(path: Path | str) -> list[dict]:
    return [d for d in yaml.safe_load_all(Path(path).read_text()) if d]


def helm_template(
    helm: Path, chart: Path, *args: str, release: str = "rsm-sidecar", namespace: str = "kafka"
):
    """``helm template``'s objects; Invalid with helm's message when it refuses."""
    proc = subprocess.run(
        [
            str(helm),
            "template",
            release,
            str(chart),
            "--namespace",
            namespace,
            "--kube-version",
            HELM_KUBE_VERSION,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise Invalid(proc.stderr.strip())
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _structural(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD's OpenAPI v3 schema as strict JSON Schema (draft 4 keywords it uses are the same)."""
    s = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "(?i)" in s.get("pattern", ""):  # Go's regexp takes inline flags anywhere, Python's at the start
        s["pattern"] = "(?i)" + s["pattern"].replace("(?i)", "")
    if schema.get("x-kubernetes-int-or-string"):
        s.pop("type", None)
        s["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable"):
        s.pop("nullable")
        if "type" in s:
            s["type"] = [s["type"], "null"]
    if "properties" in s:
        s["properties"] = {k: _structural(v) for k, v in s["properties"].items()}
        if "additionalProperties" not in s and not schema.get("x-kubernetes-preserve-unknown-fields"):
            s["additionalProperties"] = False
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = _structural(s["additionalProperties"])
    if "items" in s and isinstance(s["items"], dict):
        s["items"] = _structural(s["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema and key in s:
            # structural-schema rule: these only constrain; their properties add no fields
            s[key] = [_loose(_structural(sub)) for sub in schema[key]]
    if "not" in s:
        s["not"] = _loose(_structural(s["not"]))
    return s


def _loose(schema: dict[str, Any]) -> dict[str, Any]:
    schema = dict(schema)
    if schema.get("additionalProperties") is False:
        del schema["additionalProperties"]
    return schema


@cache
def _crd(crd_file: str) -> dict:
    return yaml.load(Path(crd_file).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@cache
def crd_validator(crd_file: str, version: str) -> jsonschema.protocols.Validator:
    crd = _crd(crd_file)
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version] or [None]
    if found is None:
        raise Invalid(f"{crd_file}: no version {version}")
    schema = copy.deepcopy(found["schema"]["openAPIV3Schema"])
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    strict = _structural(schema)
    jsonschema.Draft7Validator.check_schema(strict)
    return jsonschema.Draft7Validator(strict)


def crd_for(obj: dict, crd_dirs: list[Path]) -> tuple[Path, str]:
    group, _, version = obj["apiVersion"].rpartition("/")
    for d in crd_dirs:
        path = d / f"{obj['kind']}.yaml"
        if path.exists():
            if _crd(str(path))["spec"]["group"] == group:
                return path, version
    raise Invalid(f"no CRD for {obj['apiVersion']} {obj['kind']} in {[str(d) for d in crd_dirs]}")


def validate(obj: dict, crd_dirs: list[Path]) -> None:
    """Invalid naming the object and the field when the API server would refuse ``obj``."""
    what = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
    if obj["apiVersion"] in BUILTIN_GROUPS:
        import kubernetes_validate

        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = "/".join(str(p) for p in e.path)
                raise Invalid(f"{what} (Kubernetes {version}): {path}: {e.message}") from None
        return
    crd, version = crd_for(obj, crd_dirs)
    errors = sorted(crd_validator(str(crd), version).iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        lines = [f"{'/'.join(str(p) for p in e.path)}: {e.message}" for e in errors[:10]]
        raise Invalid(f"{what} ({crd.name} {version}):\n  " + "\n  ".join(lines))


def by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for o in objects:
        out.setdefault(o["kind"], []).append(o)
    return out


def one(objects: list[dict], kind: str) -> dict:
    (found,) = by_kind(objects)[kind]
    return found
