"""One run over listed segments, then a report: what ``inspect verify``, ``rekey`` and ``seal``
(and any job done segment by segment) share.

A job gives the work on one segment (``one``: it returns the segment's outcome, never raises
for a problem of that segment) and a :class:`Tally` of the outcomes; :func:`run` does it for each
segment in listing order, ``workers`` at a time, reports each outcome as it comes, counts it and
tells the progress line. Rewrites that are undone afterwards (a segment deleted while its
manifest was replaced: :meth:`rewrite.Rewriter.settle`) come back as revisions, reported and
counted in place of the outcome they revise. :func:`report` prints the run for people (a line
per segment, a summary line) or for scripts (one JSON document: ``segments``, ``summary``)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

from rsm_sidecar.inspect.output import JsonStream, error_line
from rsm_sidecar.inspect.parallel import ordered_map
from rsm_sidecar.segment.listing import StoredSegment

#: the action of a segment the job could not process (its outcome's ``detail`` says why)
ERROR = "error"
#: the action of a segment the job left as it was
SKIPPED = "skipped"


class Outcome(Protocol):
    """What a job says of one segment."""

    @property
    def action(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...

    def print_text(self) -> None:
        """Its lines for people (an error on stderr)."""


@dataclasses.dataclass
class SegmentOutcome:
    """What a job that rewrites segments (``rekey``, ``seal``) did with one: ``segment`` as people
    read it, ``action`` (the job's, ``SKIPPED`` or ``ERROR``) and why (``detail``)."""

    base: str
    segment: str
    action: str
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def print_text(self) -> None:
        if self.action == ERROR:
            error_line(self.segment, self.detail)
        else:
            print(f"{self.action:<12}{self.segment}{self.text()}", flush=True)

    def text(self) -> str:
        """What the line says after the action and the segment."""
        return f"  ({self.detail})" if self.detail else ""


R = TypeVar("R", bound=Outcome)


class Tally:
    """A run's summary: the segments done and how many had each action (``ACTIONS``: action ->
    its name in the summary), after the job's own facts (given to ``__init__`` as keywords: the
    active key, dry run, ...). ``tally["errors"]``: a count by its name."""

    ACTIONS: ClassVar[Mapping[str, str]] = {}
    #: the counts (by name) of which one above 0 makes the command exit with "problems found"
    PROBLEMS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **facts: Any) -> None:
        self.segments = 0
        self.counts = dict.fromkeys(self.ACTIONS.values(), 0)
        self._facts = facts

    def __getitem__(self, name: str) -> int:
        return self.counts[name]

    def count(self, outcome: Outcome) -> None:
        self.segments += 1
        self.counts[self.ACTIONS[outcome.action]] += 1

    def revise(self, was: str, outcome: Outcome) -> None:
        """``outcome`` replaces an outcome of action ``was`` already counted."""
        self.counts[self.ACTIONS[was]] -= 1
        self.counts[self.ACTIONS[outcome.action]] += 1

    def facts(self) -> dict[str, Any]:
        return dict(self._facts)

    @property
    def has_problems(self) -> bool:
        """Whether the command exits with the "problems found" code."""
        return any(self.counts[name] > 0 for name in self.PROBLEMS)

    def text(self) -> str:
        """The summary line for people."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        return {**self.facts(), "segments": self.segments, **self.counts}


class DryRunTally(Tally):
    """The summary of a job that can run dry (write nothing): ``dry_run`` is among its facts and
    ``done()`` says how many it changed, or would have changed (``DONE``: the count of the
    segments changed, the count of those it would change, and the verb's past participle)."""

    DONE: ClassVar[tuple[str, str, str]]

    def __init__(self, dry_run: bool, **facts: Any) -> None:
        super().__init__(**facts, dry_run=dry_run)
        self.dry_run = dry_run

    def done(self) -> str:
        changed, would_change, verb = self.DONE
        return f"{self[would_change]} would be {verb}" if self.dry_run else f"{self[changed]} {verb}"


T = TypeVar("T", bound=Tally)


def run(
    segs: Iterable[StoredSegment],
    one: Callable[[StoredSegment], R],
    tally: T,
    on_outcome: Callable[[R], None],
    *,
    workers: int = 1,
    progress: Any = None,
    revisions: Callable[[], Iterable[tuple[str, R]]] = lambda: (),
) -> T:
    """``one`` for each segment, ``workers`` at once, outcomes in listing order: each counted in
    ``tally`` and given to ``on_outcome`` as it comes. ``revisions``, called after the last
    segment: (the action it revises, the new outcome) pairs, counted and reported in their
    place."""
    for outcome in ordered_map(one, segs, workers):
        tally.count(outcome)
        on_outcome(outcome)
        if progress:
            progress.advance()
    for was, outcome in revisions():
        tally.revise(was, outcome)
        on_outcome(outcome)
    if progress:
        progress.done()
    return tally


def report(as_json: bool, job: Callable[[Callable[[Any], None]], T]) -> T:
    """Run ``job`` (given where each outcome goes) and print it: as one JSON document
    (``{"segments": [outcome, ...], "summary": {...}}``, the outcomes streamed as they come),
    or each outcome's text and the summary line."""
    if as_json:
        with JsonStream(sys.stdout) as doc:
            with doc.list("segments") as items:
                tally = job(lambda o: items.append(o.to_json()))
            doc.member("summary", tally.to_json())
    else:
        tally = job(lambda o: o.print_text())
        print(tally.text())
    return tally
