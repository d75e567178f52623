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
    first = re.search(r"first row:\s+kafka\.offset 0, key\.__raw__ 'customer-\d+', val\.__raw__ '(.*)'", out)
    assert first and first.group(1).startswith('{"order_id":0,"status":"created"'), out
    assert (workdir / "lake" / "catalog.db").is_file()
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
