"""What the sidecar logs for routine outcomes and for a broker that dies mid-copy:

* the answer "this segment has no transaction index" (most segments) is logged at DEBUG, not
  INFO, so a broker reading segments does not fill the log with it;
* a client killed (SIGKILL, as a broker dies) in the middle of a copy reads the same in path and
  stream transfer mode: one WARNING naming the segment and saying the broker went away, status
  CANCELLED."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

from rsm_sidecar._proto.rsm.v1 import rsm_pb2 as pb
from tests.helpers import REPO
from tests.service.rsm_client import SegmentFilesOnDisk, metadata, seg_id

MiB = 1024 * 1024
SERVICER = "rsm_sidecar.service.servicer"


def test_a_missing_transaction_index_is_not_logged_at_info(start_sidecar, tmp_path, caplog):
    sc = start_sidecar()
    md = metadata(seg_id(1), size=100_000)
    files = SegmentFilesOnDisk(str(tmp_path / "seg"), os.urandom(100_000), txn=False)
    sc.client.copy(files.stream_requests(md))
    with caplog.at_level(logging.DEBUG, logger=SERVICER):
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as e:
                sc.client.index(md, pb.TRANSACTION)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
    records = [r for r in caplog.records if r.name == SERVICER and "NOT_FOUND" in r.getMessage()]
    assert len(records) == 3 and {r.levelno for r in records} == {logging.DEBUG}, [
        (r.levelname, r.getMessage()) for r in records
    ]
    # a segment that is not there at all is still worth an INFO line
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=SERVICER), pytest.raises(grpc.RpcError):
        sc.client.fetch(metadata(seg_id(2)))
    assert [r.levelno for r in caplog.records if r.name == SERVICER] == [logging.INFO]


#: a client that starts a copy and never finishes it: stream mode sends the first MiB of the
#: .log and waits; path mode sends the request (the sidecar reads the file, slowly: rate limit)
CLIENT = textwrap.dedent(
    """
    import sys, time
    from tests.service.rsm_client import Client, SegmentFilesOnDisk, metadata, seg_id
    target, directory, mode = sys.argv[1:4]
    files = SegmentFilesOnDisk(directory, log_size=int(sys.argv[4]))
    md = metadata(seg_id(int(sys.argv[5])), size=files.log_size)
    def stalled(requests):
        for i, r in enumerate(requests):
            yield r
            if i == 1:
                print("sent", flush=True)
                if mode == "stream":
                    time.sleep(600)
                return  # "stream-cut": the stream ends here, the process dies right after
    if mode == "path":
        print("sent", flush=True)
        Client(target).copy(files.path_request(md))
    else:
        Client(target).copy(stalled(files.stream_requests(md)))
    """
)


@pytest.mark.parametrize("mode", ["stream", "stream-cut", "path"])
def test_a_broker_killed_mid_copy_is_one_warning_in_either_mode(start_sidecar, tmp_path, caplog, mode):
    """``stream-cut``: the client's request stream ends before the process dies (how a killed
    broker's stream has been seen to end), which is the broker going away too, not a short stream."""
    sc = start_sidecar(copy__upload_rate_limit=1 * MiB)
    n = {"stream": 77, "stream-cut": 78, "path": 79}[mode]
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, sc.server.address, str(tmp_path / "seg"), mode, str(16 * MiB), str(n)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    with caplog.at_level(logging.DEBUG, logger=SERVICER):
        assert proc.stdout.readline() == b"sent\n", proc.stderr.read()
        if mode != "stream-cut":
            time.sleep(1.0)  # the sidecar is copying (path mode: reading at 1 MiB/s)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            "copy failed" in r.getMessage() for r in caplog.records if r.name == SERVICER
        ):
            time.sleep(0.1)
    lines = [r for r in caplog.records if r.name == SERVICER and r.levelno >= logging.INFO]
    assert len(lines) == 1, [(r.levelname, r.getMessage()) for r in lines]
    line = lines[0]
    assert line.levelno == logging.WARNING, line.getMessage()
    assert "the broker went away" in line.getMessage(), line.getMessage()
    assert seg_id(n) in line.getMessage() and "CANCELLED" in line.getMessage(), line.getMessage()
    assert not [o.key for o in sc.store.list("") if seg_id(n) in o.key]  # nothing left behind
