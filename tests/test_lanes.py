"""`make test`'s two lanes (tests/lanes.py), run on a small suite of their own: both lanes
run, at the same time, each module in exactly one of them, and a failure in either fails the run."""

from __future__ import annotations

from tests import lanes


def _suite(tmp_path, side_passes: bool = True, main_passes: bool = True):
    # each test waits until the other one has started: they pass only when run at the same time
    wait = (
        "def wait_for(name):\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not pathlib.Path(name).exists():\n"
        "        assert time.monotonic() < deadline, f'{name} never appeared'\n"
        "        time.sleep(0.05)\n"
    )
    (tmp_path / "test_main.py").write_text(
        "import pathlib, time\n" + wait + "def test_main():\n"
        "    pathlib.Path('main.started').write_text('')\n"
        "    wait_for('side.started')\n"
        f"    assert {main_passes}, 'the main lane fails'\n"
    )
    side = tmp_path / "side"
    side.mkdir()
    (side / "test_side.py").write_text(
        "import pathlib, time\n" + wait + "def test_side():\n"
        "    pathlib.Path('side.started').write_text('')\n"
        "    wait_for('main.started')\n"
        f"    assert {side_passes}, 'the side lane fails'\n"
    )
    return ("side/test_side.py",)


def test_both_lanes_pass_together(tmp_path, capfd):
    side = _suite(tmp_path, side_passes=True)
    assert lanes.main(["-q", "-p", "no:cacheprovider"], side=side, cwd=tmp_path, work=tmp_path / "lanes") == 0
    out = capfd.readouterr().out
    # each module ran once, in its own lane
    assert out.count("1 passed") == 2, out
    assert out.index("the container lane: side/test_side.py") < out.rindex("1 passed")


def test_a_failing_container_lane_fails_the_run(tmp_path, capfd):
    side = _suite(tmp_path, side_passes=False)
    assert lanes.main(["-q", "-p", "no:cacheprovider"], side=side, cwd=tmp_path, work=tmp_path / "lanes") == 1
    out = capfd.readouterr().out
    assert "the side lane fails" in out and "1 failed" in out and "1 passed" in out


def test_a_failing_main_lane_fails_the_run(tmp_path, capfd):
    side = _suite(tmp_path, main_passes=False)
    assert lanes.main(["-q", "-p", "no:cacheprovider"], side=side, cwd=tmp_path, work=tmp_path / "lanes") == 1
    out = capfd.readouterr().out
    assert "the main lane fails" in out and "the container lane: side/test_side.py" in out
