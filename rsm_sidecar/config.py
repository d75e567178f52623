"""Configuration: a TOML file plus environment-variable overrides, validated at start.

Every key is declared once, as a field of a ``Settings`` dataclass (``setting()``) in a light
module of the package that reads it (``KEY_MODULES``, gathered by ``all_keys()``); the
dataclass is also what reads the key (``from_config``), typed. The declarations produce
``docs/configuration.md`` (``rsm-sidecar config docs``) and the Helm chart's values schema, and a
test fails when either disagrees.

Environment overrides: ``RSM__`` + the key path upper-cased with ``.`` -> ``__``, e.g.
``RSM__STORAGE__BACKEND=s3`` or ``RSM__ENCRYPTION__KEYS__K1__PUBLIC_KEY_FILE=/k.pem``.
A wrong or missing value raises ``ConfigError`` naming the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import re
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar, Self

from rsm_sidecar.durations import ACCEPTED as DURATION_FORMS
from rsm_sidecar.durations import parse_duration
from rsm_sidecar.errors import ConfigError

REQUIRED = object()
ENV_PREFIX = "RSM__"

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}


@dataclasses.dataclass(frozen=True)
class Key:
    """One configuration key.

    ``path`` may contain one ``<name>`` placeholder segment for families of keys
    (``encryption.keys.<id>.public_key_file``). ``type`` is one of: str, int, bool,
    float, size (bytes; an int or "4MiB"), seconds (float; a number or a duration string such as
    "1h30m"), list (of str), path.
    """

    path: str
    type: str
    default: Any
    doc: str
    choices: tuple | None = None
    min: float | None = None
    max: float | None = None
    secret: bool = False
    required_when: tuple[str, Any] | None = None  # (other key, value) that makes this required

    def pattern(self) -> re.Pattern:
        return re.compile(
            "^"
            + re.sub(
                r"<[a-z_]+>",
                r"[A-Za-z0-9_\\-]+",
                re.escape(self.path).replace(r"\<", "<").replace(r"\>", ">"),
            )
            + "$"
        )

    def default_text(self) -> str:
        if self.default is REQUIRED:
            return "required"
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        if isinstance(self.default, (list, tuple)):
            return "[" + ", ".join(f'"{v}"' for v in self.default) + "]"
        if isinstance(self.default, str):
            return f'"{self.default}"'
        return str(self.default)


def setting(type: str, default: Any, doc: str, *, key: str | None = None, **options: Any) -> Any:
    """A field of a ``Settings`` dataclass, declared by its configuration key: the key's path is
    the group's prefix, a dot and the field name (or ``key``, a path below the prefix, when the
    two differ); type, default, doc and options as for ``Key``. Secret keys stay out of the
    dataclass's repr."""
    return dataclasses.field(
        default=default,
        repr=not options.get("secret", False),
        metadata={"key": (type, default, doc, options), "path": key},
    )


def group(cls: type[Settings], *, key: str | None = None, **doc_vars: str) -> Any:
    """A field of a ``Settings`` dataclass that holds a nested group of keys, ``cls``'s, under the
    prefix, a dot and the field name (or ``key``; ``key=""``: under the prefix itself). One class
    may serve several groups (``iceberg.key``, ``iceberg.value``): its docs are then templates
    whose ``{prefix}`` is the group's prefix and whose other fields are ``doc_vars``."""
    return dataclasses.field(default_factory=cls, metadata={"group": (cls, doc_vars), "path": key})


def family(
    of: str | type[Settings], doc: str = "", *, name: str = "name", key: str | None = None, **options: Any
) -> Any:
    """A field of a ``Settings`` dataclass that holds a family of keys, ``<prefix>.<field>.<name>``
    (or ``key`` for the field's name, as for ``setting()``), as a dict from ``<name>`` to the
    value: ``of`` is the type of a single key (doc and options as for ``Key``), or a ``Settings``
    class whose keys each ``<name>`` has (``encryption.keys.<id>.public_key_file``)."""
    return dataclasses.field(
        default_factory=dict,
        repr=not options.get("secret", False),
        metadata={"family": (of, doc, name, options), "path": key},
    )


