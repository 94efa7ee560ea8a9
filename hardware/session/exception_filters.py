"""Exception filters: a motion stops after a step that raised a numerical exception.

nan, inf: the step wrote a NaN / Inf its inputs did not carry (every birth, the user asked for each);
nonfinite-output: only a birth whose non-finite values reach a program output (not one a `where`
absorbs on the way: provenance/births.py); divergence: the step is where the pass first leaves its
reference (provenance/forensics.py). The parallel findings of a many-core chip, race
and hang, are answered from its recorded Schedules (hardware/session/instruction_cursor.py).
loss-spike, in a training run: the loss of step s exceeds k times the running median of the losses of the steps
before it (k=10 unless its condition says `k=5`); the stop is at the start of step s, the end of the step before
the spike, going forward (step s's loss is computed first, then the motion comes back) as in reverse.

A step's NaN/Inf counts come from checks that run on the device and are read back in batches: going
forward, a step whose checks are still on their way is checked when they land, and the motion stops
after that step however many steps later they came back.
"""

from __future__ import annotations

import bisect
import math
import re
from typing import Any, Callable, Iterable, Mapping

import torch

from hardware.errors import RewindError, echo
from hardware.events import ExceptionDetails
from hardware.jsonable import json_safe
from hardware.session.state import SessionState
from hardware.ticks import Direction, Stop, Tick
from provenance.births import births_at
from provenance.forensics import Forensics
from provenance.writelog import WriteRecord

REACHING_OUTPUT = "nonfinite-output"
LOSS_SPIKE = "loss-spike"
KNOWN_FILTERS = ("nan", "inf", "divergence", REACHING_OUTPUT, "race", "access", "hang", LOSS_SPIKE)
SPIKE_FACTOR = 10.0  # loss-spike's k unless its condition says otherwise
_SPIKE_CONDITION = re.compile(r"\s*k\s*=\s*(\S+)\s*")


def spike_factor(condition: Any) -> float:
    """The k of a loss-spike condition, `k=5`: a loss more than k times the running median is a spike."""
    m = _SPIKE_CONDITION.fullmatch(condition) if isinstance(condition, str) else None
    try:
        k = float(m[1]) if m else math.nan
    except ValueError:
        k = math.nan
    if not (math.isfinite(k) and k > 0):
        shown = f"'{echo(condition)}'" if isinstance(condition, str) else f"a {type(condition).__name__}"
        raise RewindError(f"the loss-spike condition {shown} is not k=N with N a number above 0 (a step's loss "
                          f"more than N times the median of the losses before it is a spike; k={SPIKE_FACTOR:g} "
                          "without a condition)")
    return k


def check_condition(filter: str, condition: Any) -> None:
    """A condition `filter` takes (only loss-spike's: k=N), or a RewindError saying why not."""
    if filter != LOSS_SPIKE:
        raise RewindError(f"the exception filter '{echo(str(filter))}' takes no condition (only {LOSS_SPIKE} does: "
                          "k=N)")
    spike_factor(condition)


class ExceptionFilters:
    """The Session's chosen filters, and the steps of the current motion waiting for their checks."""

    def __init__(self, state: SessionState, forensics: Callable[[], Forensics], value_stats: Callable[[str, int], dict]):
        self.state = state
        self._forensics = forensics  # the pass's forensics against its reference (explains, finds divergence)
        self._value_stats = value_stats  # a value's stats at a position
        self.filters: set[str] = set()
        self.spike_factor = SPIKE_FACTOR
        self._deferred: list[int] = []  # ticks passed whose checks were still on the device
        self._losses: list[float] = []  # the finite losses of steps 0..len(_medians) - 1, sorted (one motion's)
        self._medians: list[float] = []  # _medians[s]: the median of the losses of steps 0..s (one motion's)

    def choose(self, filters: Iterable[str], conditions: Mapping[str, str] | None = None) -> None:
        """The filters to stop on; `conditions` by filter (only loss-spike takes one: `k=5`)."""
        filters = set(filters)
        unknown = filters - set(KNOWN_FILTERS)
        if unknown:
            raise RewindError(f"unknown exception filter(s): {', '.join(sorted(echo(str(f)) for f in unknown))} "
                              f"(known: {', '.join(KNOWN_FILTERS)})")
        conditions = dict(conditions or {})
        for name, condition in conditions.items():
            check_condition(name, condition)
        self.spike_factor = spike_factor(conditions[LOSS_SPIKE]) if LOSS_SPIKE in conditions else SPIKE_FACTOR
        self.filters = filters

    def start_scan(self) -> None:
        self._deferred = []
        self._losses, self._medians = [], []  # an edit since the last motion may have changed them

    def stop_at(self, q: int, direction: Direction) -> Stop | None:
        """Stop at position q, after the step q - 1, when that step raised an exception (and its checks are in);
        or at the start of a training step whose loss spikes."""
        if self.filters and q > 0 and not self._defer(q - 1, direction):
            details = self._exception_at(q - 1)
            if details is not None:
                return Stop("exception", q, details.description(), exception=details)
        spike = self._loss_spike(q) if LOSS_SPIKE in self.filters else None
        return Stop("exception", q, spike.description(), exception=spike) if spike is not None else None

    def _loss_spike(self, q: Tick) -> ExceptionDetails | None:
        """At the first node of training step s >= 1: does the loss of step s exceed k times the median of the
        finite losses before it? Step s's loss is computed first when the run has not been there yet."""
        program, node = self.state.program, self.state.tl.node_at(q)
        if node is None or node.step == 0 or program.step_starts[node.step] != node.index:
            return None
        s = node.step
        median, loss = self._median_before(s), self._loss(s)
        if not median > 0 or not loss > self.spike_factor * median:
            return None
        name = program.losses[s]
        writer = program.nodes[program.values[name].producer]
        ratio = loss / median
        message = (f"loss spike: the loss of step {s} ({loss:.6g}) is {ratio:.3g} times the median of the losses "
                   f"before it ({median:.6g}; a spike is more than k={self.spike_factor:g} times): stopped at the "
                   f"start of step {s}, the end of step {s - 1}")
        evidence = json_safe({"message": message, "step": s, "loss": loss, "median": median, "ratio": ratio,
                              "k": self.spike_factor})
        return ExceptionDetails(LOSS_SPIKE, writer.name, writer.op, str(writer.loc) if writer.loc else None, name,
                                1, None, {}, evidence)

    def _median_before(self, step: int) -> float:
        """The median of the finite losses of steps 0..step - 1 (nan when there is none)."""
        while len(self._medians) < step:
            loss = self._loss(len(self._medians))
            if math.isfinite(loss):
                bisect.insort(self._losses, loss)
            n = len(self._losses)
            self._medians.append((self._losses[(n - 1) // 2] + self._losses[n // 2]) / 2 if n else math.nan)
        return self._medians[step - 1]

    def _loss(self, step: int) -> float:
        """The loss of a training step, computed first if the run has not been there (the position stays)."""
        tl, program = self.state.tl, self.state.program
        name = program.losses[step]
        after = tl.node_tick[program.values[name].producer] + 1
        tl.record_through(after)
        return float(tl.value(name, after))

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
                                rec.value, count, first, inputs,
                                context=self.state.training_context(node) if node is not None else "")
