"""`rewind validate fixed.py --original model.py [--json]`: an edited copy of a model, validated.

Agents fix source files. This runs the original model (its pass, its reference, its tolerances
and the input sets generated from its inputs), exports the edited copy over each input set, and
validates the copy's pass by the repair loop's rules (provenance/validation.py). The copy must
build the same weights and take and return tensors of the same shapes and dtypes; the report says
which nodes the edit changed. Exit status: 0 when the copy validates, 1 when it does not or
changes no node, 2 when a file or the options cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from hardware.errors import ProgramLoadError, RewindError, program_stopped_itself
from hardware.frontends.torch_export import export_program, load_module
from hardware.frontends.torch_train import load_program
from hardware.jsonable import json_safe
from hardware.program import Program
from provenance.forensics_cli import EXIT_CLEAN, EXIT_ERROR, EXIT_PROBLEM, absolute, add_pass_arguments, launch
from provenance.inputs import InputPlan, InputSet
from provenance.repair_cli import add_validation_arguments, describe_checks
from provenance.source_edits import graph_changes
from provenance.validation import Validator

NO_CHANGE = "no node changed: the edited copy computes what the original computes, so it fixes nothing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_pass_arguments(parser)  # its model: the edited copy
    parser.add_argument("--original", required=True, metavar="MODEL.py",
                        help="the model file the copy was edited from: its pass, reference and inputs are the standard")
    add_validation_arguments(parser)


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        report = validate(args)
    except RewindError as exc:
        print(f"rewind validate: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(report, indent=2, allow_nan=False) if args.json else render(report))
    return EXIT_CLEAN if report["verdict"] == "validated" else EXIT_PROBLEM


def validate(args: argparse.Namespace) -> dict:
    """The edited copy against the original: what changed, the validation on every input set, the verdict."""
    started = time.monotonic()
    plan = InputPlan(args.seeds, tuple(args.scales), args.shapes)
    if not args.time_limit > 0:
        raise RewindError(f"the time limit is a number of seconds above 0, got {args.time_limit:g}")
    copy = EditedCopy(absolute(args.model), args.entry, args.steps)
    with _user_code(f"running {Path(args.original).name}"):
        session = launch(argparse.Namespace(**{**vars(args), "model": args.original}))
    copy.match(session.program, Path(args.original).name)
    validator = Validator(session, plan)
    changes = {**graph_changes(session.program, copy.example), "values": changed_values(session.program, copy.example)}
    report = {"fixed": copy.file, "original": absolute(args.original), "driver": session.tl.driver.name,
              "reference": session.forensics.spec, "changes": changes,
              "inputs": [s.to_dict() for s in validator.sets] + [{"skipped": why} for why in validator.skipped]}
    if not changes["hunks"] and not changes["values"]:
        return json_safe({"verdict": "rejected", "reason": NO_CHANGE, **report, "validation": None,
                          "validationReason": "not run: " + NO_CHANGE, "seconds": time.monotonic() - started})
    validation = validator.validate_program(copy.fixed_for, started + args.time_limit)
    reason = (f"every rule held on all {len(validation.checks)} input sets: outputs within tolerance of the "
              "reference, and no NaN/Inf born that the reference does not absorb") if validation.passed \
        else validation.reason
    return json_safe({"verdict": "validated" if validation.passed else "rejected", "reason": reason, **report,
                      "validation": validation.to_dict(), "seconds": time.monotonic() - started})


class EditedCopy:
    """The edited copy of a model: its module, built once by its entry, and its Program over each input set."""

    def __init__(self, file: str, entry: str, steps: int = 1):
        self.file, self.name = file, Path(file).name
        self.training: Program | None = None  # a training step's Program, as it is (it is not exported again)
        with _user_code(f"loading {self.name}"):
            try:
                self.module, self.given = load_module(file, entry)
            except ProgramLoadError:  # an entry returning an optimizer (train_step()) is a training step
                self.training = load_program(file, entry, steps)
        self.example: Program | None = None  # its export over its own inputs (match makes it)

    def match(self, original: Program, theirs: str) -> None:
        """Export the copy and check it is the original's model, edited: the same weights, inputs and outputs."""
        self.example = self.training or self._export(self.given)
        _same_tensors(self.name, theirs, "input", _inputs(self.example), _inputs(original))
        _same_tensors(self.name, theirs, "output", [(n, self.example.values[n]) for n in self.example.outputs],
                      [(n, original.values[n]) for n in original.outputs])
        _same_weights(self.name, theirs, original, self.example)

    def fixed_for(self, inputs: InputSet) -> Program:
        """The copy's Program over the input set's values: its export with those values, or (for another shape)
        exported again; inputs are matched by position."""
        tensors = [inputs.program.initial[name] for name, _ in _inputs(inputs.program)]
        mine = {name: t for (name, _), t in zip(_inputs(self.example), tensors)}
        if inputs.kind != "shape":
            return self.example.with_inputs(mine)
        if isinstance(self.given, dict):  # keyword inputs: the Program names them by their keywords
            return self._export({k: mine.get(k, v) for k, v in self.given.items()})
        given = iter(tensors)
        return self._export(tuple(next(given, v) if isinstance(v, torch.Tensor) else v for v in self.given))

    def _export(self, inputs: Any) -> Program:
        with _user_code(f"exporting {self.name}"):
            return export_program(self.module, inputs, Path(self.file).stem)


