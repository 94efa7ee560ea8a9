"""Numerical forensics: where a NaN/Inf was born, where this pass first left its reference, which
node introduced the error rather than inherited it, and how the error grew on the way out.

A node's *observed* error is its output against the reference's. Its *introduced* error is
what it does on its own: rerun it on the reference's inputs, cast to the node's dtypes, and
compare with the reference's output. A node diverges when its observed error is beyond
tolerance and either it introduced that much itself, or none of its inputs was beyond
tolerance yet (the error crossed the line here: an accumulation). Introduced errors depend
only on the reference and on how the node runs (its patch), so they are computed once.

The NaN/Inf that matters is the first birth (provenance/births.py) that reaches an output or that
the reference does not share: a -inf written on purpose and absorbed before any output (T5's
log(0), discarded by a `where`) is no problem. A node that is both a birth and a divergence gets
one diagnosis, the NaN/Inf one. Where a divergence's error came from upstream is
provenance/origins.py's question.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from hardware.driver import cast, from_host, to_host
from hardware.errors import RewindError
from hardware.events import ExceptionDetails, ProgressAfter
from hardware.program import Node, Program, SourceLoc
from provenance import training_patterns  # noqa: F401  (it registers the failure patterns of a training step)
from provenance.births import Birth, births, writes_infinity
from provenance.compare import Comparison, Tolerance, compare, judged_precision
from provenance.handed import SessionView
from provenance.magnitudes import Magnitudes
from provenance.lineage import descendants, lineage
from provenance.patterns import Evidence, Match, classify
from provenance.reference import DEFAULT_REFERENCE, Collectives, Reference, open_reference
from provenance.steps import in_words, is_training, place, training_fields

MAX_GROWTH_POINTS = 16


@dataclass
class Finding:
    """One node that went wrong: it wrote NaN/Inf from finite inputs, or it diverged from the reference."""

    kind: str  # "nonfinite" or "divergence"
    tick: int
    node: Node
    details: ExceptionDetails  # value, count and first index of the bad elements, the inputs' stats
    observed: Comparison | None = None
    introduced: Comparison | None = None
    match: Match | None = None
    reference_agrees: bool | None = None  # a NaN/Inf the reference has too: no precision removes it
    growth: list[dict] = field(default_factory=list)
    program: Program | None = field(default=None, repr=False)  # the node's Program (a training step's: step, phase)

    @property
    def place(self) -> SourceLoc | None:
        """The node's line; an optimizer node's is where the user's file makes the optimizer."""
        return place(self.program, self.node)

    @property
    def source(self) -> dict | None:
        loc = self.place
        return {"file": loc.file, "line": loc.line} if loc else None

    def where(self, verb: str = "in") -> str:
        """Where the node is, in words (provenance/steps.py's in_words): `at model.py:12 in `div``, or in a training
        step `in the backward of `log` at model.py:12 (step 0)`."""
        return in_words(self.program, self.node, verb)

    def to_dict(self) -> dict:
        """JSON; `count` is this pass's bad elements (NaN/Inf, or beyond tolerance), and every null says why."""
        d = self.details
        out = {
            "kind": self.kind, "tick": self.tick, "node": self.node.name, "op": self.node.op,
            "module": self.node.module_path, "source": self.source, "value": d.value, "count": d.count,
            "firstIndex": list(d.first_index) if d.first_index is not None else None, "inputs": d.inputs,
            "observed": self.observed.to_dict() if self.observed else None,
            "introduced": self.introduced.to_dict() if self.introduced else None,
            "pattern": self.match.to_dict() if self.match else None,
            "referenceAgrees": self.reference_agrees, "growth": self.growth,
        }
        if is_training(self.program):
            out.update(training_fields(self.program, self.node))
        return {**out, **{f"{k}Reason": why for k, why in _NULL_REASONS[self.kind].items() if out[k] is None}}


