"""Validation: the engine, not the fixer, certifies a candidate fix.

The patched pass runs on every input set (provenance/inputs.py), each on a fresh Timeline from
the same driver spec, and its outputs are certified against the reference pass on the same
inputs. An output is certified when it is within tolerance (provenance/compare.py) wherever the
reference is finite, has no NaN, and has an infinity only where the reference has the same one:
where the reference itself is NaN (a fully masked softmax row is NaN in any precision) a fix
cannot match it, only repair it. A generated set's reference is computed after the set's first
patched pass, so while a fix first runs on it there is no reference to copy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from checkpoint.branch import Patch
from checkpoint.timeline import Timeline
from hardware.driver import cast, to_host
from hardware.drivers import open_driver
from hardware.errors import RewindError
from hardware.jsonable import json_safe
from provenance.compare import compare
from provenance.forensics import WithForensics
from provenance.inputs import InputPlan, InputSet, input_sets
from provenance.integrity import REFUSED, IntegrityError
from provenance.reference import open_reference


@dataclass
class Check:
    """One input set: the patched pass's outputs certified against that set's reference."""

    inputs: InputSet
    outputs: list[dict] = field(default_factory=list)
    error: str | None = None  # the patched pass could not run, in words
    seconds: float = 0.0

    @property
    def within(self) -> bool:
        return self.error is None and all(o["within"] for o in self.outputs)

    def to_dict(self) -> dict:
        return {"inputs": self.inputs.to_dict(), "within": self.within, "error": self.error,
                "outputs": self.outputs, "seconds": self.seconds}


@dataclass
class Validation:
    checks: list[Check]
    skipped: list[str]
    stopped: str | None = None  # why validation ended before every set was checked

    @property
    def passed(self) -> bool:
        return bool(self.checks) and self.stopped is None and all(c.within for c in self.checks)

    def to_dict(self) -> dict:
        return json_safe({"passed": self.passed, "failed": [c.inputs.name for c in self.checks if not c.within],
                          "stopped": self.stopped, "skipped": self.skipped,
                          "checks": [c.to_dict() for c in self.checks]})


def certify(name: str, dtype: str, test: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> dict:
    """One output against its reference: within tolerance where the reference is finite, and no NaN/Inf
    left where the reference has none finite to match (an infinity the reference has too is kept)."""
    test, ref = test.double(), ref.double()
    finite = torch.isfinite(ref)
    c = compare(name, dtype, torch.where(finite, test, ref), ref, rtol, atol)
    left = ~finite & ~torch.isfinite(test) & (test != ref)
    return {**c.to_dict(), "nonfiniteLeft": int(left.sum()), "within": c.within and not bool(left.any())}


class Validator:
    """Certifies candidates on one session's input sets (made once per repair loop)."""

    def __init__(self, session: WithForensics, plan: InputPlan):
        options = session.options
        if options is None or options.trace:
            raise RewindError("repair runs the program: launch it from its model file, not from a trace")
        self.session = session
        self.budget = int(options.budget_mb * 2**20)
        self.sets, self.skipped = input_sets(session.program, plan, options.program, options.entry)
        self.spec = session.forensics.spec
        if not self.spec.startswith("torch:"):
            self.skipped.append(f"generated inputs: the reference {self.spec} is a recording of the example "
                                "inputs, so only they are checked")
            self.sets = self.sets[:1]
        self._references: dict[str, list[torch.Tensor]] = {}

    def validate(self, patches: list[Patch], deadline: float) -> Validation:
        result = Validation([], list(self.skipped))
        for i, inputs in enumerate(self.sets):
            if time.monotonic() > deadline:
                result.stopped = f"the time limit ran out after {i} of {len(self.sets)} input sets"
                break
            check = self._check(inputs, patches)
            result.checks.append(check)
            if check.error is not None and check.error.startswith("integrity:"):
                result.stopped = REFUSED
                break
        return result

    def _check(self, inputs: InputSet, patches: list[Patch]) -> Check:
        started = time.perf_counter()
        check = Check(inputs)
        try:
            outputs = self._patched(inputs, patches)
        except RewindError as exc:
            check.error = _failure(exc)
            check.seconds = time.perf_counter() - started
            return check
        f = self.session.forensics
        for name, test, ref in zip(inputs.program.outputs, outputs, self._reference(inputs)):
            rtol, atol = f.tolerance.for_dtype(f.precision[name])
            check.outputs.append(certify(name, inputs.program.values[name].dtype, test, ref, rtol, atol))
        check.seconds = time.perf_counter() - started
        return check

    def _patched(self, inputs: InputSet, patches: list[Patch]) -> list[torch.Tensor]:
        """The outputs of the patched pass on a fresh Timeline, on the host in their declared dtypes."""
        options = self.session.options
        tl = Timeline(inputs.program, open_driver(options.driver, options.driver_options()), self.budget)
        tl.branch(patches)
        tl.seek(tl.end)
        values = inputs.program.values
        return [to_host(tl.driver, cast(tl.driver, tl.value(n, tl.end), values[n].dtype)) for n in inputs.program.outputs]

    def _reference(self, inputs: InputSet) -> list[torch.Tensor]:
        if inputs.name not in self._references:
            reference = (self.session.forensics.reference if inputs.kind == "example"
                         else open_reference(self.spec, inputs.program, self.budget))
            self._references[inputs.name] = [reference.value(n) for n in inputs.program.outputs]
        return self._references[inputs.name]


def _failure(exc: RewindError) -> str:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, IntegrityError):
            return f"integrity: {cause}"
        cause = cause.__cause__
    return str(exc)
