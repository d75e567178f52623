"""`python -m devstack.cli up|down|demo`: the local stack by hand, and the demo.

make up             # a broker on 127.0.0.1:9092 with tiered storage; logs in run/stack/
make up BROKERS=3   # a controller, brokers on 127.0.0.1:9092-9094, a sidecar each; logs in run/cluster/
make down           # (both: Kafka's tools in run/bin/)
make demo           # start, produce, tier, consume from remote, summary, stop
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from devstack.cluster import ClusterStack
from devstack.common import wait_for_stop_signal
from devstack.kafka import create_topics
from devstack.kafka_tools import write_wrappers
from devstack.stack import LocalStack

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "run"
#: where `make setup` installs the `rsm-sidecar` command, as a user types it from the checkout
VENV_BIN = ".venv/bin"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _say(msg: str) -> None:
    print(msg, flush=True)


# -- up / down ------------------------------------------------------------------------------
def up(args) -> int:
    if args.brokers != 1 and args.brokers < 3:
        _say(f"BROKERS={args.brokers}: use 1 (one broker) or 3 and more (a cluster)")
        return 1
    workdir = RUN / ("stack" if args.brokers == 1 else "cluster")
    pidfile = RUN / "stack.pid"
    if pidfile.exists():
        try:
            os.kill(int(pidfile.read_text()), 0)
            _say(f"the stack is already running (pid {pidfile.read_text().strip()}); `make down` stops it")
            return 1
        except (OSError, ValueError):
            pidfile.unlink()
    if args.fresh and workdir.exists():
        shutil.rmtree(workdir)
    ports = list(range(9092, 9092 + args.brokers))
    busy = [p for p in ports if not _port_free(p)]
    if busy:
        _say(f"127.0.0.1:{busy[0]} is in use; stop whatever listens there first")
        return 1
    if args.brokers == 1:
        stack: LocalStack | ClusterStack = LocalStack(
            workdir, storage=args.storage, transfer_mode=args.transfer_mode, broker_port=9092
        )
    else:
        stack = ClusterStack(
            workdir,
            brokers=args.brokers,
            storage=args.storage,
            transfer_mode=args.transfer_mode,
            broker_ports=ports,
        )
    stack.start()
    pidfile.write_text(str(os.getpid()))
    try:
        wait_for_stop_signal(ready=lambda: _say(_banner(stack, args)))
    finally:
        stack.stop()
    pidfile.unlink(missing_ok=True)
    return 0


def _banner(stack: LocalStack | ClusterStack, args) -> str:
    modes = f"({args.storage} storage, {args.transfer_mode} transfer mode)"
    if isinstance(stack, LocalStack):
        dist = stack.broker.dist
        head = (
            f"up: Kafka {dist.version} on {stack.bootstrap_servers} with tiered storage {modes}\n"
            f"    sidecar: {stack.sidecar_target}  logs: {stack.workdir}/logs, {stack.workdir}/kafka/logs\n"
        )
        create = "--config remote.storage.enable=true --config local.retention.ms=60000"
    else:
        dist = stack.dist
        nodes = stack.nodes.values()
        head = (
            f"up: Kafka {dist.version}, {len(stack.nodes)} brokers on {stack.bootstrap_servers} and a "
            f"controller, with tiered storage {modes}\n"
            + "".join(
                f"    broker {n.node_id}: {n.broker.bootstrap_servers}, sidecar {n.sidecar_target}, logs "
                f"{n.workdir}/kafka/logs, {n.workdir}/logs\n"
                for n in nodes
            )
        )
        create = (
            "--partitions 6 --replication-factor 3 --config min.insync.replicas=2 "
            "--config remote.storage.enable=true --config local.retention.ms=60000"
        )
    tools = write_wrappers(dist, RUN / "bin")
    return (
        f"{head}    Kafka's tools ({len(tools)}) in {RUN / 'bin'}, e.g. create a tiered topic:\n"
        f"    run/bin/kafka-topics.sh --bootstrap-server {stack.bootstrap_servers} --create --topic t "
        + create
    )


def down(args) -> int:
    pidfile = RUN / "stack.pid"
    if not pidfile.exists():
        _say("the stack is not running")
        return 0
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pidfile.unlink()
        return 0
    for _ in range(600):
        if not pidfile.exists():
            break
        time.sleep(0.1)
    _say("down")
    return 0


# -- demo --------------------------------------------------------------------------------------
#: The JSON Schema of the demo's order values: their properties become the table's columns.
DEMO_SCHEMA = Path(__file__).resolve().parents[1] / "config" / "demo-orders.schema.json"
#: How the demo writes an order value; the table's columns must give back exactly these bytes.
ORDER_JSON = '{"order_id":%d,"status":"%s","amount":%.2f,"currency":"%s","items":%d,"note":"%s"}'


def _demo_iceberg(stack: LocalStack, topic: str, workdir: Path, record_hashes: list[bytes]) -> dict:
    """``rsm-sidecar iceberg convert`` on what the demo tiered (Spark on local[2], reading the
    stored segments, not the broker), with the orders' JSON Schema (``DEMO_SCHEMA``), then the
    table read back with PyIceberg: one row per tiered record, at its offset, with the key that
    was produced and the value's columns giving back the value that was produced."""
    import subprocess

    from rsm_sidecar.iceberg.job import load_config
    from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
    from rsm_sidecar.iceberg.settings import JobSettings

    config_file, sidecar_env = stack.sidecar_config_env()
    lake, log = workdir / "lake", workdir / "iceberg-convert.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSM__")}
    env.update(sidecar_env)
    env["RSM__ICEBERG__SPARK__SCRATCH_DIR"] = str(workdir / "spark-scratch")
    cmd = [sys.executable, "-m", "rsm_sidecar.cli.main", "iceberg", "convert", "--config", str(config_file)]
    cmd += ["--topic", topic, "--catalog-root", str(lake), "--master", "local[2]"]
    cmd += ["--value-json-schema", str(DEMO_SCHEMA)]
    t0 = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900)
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise RuntimeError(f"iceberg convert exited {done.returncode}; its log is {log}:\n{tail}")

    cfg, _ = load_config(
        config_file, environ=sidecar_env, overrides={"iceberg.catalog.local.root": str(lake)}
    )
    settings = JobSettings.from_config(cfg)
    ident = (settings.namespace, settings.table_name(topic))
    table = CatalogSpec(settings.catalog).prepare().pyiceberg().load_table(ident)
    rows = table.scan(selected_fields=("key", "val", "kafka")).to_arrow().to_pylist()
    rows.sort(key=lambda r: r["kafka"]["offset"])
    offsets = [r["kafka"]["offset"] for r in rows]
    if not rows or offsets != list(range(len(rows))):
        raise RuntimeError(
            f"the table's offsets are not 0..{len(rows) - 1}: {offsets[:5]} ... {offsets[-5:]}"
        )
    for r in rows:
        v = r["val"]
        if v["__err__"] is not None or v["__raw__"] is not None:
            raise RuntimeError(f"the table's row at offset {r['kafka']['offset']} was not decoded: {v}")
        value = ORDER_JSON % (v["order_id"], v["status"], v["amount"], v["currency"], v["items"], v["note"])
        if (
            hashlib.sha256(r["key"]["__raw__"] + b"\0" + value.encode()).digest()
            != record_hashes[r["kafka"]["offset"]]
        ):
            raise RuntimeError(f"the table's row at offset {r['kafka']['offset']} is not the record produced")
    first = rows[0]
    columns = ", ".join(
        f"{k} {x!r}" for k, x in first["val"].items() if k not in ("__raw__", "__prefix__", "__err__")
    )
    return {
        "name": ".".join(ident),
        "rows": len(rows),
        "first_row": f"kafka.offset {first['kafka']['offset']}, key.__raw__ "
        f"{first['key']['__raw__'].decode()!r}, val: {columns}",
        "files": sum(1 for _ in table.scan().plan_files()),
        "seconds": seconds,
        "hint": f"PyIceberg SqlCatalog at {lake} (rsm-sidecar iceberg status --config {config_file} "
        f"--catalog-root {lake} --topic {topic})",
    }