_NULL_REASONS = {
    "nonfinite": {"source": "the node has no source line", "firstIndex": "no element is NaN/Inf",
                  "observed": "not compared with the reference (no reference pass asked for)",
                  "introduced": "a NaN/Inf birth is not rerun on the reference's inputs: its inputs are finite",
                  "pattern": "none of the known failure patterns matches",
                  "referenceAgrees": "not compared with the reference (no reference pass asked for)"},
    "divergence": {"source": "the node has no source line", "firstIndex": "no element is beyond tolerance",
                   "observed": "no floating output", "introduced": "no floating output",
                   "pattern": "none of the known failure patterns matches",
                   "referenceAgrees": "only a NaN/Inf birth is checked for the reference's own NaN/Inf"},
}


class Forensics:
    """Forensics over one Session's Timeline; the reference pass is built on first need."""

    def __init__(self, session: SessionView, reference: str | None = None, tolerance: Tolerance | None = None):
        options = session.options
        self.session = session
        self.timeline = session.tl
        self.program = session.program
        self.spec = reference or (options.reference if options else None) or DEFAULT_REFERENCE
        self.tolerance = tolerance or Tolerance(getattr(options, "rtol", None), getattr(options, "atol", None))
        self.precision = judged_precision(self.program)  # the dtype each value is judged at
        self._reference: Reference | None = None
        self.collectives: Collectives | None = None  # how the reference pass runs a collective (ranks: its peers')
        self._introduced: dict[tuple, list[Comparison]] = {}
        self.origins: dict[tuple, tuple] = {}  # provenance/origins.py's traces, by finding and the branch's patches
        self._outputs: dict[tuple, list[Comparison]] = {}  # by the outputs' recorded digests
        self._births: tuple[tuple, list[Birth]] | None = None  # (the pass's shape, its births)
        self._magnitudes: Magnitudes | None = None  # each value's scale in the reference, as first asked
        self.unrun: list[dict] = []  # trials that could not run: {"node", "trial", "ran": False, "why"}

    # -- the reference ---------------------------------------------------------------------------------
    @property
    def reference(self) -> Reference:
        if self._reference is None:
            budget = int((self.session.options.budget_mb if self.session.options else 1024) * 2**20)
            self._reference = open_reference(self.spec, self.program, budget,
                                             self.progress(f"reference pass ({self.spec})"), self.collectives,
                                             self._carried() if len(self.program.step_starts) > 1 else None)
        return self._reference

    def _carried(self) -> Callable[[str], torch.Tensor]:
        """This pass's own value of a name, read where its steps end: what each step of the reference starts from
        (provenance/reference.py's per_step)."""
        self.record_to_end()
        return lambda name: self.test_value(name, self.timeline.end)

    def progress(self, title: str) -> Callable[[int, int], None]:
        """A callback reporting `title` as session progress once the work has run half a second."""
        progress = ProgressAfter(self.session.on_event)

        def report(done: int, total: int) -> None:
            progress(f"{title}: {done} of {total}", done, total)
        return report

    def record_to_end(self) -> None:
        """Execute what the pass has not run yet, leaving the position where the user has it."""
        self.timeline.record_through()

    # -- per-node errors ------------------------------------------------------------------------------
    def floating_outputs(self, node: Node) -> list[str]:
        return [n for n in node.outputs if is_floating(self.program.values[n].dtype)]

    def test_value(self, name: str, position: int) -> torch.Tensor:
        tl = self.timeline
        return to_host(tl.driver, tl.value(name, position))

    def observed(self, node: Node) -> list[Comparison]:
        """Each floating output of `node` in this pass against the reference's."""
        after = self.timeline.node_tick[node.index] + 1
        return [self._compare(n, self.test_value(n, after)) for n in self.floating_outputs(node)]

    def introduced(self, node: Node) -> list[Comparison]:
        """`node` rerun on the reference's inputs (cast to its dtypes), against the reference's outputs."""
        tl = self.timeline
        key = (node.index, tl.patches.get(node.index))
        if key not in self._introduced:
            try:
                inputs = {n: from_host(tl.driver, self.reference.value(n).to(_torch_dtype(self.program.values[n].dtype)))
                          for n in node.input_names()}
                outputs = dict(zip(node.outputs, tl.run_node(node, inputs.__getitem__)))
                self._introduced[key] = [self._compare(n, to_host(tl.driver, outputs[n]))
                                         for n in self.floating_outputs(node)]
            except RewindError as exc:  # the node cannot rerun on the reference's inputs: said, and judged without
                self.not_run(node, "rerun on the reference's inputs", exc)
                self._introduced[key] = []
        return self._introduced[key]

    def not_run(self, node: Node | None, trial: str, why: Exception) -> None:
        """Remember a trial that could not run (the report lists it, and the rest of the report stands)."""
        entry = {"node": node.name if node is not None else None, "trial": trial, "ran": False, "why": str(why)}
        if entry not in self.unrun:
            self.unrun.append(entry)

    def _compare(self, name: str, test: torch.Tensor) -> Comparison:
        rtol, atol = self.tolerance.for_dtype(self.precision[name])
        return compare(name, self.program.values[name].dtype, test, self.reference.value(name), rtol, atol,
                       self.scale(name))

    def scale(self, name: str) -> float:
        """The magnitude `name` was computed from, in the reference (provenance/magnitudes.py)."""
        if self._magnitudes is None or self._magnitudes.reference is not self.reference.value:
            self._magnitudes = Magnitudes(self.program, self.reference.value)
        return self._magnitudes.scale(name)

    def outputs(self) -> list[Comparison]:
        """The program's outputs at the end of this branch, in their declared dtypes, against the reference.

        Remembered by the digests the write log recorded for them: the same bytes compare the same, so
        measuring the original outputs again after an ablation needs no recomputation."""
        tl = self.timeline
        self.record_to_end()
        key = tuple(r.digest if (r := tl.log.last_writer(value=n)) and r.kind != "view" else None
                    for n in self.program.outputs)
        if None in key or key not in self._outputs:
            self._outputs[key] = [self._compare(n, to_host(tl.driver, cast(tl.driver, tl.value(n, tl.end),
                                                                                    self.program.values[n].dtype)))
                                  for n in self.program.outputs]
        return self._outputs[key]

    # -- localisation ---------------------------------------------------------------------------------
    def divergence_at(self, tick: int) -> Finding | None:
        """Does the step at `tick` diverge: observed beyond tolerance, and introduced by it or crossing here?"""
        node = self.timeline.node_at(tick)
        if node is None or tick >= self.timeline.frontier:
            return None
        observed = [c for c in self.observed(node) if not c.within]
        if not observed:
            return None
        introduced = {c.value: c for c in self.introduced(node)}
        worst = max(observed, key=lambda c: c.error)
        alone = introduced.get(worst.value)  # None: the node could not rerun alone (self.unrun says why)
        if (alone is None or alone.within) and self._inputs_beyond(node, tick):
            return None  # inherited
        return self._finding("divergence", tick, node, worst, alone)

    def _inputs_beyond(self, node: Node, tick: int) -> bool:
        for name in node.input_names():
            info = self.program.values[name]
            if info.producer is not None and is_floating(info.dtype):
                if not self._compare(name, self.test_value(name, tick)).within:
                    return True
        return False

    def first_divergence(self, start: int = 0) -> Finding | None:
        tl = self.timeline
        self.record_to_end()
        report = self.progress("looking for the first divergence")
        for tick in range(start, tl.end):
            found = self.divergence_at(tick)
            if found is not None:
                found.growth = self.growth(found)
                return found
            report(tick, tl.end)
        return None

    def births(self) -> list[Birth]:
        """Every NaN/Inf born in this pass (provenance/births.py), remembered while the pass stays as it is."""
        tl = self.timeline
        key = (tl.end, len(tl.log), tuple(sorted(tl.patches)))
        if self._births is None or self._births[0] != key:
            self._births = (key, births(tl, self.program))
        return self._births[1]

    def harmless(self, birth: Birth) -> bool:
        """A birth absorbed before any output that the reference has too: written on purpose (T5's log(0) = -inf,
        discarded by a `where`), so no problem."""
        return not birth.reaches_output and self.reference_has(birth.value, birth.tick)

    def reference_has(self, value: str, tick: int, test: torch.Tensor | None = None) -> bool:
        """Is the reference non-finite wherever this pass's `value` (written at `tick`; `test`: as read already) is?"""
        bad = ~torch.isfinite(self.test_value(value, tick + 1) if test is None else test)
        return bool((~torch.isfinite(self.reference.value(value)[bad])).all())

    def first_nonfinite(self) -> Finding | None:
        """The first NaN/Inf birth that is a problem: it reaches an output, or the reference does not share it."""
        for birth in self.births():
            if not self.harmless(birth):
                details = self.session.nonfinite_at(birth.tick, (birth.kind,))
                return self._finding("nonfinite", birth.tick, birth.node, None, None, details)
        return None

    def explain(self, details: ExceptionDetails, tick: int) -> dict:
        """Evidence for a NaN/Inf stop, without a reference pass: the failure pattern, and where the
        non-finite values its inputs carry were born (None when they carry none, or only on purpose)."""
        node = self.timeline.node_at(tick)
        if node is None:
            return {}
        match = classify(self.evidence("nonfinite", tick, node, details.value, None, None, with_reference=False))
        return {"pattern": match.to_dict() if match else None, "origin": self._origin(node, tick)}

    def _origin(self, node: Node, tick: int) -> dict | None:
        """The earliest step upstream of `node` that wrote NaN/Inf not given to it as a constant."""
        tl = self.timeline
        upstream = set(lineage(self.program, node.outputs[0]).nodes) - {node.index}
        after = -1
        while (rec := tl.log.first_nonfinite(after)) is not None and rec.tick < tick:
            after = rec.tick
            born = tl.node_at(rec.tick)
            if born is not None and born.index in upstream and not (rec.stats.nan == 0 and writes_infinity(born)):
                return {"tick": rec.tick, "node": born.name, "op": born.op, "value": rec.value,
                        "source": str(born.loc) if born.loc else None}
        return None

    def _finding(self, kind: str, tick: int, node: Node, observed: Comparison | None,
                 introduced: Comparison | None, details: ExceptionDetails | None = None) -> Finding:
        if details is None:
            details = self._divergence_details(tick, node, observed)
        found = Finding(kind, tick, node, details, observed, introduced, program=self.program)
        # One diagnosis per node: a node that wrote NaN/Inf its inputs did not carry is diagnosed as that
        # (an fp16 overflow is `overflow`), when it is found as a divergence too.
        diagnosed = "nonfinite" if kind == "nonfinite" or self.session.nonfinite_at(tick) else kind
        found.match = classify(self.evidence(diagnosed, tick, node, details.value, observed, introduced))
        return found

    def _divergence_details(self, tick: int, node: Node, observed: Comparison) -> ExceptionDetails:
        inputs = {n: self.session.value_stats(n, tick) for n in node.input_names()}
        return ExceptionDetails("divergence", node.name, node.op, str(node.loc) if node.loc else None, observed.value,
                                observed.mismatches, observed.first_mismatch, inputs)

    def evidence(self, kind: str, tick: int, node: Node, value: str, observed: Comparison | None,
                 introduced: Comparison | None, with_reference: bool = True) -> Evidence:
        """What the failure patterns see of the node at `tick` (`with_reference`: the reference's values too, made
        on first need)."""
        inputs = {n: self.test_value(n, tick) for n in node.input_names()}
        producers = {n: self.program.nodes[p].op_short for n in inputs
                     if (p := self.program.values[n].producer) is not None}
        return Evidence(kind, node, self.program.values[value].dtype, inputs, self.test_value(value, tick + 1),
                        observed, introduced, _chain(self.program, node), producers, self.program, self.recorded,
                        (lambda name: self.reference.value(name)) if with_reference else None)

    def recorded(self, name: str) -> torch.Tensor:
        """A value as this pass wrote it: a node's output after its node, an input or parameter as the pass
        started (a trained parameter's later versions are the values its updates write)."""
        producer = self.program.values[name].producer
        return self.test_value(name, 0 if producer is None else self.timeline.node_tick[producer] + 1)

    def with_reference(self, found: Finding) -> Finding:
        """Add what the reference says about a NaN/Inf finding: does it have the same non-finite values?"""
        test = self.test_value(found.details.value, found.tick + 1)
        found.reference_agrees = self.reference_has(found.details.value, found.tick, test)
        found.observed = self._compare(found.details.value, test)
        return found

    # -- growth ---------------------------------------------------------------------------------------
    def growth(self, found: Finding) -> list[dict]:
        """The observed error at a finding, then downstream where it at least doubles, and at the outputs."""
        if found.observed is None:
            return []
        points = [_growth_point(found.node, found.tick, found.observed)]
        last = found.observed.error
        outputs = set(self.program.outputs)
        for index in descendants(self.program, found.node.index):
            node = self.program.nodes[index]
            errors = self.observed(node)
            if not errors:
                continue
            worst = max(errors, key=lambda c: c.error)
            reaches_output = any(c.value in outputs for c in errors)
            if worst.error >= 2 * last or reaches_output:
                points.append(_growth_point(node, self.timeline.node_tick[index], worst))
                last = max(last, worst.error)
        return _thin(points)

    # -- the per-node table ----------------------------------------------------------------------------
    def table(self, start: int = 0, count: int | None = None, introduced: bool = False) -> list[dict]:
        """One row per floating output of each node in [start, start + count) ticks: observed (and introduced) error."""
        tl = self.timeline
        self.record_to_end()
        stop = tl.end if count is None else min(tl.end, start + count)
        report = self.progress("comparing with the reference")
        rows = []
        for tick in range(max(0, start), stop):
            node = tl.node_at(tick)
            if node is None:
                continue
            added = {c.value: c for c in self.introduced(node)} if introduced else {}
            for c in self.observed(node):
                row = {"tick": tick, "node": node.name, "op": node.op,
                       "source": str(node.loc) if node.loc else None, **c.to_dict()}
                if introduced:
                    row["introduced"] = added[c.value].to_dict()
                rows.append(row)
            report(tick - start, stop - start)
        return rows


