#!/usr/bin/env python3
"""The docker-compose demo producer: Protobuf, Avro and raw records to tiered topics, then
proof that they are tiered and read back.

    python produce.py --bootstrap kafka-1:9092 --registry http://registry:8080/apis/ccompat/v7 \\
        --config /etc/rsm-sidecar/sidecar.toml [--records 25000] \\
        [--metrics http://sidecar-1:9096/metrics,http://sidecar-2:9096/metrics]

1. waits for the brokers and the schema registry;
2. creates three topics at the brokers' default replication factor (3 in the compose cluster)
   with ``remote.storage.enable=true`` and 1 MiB segments (the 4.x minimum): ``demo-orders``
   (Protobuf values, docker/demo/demo/v1/order.proto), ``demo-clicks`` (Avro values,
   docker/demo/click.avsc), ``demo-raw`` (plain JSON bytes); keys are plain strings;
3. produces ``--records`` records to each, the values serialized by confluent-kafka's
   registry serializers (the schemas are registered under the topic subject, as the Iceberg
   job expects);
4. waits until at least ``--min-segments`` new segments of every topic are in object storage,
   looking at the storage the sidecars use (``--config`` plus the same ``RSM__...``
   environment: the segment manifests are listed, nothing is decrypted);
5. consumes what it produced from the first offset and compares a SHA-256 of every key and
   value with what was sent; the segments deleted locally (``local.retention.ms=1000``) are
   served by the leader's sidecar from object storage, which the sidecars' ``rsm_bytes_total
   {kind="fetch_served"}`` counters show when ``--metrics`` is given.

Exit 0 when every record came back unchanged. Every setting also reads an environment
variable (``DEMO_BOOTSTRAP``, ``DEMO_SCHEMA_REGISTRY``, ``DEMO_SIDECAR_CONFIG``,
``DEMO_RECORDS``, ``DEMO_SIDECAR_METRICS``), so docker-compose.yml sets them there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import importlib
import json
import os
import random
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOPICS = ("demo-orders", "demo-clicks", "demo-raw")
TOPIC_CONFIG = {
    "remote.storage.enable": "true",
    "segment.bytes": "1048576",  # the smallest segment Kafka 4.x accepts
    "local.retention.ms": "1000",  # tiered segments leave the broker's disk at once
    "retention.ms": "604800000",  # and stay in object storage for 7 days
    "file.delete.delay.ms": "1000",
}
# confluent-kafka 2.16 defaults to the ASSOCIATED subject strategy, which Apicurio lacks.
SERIALIZER_CONF = {"subject.name.strategy.type": "TOPIC"}


def say(msg: str) -> None:
    print(msg, flush=True)


def wait_for(what: str, probe: Callable[[], object], timeout: float) -> object:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            result = probe()
            if result:
                return result
        except Exception as e:
            last = e
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: {what} not ready after {timeout:.0f}s" + (f": {last}" if last else ""))
        time.sleep(2)


# -- values ----------------------------------------------------------------------------------
def order_module():
    """demo.v1.order_pb2, compiled at run time by grpcio-tools' bundled protoc."""
    import grpc_tools
    from grpc_tools import protoc

    wkt = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="demo-pb2-") as out:  # imported, then not needed
        rc = protoc.main(["protoc", f"-I{HERE}", f"-I{wkt}", f"--python_out={out}", "demo/v1/order.proto"])
        if rc != 0:
            raise SystemExit("demo: protoc failed on demo/v1/order.proto")
        sys.path.insert(0, out)
        try:
            return importlib.import_module("demo.v1.order_pb2")
        finally:
            sys.path.remove(out)


def orders(rng: random.Random, pb2) -> Iterator[tuple[bytes, object]]:
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    i = 0
    while True:
        o = pb2.Order(
            order_id=f"o-{i:08d}",
            customer=f"customer-{rng.randrange(20000):05d}",
            status=1 + i % 4,
            currency=rng.choice(("EUR", "USD", "GBP")),
        )
        for _ in range(rng.randrange(1, 4)):
            o.lines.add(
                sku=f"sku-{rng.randrange(5000):04d}",
                quantity=rng.randrange(1, 5),
                unit_price_cents=rng.randrange(100, 50000),
            )
        o.created_at.FromDatetime(start + dt.timedelta(seconds=i))
        if i % 7 == 0:
            o.note = "gift wrap"
        yield o.customer.encode(), o
        i += 1


