"""Validation: the engine, not the fixer, certifies a candidate fix.

The fixed pass runs on every input set (provenance/inputs.py), each on a fresh Timeline from the
same driver spec, and must pass every rule on each:

1. it prevents what it fixes: every NaN/Inf it gives birth to (provenance/births.py) is one the
   original program's reference pass has too, as an intended value that something absorbs (a
   masked score that softmax turns into 0). A NaN still born upstream and replaced downstream
   (`nan_to_num` at the output) is *masked, not fixed*: rejected, with where it was born and
   where it was masked;
2. its outputs are certified against the reference on the same inputs: within tolerance
   (provenance/compare.py) wherever the original's reference is finite. Where that reference is
   itself NaN/Inf it cannot judge, so there the fixed program run at float64 (on the reference's
   driver, the fix computing in float64 too) is the reference for those elements; and so it is
   where the finite reference is in doubt: its float32 twin shows its own rounding beyond the
   tolerance (asked only when an element fails); and so it is, in a training Program, for every
   output after a step whose update the reference itself blew up (it moved the parameters by more
   than their size, provenance/steps.py): the reference's later losses and weights are no standard;
3. a patch returns the dtype the node's output has (checkpoint/branch.py): another dtype is an
   error naming the node, not a silent cast back.

A generated set's reference is computed after the set's first fixed pass, so while a fix first
runs on it there is no reference to copy.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from checkpoint.branch import DtypeMismatch, Patch, PrecisionPatch
from checkpoint.timeline import Timeline
from hardware.driver import Driver, cast, to_host
from hardware.drivers import open_driver
from hardware.errors import RewindError
from hardware.jsonable import json_safe
from hardware.program import Node, Program
from provenance.births import Birth, births, node_dict
from provenance.compare import abs_tolerance, compare
from provenance.forensics import WithForensics
from provenance.inputs import InputPlan, InputSet, input_sets
from provenance.integrity import REFUSED, IntegrityError
from provenance.program_edits import ProgramEdit
from provenance.reference import open_reference
from provenance.steps import exploded_at, outputs_after

MASKED = "masked, not fixed"
NOT_FIXED = "not fixed"
BEYOND = "outputs beyond tolerance of the reference"
DTYPE = "a patched node returned another dtype"
FAILED = "the fixed pass failed"
TWIN = {"float64": "float32"}  # a reference's compute dtype -> the one whose pass bounds its rounding error
NO_BIRTHS = "the reference is a file of saved values: it keeps no pass to read NaN/Inf births from"
EXPLODED_NONE = "no update of the reference moved the parameters by more than their size (or no training step)"


@dataclass(frozen=True)
class Fixed:
    """The fixed program over one input set: the original Program under patches, or an edited Program."""

    program: Program
    patches: tuple[Patch, ...] = ()

    def run(self, driver: Driver, budget: int, at_reference: bool = False) -> Timeline:
        """The fixed pass on `driver`, run to its end. At the reference's precision a precision patch is a
        no-op (every node already computes wider), so it is left out."""
        tl = Timeline(self.program, driver, budget)
        patches = [p for p in self.patches if not (at_reference and isinstance(p, PrecisionPatch))]
        if patches:
            tl.branch(patches)
        tl.seek(tl.end)
        return tl


@dataclass(frozen=True)
class ReferencePass:
    """What the original program's reference says about one input set: its outputs, and its births."""

    outputs: list[torch.Tensor]
    births: list[Birth] | None  # None: the reference keeps no pass (saved values)
    exploded: int | None = None  # a training step whose update the reference blew up: it cannot judge after it


