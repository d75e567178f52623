"""How `dump` shows keys, values and header values.

The default is plain: UTF-8 text when the bytes are valid, printable UTF-8, hex
otherwise. A decoder for schema-registry framed data (Confluent wire format: Avro,
Protobuf, JSON Schema) is used when a registry is configured (``--schema-registry URL``,
or ``iceberg.registry.*`` in the sidecar's configuration, with its credentials and TLS
settings) and the schema-registry modules of :mod:`rsm_sidecar.iceberg` are importable;
it falls back to plain for data that is not framed or whose schema cannot be resolved.
Other decoders plug in by implementing :class:`Decoder`.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import io
import json
import uuid
from typing import Any, Protocol, overload

NO_LIMIT = 0


def _printable(text: str) -> bool:
    return all(c.isprintable() or c in "\t\n\r" for c in text)


def _utf8(data: bytes, cut_ok: bool) -> str | None:
    """Printable UTF-8 text of ``data``; when ``cut_ok``, a character cut at the end (by a
    display limit) is dropped. None when the bytes are not printable UTF-8."""
    for cut in range(4 if cut_ok else 1):
        try:
            text = data[: len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return text if _printable(text) else None
    return None


@overload
def plain(data: bytes, max_bytes: int = ...) -> dict[str, Any]: ...
@overload
def plain(data: bytes | None, max_bytes: int = ...) -> dict[str, Any] | None: ...
def plain(data: bytes | None, max_bytes: int = NO_LIMIT) -> dict[str, Any] | None:
    """``{"utf8": text}`` or ``{"hex": digits}``, plus ``size`` and ``truncated`` when only the
    first ``max_bytes`` bytes are shown; None for a null field."""
    if data is None:
        return None
    truncated = bool(max_bytes) and len(data) > max_bytes
    shown = data[:max_bytes] if truncated else data
    text = _utf8(shown, truncated)
    out: dict[str, Any] = {"utf8": text} if text is not None else {"hex": shown.hex()}
    if truncated:
        out.update(size=len(data), truncated=True)
    return out


def render_text(rendered: dict[str, Any] | None) -> str:
    """One field for the text output: ``null``, a JSON-quoted string, ``hex:...``, or a
    decoded value ``<type>#<id> {...}``."""
    if rendered is None:
        return "null"
    if "decoded" in rendered:
        value = json.dumps(rendered["decoded"], default=str, ensure_ascii=False)
        return f"{rendered['schema_type'].lower()}#{rendered['schema_id']} {value}"
    more = f"...(+{rendered['size'] - _shown_len(rendered)} bytes)" if rendered.get("truncated") else ""
    if "utf8" in rendered:
        return json.dumps(rendered["utf8"], ensure_ascii=False) + more
    return "hex:" + rendered["hex"] + more


def _shown_len(rendered: dict[str, Any]) -> int:
    if "utf8" in rendered:
        return len(rendered["utf8"].encode("utf-8"))
    return len(rendered["hex"]) // 2


class Decoder(Protocol):
    def decode(self, topic: str, is_key: bool, data: bytes | None) -> dict[str, Any] | None:
        """A JSON-able rendering of one key or value (None for null)."""


@dataclasses.dataclass
class PlainDecoder:
    max_bytes: int = NO_LIMIT

    def decode(self, topic: str, is_key: bool, data: bytes | None) -> dict[str, Any] | None:
        return plain(data, self.max_bytes)


class DecoderUnavailable(Exception):
    """The schema-registry decoder cannot be used here (its modules are missing)."""


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return "hex:" + bytes(v).hex()
    if isinstance(v, (datetime.date, datetime.time, decimal.Decimal, uuid.UUID)):
        return str(v)
    return v


class RegistryDecoder:
    """Decodes Confluent-framed data through a schema registry; plain otherwise."""

    def __init__(self, registry_conf: str | dict[str, Any], max_bytes: int = NO_LIMIT):
        try:
            from rsm_sidecar.iceberg.decoding import framing, schema_registry
        except ImportError as e:
            raise DecoderUnavailable(f"schema-registry decoding needs rsm_sidecar.iceberg ({e})") from None
        self._framing = framing
        self._sr = schema_registry
        self.registry = schema_registry.SchemaRegistry(registry_conf)
        self.max_bytes = max_bytes

    def decode(self, topic: str, is_key: bool, data: bytes | None) -> dict[str, Any] | None:
        if data is None:
            return None
        try:
            framed = self._framing.parse(data, protobuf=False)
        except self._framing.FramingError:
            return plain(data, self.max_bytes)
        sr = self._sr
        try:
            schema = self.registry.resolve(framed.schema_id)
            if schema.schema_type == sr.PROTOBUF:
                framed = self._framing.parse(data, protobuf=True)
            value = self._decode(schema, framed, data)
        except (sr.UnknownSchema, sr.SchemaUnusable, sr.RegistryUnavailable, sr.RegistryAuthError) as e:
            return {**plain(data, self.max_bytes), "schema_id": framed.schema_id, "schema_error": str(e)}
        except Exception as e:  # bytes that do not decode under the schema they name
            return {
                **plain(data, self.max_bytes),
                "schema_id": framed.schema_id,
                "schema_error": f"does not decode as schema id {framed.schema_id}: {type(e).__name__}: {e}",
            }
        return {"schema_id": framed.schema_id, "schema_type": schema.schema_type, "decoded": _jsonable(value)}

    def _decode(self, schema, framed, data: bytes) -> Any:
        payload = data[framed.header_len :]
        if schema.schema_type == self._sr.AVRO:
            import fastavro

            return fastavro.schemaless_reader(io.BytesIO(payload), schema.avro, None)
        if schema.schema_type == self._sr.PROTOBUF:
            from google.protobuf.json_format import MessageToDict

            desc = schema.proto.message_by_indexes(framed.indexes or (0,))
            message = schema.proto.message_class(desc).FromString(payload)
            return MessageToDict(message, preserving_proto_field_name=True)
        if schema.schema_type == self._sr.JSON:
            return json.loads(payload)
        return {"base64": base64.b64encode(payload).decode()}


def configured_registry(cfg) -> dict[str, Any] | None:
    """The registry client settings of the sidecar's configuration (``iceberg.registry.*``),
    or None when no registry is configured or the Iceberg settings are not available.
    Raises ``DecoderUnavailable`` when they are set but unusable."""
    try:
        url = cfg.get("iceberg.registry.url")
        from rsm_sidecar.iceberg.settings import RegistrySettings
    except (KeyError, ImportError):
        return None
    if not url:
        return None
    from rsm_sidecar.errors import ConfigError

    try:
        return RegistrySettings.from_config(cfg).client_config()
    except ConfigError as e:
        raise DecoderUnavailable(f"the configured schema registry cannot be used: {e}") from None


def build(registry: str | dict[str, Any] | None, max_bytes: int = NO_LIMIT) -> Decoder:
    """The registry decoder when a registry (URL or client settings) is given, plain
    otherwise. Raises ``DecoderUnavailable`` when the registry modules are missing."""
    if registry:
        return RegistryDecoder(registry, max_bytes)
    return PlainDecoder(max_bytes)
