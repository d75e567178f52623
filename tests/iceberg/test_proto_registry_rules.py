"""The seed's mapping rules that involve the registry, against a real Apicurio: Protobuf
extensions declared in a schema and in its reference, schema ids
fetched once per process (HTTP requests counted by a proxy in front of Apicurio), and values
framed the Kafka-on-Pulsar way (unsupported: ``__err__`` + ``__raw__``)."""

from __future__ import annotations

import collections
import http.client
import http.server
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka.schema_registry import Schema, SchemaReference
from google.protobuf import descriptor_pb2

from rsm_sidecar.iceberg.decoding import framing
from rsm_sidecar.iceberg.decoding.protobuf_schema import ProtoSchema
from rsm_sidecar.iceberg.decoding.schema_registry import SchemaRegistry, topic_subject
from rsm_sidecar.iceberg.decoding.sides import descriptor_set_side, resolve_side
from rsm_sidecar.iceberg.mapping.rows import EncoderSpec, RowEncoder
from rsm_sidecar.iceberg.reading.raw_records import KafkaRecord, raw_batch
from tests.iceberg.test_proto_mapping import EXT_BASE, EXT_MAIN, ext_event


def rec(offset: int, value: bytes | None, key: bytes | None = b"k", headers=()) -> KafkaRecord:
    return KafkaRecord(0, offset, offset, 1_700_000_000_000, 1_700_000_000_000, key, value, list(headers))


def register_ext(sr_client, topic: str) -> int:
    """ext/base.proto as its own subject, app.proto (importing it) as ``<topic>-value``."""
    ref_subject = f"{topic}-ext-base"
    sr_client.register_schema(ref_subject, Schema(EXT_BASE, "PROTOBUF"))
    main = Schema(EXT_MAIN, "PROTOBUF", [SchemaReference("ext/base.proto", ref_subject, 1)])
    return sr_client.register_schema(topic_subject(topic, False), main)


def test_extension_values_from_registered_schemas_land_in_unrecognized(registry_url, sr_client, topic):
    """``extend`` in the registered schema and in the schema it references: the values land in
    ``__unrecognized__`` of the extended message, on the vectorised path and the per-record one."""
    sid = register_ext(sr_client, topic)
    local = ProtoSchema.from_sources("app.proto", {"app.proto": EXT_MAIN, "ext/base.proto": EXT_BASE})
    pre = framing.encode_preamble(sid, [0])
    events = [ext_event(local, i) for i in range(3)]
    values = [pre + m.SerializeToString() for m, _ in events]
    reg = SchemaRegistry(registry_url)
    enc = RowEncoder(EncoderSpec(val=resolve_side(reg, topic, False)))
    assert enc.spec.val.kind == "protobuf" and enc.spec.val.message == "app.Event"
    names = [f.name for f in enc.schema.find_field("val").field_type.fields]
    assert names == ["__raw__", "__prefix__", "__err__", "id", "base", "__unrecognized__"]
    fast = enc.encode(raw_batch([rec(i, v) for i, v in enumerate(values)])).to_pylist()
    # a record with a bad preamble sends the whole batch through the per-record path
    slow = enc.encode(raw_batch([rec(i, v) for i, v in enumerate([*values, b"\x01bad-magic"])])).to_pylist()
    assert slow[-1]["val"]["__err__"].startswith("missing magic byte")
    for rows in (fast, slow):
        for i, ((_, (top, base, inner)), row) in enumerate(zip(events, rows)):
            val = row["val"]
            assert val["__err__"] is None and val["__raw__"] is None and val["id"] == f"e{i}"
            assert val["__unrecognized__"] == top
            assert val["base"]["name"] == "b" and val["base"]["__unrecognized__"] == base
            assert val["base"]["inner"] == {"n": i, "__unrecognized__": inner}


