"""Configuration: a TOML file plus environment-variable overrides, validated at start.

Every key is declared once, as a ``Key`` next to the code that reads it (core keys
here; backend keys in their modules, gathered by ``all_keys()``). The declarations
produce ``docs/configuration.md`` (``rsm-sidecar config docs``) and a test fails when
the two disagree.

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
from collections.abc import Iterable, Mapping
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


def setting(type: str, default: Any, doc: str, **options: Any) -> Any:
    """A field of a ``Settings`` dataclass, declared by its configuration key: the key's path is
    the class's ``KEY_PREFIX``, a dot and the field name; type, default, doc and options as for
    ``Key``. Secret keys stay out of the dataclass's repr."""
    return dataclasses.field(
        default=default,
        repr=not options.get("secret", False),
        metadata={"key": (type, default, doc, options)},
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """Base of the frozen dataclasses that hold one group of keys: each field made by
    ``setting()`` is a key, declared only there, read by ``from_config``."""

    KEY_PREFIX: ClassVar[str] = ""

    @classmethod
    def keys(cls) -> list[Key]:
        """The ``Key`` of every ``setting()`` field, in field order."""
        return [
            Key(f"{cls.KEY_PREFIX}.{f.name}", t, default, doc, **options)
            for f in dataclasses.fields(cls)
            if "key" in f.metadata
            for t, default, doc, options in [f.metadata["key"]]
        ]

    @classmethod
    def from_config(cls, cfg: Config) -> Self:
        """The configured value of each key."""
        return cls(
            **{
                f.name: cfg.get(f"{cls.KEY_PREFIX}.{f.name}")
                for f in dataclasses.fields(cls)
                if "key" in f.metadata
            }
        )


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


MiB = 1024 * 1024

CONFIG_KEYS = [
    # -- server -------------------------------------------------------------------
    Key(
        "server.listen",
        "str",
        "127.0.0.1:9095",
        "gRPC listen address: `host:port`, or `unix:///path/to.sock` for a Unix domain socket.",
    ),
    Key(
        "server.max_workers",
        "int",
        64,
        "Threads serving gRPC calls (copies, fetch streams, indexes, deletes).",
        min=4,
        max=1024,
    ),
    Key(
        "server.stream_window_bytes",
        "size",
        4 * 1024 * 1024,
        "HTTP/2 flow-control window of each call the sidecar receives: how many bytes of a stream-mode "
        "copy its gRPC transport takes in ahead of the copy, per copy. Fixed, so a copy's memory has a "
        "bound that does not depend on the machine's load; 0 lets gRPC size it from its bandwidth-delay "
        "probes, which on a busy host let a 1 GiB copy's memory grow by up to 30 MiB more "
        "(docs/operations.md, Memory). Otherwise at least 65535 (HTTP/2's default window).",
        min=0,
        max=256 * 1024 * 1024,
    ),
    Key(
        "server.shutdown_grace_seconds",
        "seconds",
        30.0,
        "On SIGTERM: stop accepting calls, then wait this long for in-flight copies and fetches.",
        min=0,
    ),
    Key(
        "server.tls.cert_file",
        "path",
        None,
        "PEM server certificate; enables TLS together with `server.tls.key_file`.",
    ),
    Key("server.tls.key_file", "path", None, "PEM private key of `server.tls.cert_file`."),
    Key(
        "server.tls.client_ca_file",
        "path",
        None,
        "PEM CA bundle; when set, clients must present a certificate it signed (mTLS).",
    ),
    Key(
        "server.allow_plaintext_non_loopback",
        "bool",
        False,
        "Allow `server.listen` on a non-loopback TCP address without client certificates. Anyone who reaches "
        "the port can then copy, read and delete every tiered segment: only for a network that only the "
        "broker can reach (a pod or a private container network).",
    ),
    Key(
        "metrics.listen",
        "str",
        "127.0.0.1:9096",
        "Prometheus metrics HTTP address `host:port` (path `/metrics`; `:port` alone listens on 127.0.0.1); "
        "empty disables.",
    ),
    Key(
        "log.level",
        "str",
        "INFO",
        "Lowest level of the log lines written to stderr.",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
    ),
    Key(
        "log.format",
        "str",
        "json",
        "Log line format: one JSON object per line, or plain text.",
        choices=("json", "text"),
    ),
    # -- segment transform ----------------------------------------------------------
    Key(
        "segment.chunk_size",
        "size",
        4 * MiB,
        "Size of the original chunks a segment is cut into; each is compressed/encrypted on its own, "
        "so a ranged fetch downloads whole chunks.",
        min=1024,
        max=1024 * MiB,
    ),
    Key("segment.compression", "bool", True, "Compress chunks with zstd."),
    Key(
        "segment.compression_heuristic",
        "bool",
        True,
        "Skip zstd for segments whose record batches are already compressed by the producer "
        "(decided from the batch headers of the first chunk).",
    ),
    Key(
        "segment.compression_level",
        "int",
        3,
        "zstd compression level (higher: smaller, slower).",
        min=-7,
        max=22,
    ),
    Key(
        "segment.custom_metadata_fields",
        "list",
        ["REMOTE_SIZE", "OBJECT_PREFIX"],
        "KIP-917 fields returned to the broker with each copy (Aiven-compatible tags). OBJECT_PREFIX lets "
        "fetch and delete find segments written under an older `storage.key_prefix`.",
        choices=("REMOTE_SIZE", "OBJECT_PREFIX", "OBJECT_KEY"),
    ),
    Key(
        "segment.custom_metadata_max_bytes",
        "int",
        128,
        "The broker's `remote.log.metadata.custom.metadata.max.bytes`; start-up fails if the configured "
        "fields could exceed it.",
        min=0,
    ),
    # -- copy ---------------------------------------------------------------------
    Key("copy.parallelism", "int", 2, "Chunks of one segment transformed concurrently.", min=1, max=64),
    Key(
        "copy.max_concurrent",
        "int",
        16,
        "Copies processed at once; a further copy is answered RESOURCE_EXHAUSTED at once (the broker retries "
        "it at its next copy interval). Memory per copy is about "
        "(copy.parallelism + 2) x chunk size plus the storage upload buffer.",
        min=1,
        max=256,
    ),
    Key(
        "copy.journal_dir",
        "path",
        None,
        "Directory (local disk) where each copy records the keys it is writing until it completes; what a "
        "killed or failed copy left in storage is deleted right after start-up (beside serving) and by a "
        "periodic sweep. Unset: no journal (find leftovers with `rsm-sidecar inspect orphans`).",
    ),
    Key(
        "copy.journal_sweep_seconds",
        "seconds",
        60.0,
        "How often leftovers of interrupted copies are looked for while the sidecar runs.",
        min=1,
    ),
    Key(
        "copy.allowed_dirs",
        "list",
        [],
        "Path transfer mode: the broker's log directories (log.dirs); only regular files under them are "
        "read. Empty: path transfer mode is disabled (copies must use stream mode). Each entry must be an "
        "existing absolute directory other than `/`.",
    ),
    Key(
        "copy.idle_timeout_seconds",
        "seconds",
        60.0,
        "A copy that makes no progress (no message from the client, no byte stored) for this long is "
        "abandoned and its slot freed.",
        min=1,
    ),
    Key(
        "copy.upload_rate_limit",
        "size",
        0,
        "Bytes per second that all copies of this sidecar together may upload (`.log` chunks and "
        "`.indexes`), so that tiering a backlog cannot saturate the broker's network; at most one second "
        "of budget is saved up while idle. 0: no limit. Aiven's `upload.rate.limit.bytes.per.second`; the "
        "broker's own limit is `remote.log.manager.copy.max.bytes.per.second`.",
        min=0,
    ),
    Key(
        "copy.max_index_file_bytes",
        "size",
        64 * MiB,
        "Largest index file (offset, time, producer snapshot, transaction index) a copy accepts; index files "
        "are held in memory while they are encrypted.",
        min=1024,
    ),
    # -- encryption -----------------------------------------------------------------
    Key(
        "encryption.enabled",
        "bool",
        False,
        "Encrypt chunks and indexes with AES-256-GCM under a fresh data key per segment.",
    ),
    Key(
        "encryption.active_key_id",
        "str",
        None,
        "Key id whose RSA public key wraps the data keys of new segments; must be one of `encryption.keys`.",
        required_when=("encryption.enabled", True),
    ),
    Key(
        "encryption.keys.<id>.public_key_file",
        "path",
        REQUIRED,
        "PEM RSA public key (X.509 SubjectPublicKeyInfo) of key id `<id>`.",
    ),
    Key(
        "encryption.keys.<id>.private_key_file",
        "path",
        REQUIRED,
        "PEM RSA private key (PKCS#8 or PKCS#1) of key id `<id>`; needed to read segments written under it. "
        "Must not be readable or writable by other users (mode 0600 or 0640).",
    ),
    Key(
        "encryption.allow_exposed_private_keys",
        "bool",
        False,
        "Accept private key files that other users can read or write (start-up fails otherwise).",
    ),
    # -- caches and fetch -------------------------------------------------------------
    Key(
        "cache.manifest_bytes",
        "size",
        32 * MiB,
        "Parsed segment manifests kept in memory (bytes of JSON).",
        min=0,
    ),
    Key("cache.index_bytes", "size", 64 * MiB, "Plain index files kept in memory.", min=0),
    Key(
        "cache.chunk_bytes",
        "size",
        256 * MiB,
        "Decoded (plain) chunks kept in memory; 0 disables the chunk cache.",
        min=0,
    ),
    Key(
        "cache.prefetch_bytes",
        "size",
        16 * MiB,
        "Sequential prefetch: after a sequential fetch reads a chunk, the next chunks up to this many "
        "original bytes are loaded into the chunk cache in the background; 0 disables. A fetch is "
        "sequential when it starts at the segment's start, continues one of the segment's last 16 fetches "
        "(starts after its "
        "first byte and at most at its end), or has served a chunk's size; a fetch at a random place "
        "downloads only the chunks it needs. Near a segment's end the window "
        "reaches into the partition's next segment (the one starting at this one's end offset + 1, "
        "found with one LIST when exactly one is stored): its manifest, its offset, time and "
        "transaction indexes and its first chunks, so the broker's first reads of it do not wait for "
        "the object store. While several partitions are read sequentially at once (each within the last "
        "5 s), each gets an equal share of `cache.chunk_bytes` for its chunk in use and its window, so "
        "the window shrinks to fit (at least one chunk): prefetched chunks are not evicted before they "
        "are read.",
        min=0,
    ),
    Key(
        "fetch.max_range_bytes",
        "size",
        8 * MiB,
        "Largest single ranged GET a fetch issues; contiguous chunks up to this size are read in one "
        "request. Each fetch stream and each of the 4 prefetch threads holds at most one such range in "
        "memory (docs/operations.md, Memory).",
        min=1024,
    ),
    Key(
        "fetch.disk_cache.path",
        "path",
        "",
        "Directory of the disk chunk cache: stored chunks (as downloaded, still compressed and encrypted; "
        "never plaintext) kept across restarts and verified again on every use. Created 0700, files 0600. "
        "Empty: no disk cache. An unusable directory or a full disk turns the cache off with one warning.",
    ),
    Key(
        "fetch.disk_cache.bytes",
        "size",
        1024 * MiB,
        "Capacity of the disk chunk cache (sum of its file sizes); least recently used chunks are "
        "evicted beyond it. Each sidecar bounds what it wrote or read; sidecars sharing a directory may "
        "together use the sum of their capacities.",
        min=1024,
    ),
    Key(
        "fetch.max_concurrent",
        "int",
        32,
        "Fetch and index streams served at once; further ones are refused with RESOURCE_EXHAUSTED (the "
        "broker reads with `remote.log.reader.threads`, 10 by default). `server.max_workers` must exceed "
        "`copy.max_concurrent` + `fetch.max_concurrent` by at least 8.",
        min=1,
        max=1024,
    ),
    Key(
        "fetch.idle_timeout_seconds",
        "seconds",
        60.0,
        "A fetch stream whose client reads nothing for this long is cancelled and its slot freed.",
        min=1,
    ),
    Key(
        "fetch.accept_unauthenticated_segments",
        "bool",
        False,
        "Read segments whose manifest carries no rsm-sidecar authenticator: written by Aiven's plugin or by "
        "rsm-sidecar before 0.2, or unencrypted while encryption is enabled. For migrations only: whoever "
        "can write the bucket can then plant, swap or rearrange such segments.",
    ),
]

# Modules that declare keys, each as a module-level ``CONFIG_KEYS`` list. Each must stay light:
# every ``Config()`` imports them all, so none may import a cloud SDK, pyspark or pyiceberg
# (tests/test_config.py checks it).
KEY_MODULES = (
    "rsm_sidecar.config",
    "rsm_sidecar.storage.factory",
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
            if key.path == path:
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
        section = (
            ".".join(k.path.split(".")[:2])
            if k.path.startswith(("storage.", "cache."))
            else k.path.split(".")[0]
        )
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
