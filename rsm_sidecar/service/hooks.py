"""Two points of the service where a process that runs it can step in: right after a copy
stored its whole segment (manifest written, journal entry settled) and before it answers, and
when a fetch or index fetch has taken its slot and before it reads. In rsm-sidecar they do
nothing. The end-to-end tests run the sidecar with faults put here
(``tests/e2e/fault_sidecar.py``: a copy held while the test kills the broker, a fetch slot held
so that concurrent reads surely find the sidecar busy): instants no real server can be made to
reach otherwise."""

from __future__ import annotations

from collections.abc import Callable


def after_copy(segment_id: str, is_active: Callable[[], bool], touch: Callable[[], None]) -> None:
    """A copy of ``segment_id`` is stored; ``is_active``: whether its caller still waits,
    ``touch``: progress (keeps the copy's idle timeout away)."""


def before_fetch() -> None:
    """A fetch or index fetch took its slot (``fetch.max_concurrent``)."""
