"""The compose cluster's images, built in the background while the rest of the suite runs.

Building docker/Dockerfile's targets cold (no image cache, as on a fresh CI machine) took 4-7
minutes of a 53-minute ``make test``: debootstrap, then apt, pip and Maven inside the build
stages. The tests that need the images (``CONTAINER_MODULES``) run last (tests/conftest.py
orders them; `make test` runs them in a pytest process of their own beside the rest,
tests/lanes.py), and the build starts as soon as collection ends, in a thread whose processes run
at a lower CPU priority (``nice`` 10: Linux keeps the nice value per thread, and the processes
a thread starts inherit it), so the other tests run meanwhile and keep the CPU when they want
it. The container tests then share the build's podman service (one per session: a second
service on the same socket would take it over).

Their fixtures call :func:`podman_service`; with no build started (a run of only some of their
tests selected by ``-k`` after collection, ``--collect-only``), it starts one and waits.
"""

from __future__ import annotations

import os
import threading
import time

from devstack.containers import ComposeProject, PodmanService, prepare

#: the modules whose fixtures use the images; run last
CONTAINER_MODULES = ("tests/compose/test_compose_cluster.py", "tests/deploy/test_topology.py")
#: the compose project that builds the images (docker-compose.yml names every image it builds)
BUILD_PROJECT = "rsm-image-build"
NICE = 10
BUILD_TIMEOUT_S = 2700


class BackgroundImageBuild:
    """``prepare()`` (podman, the debootstrap base image) and ``compose build`` of
    docker-compose.yml in a thread; :meth:`wait` gives the podman service or raises what failed."""

    def __init__(self) -> None:
        self.service: PodmanService | None = None
        self.engine: dict[str, object] = {}
        self.timings: dict[str, float] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="podman-image-build", daemon=True)

    def start(self) -> BackgroundImageBuild:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
            t0 = time.monotonic()
            self.engine = prepare()
            self.timings["engine"] = time.monotonic() - t0
            self.service = PodmanService().start()
            t1 = time.monotonic()
            ComposeProject(self.service, BUILD_PROJECT).run("build", timeout=BUILD_TIMEOUT_S)
            self.timings["images"] = time.monotonic() - t1
        except BaseException as e:  # handed to the fixture that waits
            self._error = e

    def wait(self) -> PodmanService:
        t0 = time.monotonic()
        self._thread.join(BUILD_TIMEOUT_S + 600)
        if self._thread.is_alive():
            raise TimeoutError(f"the background image build ran past {BUILD_TIMEOUT_S + 600} s")
        if self._error is not None:
            raise self._error
        assert self.service is not None
        waited = time.monotonic() - t0
        print(
            f"\nengine ready in {self.timings['engine']:.1f}s: {self.engine}\n"
            f"images built in {self.timings['images']:.1f}s (in the background; waited {waited:.1f}s for it)"
        )
        return self.service

    def stop(self) -> None:
        self._thread.join(BUILD_TIMEOUT_S + 600)
        if self.service is not None:
            self.service.stop()


_build: BackgroundImageBuild | None = None


def start_build() -> None:
    """Start the build once per session (tests/conftest.py, after collection)."""
    global _build
    if _build is None:
        _build = BackgroundImageBuild().start()


def podman_service() -> PodmanService:
    """The session's podman service, once the images are built."""
    start_build()
    assert _build is not None
    return _build.wait()


def stop() -> None:
    """End of the session: the service stops (containers are the fixtures' to remove)."""
    global _build
    if _build is not None:
        _build.stop()
        _build = None
