"""`make demo`, the README's first command, as its target runs it (`python -m devstack.cli
demo`, the embedded default: local-directory storage, local Iceberg catalog): a real broker
with the shim and the sidecar, 60,000 records tiered, read back from remote storage, and the
tiered segments written to an Iceberg table that the demo reads back row by row."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def demo(workdir: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """What `make demo` runs, with its own work directory."""
    cmd = [sys.executable, "-m", "devstack.cli", "demo", "--workdir", str(workdir)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_make_demo_tiers_reads_back_and_writes_the_iceberg_table(tmp_path):
    workdir = tmp_path / "demo"
    run = demo(workdir, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert run.stdout.rstrip().endswith("demo OK"), out
    assert "records verified:       60,000 of 60,000 (sha256 of keys and values matches" in out, out
    tiered = int(re.search(r"offsets below (\d+) are served from remote", out).group(1))
    segments = int(re.search(r"segments tiered:\s+(\d+) \((\d+) zstd-compressed, (\d+) AES", out).group(1))
    assert tiered > 0 and segments >= 2, out
    # the demo checks each row against what it produced (offset, sha256 of key and value) and
    # fails otherwise; here: the table holds every tiered record, and it is where the demo says
    table = re.search(r"Iceberg table:\s+kafka\.demo_orders: ([\d,]+) rows", out)
    rows = int(table.group(1).replace(",", ""))
    assert rows == tiered, out
    # the orders are columns (config/demo-orders.schema.json), and the summary shows a row by them
    first = re.search(r"first row:\s+kafka\.offset 0, key\.__raw__ 'customer-\d+', val: (.*)", out)
    assert first and first.group(1).startswith("order_id 0, status 'created', amount "), out
    assert "currency 'EUR', items " in first.group(1), out
    assert (workdir / "lake" / "catalog.db").is_file()
    _check_order_columns(workdir / "lake", rows)
    assert len(list((workdir / "remote").rglob("*.rsm-manifest"))) == segments
    # the Spark job's scratch space was its own and is gone
    assert not any((workdir / "spark-scratch").glob("job-*")), list((workdir / "spark-scratch").iterdir())
    # the summary says how to look at what it stored, and that command works on the store as the
    # demo left it (its sidecar gone, no RSM__ variables)
    command = re.search(r"look at what it stored: (\S+/rsm-sidecar inspect ls -c \S+)", out).group(1)
    argv = [sys.executable, "-m", "rsm_sidecar.cli.main", *command.split()[1:]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RSM__")}
    ls = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert ls.returncode == 0, ls.stdout + ls.stderr
    assert f"\n{segments} segments, " in ls.stdout, ls.stdout


def _check_order_columns(lake: Path, rows: int) -> None:
    """The table read as a user would (PyIceberg on the demo's catalog): the val struct's columns
    are the orders' properties, every row decoded, with the values the demo produced (order i at
    offset i, status by i % 5, amounts in cents, 48 hex digits of note)."""
    from rsm_sidecar.iceberg.session.catalogs import LocalCatalog

    table = LocalCatalog(lake, "rsm").pyiceberg().load_table(("kafka", "demo_orders"))
    val = table.schema().find_field("val").field_type
    assert [(f.name, str(f.field_type)) for f in val.fields] == [
        ("__raw__", "binary"),
        ("__prefix__", "binary"),
        ("__err__", "string"),
        ("order_id", "long"),
        ("status", "string"),
        ("amount", "double"),
        ("currency", "string"),
        ("items", "long"),
        ("note", "string"),
    ]
    got = table.scan(selected_fields=("val", "kafka.offset")).to_arrow().to_pylist()
    assert len(got) == rows
    statuses = ["created", "paid", "packed", "shipped", "delivered"]
    for r in got:
        v, offset = r["val"], r["kafka"]["offset"]
        assert v["__raw__"] is None and v["__err__"] is None and v["__prefix__"] is None, r
        assert (v["order_id"], v["status"], v["currency"]) == (offset, statuses[offset % 5], "EUR"), r
        assert 1 <= v["amount"] < 900 and abs(v["amount"] * 100 - round(v["amount"] * 100)) < 1e-6, r
        assert 1 <= v["items"] <= 8 and re.fullmatch(r"[0-9a-f]{48}", v["note"]), r


def test_the_demo_empties_no_directory_it_did_not_make(tmp_path):
    """``--workdir`` is emptied before the demo starts, so a directory with someone's files in
    it is refused (nothing started, nothing removed)."""
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    run = demo(precious, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "is not empty and no earlier demo made it" in run.stdout
    assert (precious / "notes.txt").read_text() == "mine"