class WithForensics(SessionView, Protocol):
    """A handed Session that also keeps the forensics of its pass (built once: the reference pass is costly)."""

    @property
    def forensics(self) -> Forensics: ...


def _growth_point(node: Node, tick: int, c: Comparison) -> dict:
    return {"tick": tick, "node": node.name, "op": node.op, "source": str(node.loc) if node.loc else None,
            "value": c.value, "error": c.to_dict()["error"], "maxAbs": c.to_dict()["maxAbs"],
            "mismatches": c.mismatches}


def _thin(points: list[dict]) -> list[dict]:
    if len(points) <= MAX_GROWTH_POINTS:
        return points
    step = math.ceil(len(points) / (MAX_GROWTH_POINTS - 1))
    return points[:-1:step] + points[-1:]


def _chain(program, node: Node) -> int:
    """How many nodes of this op at this source line feed each other in a row, ending with `node`."""
    count = 1
    while True:
        producers = [program.values[n].producer for n in node.input_names()]
        same = [program.nodes[p] for p in producers if p is not None
                and program.nodes[p].op == node.op and program.nodes[p].loc == node.loc]
        if not same:
            return count
        node, count = same[0], count + 1


def is_floating(dtype: str) -> bool:
    found = getattr(torch, dtype, None)
    return isinstance(found, torch.dtype) and found.is_floating_point


def _torch_dtype(dtype: str) -> torch.dtype:
    found = getattr(torch, dtype, None)
    if not isinstance(found, torch.dtype):
        raise RewindError(f"unknown dtype '{dtype}'")
    return found

