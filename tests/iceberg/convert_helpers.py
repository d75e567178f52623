"""Helpers for the convert-job tests: topics tiered by the sidecar's copy code into a local
directory (no broker), the job's configuration, the CLI in a subprocess with pause points,
and reading tables back."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from rsm_sidecar.config import Config
from rsm_sidecar.format.keys import KeyLayout
from rsm_sidecar.kafka import ControlType
from rsm_sidecar.kafka.builder import SimpleRecord, build_batch, build_control_batch
from rsm_sidecar.kafka.records import Header
from rsm_sidecar.storage.factory import open_store
from rsm_sidecar.transform.keyring import Keyring, write_key_pair
from tests.tiered_writer import TieredWriter

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000


#: the S3 identity of the session's SeaweedFS (tests/iceberg/conftest.py ``s3``)
ACCESS, SECRET = "iceberg-tests", "iceberg-tests-secret"


def s3_segments_toml(endpoint: str, bucket: str = "segments") -> str:
    """The sidecar's storage section for segments in the test S3 server."""
    return (
        f'[storage]\nbackend = "s3"\nkey_prefix = "tiered/"\n'
        f'[storage.s3]\nbucket = "{bucket}"\nendpoint_url = "{endpoint}"\n'
        f'region = "us-east-1"\naddressing_style = "path"\naccess_key_id = "{ACCESS}"\n'
        f'secret_access_key = "{SECRET}"\n'
    )


def rest_s3_overrides(endpoint: str, rest_uri: str) -> dict:
    """The ``[iceberg]`` settings of the REST catalog with its warehouse in the test S3 server."""
    return {
        "iceberg.catalog.type": "rest",
        "iceberg.catalog.rest.uri": rest_uri,
        "iceberg.warehouse": "s3://lake/warehouse",
        "iceberg.s3.endpoint": endpoint,
        "iceberg.s3.access_key_id": ACCESS,
        "iceberg.s3.secret_access_key": SECRET,
        "iceberg.s3.path_style_access": True,
    }


#: every step of ``iceberg maintain``, with no age guard
MAINTAIN_EVERYTHING_NOW = {
    "compact": True,
    "expire": True,
    "expire_older_than": dt.timedelta(0),
    "remove_orphans": True,
    "orphan_older_than": dt.timedelta(0),
}


@dataclasses.dataclass(frozen=True)
class Produced:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int