def _below(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if prefix and path else prefix or path


@dataclasses.dataclass(frozen=True)
class Settings:
    """Base of the frozen dataclasses that hold one group of keys: each field made by
    ``setting()`` is a key, declared only there; ``group()`` nests a group, ``family()`` a
    ``<name>`` family. ``keys()`` lists them (the docs and the Helm schema are made from it),
    ``from_config`` reads them. ``KEY_PREFIX``: where the group stands when it is not nested."""

    KEY_PREFIX: ClassVar[str] = ""

    @classmethod
    def _paths(cls, prefix: str | None) -> Iterator[tuple[dataclasses.Field, str]]:
        prefix = cls.KEY_PREFIX if prefix is None else prefix
        for f in dataclasses.fields(cls):
            if f.metadata.keys() & {"key", "group", "family"}:
                path = f.metadata.get("path")
                yield f, _below(prefix, f.name if path is None else path)

    @classmethod
    def keys(cls, prefix: str | None = None, **doc_vars: str) -> list[Key]:
        """The ``Key`` of every ``setting()`` field, nested groups' and families' included, in
        field order."""
        out: list[Key] = []
        own = cls.KEY_PREFIX if prefix is None else prefix
        for f, path in cls._paths(prefix):
            if "key" in f.metadata:
                t, default, doc, options = f.metadata["key"]
                if doc_vars:
                    doc = doc.format(prefix=own, **doc_vars)
                out.append(Key(path, t, default, doc, **options))
            elif "group" in f.metadata:
                inner, inner_vars = f.metadata["group"]
                out.extend(inner.keys(path, **inner_vars))
            else:
                of, doc, name, options = f.metadata["family"]
                if isinstance(of, str):
                    out.append(Key(f"{path}.<{name}>", of, None, doc, **options))
                else:
                    out.extend(of.keys(f"{path}.<{name}>"))
        return out

    @classmethod
    def from_config(cls, cfg: Config, prefix: str | None = None) -> Self:
        """The configured value of each key."""
        values: dict[str, Any] = {}
        for f, path in cls._paths(prefix):
            if "key" in f.metadata:
                values[f.name] = cfg.get(path)
            elif "group" in f.metadata:
                values[f.name] = f.metadata["group"][0].from_config(cfg, path)
            else:
                of = f.metadata["family"][0]
                members = cfg.family(path)
                values[f.name] = (
                    {name: leaves[""] for name, leaves in members.items()}
                    if isinstance(of, str)
                    else {name: of.from_config(cfg, f"{path}.{name}") for name in members}
                )
        return cls(**values)


def parse_size(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f'{what}: expected a size in bytes (e.g. 4194304 or "4MiB"), got {value!r}')
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ConfigError(f'{what}: expected a size in bytes (e.g. 4194304 or "4MiB"), got {value!r}')
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def _coerce(key: Key, name: str, value: Any, from_env: bool) -> Any:
    t = key.type
    try:
        if t in ("str", "path"):
            if not isinstance(value, str):
                raise ValueError
            out: Any = value
        elif t == "bool":
            if isinstance(value, bool):
                out = value
            elif from_env and str(value).lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
                out = str(value).lower() in ("true", "1", "yes", "on")
            else:
                raise ValueError
        elif t == "int":
            if isinstance(value, bool):
                raise ValueError
            if not (from_env or isinstance(value, int)):
                raise ValueError
            out = int(value)
        elif t == "seconds" and isinstance(value, str):
            out = parse_duration(value)
        elif t in ("float", "seconds"):
            if isinstance(value, bool):
                raise ValueError
            if not (from_env or isinstance(value, (int, float))):
                raise ValueError
            out = float(value)
        elif t == "size":
            out = parse_size(value, name)
        elif t == "list":
            if from_env and isinstance(value, str):
                out = [v.strip() for v in value.split(",") if v.strip()]
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                out = list(value)
            else:
                raise ValueError
        else:  # pragma: no cover - declaration bug
            raise ConfigError(f"{name}: unknown key type {t}")
    except (ValueError, TypeError):
        raise ConfigError(f"{name}: expected {_describe_type(t)}, got {value!r}") from None
    if key.choices is not None:
        values = out if isinstance(out, list) else [out]
        for v in values:
            if v not in key.choices:
                raise ConfigError(
                    f"{name}: {v!r} is not allowed; allowed: {', '.join(map(str, key.choices))}"
                )
    if key.min is not None and out < key.min:
        raise ConfigError(f"{name}: {out} is below the minimum {key.min:g}")
    if key.max is not None and out > key.max:
        raise ConfigError(f"{name}: {out} is above the maximum {key.max:g}")
    return out


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The configuration file's contents; a :class:`ConfigError` naming the file when it is
    missing or not valid TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"configuration file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"configuration file {path} is not valid TOML: {e}") from None


def _describe_type(t: str) -> str:
    return {
        "str": "a string",
        "path": "a file path (string)",
        "bool": "true or false",
        "int": "an integer",
        "float": "a number",
        "seconds": f"a duration: {DURATION_FORMS}",
        "size": 'a size in bytes (e.g. 4194304 or "4MiB")',
        "list": "a list of strings",
    }.get(t, t)


# Modules that declare keys, each as a module-level ``CONFIG_KEYS`` list (its ``Settings``
# classes' keys), in the order of the reference. Each must stay light: every ``Config()`` imports
# them all, so none may import a cloud SDK, pyspark or pyiceberg (tests/test_config.py checks it).
KEY_MODULES = (
    "rsm_sidecar.service.settings",
    "rsm_sidecar.segment.settings",
    "rsm_sidecar.transform.keyring_settings",
    "rsm_sidecar.storage.factory",
    "rsm_sidecar.storage.local_settings",
    "rsm_sidecar.storage.s3_settings",
    "rsm_sidecar.storage.gcs_settings",
    "rsm_sidecar.storage.azure_settings",
    "rsm_sidecar.iceberg.settings",
)


def all_keys() -> list[Key]:
    keys: list[Key] = []
    for mod in KEY_MODULES:
        keys.extend(getattr(importlib.import_module(mod), "CONFIG_KEYS", []))
    seen = set()
    for k in keys:
        if k.path in seen:
            raise AssertionError(f"configuration key declared twice: {k.path}")
        seen.add(k.path)
    return keys


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, path + "."))
        else:
            out[path] = v
    return out


