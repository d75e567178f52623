"""The convert job under ``spark-submit`` with the package shipped as ``--py-files`` zip, as on a
cluster: the driver and the executors run an interpreter that has the dependencies but *not*
this checkout's rsm_sidecar (``python -S`` with only site-packages on ``PYTHONPATH``, so the
editable install's ``.pth`` is not read, and a working directory outside the checkout), so every
import of rsm_sidecar on the executors comes from the zip."""

from __future__ import annotations

import json
import subprocess

from tests.iceberg.convert_helpers import (
    SyntheticTopic,
    env_without_checkout,
    python_without_checkout,
    rows,
    spark_submit_convert,
    zip_package,
)


def test_spark_submit_with_the_package_as_py_files(tmp_path):
    t = SyntheticTopic(tmp_path / "topic", "submitted")
    t.simple_segments(0, 2)
    t.simple_segments(1, 1)
    pkg = zip_package(tmp_path / "rsm_sidecar.zip")
    python = python_without_checkout(tmp_path / "python-without-checkout")
    env = env_without_checkout()
    check = subprocess.run(
        [str(python), "-c", "import rsm_sidecar"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert "No module named 'rsm_sidecar'" in check.stderr  # really not importable without the zip
    env.update(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    proc = subprocess.run(
        spark_submit_convert("local[2]", pkg, t, "--json"),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert result["committed"] and sum(p["records"] for p in result["partitions"]) == 180
    assert rows(t.table()) == t.expected()