def write_inspect_config(config_file: Path, environ: dict[str, str], path: Path) -> str:
    """A configuration file of what a sidecar with ``config_file`` and ``environ`` (its RSM__
    overrides) stored on local storage, for `rsm-sidecar inspect` once the sidecar is gone: its
    storage root, key prefix and keyring and nothing else. Returns the command that lists it."""
    import json

    from rsm_sidecar.config import Config

    cfg = Config.load(config_file, environ=environ)
    lines = [
        "# What `make demo` stored, for `rsm-sidecar inspect` (written by the demo; docs/inspect.md)",
        "[storage]",
        'backend = "local"',
        f"key_prefix = {json.dumps(cfg['storage.key_prefix'])}",
        "[storage.local]",
        f"root = {json.dumps(os.path.abspath(cfg['storage.local.root']))}",
        "[encryption]",
        f"enabled = {'true' if cfg['encryption.enabled'] else 'false'}",
    ]
    if cfg["encryption.enabled"]:
        lines.append(f"active_key_id = {json.dumps(cfg['encryption.active_key_id'])}")
        for key_id, files in sorted(cfg.family("encryption.keys").items()):
            lines.append(f"[encryption.keys.{key_id}]")
            lines += [f"{leaf} = {json.dumps(os.path.abspath(v))}" for leaf, v in sorted(files.items())]
    path.write_text("\n".join(lines) + "\n")
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return f"{VENV_BIN}/rsm-sidecar inspect ls -c {shown}"


