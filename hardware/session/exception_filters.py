"""Exception filters: a motion stops after a step that raised a numerical exception.

nan, inf: the step wrote a NaN / Inf its inputs did not carry (every birth, the user asked for each);
nonfinite-output: only a birth whose non-finite values reach a program output (not one a `where`
absorbs on the way: provenance/births.py); divergence: the step is where the pass first leaves its
reference (provenance/forensics.py). The parallel findings of a many-core chip, race
and hang, are answered from its recorded Schedules (hardware/session/instruction_cursor.py).

A step's NaN/Inf counts come from checks that run on the device and are read back in batches: going
forward, a step whose checks are still on their way is checked when they land, and the motion stops
after that step however many steps later they came back.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from hardware.errors import RewindError
from hardware.events import ExceptionDetails
from hardware.session.state import SessionState
from hardware.ticks import Direction, Stop, Tick
from provenance.births import births_at
from provenance.forensics import Forensics
from provenance.writelog import WriteRecord

REACHING_OUTPUT = "nonfinite-output"
KNOWN_FILTERS = ("nan", "inf", "divergence", REACHING_OUTPUT, "race", "hang")


class ExceptionFilters:
    """The Session's chosen filters, and the steps of the current motion waiting for their checks."""

    def __init__(self, state: SessionState, forensics: Callable[[], Forensics], value_stats: Callable[[str, int], dict]):
        self.state = state
        self._forensics = forensics  # the pass's forensics against its reference (explains, finds divergence)
        self._value_stats = value_stats  # a value's stats at a position
        self.filters: set[str] = set()
        self._deferred: list[int] = []  # ticks passed whose checks were still on the device

    def choose(self, filters: Iterable[str]) -> None:
        unknown = set(filters) - set(KNOWN_FILTERS)
        if unknown:
            raise RewindError(f"unknown exception filter(s): {', '.join(sorted(unknown))} "
                              f"(known: {', '.join(KNOWN_FILTERS)})")
        self.filters = set(filters)

    def start_scan(self) -> None:
        self._deferred = []

    def stop_at(self, q: int, direction: Direction) -> Stop | None:
        """Stop at position q, after the step q - 1, when that step raised an exception (and its checks are in)."""
        if self.filters and q > 0 and not self._defer(q - 1, direction):
            details = self._exception_at(q - 1)
            if details is not None:
                return Stop("exception", q, details.description(), exception=details)
        return None

    def _defer(self, tick: Tick, direction: Direction) -> bool:
        """Must the exception check of `tick` wait for its on-device checks, still on their way (going forward)?"""
        checks = self.state.tl.checks
        if direction is Direction.FORWARD and checks is not None and checks.waiting(tick):
            self._deferred.append(tick)
            return True
        return False

    def late_stop(self, settle: bool) -> Stop | None:
        """The first deferred tick whose checks have landed (all have, when `settle`) and show an exception: the
        scan stops after the tick that set the flag, however many ticks later it came back."""
        if not self._deferred:
            return None
        checks = self.state.tl.checks
        if settle:
            checks.settle()
        else:
            checks.poll()
        while self._deferred and not checks.waiting(self._deferred[0]):
            details = self._exception_at(tick := self._deferred.pop(0))
            if details is not None:
                self._deferred.clear()
                return Stop("exception", tick + 1, details.description(), exception=details)
        return None

    def _exception_at(self, tick: Tick) -> ExceptionDetails | None:
        details = self.nonfinite_at(tick, self.filters) or self._reaching_output(tick)
        if details is not None:
            details.evidence = self._forensics().explain(details, tick)
            return details
        if "divergence" in self.filters:
            found = self._forensics().divergence_at(tick)
            if found is not None:
                found.details.evidence = found.to_dict()
                return found.details
        return None

    def nonfinite_at(self, tick: Tick, filters: Iterable[str] = ("nan", "inf")) -> ExceptionDetails | None:
        """Did step `tick` produce a NaN/Inf of a kind in `filters` (one its inputs did not carry)?"""
        tl = self.state.tl
        for rec in tl.log.at_tick(tick):
            for filt, count in (("nan", rec.stats.nan), ("inf", rec.stats.inf)):
                if filt in filters and count and not self._inputs_carry(tick, filt):
                    return self._exception_details(rec, filt, count)
        return None

    def _reaching_output(self, tick: Tick) -> ExceptionDetails | None:
        """With the nonfinite-output filter: a birth at step `tick` whose non-finite values reach an output (the
        pass is recorded to the end to know; only where the step wrote NaN/Inf)."""
        if REACHING_OUTPUT not in self.filters or self.nonfinite_at(tick) is None:
            return None
        tl = self.state.tl
        for birth in births_at(tl, self.state.program, tick):
            if birth.reaches_output:
                rec = next(r for r in tl.log.at_tick(tick) if r.value == birth.value)
                return self._exception_details(rec, birth.kind, birth.count)
        return None

    def _inputs_carry(self, tick: Tick, filt: str) -> bool:
        tl = self.state.tl
        node = tl.node_at(tick)
        names = node.input_names() if node else [tl.step_at(tick).edit.value]
        for name in names:
            s = self._value_stats(name, tick)
            if (s["nan"] if filt == "nan" else s["inf"]):
                return True
        return False

    def _exception_details(self, rec: WriteRecord, filt: str, count: int) -> ExceptionDetails:
        tl, value_stats = self.state.tl, self._value_stats
        tensor = tl.value(rec.value, rec.tick + 1)
        mask = torch.isnan(tensor) if filt == "nan" else torch.isinf(tensor)
        idx = mask.nonzero()
        first = tuple(int(i) for i in idx[0]) if len(idx) else None
        node = tl.node_at(rec.tick)
        inputs = {n: value_stats(n, rec.tick) for n in (node.input_names() if node else [])}
        return ExceptionDetails(filt, rec.node_name or "edit", rec.op or "edit", str(rec.loc) if rec.loc else None,
                                rec.value, count, first, inputs)
