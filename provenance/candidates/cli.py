"""`rewind compare CANDIDATE --against REFERENCE [--function NAME] [--inputs FILE:FN] [--json]`: a candidate
model, module or function compared with a trusted one, down to the line where they part; `rewind validate
--function NAME CANDIDATE --against REFERENCE`: the candidate function run on a generated coverage suite; `rewind
repair --function NAME CANDIDATE --against REFERENCE --fix FILE`: each fix validated on that suite.

Exit status: 0 when the candidate is clean (validated), 1 when it departs, is refused or fails a case, 2 when a
file, a function or the options cannot be used."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from hardware.errors import RewindError
from hardware.frontends.torch_export import positional_names
from hardware.jsonable import json_safe
from provenance.candidates.comparison import Request, Sides, compare_sides
from provenance.candidates.coverage import validate
from provenance.candidates.report import render, render_repair, render_validation
from provenance.candidates.wrappers import wrapper_call

EXIT_CLEAN, EXIT_PROBLEM, EXIT_ERROR = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("candidate", help="model.py, model.py:entry, model.py@REV, or the file of --function")
    parser.add_argument("--against", required=True, metavar="REFERENCE",
                        help="the trusted side: model.py, model.py@HEAD~1, ref.py:function, or a driver such as "
                             "torch:cpu:float64")
    parser.add_argument("--function", metavar="NAME", help="compare this function of the candidate's file (the "
                        "reference's function: its :name, else the same name)")
    parser.add_argument("--inputs", metavar="FILE:FN", help="the arguments both functions are called with (default: "
                        "inputs() of the candidate's file, else of the reference's)")
    parser.add_argument("--driver", default="torch:cpu", help="where the candidate runs (default torch:cpu)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (for agents)")


def request(args: argparse.Namespace) -> Request:
    return Request(args.candidate, args.against, args.function, args.inputs, args.driver)


def run(args: argparse.Namespace) -> int:
    return _report("compare", lambda: compare_sides(request(args)), args.json, render)


def run_validate(args: argparse.Namespace) -> int:
    if not args.function:
        print("rewind validate: --against validates a function: give --function NAME", file=sys.stderr)
        return EXIT_ERROR
    return _report("validate", lambda: validate_function(request(args)), args.json, render_validation)


def add_repair_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    parser.add_argument("--fix", action="append", required=True, metavar="FILE",
                        help="a fixed copy of the candidate's file defining the same function (repeatable)")


def run_repair(args: argparse.Namespace) -> int:
    if not args.function:
        print("rewind repair: --against repairs a function: give --function NAME", file=sys.stderr)
        return EXIT_ERROR
    return _report("repair", lambda: repair_function(request(args), args.fix), args.json, render_repair)


def repair_function(req: Request, fixes: list[str]) -> dict:
    """The repair loop on a candidate: where it departs (and the kernel pattern it matches), then each fix file
    validated on the coverage suite; the first that validates is the repair."""
    found = compare_sides(req)
    if found["verdict"] == "refused":
        return {**found, "fixes": [], "repair": None}
    tried = []
    for fix in fixes:
        try:
            result = validate_function(Request(fix, req.against, req.function, req.inputs, req.driver))
        except RewindError as exc:
            result = {"verdict": "rejected", "reason": str(exc), "cases": [], "failed": None}
        tried.append({"fix": fix, "verdict": result["verdict"], "reason": result["reason"],
                      "cases": len(result["cases"]), "failed": result.get("failed")})
    repair = next((t["fix"] for t in tried if t["verdict"] == "validated"), None)
    return {"candidate": found["candidate"], "reference": found["reference"], "headline": found["headline"],
            "pattern": found.get("pattern"), "departure": found.get("departure"), "fixes": tried, "repair": repair,
            "verdict": "clean" if found["verdict"] == "clean" else "repaired" if repair else "not repaired"}


def validate_function(req: Request) -> dict:
    """The candidate function on the coverage suite, refused first if it wraps the reference's operator."""
    with Sides(req) as sides:
        if sides.reference is None:
            raise RewindError("validate compares a function with a reference function (ref.py:name), not a driver")
        if not isinstance(sides.args, tuple):
            raise RewindError("a function is called with positional arguments: its inputs() returns a tuple")
        head = {"candidate": f"{sides.candidate_spec.file.name}:{sides.function}",
                "reference": f"{sides.reference_spec.file.name}:{sides.against}"}
        refused = wrapper_call(sides.candidate.export(sides.args), sides.reference.export(sides.args),
                               sides.candidate.display)
        if refused:
            return {**head, "verdict": "refused", "reason": refused, "cases": []}
        names = positional_names(sides.candidate.function)
        return {**head, **validate(sides.args, sides.candidate.export, sides.reference.export, names, req.driver)}


def _report(command: str, make, as_json: bool, text) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        report = make()
    except RewindError as exc:
        print(f"rewind {command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(json_safe(report), indent=2, allow_nan=False) if as_json else text(report))
    return EXIT_CLEAN if report["verdict"] in ("clean", "validated", "repaired") else EXIT_PROBLEM


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rewind compare", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
