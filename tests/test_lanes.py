"""`make test`'s lanes (tests/lanes.py), run on a small suite of their own: every lane runs, at
the same time as the others, each module in exactly one of them, and a failure in any lane fails
the run."""

from __future__ import annotations

from tests import lanes

LANES = ("main", "first", "second")


def _suite(tmp_path, failing: str | None = None):
    """A module per lane whose test passes only when every lane's test runs at the same time;
    ``failing`` names the lane whose test then fails anyway."""
    wait = (
        "def wait_for(name):\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not pathlib.Path(name).exists():\n"
        "        assert time.monotonic() < deadline, f'{name} never appeared'\n"
        "        time.sleep(0.05)\n"
    )
    for lane in LANES:
        where = tmp_path if lane == "main" else tmp_path / lane
        where.mkdir(exist_ok=True)
        others = "".join(f"    wait_for('{o}.started')\n" for o in LANES if o != lane)
        (where / f"test_{lane}.py").write_text(
            "import pathlib, time\n" + wait + f"def test_{lane}():\n"
            f"    pathlib.Path('{lane}.started').write_text('')\n"
            + others
            + f"    assert {lane != failing}, "
            f"'the {lane} lane fails'\n"
        )
    return tuple((lane, (f"{lane}/test_{lane}.py",)) for lane in LANES[1:])


def _run(tmp_path, side) -> int:
    return lanes.main(["-q", "-p", "no:cacheprovider"], side=side, cwd=tmp_path, work=tmp_path / "lanes")


def test_every_lane_passes_together(tmp_path, capfd):
    side = _suite(tmp_path)
    assert _run(tmp_path, side) == 0
    out = capfd.readouterr().out
    # each module ran once, in its own lane, and the side lanes' logs follow the main lane's
    assert out.count("1 passed") == 3, out
    assert out.index("the first lane: first/test_first.py") < out.index(
        "the second lane: second/test_second.py"
    )
    assert "the main lane exited 0, the first lane exited 0, the second lane exited 0" in out
    assert not (tmp_path / "lanes").exists()  # the side lanes' logs are removed when they passed


def test_a_failing_side_lane_fails_the_run_and_keeps_its_log(tmp_path, capfd):
    side = _suite(tmp_path, failing="second")
    assert _run(tmp_path, side) == 1
    out = capfd.readouterr().out
    assert "the second lane fails" in out and "1 failed" in out and out.count("1 passed") == 2
    assert "the second lane exited 1" in out
    assert "the second lane fails" in (tmp_path / "lanes" / "second.log").read_text()


def test_a_failing_main_lane_fails_the_run(tmp_path, capfd):
    side = _suite(tmp_path, failing="main")
    assert _run(tmp_path, side) == 1
    out = capfd.readouterr().out
    assert "the main lane fails" in out and "the first lane: first/test_first.py" in out
    assert "the main lane exited 1, the first lane exited 0" in out


def test_the_lanes_of_make_test_split_the_suite_without_overlap():
    paths = [p for _, lane in lanes.SIDE_LANES for p in lane]
    assert len(paths) == len(set(paths))
    for p in paths:
        assert (lanes.REPO / p).exists(), p
        assert not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths), p