#: keys of earlier versions that do nothing now, with what replaced them: a configuration that still
#: sets one is accepted (an upgrade must not stop a sidecar from starting), with a warning
REMOVED_KEYS = {
    "fetch.handoff_max_bytes": "fetches come over the fetch channel, on the Unix socket too (docs/design.md, "
    '"The fetch channel"); hand-off files are no longer written',
}


class Config:
    """Validated configuration values by dotted key path."""

    def __init__(
        self,
        values: Mapping[str, Any],
        keys: Iterable[Key] | None = None,
        environ: Mapping[str, str] | None = None,
        source: str = "<dict>",
    ):
        self.source = source
        self._keys = list(keys) if keys is not None else all_keys()
        merged: dict[str, tuple[Any, bool]] = {p: (v, False) for p, v in _flatten(values).items()}
        for name, val in (os.environ if environ is None else environ).items():
            if name.startswith(ENV_PREFIX):
                merged[self._env_to_path(name)] = (val, True)
        self._values: dict[str, Any] = {}
        #: keys of earlier versions that were set (they do nothing now; ``serve`` warns about each)
        self.removed: dict[str, str] = {p: REMOVED_KEYS[p] for p in merged if p in REMOVED_KEYS}
        for path, (val, from_env) in merged.items():
            if path not in REMOVED_KEYS:
                self._values[path] = _coerce(self._find(path, from_env), path, val, from_env)
        for key in self._keys:
            if "<" in key.path:
                continue
            if key.path not in self._values:
                required = key.default is REQUIRED
                if key.required_when is not None:
                    other, expected = key.required_when
                    required = self.get(other) == expected
                if required:
                    cond = (
                        f" when {key.required_when[0]} = {key.required_when[1]!r}"
                        if key.required_when
                        else ""
                    )
                    raise ConfigError(f"{key.path}: missing{cond}; {key.doc}")

    def env_path(self, name: str) -> str:
        """The key path an ``RSM__`` environment variable sets."""
        return self._env_to_path(name)

    def _env_to_path(self, name: str) -> str:
        parts = name[len(ENV_PREFIX) :].split("__")
        for key in self._keys:
            segments = key.path.split(".")
            if len(segments) == len(parts) and all(
                seg.startswith("<") or seg == part.lower() for seg, part in zip(segments, parts)
            ):
                # placeholder segments (key ids) keep their case
                return ".".join(part if seg.startswith("<") else seg for seg, part in zip(segments, parts))
        return ".".join(p.lower() for p in parts)

    def _find(self, path: str, from_env: bool = False) -> Key:
        for key in self._keys:
            if key.path == path or ("<" in key.path and key.pattern().match(path)):
                return key
        close = difflib.get_close_matches(path, [k.path for k in self._keys], n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        origin = (
            f"environment variable {ENV_PREFIX}{path.upper().replace('.', '__')}" if from_env else self.source
        )
        raise ConfigError(f"{path}: unknown configuration key in {origin}{hint}")

    @classmethod
    def load(cls, path: str | os.PathLike | None, environ: Mapping[str, str] | None = None) -> Config:
        if path is None:
            return cls({}, environ=environ, source="<defaults>")
        return cls(read_toml(path), environ=environ, source=str(path))

    def get(self, path: str) -> Any:
        if path in self._values:
            return self._values[path]
        for key in self._keys:
            if key.path == path or ("<" in key.path and key.pattern().match(path)):
                if key.default is REQUIRED:
                    raise ConfigError(f"{path}: missing; {key.doc}")
                return list(key.default) if isinstance(key.default, (list, tuple)) else key.default
        raise KeyError(path)

    __getitem__ = get

    def is_set(self, path: str) -> bool:
        return path in self._values

    def family(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Values of a ``<name>`` key family: ``family("encryption.keys")`` ->
        ``{"k1": {"public_key_file": ..., ...}}``."""
        out: dict[str, dict[str, Any]] = {}
        for path, val in self._values.items():
            if path.startswith(prefix + "."):
                rest = path[len(prefix) + 1 :]
                name, _, leaf = rest.partition(".")
                out.setdefault(name, {})[leaf] = val
        return out

    def with_overrides(self, **values: Any) -> Config:
        """A copy with some keys replaced (``storage__backend="s3"`` style names)."""
        merged = dict(self._values)
        for k, v in values.items():
            merged[k.replace("__", ".")] = v
        return Config(merged, keys=self._keys, environ={}, source=self.source)

    def redacted(self) -> dict[str, Any]:
        """Values for logs: secrets replaced."""
        secret = {k.path for k in self._keys if k.secret}
        out = {}
        for path, val in sorted(self._values.items()):
            key = self._find(path)
            out[path] = "***" if (path in secret or key.secret) else val
        return out


def docs_markdown(keys: Iterable[Key] | None = None) -> str:
    """The configuration reference tables, grouped by section."""
    keys = list(keys) if keys is not None else all_keys()
    sections: dict[str, list[Key]] = {}
    for k in keys:
        parts = k.path.split(".")
        # a table of its own per storage backend ([storage.s3]); else the top-level table
        section = ".".join(parts[:2]) if parts[0] == "storage" and len(parts) > 2 else parts[0]
        sections.setdefault(section, []).append(k)
    out = []
    for section, ks in sections.items():
        out.append(f"### `[{section}]`\n")
        out.append("| key | type | default | meaning |")
        out.append("|---|---|---|---|")
        for k in ks:
            doc = k.doc.replace("|", "\\|")
            if k.choices:
                doc += " Allowed: " + ", ".join(f"`{c}`" for c in k.choices) + "."
            if k.min is not None or k.max is not None:
                rng = f"{'' if k.min is None else f'{k.min:g}'}..{'' if k.max is None else f'{k.max:g}'}"
                doc += f" Range: {rng}."
            if k.required_when:
                doc += f" Required when `{k.required_when[0]}` is `{k.required_when[1]}`."
            out.append(f"| `{k.path}` | {k.type} | {k.default_text()} | {doc} |")
        out.append("")
    return "\n".join(out)
