"""Confluent-compatible schema registry access for the Iceberg jobs.

The REST calls, authentication (``basic.auth.user.info``, ``bearer.auth.*``), TLS
(``ssl.ca.location``, ``ssl.certificate.location``, ``ssl.key.location``), retries, caching by
id and the latest-version TTL cache (``cache.latest.ttl.sec``) are confluent-kafka's
``SchemaRegistryClient``; this module only adds what it lacks:

* error classification: an unknown schema id or subject is a *record-level* problem
  (:class:`UnknownSchema`); a registry that cannot be reached, answers 5xx or refuses our
  credentials is a *job-level* failure (:class:`RegistryUnavailable`, :class:`RegistryAuthError`)
  that must stop the job before it commits anything;
* subject naming (:func:`topic_subject`, :class:`SubjectSpec`);
* turning a registered schema into something that decodes: Protobuf sources with their
  references fetched recursively and compiled by protoc (:mod:`.protobuf_schema`), Avro with
  named-type references parsed by fastavro, JSON Schema documents parsed with the documents
  they reference (by reference name); other types stay raw.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rsm_sidecar.errors import ConfigError, Unavailable
from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema, SchemaCompileError

PROTOBUF = "PROTOBUF"
AVRO = "AVRO"
JSON = "JSON"


class RegistryUnavailable(Unavailable):
    """The schema registry is unreachable or failing (job-level: fail, commit nothing)."""


class RegistryAuthError(ConfigError):
    """The registry rejected our credentials (401/403) (job-level)."""


class UnknownSchema(LookupError):
    """The registry does not know this schema id / subject / version (record-level)."""


class SchemaUnusable(ValueError):
    """The registry returned a schema we cannot compile or parse (record-level for ids)."""


def topic_subject(topic: str, is_key: bool) -> str:
    """TopicNameStrategy: ``<topic>-key`` / ``<topic>-value``."""
    return f"{topic}-{'key' if is_key else 'value'}"


@dataclass(frozen=True)
class SubjectSpec:
    """Which registry subject (and, for Protobuf, which message) defines a table side.

    ``subject=None`` means TopicNameStrategy. ``message`` is a Protobuf full message name
    (``pkg.Outer.Inner``); None means the first message of the subject's schema file.
    """

    subject: str | None = None
    message: str | None = None

    def subject_for(self, topic: str, is_key: bool) -> str:
        return self.subject or topic_subject(topic, is_key)


@dataclass
class ResolvedSchema:
    """A registered schema made usable: ``proto`` for Protobuf, ``avro`` for Avro."""

    schema_id: int | None
    schema_type: str
    text: str
    proto: ProtoSchema | None = None
    avro: Any = None  # fastavro parsed schema
    avro_named: dict[str, Any] = field(default_factory=dict)
    json: Any = None  # the parsed JSON Schema document
    #: the documents its ``$ref``s may name: reference name -> parsed document
    json_refs: dict[str, Any] = field(default_factory=dict)
    subject: str | None = None
    version: int | None = None


def _default_conf(conf: Mapping[str, Any] | str) -> dict[str, Any]:
    c: dict[str, Any] = {"url": conf} if isinstance(conf, str) else dict(conf)
    c.setdefault("cache.latest.ttl.sec", 300)
    c.setdefault("timeout", 10)
    c.setdefault("max.retries", 2)
    c.setdefault("retries.wait.ms", 200)
    return c


_SHARED: dict[str, SchemaRegistry] = {}
_SHARED_LOCK = threading.Lock()


class SchemaRegistry:
    """Registry access with classified errors and compiled schemas cached by id."""

    def __init__(self, conf: Mapping[str, Any] | str):
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.conf = _default_conf(conf)
        self.url = str(self.conf["url"])
        self.client = SchemaRegistryClient(self.conf)
        self._resolved: dict[int, ResolvedSchema] = {}
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, conf: Mapping[str, Any] | str) -> SchemaRegistry:
        """One instance per configuration per process (Spark workers reuse it across tasks)."""
        key = json.dumps(_default_conf(conf), sort_keys=True, default=str)
        with _SHARED_LOCK:
            inst = _SHARED.get(key)
            if inst is None:
                inst = _SHARED[key] = cls(conf)
            return inst

    def add_resolved(self, resolved: ResolvedSchema) -> None:
        """Seed the id cache (a schema known without asking the registry, e.g. benchmarks)."""
        assert resolved.schema_id is not None
        with self._lock:
            self._resolved[resolved.schema_id] = resolved

    # -------------------------------------------------------------- raw calls, classified
    def _call(self, what: str, fn, *args, **kwargs):
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return fn(*args, **kwargs)
        except SchemaRegistryError as exc:
            code = exc.http_status_code
            if code == 404:
                raise UnknownSchema(f"{what}: not found in the registry at {self.url} ({exc})") from None
            if code in (401, 403):
                raise RegistryAuthError(
                    f"{what}: the registry at {self.url} refused our credentials ({exc})"
                ) from None
            if code is not None and 400 <= code < 500:
                raise SchemaUnusable(f"{what}: the registry at {self.url} answered {exc}") from None
            raise RegistryUnavailable(f"{what}: the registry at {self.url} failed ({exc})") from exc
        except (UnknownSchema, RegistryAuthError, SchemaUnusable):
            raise
        except Exception as exc:  # httpx transport errors, timeouts, TLS failures, bad JSON
            raise RegistryUnavailable(
                f"{what}: the schema registry at {self.url} is unreachable ({type(exc).__name__}: {exc})"
            ) from exc

    def schema(self, schema_id: int):
        """The confluent ``Schema`` for an id (cached by the client)."""
        return self._call(f"schema id {schema_id}", self.client.get_schema, schema_id)

    def latest(self, subject: str):
        """The latest ``RegisteredSchema`` of a subject (cached for ``cache.latest.ttl.sec``)."""
        return self._call(f"latest version of subject {subject!r}", self.client.get_latest_version, subject)

    def version(self, subject: str, version: int):
        return self._call(f"subject {subject!r} version {version}", self.client.get_version, subject, version)

    def check_available(self) -> None:
        """Raise :class:`RegistryUnavailable` unless the registry answers (``GET /subjects``)."""
        self._call("list subjects", self.client.get_subjects)

    # -------------------------------------------------------------- resolution
    def resolve(self, schema_id: int) -> ResolvedSchema:
        """Compile/parse the schema with this id (cached). Raises :class:`UnknownSchema`,
        :class:`SchemaUnusable` or the job-level errors."""
        with self._lock:
            hit = self._resolved.get(schema_id)
        if hit is not None:
            return hit
        schema = self.schema(schema_id)
        resolved = self._make(schema_id, schema)
        with self._lock:
            self._resolved[schema_id] = resolved
        return resolved

    def resolve_latest(self, subject: str) -> ResolvedSchema:
        reg = self.latest(subject)
        res = self.resolve(reg.schema_id)
        res.subject, res.version = subject, reg.version
        return res

    def _reference_closure(self, schema, seen: dict[str, Any] | None = None) -> dict[str, Any]:
        """name -> confluent Schema for every (transitive) reference, dependencies first."""
        seen = {} if seen is None else seen
        for ref in schema.references or []:
            if ref.name in seen:
                continue
            dep = self.version(ref.subject, ref.version).schema
            self._reference_closure(dep, seen)
            seen[ref.name] = dep
        return seen

    def _make(self, schema_id: int | None, schema) -> ResolvedSchema:
        stype = (schema.schema_type or AVRO).upper()
        text = schema.schema_str
        refs = self._reference_closure(schema)
        if stype == PROTOBUF:
            main = f"__schema_{schema_id}.proto"
            sources = {name: dep.schema_str for name, dep in refs.items()}
            sources[main] = text
            try:
                proto = ProtoSchema.from_sources(main, sources)
            except SchemaCompileError as exc:
                raise SchemaUnusable(f"schema id {schema_id}: {exc}") from None
            return ResolvedSchema(schema_id, stype, text, proto=proto)
        if stype == AVRO:
            named: dict[str, Any] = {}
            try:
                for dep in refs.values():
                    parse_avro(dep.schema_str, named)
                parsed = parse_avro(text, named)
            except Exception as exc:
                raise SchemaUnusable(f"schema id {schema_id}: invalid Avro schema: {exc}") from None
            return ResolvedSchema(schema_id, stype, text, avro=parsed, avro_named=named)
        if stype == JSON:
            try:
                docs = {name: json.loads(dep.schema_str) for name, dep in refs.items()}
                doc = json.loads(text)
            except ValueError as exc:
                raise SchemaUnusable(f"schema id {schema_id}: invalid JSON Schema: {exc}") from None
            return ResolvedSchema(schema_id, stype, text, json=doc, json_refs=docs)
        return ResolvedSchema(schema_id, stype, text)

    def close(self) -> None:
        try:
            self.client.__exit__()
        except Exception:  # pragma: no cover - best effort
            pass


def parse_avro(text: str, named_schemas: dict[str, Any] | None = None) -> Any:
    """Parse an Avro schema JSON with fastavro, registering named types in ``named_schemas``."""
    import fastavro

    return fastavro.parse_schema(json.loads(text), named_schemas=named_schemas)