class SyntheticTopic:
    """A topic whose segments the sidecar's own copy code stores (zstd + AES-GCM) in
    ``<workdir>/remote``; remembers every committed record."""

    def __init__(
        self,
        workdir: Path,
        topic: str = "orders",
        *,
        catalog_name: str | None = None,
        storage_toml: str | None = None,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.topic = topic
        self.catalog_name = catalog_name or f"c{uuid.uuid4().hex[:8]}"
        write_key_pair(self.workdir / "k1.pub", self.workdir / "k1.priv", 2048)
        self.config_file = self.workdir / "sidecar.toml"
        storage = storage_toml or (
            f'[storage]\nbackend = "local"\nkey_prefix = "tiered/"\n'
            f'[storage.local]\nroot = "{self.workdir / "remote"}"\n'
        )
        self.config_file.write_text(
            storage + f'[encryption]\nenabled = true\nactive_key_id = "k1"\n'
            f'[encryption.keys.k1]\npublic_key_file = "{self.workdir / "k1.pub"}"\n'
            f'private_key_file = "{self.workdir / "k1.priv"}"\n'
            f'[iceberg]\nnamespace = "kafka"\n'
            f'[iceberg.catalog]\nname = "{self.catalog_name}"\n'
            f'[iceberg.catalog.local]\nroot = "{self.workdir / "catalog"}"\n'
        )
        cfg = Config.load(self.config_file, environ={})
        self.store = open_store(cfg)
        self.layout = KeyLayout("tiered/")
        self.writer = TieredWriter(self.store, self.layout, Keyring.from_config(cfg), topic)
        self.next_offset: dict[int, int] = {}
        self.records: list[Produced] = []  # committed records, in offset order per partition
        self.segments: list = []  # SegmentMetadata of every segment written

    @property
    def remote_root(self) -> Path:
        return self.workdir / "remote"

    def batch(
        self,
        partition: int,
        n: int,
        *,
        ts: int | None = None,
        headers: bool = True,
        transactional_pid: int | None = None,
        record: bool = True,
    ) -> bytes:
        """One data batch of ``n`` records at the partition's next offset."""
        off = self.next_offset.get(partition, 0)
        ts = T0 + off * 10 if ts is None else ts
        recs = []
        for i in range(n):
            o = off + i
            key = None if o % 7 == 3 else b"key-%d-%d" % (partition, o)
            value = None if o % 11 == 5 else b"value-%d-%d-" % (partition, o) + os.urandom(o % 13)
            hdrs = (Header("trace", b"%d" % o), Header("null", None)) if headers and o % 3 == 0 else ()
            recs.append(SimpleRecord(key, value, ts + i, hdrs))
            if record:
                self.records.append(
                    Produced(partition, o, key, value, tuple((h.key, h.value) for h in hdrs), ts + i)
                )
        self.next_offset[partition] = off + n
        kw = {}
        if transactional_pid is not None:
            kw = dict(transactional=True, producer_id=transactional_pid, producer_epoch=0)
        return build_batch(recs, base_offset=off, **kw)

    def marker(self, partition: int, pid: int, commit: bool, ts: int | None = None) -> bytes:
        off = self.next_offset.get(partition, 0)
        self.next_offset[partition] = off + 1
        return build_control_batch(
            ControlType.COMMIT if commit else ControlType.ABORT,
            base_offset=off,
            producer_id=pid,
            timestamp=T0 + off * 10 if ts is None else ts,
        )

    def segment(self, partition: int, batches: list[bytes], **kw):
        md = self.writer.write_segment(partition, batches, **kw)
        self.segments.append(md)
        return md

    def simple_segments(self, partition: int, count: int, per_segment: int = 60, batch_size: int = 20):
        for _ in range(count):
            self.segment(
                partition, [self.batch(partition, batch_size) for _ in range(per_segment // batch_size)]
            )

    def transactional_segments(self) -> None:
        """190 committed records: partition 0 holds a committed batch, an aborted transaction
        and a batch after it (70 records); partition 1 two plain segments (120)."""
        self.segment(0, [self.batch(0, 40), self.batch(0, 6, transactional_pid=3, record=False)])
        self.segment(0, [self.marker(0, 3, commit=False), self.batch(0, 30)])
        self.simple_segments(1, 2)

    def expected(self, partitions=None) -> list[tuple]:
        return sorted(
            (r.partition, r.offset, r.key, r.value, r.headers, r.timestamp)
            for r in self.records
            if partitions is None or r.partition in partitions
        )

    def objects_of(self, md) -> list[Path]:
        base = self.layout.base(md)
        return [self.remote_root / f"{base}.{s}" for s in ("log", "indexes", "rsm-manifest")]

    # ------------------------------------------------------------------ the job
    def overrides(self, **extra) -> dict:
        return dict(extra)

    def convert(self, spark, **overrides):
        from rsm_sidecar.iceberg.job import convert

        return convert(
            self.config_file, self.topic, environ={}, overrides=overrides, spark=spark, log=lambda line: None
        )

    def maintain(self, spark, overrides: dict | None = None, **options):
        """``iceberg maintain`` on this topic's table (``options``: those of ``maintain``)."""
        from rsm_sidecar.iceberg.job import load_config
        from rsm_sidecar.iceberg.maintenance import maintain

        cfg, storage = load_config(self.config_file, {}, overrides or {})
        return maintain(cfg, storage, self.topic, spark=spark, log=lambda line: None, **options)

    def table(self, **overrides):
        from rsm_sidecar.iceberg.job import load_config
        from rsm_sidecar.iceberg.session.catalogs import CatalogSpec
        from rsm_sidecar.iceberg.settings import JobSettings

        cfg, _ = load_config(self.config_file, {}, overrides)
        s = JobSettings.from_config(cfg)
        return CatalogSpec(s.catalog).pyiceberg().load_table((s.namespace, s.table_name(self.topic)))

    def cli(
        self,
        *args: str,
        pause_at: str | None = None,
        pause_dir: Path | None = None,
        extra_env: dict | None = None,
    ) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RSM__")}
        env["PYTHONPATH"] = str(REPO)
        # the job's Spark temporary files in the test's directory, not the machine's temp dir
        env["RSM__ICEBERG__SPARK__SCRATCH_DIR"] = str(self.workdir / "spark-scratch")
        if pause_at:
            env["RSM_ICEBERG_PAUSE_AT"] = pause_at
            env["RSM_ICEBERG_PAUSE_DIR"] = str(pause_dir)
        env.update(extra_env or {})
        cmd = [
            sys.executable,
            "-m",
            "rsm_sidecar.cli.main",
            "iceberg",
            *args,
            "--config",
            str(self.config_file),
            "--topic",
            self.topic,
        ]
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )


def zip_package(dest: Path) -> Path:
    """``rsm_sidecar`` as a zip for ``spark-submit --py-files`` (what executors import)."""
    import zipfile

    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted((REPO / "rsm_sidecar").rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                z.write(p, p.relative_to(REPO))
    return dest


def python_without_checkout(dest: Path) -> Path:
    """An interpreter that has the dependencies (the venv's site-packages) but not this
    checkout: ``python -S`` (the editable install's ``.pth`` is not read) with only
    site-packages, and whatever ``PYTHONPATH`` Spark gives its workers (pyspark, the py-files)."""
    import sysconfig

    dest.write_text(
        f'#!/bin/sh\nPYTHONPATH="{sysconfig.get_paths()["purelib"]}${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'exec {os.path.realpath(sys.executable)} -S "$@"\n'
    )
    dest.chmod(0o755)
    return dest


def env_without_checkout() -> dict[str, str]:
    """This process's environment without what would put the checkout or a Spark setting in
    front of a job: tests/conftest.py puts the checkout on ``PYTHONPATH`` for the processes
    tests start."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RSM__", "PYSPARK", "SPARK_")) and k != "PYTHONPATH"
    }


def spark_submit_convert(
    master: str,
    pkg: Path,
    t: SyntheticTopic,
    *args: str,
    cloud: tuple[str, ...] = (),
    conf: dict | None = None,
) -> list[str]:
    """``spark-submit`` of ``iceberg convert`` of ``t`` (the shipped job script, the package zip
    ``pkg`` for the executors, the set-up's jars, ``--conf`` each of ``conf``) on ``master``."""
    from rsm_sidecar.iceberg import jars

    return [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        master,
        "--jars",
        ",".join(str(p) for p in jars.spark_jars(cloud=cloud)),
        "--py-files",
        str(pkg),
        *[a for k, v in (conf or {}).items() for a in ("--conf", f"{k}={v}")],
        str(REPO / "rsm_sidecar/iceberg/submit/rsm_iceberg_job.py"),
        *("convert", "--config", str(t.config_file), "--topic", t.topic, *args),
    ]


def rows(table) -> list[tuple]:
    """(partition, offset, key, value, headers, event ms) of every row, sorted."""
    out = []
    for r in table.scan().to_arrow().to_pylist():
        k = r["kafka"]
        ev = k["event_timestamp"]
        ms = None if ev is None else int(ev.timestamp() * 1000 + 0.5)
        out.append(
            (
                k["partition"],
                k["offset"],
                r["key"]["__raw__"] if r["key"] else None,
                r["val"]["__raw__"] if r["val"] else None,
                tuple((h["key"], h["value"]) for h in r["headers"]),
                ms,
            )
        )
    return sorted(out, key=lambda x: (x[0], x[1]))


def offsets(table) -> list[tuple[int, int]]:
    return sorted(
        (r["partition"], r["offset"])
        for r in table.scan(selected_fields=("kafka",)).to_arrow().column("kafka").to_pylist()
    )


def wait_paused(proc: subprocess.Popen, pause_dir: Path, point: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not (pause_dir / f"{point}.paused").exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(
                f"the job exited with {proc.returncode} before pausing at {point}:\n{err[-4000:]}"
            )
        if time.monotonic() > deadline:
            kill_group(proc)
            raise AssertionError(f"the job did not reach pause point {point} within {timeout:.0f}s")
        time.sleep(0.1)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the job's whole process group: the Python driver, Spark's JVM and its workers."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
            except (OSError, IndexError, ValueError):
                continue
    return False


def result_json(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, dict | None, str]:
    out, err = proc.communicate(timeout=timeout)
    data = None
    for line in out.splitlines():
        if line.startswith("{"):
            data = json.loads(line)
    return proc.returncode, data, err