def demo(args) -> int:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import NewTopic

    from rsm_sidecar.format.keys import KeyLayout
    from rsm_sidecar.format.manifest import SegmentManifest

    t_start = time.monotonic()
    workdir = Path(args.workdir).resolve() if args.workdir else RUN / "demo"
    marker = workdir / ".rsm-demo"  # a directory the demo may empty: run/demo, or one it made
    if args.workdir and workdir.exists() and any(workdir.iterdir()) and not marker.exists():
        _say(f"{workdir} is not empty and no earlier demo made it: give --workdir a new or empty directory")
        return 2
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    marker.touch()
    _say(f"[1/6] starting Kafka with tiered storage ({args.storage} storage, {args.transfer_mode} mode) ...")
    stack = LocalStack(
        workdir,
        storage=args.storage,
        transfer_mode=args.transfer_mode,
        broker_port=9092 if _port_free(9092) else None,
    )
    stack.start()
    try:
        bootstrap = stack.bootstrap_servers
        _say(f"      broker {bootstrap} (Kafka {stack.broker.dist.version}), sidecar {stack.sidecar_target}")
        topic = "demo-orders"
        create_topics(
            bootstrap,
            [
                NewTopic(
                    topic,
                    1,
                    1,
                    config={
                        "remote.storage.enable": "true",
                        "segment.bytes": "1048576",
                        "local.retention.ms": "1000",
                        "retention.ms": "604800000",
                        "file.delete.delay.ms": "1000",
                    },
                )
            ],
        )

        _say(f"[2/6] producing {args.records} order events to {topic} (1 MiB segments) ...")
        rng = random.Random(2026)
        digest = hashlib.sha256()
        record_hashes: list[bytes] = []  # by offset: what the Iceberg table must hold
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
        statuses = ["created", "paid", "packed", "shipped", "delivered"]
        for i in range(args.records):
            key = b"customer-%05d" % rng.randrange(20000)
            cents = rng.randrange(100, 90000)
            value = (
                ORDER_JSON
                % (i, statuses[i % 5], cents / 100, "EUR", rng.randrange(1, 9), rng.randbytes(24).hex())
            ).encode()
            digest.update(key + b"\0" + value + b"\n")
            record_hashes.append(hashlib.sha256(key + b"\0" + value).digest())
            p.produce(topic, key=key, value=value)
            if i % 10000 == 0:
                p.poll(0)
                if i:
                    _say(f"      {i} records")
        p.flush(60)
        del p  # no client left to complain while the broker stops
        _say(f"      {args.records} records produced")

        _say(
            "[3/6] waiting until closed segments are in remote storage and deleted from the broker's disk ..."
        )
        part_dir = stack.broker.partition_dir(topic)
        store = stack.object_store()
        layout = KeyLayout("tiered/")
        last_line = ""
        deadline = time.monotonic() + 300
        while True:
            local = sorted(int(f.name.split(".")[0]) for f in part_dir.iterdir() if f.name.endswith(".log"))
            manifests = [
                o
                for o in store.list("tiered/")
                if o.key.endswith(".rsm-manifest")
                and (layout.parse(o.key) or None)
                and layout.parse(o.key).topic == topic
            ]
            line = f"      {len(manifests)} segments in remote storage, {len(local)} on the broker's disk"
            if line != last_line:
                _say(line)
                last_line = line
            if manifests and len(local) == 1:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("segments were not tiered within 5 minutes; see run/demo/kafka/logs")
            time.sleep(1)
        first_local = local[0]

        _say(
            f"[4/6] consuming everything from offset 0 "
            f"(offsets below {first_local} are served from remote) ..."
        )
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "demo",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        c.assign([TopicPartition(topic, 0, 0)])
        check = hashlib.sha256()
        n = 0
        t0 = time.monotonic()
        from_remote = 0
        while n < args.records and time.monotonic() - t0 < 180:
            m = c.poll(1.0)
            if m is None or m.error():
                continue
            if m.offset() != n:
                raise RuntimeError(f"expected offset {n}, got {m.offset()}")
            check.update(m.key() + b"\0" + m.value() + b"\n")
            from_remote += m.offset() < first_local
            n += 1
        c.close()
        del c
        import gc

        gc.collect()
        read_secs = time.monotonic() - t0
        if n != args.records or check.digest() != digest.digest():
            raise RuntimeError(
                f"verification failed: {n} of {args.records} records, digest "
                f"{'matches' if check.digest() == digest.digest() else 'differs'}"
            )

        original = stored = 0
        compressed = encrypted = 0
        for o in manifests:
            m = SegmentManifest.from_bytes(store.get(o.key), o.key)
            original += m.original_size
            base = o.key[: -len(".rsm-manifest")]
            stored += sum(store.size(base + s) for s in (".log", ".indexes", ".rsm-manifest"))
            compressed += m.compression
            encrypted += m.encryption is not None
        _say(
            f"[5/6] writing the tiered segments to an Iceberg table (Spark local[2], local catalog in "
            f"{workdir / 'lake'}) ..."
        )
        table = _demo_iceberg(stack, topic, workdir, record_hashes)
        if args.storage == "local":
            inspect = write_inspect_config(*stack.sidecar_config_env(), workdir / "inspect.toml")
            look = f"{inspect}   (then du, verify, dump SEGMENT: docs/inspect.md)"
        else:
            look = f"the {args.storage} server stops with the demo; with local storage the store stays"
        _say("[6/6] summary")
        _say(
            f"      segments tiered:        {len(manifests)} ({compressed} zstd-compressed, {encrypted} "
            f"AES-256-GCM encrypted)"
        )
        _say(f"      bytes on the broker:    {original:,} (the segments' .log files)")
        _say(f"      bytes in storage:       {stored:,} (.log + .indexes + .rsm-manifest)")
        _say(f"      compression ratio:      {original / stored:.2f}x")
        _say(
            f"      records verified:       {n:,} of {args.records:,} (sha256 of keys and values matches; "
            f"{from_remote:,} served from remote storage, {n / read_secs:,.0f} records/s)"
        )
        _say(
            f"      remote objects:         {stack.remote_root if args.storage == 'local' else args.storage}"
        )
        _say(
            f"      Iceberg table:          {table['name']}: {table['rows']:,} rows = every record of the "
            f"tiered segments (offsets 0-{table['rows'] - 1:,}; the value's JSON as columns, "
            f"{DEMO_SCHEMA.relative_to(DEMO_SCHEMA.parents[1])}; each key and value matches), "
            f"{table['files']} data files, written in {table['seconds']:.0f}s"
        )
        _say(f"      its first row:          {table['first_row']}")
        _say(f"      read it:                {table['hint']}")
        _say(f"      look at what it stored: {look}")
        _say(f"      total time:             {time.monotonic() - t_start:.0f}s")
    finally:
        _say("stopping the stack ...")
        stack.stop()
    _say("demo OK")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="devstack")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in (("up", up), ("down", down), ("demo", demo)):
        p = sub.add_parser(name)
        p.set_defaults(func=fn)
        if name != "down":
            p.add_argument(
                "--storage",
                default=os.environ.get("STORAGE") or "local",
                choices=("local", "s3", "gcs", "azure"),
            )
            p.add_argument(
                "--transfer-mode",
                default=os.environ.get("TRANSFER_MODE") or "path",
                choices=("path", "stream"),
            )
        if name == "up":
            p.add_argument("--fresh", action="store_true", help="start from empty data directories")
            p.add_argument(
                "--brokers",
                type=int,
                default=int(os.environ.get("BROKERS") or 1),
                help="1 (one broker, the default) or 3 and more (a controller and a cluster of brokers)",
            )
        if name == "demo":
            p.add_argument("--records", type=int, default=int(os.environ.get("RECORDS") or 60000))
            p.add_argument("--workdir", help="where the broker, sidecar, objects and table go (run/demo)")
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