@contextmanager
def _user_code(doing: str) -> Iterator[None]:
    """The user's code may call sys.exit(): that is its act, said in words, and the command goes on to report it."""
    try:
        yield
    except SystemExit as exc:
        raise RewindError(program_stopped_itself(exc, doing)) from None


def _inputs(program: Program) -> list[tuple[str, Any]]:
    return [(n, v) for n, v in program.values.items() if v.kind == "input"]


def _same_tensors(mine: str, theirs: str, what: str, have: list, want: list) -> None:
    """Inputs or outputs, by position: the same count, shapes and dtypes."""
    if len(have) != len(want):
        raise RewindError(f"{mine} has {len(have)} {what} tensor(s) where {theirs} has {len(want)}: "
                          f"{_listed(have)} against {_listed(want)}")
    for i, ((name, a), (other, b)) in enumerate(zip(have, want), 1):
        if (a.dtype, a.shape) != (b.dtype, b.shape):
            raise RewindError(f"{mine}'s {what} {i} '{name}' is {a.dtype}{list(a.shape)} where {theirs}'s "
                              f"'{other}' is {b.dtype}{list(b.shape)}")


def _listed(tensors: list) -> str:
    return ", ".join(f"'{n}' {v.dtype}{list(v.shape)}" for n, v in tensors) or "none"


def _weights(program: Program) -> dict[str, torch.Tensor]:
    return {v.target: program.initial[n] for n, v in program.values.items() if v.kind == "parameter"}


def _same_weights(mine: str, theirs: str, original: Program, copy: Program) -> None:
    """The same parameters by name and shape, with the same values (compared in the narrower of two dtypes: a
    fix may keep a module's weights in a wider dtype than the original rounded them to)."""
    have, want = _weights(copy), _weights(original)
    missing, extra = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
    if missing:
        raise RewindError(f"{mine} builds no weight '{missing[0]}', which {theirs} has (a module renamed or removed?)")
    if extra:
        raise RewindError(f"{mine} builds a weight '{extra[0]}', which {theirs} does not have")
    for name, b in want.items():
        a = have[name]
        if a.shape != b.shape:
            raise RewindError(f"{mine}'s weight '{name}' has shape {list(a.shape)} where {theirs}'s has "
                              f"{list(b.shape)}")
        narrow = min((a.dtype, b.dtype), key=lambda d: torch.finfo(d).bits if d.is_floating_point else 0)
        if not torch.equal(a.to(narrow), b.to(narrow)):
            raise RewindError(f"{mine} builds different weights for '{name}' than {theirs}: seed it the same way")


def changed_values(original: Program, copy: Program) -> list[dict]:
    """Buffers and constants the edit changed (by the module attribute they come from): a fix may compute a
    buffer another way (rotary frequencies in float32) and leave every node as it was."""
    def held(program: Program) -> dict[str, torch.Tensor]:
        return {v.target: program.initial[n] for n, v in program.values.items()
                if v.kind in ("buffer", "constant") and v.target}

    mine, theirs = held(copy), held(original)
    return [{"value": name, "kind": "added" if name not in theirs else "removed" if name not in mine else "changed"}
            for name in sorted(mine.keys() | theirs.keys())
            if name not in mine or name not in theirs or mine[name].dtype != theirs[name].dtype
            or mine[name].shape != theirs[name].shape or not torch.equal(mine[name], theirs[name])]


def render(report: dict) -> str:
    fixed, original = Path(report["fixed"]).name, Path(report["original"]).name
    lines = [f"Rewind validate: {fixed} against {original} on {report['driver']}, reference {report['reference']}", ""]
    changes = report["changes"]
    lines.append(f"Nodes the edit changed ({changes['unchanged']} unchanged):" if changes["hunks"] else
                 "No node changed.")
    for hunk in changes["hunks"]:
        lines += [f"  - {_node(n)}" for n in hunk["original"]] + [f"  + {_node(n)}" for n in hunk["fixed"]]
    lines += [f"  {v['kind']}: the value '{v['value']}'" for v in changes["values"]]
    if report["validation"] is not None:
        lines += ["", "Validation on the original's input sets:", *describe_checks(report["validation"])]
        lines += [f"  skipped: {why}" for why in report["validation"]["skipped"]]
    lines += ["", f"Verdict: {report['verdict']}: {report['reason']}"]
    return "\n".join(lines)


def _node(n: dict) -> str:
    where = f" at {Path(n['source']).name}" if n["source"] else ""
    return f"{n['node']} ({n['op']}){where}" + (f": {n['text']}" if n["text"] else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rewind validate", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