@dataclass
class Check:
    """One input set: the fixed pass's births and outputs judged against that set's reference."""

    inputs: InputSet
    outputs: list[dict] = field(default_factory=list)
    error: str | None = None  # the fixed pass could not run, in words
    births: list[Birth] = field(default_factory=list)  # the fixed pass's
    reference_births: list[Birth] | None = None
    unfixed: list[dict] = field(default_factory=list)  # births the reference does not have as absorbed values
    mismatch: DtypeMismatch | None = None
    fixed_reference: bool = False  # the fixed program ran at float64 where the reference is NaN/Inf or in doubt
    seconds: float = 0.0
    reference_exploded: int | None = None  # the step whose update the reference blew up (training)

    @property
    def within(self) -> bool:
        return self.error is None and not self.unfixed and all(o["within"] for o in self.outputs)

    @property
    def reason(self) -> str:
        """Why the set failed, in words (or that it passed)."""
        if self.error is not None:
            return self.error
        if self.unfixed:
            return self.unfixed[0]["verdict"] + ": " + self.unfixed[0]["what"]
        return BEYOND if not self.within else "within tolerance, and no NaN/Inf born that the reference does not absorb"

    @property
    def rule(self) -> str | None:
        """The rule the set broke, in the few words the knowledge base records (None: it broke none)."""
        if self.mismatch is not None:
            return DTYPE
        if self.error is not None:
            return REFUSED if self.error.startswith("integrity:") else FAILED
        if self.unfixed:
            return self.unfixed[0]["verdict"]
        return None if self.within else BEYOND

    def to_dict(self) -> dict:
        out = {"inputs": self.inputs.to_dict(), "within": self.within, "reason": self.reason, "error": self.error,
               "outputs": self.outputs, "births": [b.to_dict() for b in self.births], "unfixed": self.unfixed,
               "dtypeMismatch": self.mismatch.to_dict() if self.mismatch else None,
               "fixedReference": self.fixed_reference, "seconds": self.seconds,
               "referenceExplodedAt": self.reference_exploded}
        if self.reference_exploded is None:
            out["referenceExplodedAtReason"] = EXPLODED_NONE
        if self.error is None:
            out["errorReason"] = "the fixed pass ran to its end"
        if self.mismatch is None:
            out["dtypeMismatchReason"] = "every patched node returned its output's dtype" if self.error is None \
                else "the fixed pass stopped before its dtypes were all seen"
        if self.reference_births is None:
            out["referenceBirths"] = None
            out["referenceBirthsReason"] = NO_BIRTHS if self.error is None else \
                "the fixed pass failed before the reference was read"
        else:
            out["referenceBirths"] = [b.to_dict() for b in self.reference_births]
        return out


