"""A candidate compared with a trusted implementation, down to the line where they part.

The outputs are aligned first (by name where both sides name them, else by position; shapes and dtypes must
agree), each judged against the reference's exact (float64) value at the candidate's dtype. Where outputs are
wrong, the report says which elements (rows, columns, a mask) and goes inside the candidate
(provenance/candidates/localize.py) for the first line whose values depart from what the reference implies.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from hardware.errors import RewindError
from hardware.program import Program
from provenance.candidates.kernel_patterns import classify
from provenance.candidates.localize import (Departure, by_dependence, by_names, by_prefix, line_of, name_of,
                                            spans, where_wrong)
from provenance.candidates.passes import BUDGET, Pass, judge, truth
from provenance.candidates.sides import Loaded, check_signatures, inputs_from, loaded, parse_side
from provenance.candidates.wrappers import wrapper_call
from hardware.frontends.torch_export import positional_names
from provenance.reference import open_reference


@dataclass
class Request:
    candidate: str
    against: str
    function: str | None = None  # the candidate's function (None: the candidate is a model file)
    inputs: str | None = None  # `file.py:fn` giving the arguments of both functions
    driver: str = "torch:cpu"


class Sides:
    """Both sides loaded for as long as the comparison runs (a revision's temporary copy lives so long)."""

    def __init__(self, request: Request):
        self.request = request
        self._stack = ExitStack()
        self.candidate_spec = parse_side(request.candidate, "candidate")
        if self.candidate_spec.driver:
            raise RewindError(f"the candidate is a model or a function, not the driver {request.candidate}")
        self.reference_spec = parse_side(request.against, "reference")
        self.function = request.function

    def __enter__(self) -> "Sides":
        function = self.function
        self.candidate: Loaded = self._stack.enter_context(loaded(self.candidate_spec, function))
        self.reference: Loaded | None = None
        if self.reference_spec.driver is None:
            against = (self.reference_spec.name or function) if function else None
            self.against = against
            self.reference = self._stack.enter_context(loaded(self.reference_spec, against))
            if function:
                check_signatures(self.candidate, self.reference, function, against)
        self.args = self._arguments()
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _arguments(self):
        if self.request.inputs:
            return inputs_from(self.request.inputs)
        if self.reference is not None and self.reference.function is None:  # models: the reference's own inputs
            return self.reference.example
        for side in (self.candidate, self.reference):
            if side is not None and side.example is not None:
                return side.example
        raise RewindError(f"no arguments to call {self.function} with: give --inputs file.py:fn, or define "
                          f"inputs() in {self.candidate_spec.file.name}")


def compare_sides(request: Request) -> dict:
    started = time.monotonic()
    with Sides(request) as sides:
        report = _against_driver(sides) if sides.reference is None else _against_implementation(sides)
    report["seconds"] = time.monotonic() - started
    return report


def _base_report(sides: Sides) -> dict:
    return {"candidate": sides.candidate_spec.label if not sides.function else
            f"{sides.candidate_spec.label.split(':')[0]}:{sides.function}",
            "reference": sides.reference_spec.label if sides.reference is None or not sides.function else
            f"{sides.reference_spec.label.split(':')[0]}:{sides.against}"}


def _against_implementation(sides: Sides) -> dict:
    report = _base_report(sides)
    args = sides.args
    candidate_program = sides.candidate.export(args)
    reference_program = sides.reference.export(args)
    if sides.function:
        refused = wrapper_call(candidate_program, reference_program, sides.candidate.display)
        if refused:
            return {**report, "verdict": "refused", "reason": refused, "headline": refused, "outputs": []}
    _same_outputs(sides, candidate_program, reference_program)
    if not sides.function:
        _same_models(sides, candidate_program, reference_program)
    candidate = Pass(candidate_program, sides.request.driver)
    if sides.candidate.function is not None:
        inputs = [n for n, v in candidate_program.values.items() if v.kind == "input"]
        candidate.labels = dict(zip(inputs, positional_names(sides.candidate.function)))
    exact = truth(reference_program)
    at_dtype = Pass(reference_program, sides.request.driver)
    outputs, wrong = _judged_outputs(candidate, at_dtype, exact, reference_program)
    report["outputs"] = outputs
    if all(o["within"] for o in outputs):
        return {**report, "verdict": "clean", "headline": None,
                "reason": "every output is within tolerance of the reference"}
    slack = outputs[0]["slack"]
    departure = None
    if not sides.function:
        departure = by_names(candidate, reference_program, exact.value)
    if departure is None and isinstance(args, tuple):
        departure = by_prefix(candidate, sides.reference.export, args, wrong[0], slack)
    if departure is None and isinstance(args, tuple):
        departure = by_dependence(candidate, reference_program, sides.candidate.export, sides.reference.export, args)
    return {**report, **_verdict(sides.candidate, candidate_program, departure, outputs)}


def _against_driver(sides: Sides) -> dict:
    """The candidate's own program on another driver (provenance/reference.py): values share their names."""
    report = _base_report(sides)
    args = sides.args
    program = sides.candidate.export(args)
    candidate = Pass(program, sides.request.driver)
    reference = open_reference(sides.reference_spec.driver, program, BUDGET)
    outputs = []
    for name in program.outputs:
        judged = judge(name, candidate.value(name), reference.value(name))
        outputs.append({"value": name, "within": judged.comparison.within, "slack": 1.0,
                        "comparison": judged.comparison.to_dict(), "wrong": where_wrong(judged.wrong)})
    report["outputs"] = outputs
    if all(o["within"] for o in outputs):
        return {**report, "verdict": "clean", "headline": None,
                "reason": f"every output is within tolerance of the pass on {sides.reference_spec.driver}"}
    departure = None
    for node in program.nodes:
        for name in node.outputs:
            if not program.values[name].dtype.startswith(("float", "bfloat")):
                continue
            judged = judge(name, candidate.value(name), reference.value(name))
            if not judged.comparison.within and departure is None:
                file, line = line_of(program, name)
                departure = Departure(line, file, name_of(program, name), "driver", [
                    f"'{name_of(program, name)}' ({node.op_short}) is the first value beyond tolerance of the pass on "
                    f"{sides.reference_spec.driver} (error {judged.comparison.error:.3g} x tolerance)"])
        if departure is not None:
            break
    return {**report, **_verdict(sides.candidate, program, departure, outputs)}


def _same_outputs(sides: Sides, mine: Program, theirs: Program) -> None:
    a, b = mine.outputs, theirs.outputs
    if len(a) != len(b):
        raise RewindError(f"{sides.candidate_spec.label} returns {len(a)} output(s) where {sides.reference_spec.label} "
                          f"returns {len(b)}")
    for i, (x, y) in enumerate(zip(a, b), 1):
        p, q = mine.values[x], theirs.values[y]
        if (p.shape, p.dtype) != (q.shape, q.dtype):
            raise RewindError(f"output {i} is {p.dtype}{list(p.shape)} in {sides.candidate_spec.label} but "
                              f"{q.dtype}{list(q.shape)} in {sides.reference_spec.label}")


def _same_models(sides: Sides, mine: Program, theirs: Program) -> None:
    """Two model files are compared on the reference's inputs: the candidate's own must have their shapes, and
    weights both build under one name and shape must be the same (else every value departs for that alone)."""
    own, given = sides.candidate.example, sides.args
    if isinstance(own, tuple) and isinstance(given, tuple):
        shapes = [tuple(t.shape) for t in own if isinstance(t, torch.Tensor)]
        wanted = [tuple(t.shape) for t in given if isinstance(t, torch.Tensor)]
        if shapes != wanted:
            raise RewindError(f"{sides.candidate_spec.label} builds inputs of shapes {[list(s) for s in shapes]} where "
                              f"{sides.reference_spec.label} builds {[list(s) for s in wanted]}: both are called with "
                              "the reference's")
    weights = {v.target: theirs.initial[n] for n, v in theirs.values.items() if v.kind == "parameter"}
    for name, info in mine.values.items():
        other = weights.get(info.target) if info.kind == "parameter" else None
        if other is not None and tuple(other.shape) == info.shape and not torch.equal(mine.initial[name], other):
            raise RewindError(f"{sides.candidate_spec.label} builds different weights for '{info.target}' than "
                              f"{sides.reference_spec.label}: seed both the same way")


def _judged_outputs(candidate: Pass, at_dtype: Pass, exact, reference: Program) -> tuple[list[dict], list]:
    outputs, wrong = [], []
    for mine, theirs in zip(candidate.program.outputs, reference.outputs):
        truth_value = exact.value(theirs)
        own = judge(theirs, at_dtype.value(theirs), truth_value).comparison
        slack = max(1.0, 2.0 * own.error) if own.error == own.error and own.error != float("inf") else 1.0
        judged = judge(mine, candidate.value(mine), truth_value, slack)
        outputs.append({"value": mine, "within": judged.comparison.within, "slack": slack,
                        "comparison": judged.comparison.to_dict(), "wrong": where_wrong(judged.wrong)})
        wrong.append(judged.wrong)
    return outputs, wrong


def _verdict(side: Loaded, program: Program, departure: Departure | None, outputs: list[dict]) -> dict:
    wrong = next(o for o in outputs if not o["within"])
    summary = _wrong_summary(wrong)
    if departure is None or departure.line is None:
        reason = departure.evidence[0] if departure else "no single line of the candidate could be named"
        return {"verdict": "departs", "headline": f"the outputs depart from the reference ({summary}); {reason}",
                "departure": departure.to_dict() if departure else None, "source": None, "wrongSummary": summary}
    text = _line_text(program, departure.file, departure.line)
    where = f"line {departure.line} of {side.display(departure.file)}"
    claim = ("the loop stops before the tail of its input" if departure.how == "tail" else
             "a block slice starts away from where the previous ended" if departure.how == "gap" else
             f"{departure.value if departure.value.startswith('the ') else repr(departure.value)} is the first value "
             "that departs from what the reference implies")
    headline = f"{where} (`{text}`): {claim}; {summary}"

    pattern = classify(departure)
    return {"verdict": "departs", "headline": headline, "departure": departure.to_dict(),
            "source": {"file": side.display(departure.file), "line": departure.line, "text": text},
            "wrongSummary": summary, "pattern": pattern.to_dict() if pattern else None,
            "patternReason": None if pattern else "the departure matches none of the kernel patterns"}


def _wrong_summary(output: dict) -> str:
    w = output["wrong"]
    if "rows" in w and w["wholeRows"] and len(w["rows"]) < w["rowsOf"]:
        return f"{len(w['rows'])} of {w['rowsOf']} rows of '{output['value']}' are wrong (rows {spans(w['rows'])})"
    if "rows" in w:
        return (f"{w['count']} of {w['of']} elements of '{output['value']}' are wrong, in {len(w['rows'])} of "
                f"{w['rowsOf']} rows and columns {spans(w['columns'])}")
    return f"{w['count']} of {w['of']} elements of '{output['value']}' are wrong"


def _line_text(program: Program, file: str, line: int) -> str:
    text = program.source_files.get(file)
    if text is None and Path(file).is_file():
        text = Path(file).read_text()
    lines = (text or "").splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""
