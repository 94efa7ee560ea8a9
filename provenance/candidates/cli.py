"""`rewind compare CANDIDATE --against REFERENCE [--function NAME] [--inputs FILE:FN] [--json]`: a candidate
model, module or function compared with a trusted one, down to the line where they part; `rewind validate
--function NAME CANDIDATE --against REFERENCE`: the candidate function run on a generated coverage suite.

Exit status: 0 when the candidate is clean (validated), 1 when it departs, is refused or fails a case, 2 when a
file, a function or the options cannot be used."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from hardware.errors import RewindError
from hardware.jsonable import json_safe
from provenance.candidates.comparison import Request, Sides, compare_sides, render
from provenance.candidates.coverage import validate
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
        return {**head, **validate(sides.args, sides.candidate.export, sides.reference.export, req.driver)}


def _report(command: str, make, as_json: bool, text) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        report = make()
    except RewindError as exc:
        print(f"rewind {command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(json_safe(report), indent=2, allow_nan=False) if as_json else text(report))
    return EXIT_CLEAN if report["verdict"] in ("clean", "validated") else EXIT_PROBLEM


def render_validation(report: dict) -> str:
    lines = [f"Rewind validate: {report['candidate']} against {report['reference']}", ""]
    for case in report["cases"]:
        mark = "pass" if case["passed"] else "FAIL"
        error = f" (error {case['error']:.3g} x tolerance)" if "error" in case and case["passed"] else ""
        lines.append(f"  {mark}  {case['case']}{error}" + ("" if case["passed"] else f": {case['reason']}"))
    return "\n".join(lines + ["", f"Verdict: {report['verdict']}: {report['reason']}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rewind compare", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