def clicks(rng: random.Random) -> Iterator[tuple[bytes, dict]]:
    pages = ["/", "/search", "/product", "/cart", "/checkout", "/account"]
    t0 = 1_767_225_600_000
    i = 0
    while True:
        session = f"s-{rng.randrange(50000):05d}"
        yield (
            session.encode(),
            {
                "session": session,
                "page": rng.choice(pages) + f"?id={rng.randrange(10**6)}",
                "referrer": None if i % 3 else rng.choice(("google", "newsletter", "partner")),
                "duration_ms": rng.randrange(50, 120000),
                "at": t0 + i * 37,
                "device": rng.choice(("DESKTOP", "MOBILE", "TABLET")),
            },
        )
        i += 1


def raw_events(rng: random.Random) -> Iterator[tuple[bytes, bytes]]:
    i = 0
    while True:
        key = f"sensor-{rng.randrange(500):03d}"
        yield (
            key.encode(),
            json.dumps(
                {
                    "sensor": key,
                    "seq": i,
                    "celsius": round(rng.uniform(-20, 45), 2),
                    "battery": rng.randrange(100),
                    "fw": "1.4.2",
                }
            ).encode(),
        )
        i += 1


# -- storage and metrics ---------------------------------------------------------------------
class TieredSegments:
    """Counts segment manifests per topic in the sidecar's object storage."""

    def __init__(self, config_path: str):
        from rsm_sidecar.config import Config
        from rsm_sidecar.format.keys import KeyLayout
        from rsm_sidecar.storage.factory import open_store

        cfg = Config.load(config_path)
        self.store = open_store(cfg)
        self.layout = KeyLayout(cfg["storage.key_prefix"], cfg["storage.hashed_prefix_chars"])

    def count(self) -> dict[str, int]:
        out = dict.fromkeys(TOPICS, 0)
        for obj in self.store.list(self.layout.topic_list_prefix()):
            parsed = self.layout.parse(obj.key)
            if parsed and parsed.suffix == "rsm-manifest" and parsed.topic in out:
                out[parsed.topic] += 1
        return out


def fetch_served_bytes(metrics_urls: str | None) -> float | None:
    """The sidecars' ``rsm_bytes_total{kind="fetch_served"}``, summed over the comma-separated
    /metrics URLs (one per sidecar); None if any does not answer."""
    if not metrics_urls:
        return None
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for url in metrics_urls.split(","):
        try:
            with urllib.request.urlopen(url.strip(), timeout=5) as r:
                text = r.read().decode()
        except (urllib.error.URLError, OSError):
            return None
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "rsm_bytes_total" and s.labels.get("kind") == "fetch_served":
                    total += s.value
    return total


