"""`make down` (LocalStack.stop) removes only what the stack created: its runtime directory
(the sidecar's socket and hand-off directory, on /dev/shm when there is one) unless another
sidecar serves on that socket now, and never a directory that was there before."""

from __future__ import annotations

import pytest

from devstack.sidecar import SidecarProcess
from devstack.stack import CONFIG_DIR, LocalStack

pytestmark = pytest.mark.integration  # sidecar processes


def _stack(tmp_path, name: str) -> LocalStack:
    st = LocalStack(tmp_path / name, encryption=False)
    st.start_storage()
    return st


def test_stop_keeps_the_runtime_dir_of_a_sidecar_it_did_not_start(tmp_path):
    stack = _stack(tmp_path, "up")
    stack.start_sidecar()
    runtime = stack.runtime_dir
    assert stack.socket_path.exists()
    # the stack's sidecar is stopped and another one (started by hand) serves on the same socket
    stack.sidecar.stop()
    other = SidecarProcess(
        CONFIG_DIR / "sidecar.toml", tmp_path / "by-hand", stack.sidecar_environment(), stack.sidecar_target
    )
    other.start()
    try:
        stack.stop()  # what `make down` runs
        assert runtime.is_dir() and stack.socket_path.exists()
        other.wait_serving(10)  # still reachable
    finally:
        other.stop()
    stack.stop()  # nobody serves there any more: now it goes
    assert not runtime.exists()


def test_stop_removes_the_runtime_dir_it_created_and_keeps_one_it_found(tmp_path):
    stack = _stack(tmp_path, "fresh")
    stack.start_sidecar()
    stack.stop()
    assert not stack.runtime_dir.exists()

    found = _stack(tmp_path, "found")
    found.runtime_dir.mkdir(mode=0o700, parents=True)
    (found.runtime_dir / "someone-elses-file").write_text("x")
    try:
        found.start_sidecar()
        found.stop()
        assert (found.runtime_dir / "someone-elses-file").exists()
    finally:
        (found.runtime_dir / "someone-elses-file").unlink()
        found.runtime_dir.rmdir()