class _CountingProxy(http.server.ThreadingHTTPServer):
    """Forwards every request to ``upstream`` and counts them by method and path."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    server: _CountingProxy

    def _forward(self) -> None:
        srv = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
        for attempt in (1, 2):  # a connection the registry dropped unanswered is the proxy's to retry
            req = urllib.request.Request(srv.upstream + self.path, body, headers, method=self.command)
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    status, ctype, data = resp.status, resp.headers.get("Content-Type"), resp.read()
            except urllib.error.HTTPError as exc:
                status, ctype, data = exc.code, exc.headers.get("Content-Type"), exc.read()
            except (http.client.RemoteDisconnected, ConnectionResetError):
                if attempt == 2:
                    raise
                continue
            break
        with srv.lock:  # counted once answered: what the client asked for, not the proxy's retries
            srv.counts[(self.command, self.path.split("?")[0])] += 1
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _forward

    def log_message(self, format, *args):  # quiet
        pass


@contextmanager
def counting_proxy(upstream: str) -> Iterator[_CountingProxy]:
    proxy = _CountingProxy(upstream)
    t = threading.Thread(target=proxy.serve_forever, daemon=True)
    t.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
        t.join(10)


def test_each_schema_id_is_fetched_once_per_process(registry_url, sr_client, topic):
    """Resolving the sides and encoding many batches of records written with two versions of
    the schema (and one unknown id) asks the registry for each id once, not per record/batch."""
    sid = register_ext(sr_client, topic)
    # a second version (one field more) written by some producers
    ref = SchemaReference("ext/base.proto", f"{topic}-ext-base", 1)
    v2_text = EXT_MAIN.replace(
        "optional ext.Base base = 2;", "optional ext.Base base = 2; optional int32 v = 3;"
    )
    sid2 = sr_client.register_schema(topic_subject(topic, False), Schema(v2_text, "PROTOBUF", [ref]))
    assert sid2 != sid
    local = ProtoSchema.from_sources("app.proto", {"app.proto": EXT_MAIN, "ext/base.proto": EXT_BASE})
    payload = ext_event(local)[0].SerializeToString()
    good = [framing.encode_preamble(sid, [0]) + payload, framing.encode_preamble(sid2, [0]) + payload]
    unknown = framing.encode_preamble(987_654, [0]) + payload
    with counting_proxy(registry_url) as proxy:
        conf = {"url": proxy.url}  # a new port: a shared instance of its own
        reg = SchemaRegistry.shared(conf)
        spec = EncoderSpec(val=resolve_side(reg, topic, False))
        assert spec.val.schema_id == sid2  # the latest version is the table's
        enc = RowEncoder(spec)
        n = 0
        for _ in range(5):  # batches
            batch = [rec(n + i, good[i % 2]) for i in range(200)] + [rec(n + 200, unknown)]
            n += 201
            rows = enc.encode(raw_batch(batch)).to_pylist()
            assert [r["val"]["id"] for r in rows[:200]] == ["e1"] * 200
            assert rows[-1]["val"]["__err__"] == "unknown schema id 987654"
        RowEncoder(spec).encode(raw_batch(batch))  # another encoder in the process: cached too
        counts = dict(proxy.counts)
    by_id = {path: c for (method, path), c in counts.items() if path.startswith("/schemas/ids/")}
    # an unknown id is remembered per encoder (the job builds one per process: encoder_for)
    assert by_id == {f"/schemas/ids/{sid}": 1, f"/schemas/ids/{sid2}": 1, "/schemas/ids/987654": 2}, counts
    # the latest version once at job start, the referenced schema once (both ids share it)
    latest = [c for (_, p), c in counts.items() if p.endswith(f"/subjects/{topic}-value/versions/latest")]
    assert latest == [1], counts
    assert sum(c for (_, p), c in counts.items() if f"{topic}-ext-base/versions" in p) == 1, counts
    assert sum(counts.values()) == 6, counts  # nothing else


def test_kop_framed_values_and_schema_version_headers_are_not_decoded(
    registry_url, sr_client, topic, tmp_path
):
    """Kafka-on-Pulsar framing (``0x03 0x04`` + 8-byte Pulsar schema version) is unsupported:
    such values end as ``__err__`` + ``__raw__``, never decoded as something else. A
    ``schema.version`` header neither helps an unframed value nor changes a framed one."""
    sid = register_ext(sr_client, topic)
    local = ProtoSchema.from_sources("app.proto", {"app.proto": EXT_MAIN, "ext/base.proto": EXT_BASE})
    payload = ext_event(local)[0].SerializeToString()
    framed = framing.encode_preamble(sid, [0]) + payload
    kop = b"\x03\x04" + (1).to_bytes(8, "big") + payload
    version_header = [("schema.version", (1).to_bytes(8, "big"))]
    reg = SchemaRegistry(registry_url)
    enc = RowEncoder(EncoderSpec(val=resolve_side(reg, topic, False)))
    rows = enc.encode(
        raw_batch(
            [
                rec(0, kop),
                rec(1, kop, headers=version_header),
                rec(2, payload, headers=version_header),
                rec(3, framed, headers=version_header),
            ]
        )
    ).to_pylist()
    for r, data in zip(rows[:2], (kop, kop)):
        assert r["val"]["__err__"] == (
            "KoP schema-version marker 0x03 0x04 (Pulsar schema version 1) is not supported: "
            "only the Confluent preamble (0x00 + 4-byte schema id) is decoded"
        )
        assert r["val"]["__raw__"] == data and r["val"]["__prefix__"] is None
        assert r["val"]["id"] is None and r["val"]["base"] is None and r["val"]["__unrecognized__"] is None
    assert rows[2]["val"]["__err__"].startswith("missing magic byte")
    assert rows[2]["val"]["__raw__"] == payload and rows[2]["val"]["id"] is None
    assert rows[3]["val"]["__err__"] is None and rows[3]["val"]["id"] == "e1"
    assert rows[3]["headers"] == [{"key": "schema.version", "value": (1).to_bytes(8, "big")}]
    # without a registry (unframed values, a descriptor-set file) the marker is no valid
    # Protobuf either: field number 0 in the first tag
    fds = descriptor_pb2.FileDescriptorSet()
    for name in ("google/protobuf/descriptor.proto", "ext/base.proto", "app.proto"):
        local.pool.FindFileByName(name).CopyToProto(fds.file.add())
    path = tmp_path / "app.binpb"
    path.write_bytes(fds.SerializeToString())
    unframed = RowEncoder(EncoderSpec(val=descriptor_set_side(path, "app.Event")))
    (r,) = unframed.encode(raw_batch([rec(0, kop)])).to_pylist()
    assert r["val"]["__err__"].startswith("invalid Protobuf for app.Event")
    assert r["val"]["__raw__"] == kop and r["val"]["id"] is None