# -- main ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default=env("DEMO_BOOTSTRAP", "kafka-1:9092"))
    ap.add_argument(
        "--registry",
        default=env("DEMO_SCHEMA_REGISTRY", "http://registry:8080/apis/ccompat/v7"),
        help="Confluent-compatible schema registry URL",
    )
    ap.add_argument(
        "--config",
        default=env("DEMO_SIDECAR_CONFIG", "/etc/rsm-sidecar/sidecar.toml"),
        help="the sidecar's configuration (RSM__ environment applies), to see its storage",
    )
    ap.add_argument(
        "--records", type=int, default=int(env("DEMO_RECORDS", "25000")), help="records per topic"
    )
    ap.add_argument("--min-segments", type=int, default=2, help="new tiered segments to wait for, per topic")
    ap.add_argument(
        "--metrics",
        default=env("DEMO_SIDECAR_METRICS", ""),
        help="the sidecars' /metrics URLs, comma-separated",
    )
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each stage")
    args = ap.parse_args(argv)

    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    t_start = time.monotonic()
    say(f"[1/5] waiting for the broker at {args.bootstrap} and the registry at {args.registry} ...")
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    brokers = len(args.bootstrap.split(","))
    wait_for(f"{brokers} brokers", lambda: len(admin.list_topics(timeout=5).brokers) >= brokers, args.timeout)
    wait_for(
        "the schema registry",
        lambda: urllib.request.urlopen(args.registry + "/subjects", timeout=5).status == 200,
        args.timeout,
    )
    tiered = TieredSegments(args.config)
    before = tiered.count()

    say(f"[2/5] creating {', '.join(TOPICS)} (remote.storage.enable=true, 1 MiB segments) ...")
    existing = admin.list_topics(timeout=10).topics
    # the brokers' default replication factor (3: config/cluster.properties)
    new = [NewTopic(t, 1, config=TOPIC_CONFIG) for t in TOPICS if t not in existing]
    for _topic, fut in admin.create_topics(new).items() if new else []:
        fut.result(30)

    say(f"[3/5] producing {args.records:,} records to each topic ...")
    registry = SchemaRegistryClient({"url": args.registry})
    pb2 = order_module()
    proto_ser = ProtobufSerializer(pb2.Order, registry, SERIALIZER_CONF)
    avro_ser = AvroSerializer(registry, (HERE / "click.avsc").read_text(), conf=SERIALIZER_CONF)
    rng = random.Random(2026)
    sources = {
        "demo-orders": (
            orders(rng, pb2),
            lambda v, t: proto_ser(v, SerializationContext(t, MessageField.VALUE)),
        ),
        "demo-clicks": (clicks(rng), lambda v, t: avro_ser(v, SerializationContext(t, MessageField.VALUE))),
        "demo-raw": (raw_events(rng), lambda v, t: v),
    }
    consumer_probe = Consumer({"bootstrap.servers": args.bootstrap, "group.id": "demo-probe"})
    first_offset = {
        t: consumer_probe.get_watermark_offsets(TopicPartition(t, 0), timeout=10)[1] for t in TOPICS
    }
    consumer_probe.close()
    producer = Producer({"bootstrap.servers": args.bootstrap, "enable.idempotence": True, "linger.ms": 20})
    digests = {}
    for topic, (gen, serialize) in sources.items():
        h = hashlib.sha256()
        for i in range(args.records):
            key, value = next(gen)
            data = serialize(value, topic)
            h.update(key + b"\0" + data + b"\n")
            while True:
                try:
                    producer.produce(topic, key=key, value=data)
                    break
                except BufferError:
                    producer.poll(0.1)
            if i % 5000 == 0:
                producer.poll(0)
        digests[topic] = h.digest()
        say(f"      {topic}: {args.records:,} records from offset {first_offset[topic]}")
    if producer.flush(120) != 0:
        raise SystemExit("demo: not every record was acknowledged by the broker")

    say(
        f"[4/5] waiting until at least {args.min_segments} new segments of each topic"
        " are in object storage ..."
    )
    last = ""

    def enough() -> bool:
        nonlocal last
        now = tiered.count()
        line = "      " + ", ".join(f"{t}: {now[t] - before[t]}" for t in TOPICS)
        if line != last:
            say(line)
            last = line
        return all(now[t] - before[t] >= args.min_segments for t in TOPICS)

    wait_for("tiering", enough, args.timeout)
    time.sleep(5)  # local retention (1 s) and the broker's retention check (1 s) delete the local copies

    say(
        "[5/5] consuming everything produced, from the first offset"
        " (tiered segments come from object storage) ..."
    )
    served_before = fetch_served_bytes(args.metrics)
    ok = True
    for topic in TOPICS:
        c = Consumer(
            {
                "bootstrap.servers": args.bootstrap,
                "group.id": f"demo-verify-{topic}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        c.assign([TopicPartition(topic, 0, first_offset[topic])])
        h = hashlib.sha256()
        n = 0
        deadline = time.monotonic() + args.timeout
        while n < args.records and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            h.update(m.key() + b"\0" + m.value() + b"\n")
            n += 1
        c.close()
        same = n == args.records and h.digest() == digests[topic]
        ok &= same
        say(
            f"      {topic}: {n:,} of {args.records:,} records read back, "
            f"{'identical' if same else 'DIFFERENT'} (sha256 of keys and values)"
        )
    served_after = fetch_served_bytes(args.metrics)
    counts = tiered.count()
    say("summary")
    say("      segments in object storage: " + ", ".join(f"{t} {counts[t]}" for t in TOPICS))
    if served_before is not None and served_after is not None:
        say(
            f"      served by the sidecars from object storage while reading back: "
            f'{(served_after - served_before) / 2**20:.1f} MiB (rsm_bytes_total{{kind="fetch_served"}})'
        )
    say(f"      total time: {time.monotonic() - t_start:.0f}s")
    if not ok:
        say("demo FAILED: records differ")
        return 1
    say("demo OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