@dataclass
class Validation:
    checks: list[Check]
    skipped: list[str]
    stopped: str | None = None  # why validation ended before every set was checked

    @property
    def passed(self) -> bool:
        return bool(self.checks) and self.stopped is None and all(c.within for c in self.checks)

    @property
    def reason(self) -> str:
        """Why it did not pass: each reason with the input sets it failed on, in the order first seen."""
        if self.stopped is not None:
            return self.stopped
        sets: dict[str, list[str]] = {}
        for c in self.checks:
            if not c.within:
                sets.setdefault(c.reason, []).append(c.inputs.name)
        return "; ".join(f"{why} (on {', '.join(names)})" for why, names in sets.items())

    @property
    def rules(self) -> list[str]:
        """The rules broken, each once, in the order first broken."""
        return list(dict.fromkeys(c.rule for c in self.checks if c.rule is not None))

    def to_dict(self) -> dict:
        return json_safe({"passed": self.passed, "rules": self.rules,
                          "failed": [c.inputs.name for c in self.checks if not c.within],
                          "stopped": self.stopped, **({} if self.stopped else {"stoppedReason": "every input set "
                                                                                                 "was checked"}),
                          "skipped": self.skipped, "checks": [c.to_dict() for c in self.checks]})


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
        self._references: dict[str, ReferencePass] = {}
        self._twins: dict[str, list[torch.Tensor]] = {}  # the original computed in float32, where doubt was asked

    def validate(self, patches: list[Patch], deadline: float, edit: ProgramEdit | None = None) -> Validation:
        """The original Program under `patches` (edited by `edit` first: its nodes inserted), on every input set,
        against every rule."""
        return self._validate(lambda inputs: Fixed(edit.apply(inputs.program) if edit else inputs.program,
                                                   tuple(patches)), deadline)

    def validate_program(self, fixed_for: Callable[[InputSet], Program], deadline: float) -> Validation:
        """A whole edited Program (an edited copy of the model, exported again) instead of patches.

        For each input set in order, `fixed_for(inputs)` returns the fixed Program over that set's inputs
        (the same input values as `inputs.program`, which is the original over them); a RewindError it raises
        becomes that set's check error (the set fails, the others still run). The same rules as `validate`:
        the fixed Program runs on a fresh Timeline of the session's driver; its births must be ones the
        original's reference has as absorbed values (a birth matches by kind and by its node's op, module path
        and rank among that op's nodes there, since an edit renames nodes); its outputs, matched to the
        original's by position, must have the original's shapes and dtypes and be within the original's output
        tolerances of the original's reference where that is finite and not in doubt, and of the fixed Program
        run on the reference's driver (float64) where it is not. Stops at `deadline` (time.monotonic()) between
        sets, saying so in `stopped`."""
        return self._validate(lambda inputs: Fixed(fixed_for(inputs)), deadline)

    def _validate(self, fixed_for: Callable[[InputSet], Fixed], deadline: float) -> Validation:
        result = Validation([], list(self.skipped))
        for i, inputs in enumerate(self.sets):
            if time.monotonic() > deadline:
                result.stopped = f"the time limit ran out after {i} of {len(self.sets)} input sets"
                break
            check = self._check(inputs, fixed_for)
            result.checks.append(check)
            if check.error is not None and check.error.startswith("integrity:"):
                result.stopped = REFUSED
                break
        return result

    def _check(self, inputs: InputSet, fixed_for: Callable[[InputSet], Fixed]) -> Check:
        started = time.perf_counter()
        check = Check(inputs)
        try:
            fixed = fixed_for(inputs)
            tl = fixed.run(self._driver(), self.budget)
            outputs = self._outputs(tl, fixed.program, inputs.program)
            check.births = births(tl, fixed.program)
            reference = self._reference(inputs)
            check.reference_births = reference.births
            check.unfixed = unfixed(check.births, fixed.program, reference.births, inputs.program)
            check.reference_exploded = reference.exploded
            self._certify(check, fixed, outputs, reference.outputs,
                          outputs_after(inputs.program, reference.exploded))
        except RewindError as exc:
            check.error, check.mismatch = _failure(exc)
        check.seconds = time.perf_counter() - started
        return check

    def _driver(self) -> Driver:
        options = self.session.options
        return open_driver(options.driver, options.driver_options())

    def _outputs(self, tl: Timeline, program: Program, original: Program) -> list[torch.Tensor]:
        """The fixed pass's outputs on the host, in the original's declared dtypes (which they must have)."""
        if len(program.outputs) != len(original.outputs):
            raise RewindError(f"the fixed program has {len(program.outputs)} outputs; the original has "
                              f"{len(original.outputs)}")
        out = []
        for mine, theirs in zip(program.outputs, original.outputs):
            have, want = program.values[mine], original.values[theirs]
            if (have.dtype, have.shape) != (want.dtype, want.shape):
                raise RewindError(f"the fixed program's output '{mine}' is {have.dtype}{list(have.shape)}; the "
                                  f"original's '{theirs}' is {want.dtype}{list(want.shape)}")
            out.append(to_host(tl.driver, cast(tl.driver, tl.value(mine, tl.end), have.dtype)))
        return out

    def _certify(self, check: Check, fixed: Fixed, outputs: list[torch.Tensor], refs: list[torch.Tensor],
                 unjudged: list[bool]) -> None:
        """Each output against the original's reference where that can judge it; where it is NaN/Inf, or finite
        but doubtful (its own float64 rounding is beyond the tolerance, as its float32 twin shows), or `unjudged`
        (after the reference's own updates blew up), against the fixed program run at float64. Each extra pass
        runs only when needed."""
        stand_in = [~torch.isfinite(r) | bool(u) for r, u in zip(refs, unjudged)]
        doubt = [torch.zeros_like(m) for m in stand_in]
        wide = self._wide(fixed) if any(bool(m.any()) for m in stand_in) else None
        judged = self._judged(check.inputs, outputs, refs, wide, stand_in)
        if not all(c["within"] for c in judged):
            doubt = self._doubtful(check.inputs, refs)
            if any(bool(d.any()) for d in doubt):
                wide = wide or self._wide(fixed)
                stand_in = [m | d for m, d in zip(stand_in, doubt)]
                judged = self._judged(check.inputs, outputs, refs, wide, stand_in)
        check.fixed_reference = wide is not None
        check.outputs = [{**c, "fixedReferenceElements": int(m.sum()) if wide is not None else 0,
                          "doubtfulReferenceElements": int(d.sum())} for c, m, d in zip(judged, stand_in, doubt)]

    def _judged(self, inputs: InputSet, outputs: list[torch.Tensor], refs: list[torch.Tensor],
                wide: list[torch.Tensor] | None, stand_in: list[torch.Tensor]) -> list[dict]:
        values = inputs.program.values
        out = []
        for i, (name, test, ref) in enumerate(zip(inputs.program.outputs, outputs, refs)):
            ref = ref.double() if wide is None else torch.where(stand_in[i], wide[i], ref.double())
            out.append(certify(name, values[name].dtype, test, ref, *self._tolerance(name)))
        return out

    def _tolerance(self, name: str) -> tuple[float, float]:
        f = self.session.forensics
        return f.tolerance.for_dtype(f.precision[name])

    def _wide(self, fixed: Fixed) -> list[torch.Tensor]:
        """The fixed program's outputs run on the reference's driver (a fix's functions compute in float64 there)."""
        tl = fixed.run(open_driver(self.spec), self.budget, at_reference=True)
        return [to_host(tl.driver, tl.value(n, tl.end)).double() for n in fixed.program.outputs]

    def _doubtful(self, inputs: InputSet, refs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Where the original's finite reference is in doubt: the same pass computed in float32 is NaN/Inf there,
        or differs from it by more than the tolerance times float64's precision over float32's (the float64
        pass's own rounding error, to first order: 1 - sigmoid(34) keeps 6% of its digits in float64)."""
        twin = TWIN.get(self.spec.rpartition(":")[2])
        if twin is None:
            return [torch.zeros(r.shape, dtype=torch.bool) for r in refs]
        if inputs.name not in self._twins:
            spec = self.spec.rpartition(":")[0] + ":" + twin
            reference = open_reference(spec, inputs.program, self.budget)
            self._twins[inputs.name] = [reference.value(n).double() for n in inputs.program.outputs]
        ratio = torch.finfo(torch.float64).eps / torch.finfo(getattr(torch, twin)).eps
        out = []
        for name, ref, other in zip(inputs.program.outputs, refs, self._twins[inputs.name]):
            rtol, atol = self._tolerance(name)
            ref = ref.double()
            bound = (ref.abs() * rtol + atol).clamp_min(abs_tolerance(ref, rtol, atol))
            off = ~torch.isfinite(other) | ((other - ref).abs() * ratio > bound)
            out.append(off & torch.isfinite(ref))
        return out

    def _reference(self, inputs: InputSet) -> ReferencePass:
        if inputs.name not in self._references:
            reference = (self.session.forensics.reference if inputs.kind == "example"
                         else open_reference(self.spec, inputs.program, self.budget))
            self._references[inputs.name] = ReferencePass([reference.value(n) for n in inputs.program.outputs],
                                                          reference.births(),
                                                          exploded_at(inputs.program, reference.value))
        return self._references[inputs.name]


def unfixed(born: list[Birth], program: Program, reference: list[Birth] | None, original: Program) -> list[dict]:
    """The births of the fixed pass (over `program`) that the original's reference (over `original`) does not
    have as intended, absorbed values, as evidence: masked (absorbed downstream: where born, where masked) or
    reaching the outputs."""
    mine, theirs = _places(program), _places(original)
    intended = {(theirs[b.node.index], b.kind) for b in reference or () if b.absorbed}
    shared = {(theirs[b.node.index], b.kind) for b in reference or ()}
    out = []
    for b in born:
        place = (mine[b.node.index], b.kind)
        if place in intended:
            continue
        born_at = {**node_dict(b.node), "value": b.value, "kind": b.kind, "count": b.count}
        also = " (the reference's own is not absorbed either: no value it intends)" if place in shared else ""
        where = f"{b.kind} born at {_where(b.node)}"
        if b.absorbed:
            masked = ", ".join(_where(n) for n in b.absorbed_at)
            out.append({"verdict": MASKED, "born": born_at, "maskedBy": [node_dict(n) for n in b.absorbed_at],
                        "inReference": place in shared, "what": f"{where}, masked by {masked}{also}"})
        else:
            fate = "reaches the outputs" if b.reaches_output else "is left in the pass"
            out.append({"verdict": NOT_FIXED, "born": born_at, "maskedBy": [], "inReference": place in shared,
                        "what": f"{where} {fate}{also}"})
    return out


def _places(program: Program) -> dict[int, tuple[str, str, int]]:
    """Each node's place: its op, its module path and how many nodes of both came before it. An edited copy
    of a program renames its nodes, but a node the edit did not touch keeps its place."""
    seen: Counter = Counter()
    out = {}
    for n in program.nodes:
        key = (n.op, n.module_path)
        out[n.index] = (*key, seen[key])
        seen[key] += 1
    return out


def _where(node: Node) -> str:
    line = f", {Path(node.loc.file).name}:{node.loc.line}" if node.loc else ""
    return f"{node.name} ({node.op}{line})"


def _failure(exc: RewindError) -> tuple[str, DtypeMismatch | None]:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, IntegrityError):
            return f"integrity: {cause}", None
        if isinstance(cause, DtypeMismatch):
            return str(cause), cause
        cause = cause.__cause__
    return str(exc), None
