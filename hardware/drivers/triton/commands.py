"""`rewind forensics|validate|repair FILE --entry kernel`: the one-shot tools on a Triton kernel file.

forensics: the launch against the file's reference() (or `--against OP`, a torch op: against.py), the wrong
elements, the program and line, the patterns. validate: a fixed kernel file over a coverage suite (each size
kernel() takes, at tails, powers of two and not, block multiples; inputs at other value ranges; its float32 tensors
as float16 and as bfloat16, where the interpreter computes in them): it holds where every case run matches its
reference with no check firing, and it is never a wrapper that computes the answer outside the kernel. repair:
forensics of the original, then each fix validated against it (the cases the original fails are said).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

import torch

from hardware.drivers.triton.against import AgainstError, AgainstOp, parse_against
from hardware.drivers.triton.driver import TritonDriver
from hardware.drivers.triton.forensics import REFERENCE, KernelReport, investigate, tolerance, wrapper_assisted
from hardware.drivers.triton.launch import KERNEL_ENTRY, KernelLaunch, interpreter_refuses
from hardware.errors import RewindError

EXIT_CLEAN, EXIT_PROBLEM, EXIT_ERROR = 0, 1, 2
SIZES = (1, 7, 16, 17, 31, 32, 33, 64, 100)  # tails, powers of two and not, block multiples and one past
SCALES = (1e-3, 1e3)  # the inputs' value ranges besides their own
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}  # the float32 tensors as each: a case each
OWN = {"sizes": {}, "scale": 1.0, "dtype": None}  # the launch kernel() makes
NOT_RUN = "not run"
AGAINST_HELP = ("compare the outputs with a torch op instead of reference(): an op's name (softmax, F.gelu: called "
                "with the tensors the kernel only reads) or a call with the kernel's parameters and literals "
                "('torch.softmax(x_ptr, dim=-1)'), computed in float64")


class CaseNotRun(RewindError):
    """A case that cannot be run on this launch (a dtype case with no float32 tensor to cast)."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"rewind {argv[0]}", description=__doc__.splitlines()[0])
    parser.add_argument("kernel", help="the kernel file: kernel() returns (jit_function, grid, args, kwargs)")
    parser.add_argument("--entry", default=KERNEL_ENTRY, choices=[KERNEL_ENTRY])
    parser.add_argument("--against", metavar="OP", help=AGAINST_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object (for agents)")
    if argv[0] == "validate":
        parser.add_argument("--original", required=True, metavar="KERNEL.py", help="the kernel file it fixes")
    if argv[0] == "repair":
        parser.add_argument("--fix", required=True, action="append", metavar="FIXED.py",
                            help="a candidate fix of the kernel file (may be given more than once)")
    args = parser.parse_args(argv[1:])
    try:
        against = parse_against(args.against) if args.against is not None else None
        if argv[0] == "forensics":
            report = forensics(args.kernel, against).to_dict()
            ok = report["clean"]
        elif argv[0] == "validate":
            report = validate(args.kernel, args.original, against)
            ok = report["verdict"] == "validated"
        else:
            report = repair(args.kernel, args.fix, against)
            ok = any(f["verdict"] == "validated" for f in report["fixes"])
    except RewindError as exc:
        print(f"rewind {argv[0]}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(report, indent=2, allow_nan=False) if args.json else render(argv[0], report))
    return EXIT_CLEAN if ok else EXIT_PROBLEM


def run_launch(path: str, case: dict = OWN, against: AgainstOp | None = None) -> tuple[TritonDriver, KernelReport]:
    launch = KernelLaunch.from_file(path, case["sizes"])
    if case["scale"] != 1.0:
        launch.scale_inputs(case["scale"])
    if case["dtype"] and not launch.cast_inputs(DTYPES[case["dtype"]]):
        raise CaseNotRun(f"{launch.name} is given no float32 tensor to cast to {case['dtype']}")
    driver = TritonDriver(launch)
    driver.first_run()
    return driver, investigate(driver, against)


def forensics(path: str, against: AgainstOp | None = None) -> KernelReport:
    return run_launch(path, OWN, against)[1]


def coverage(path: str) -> list[dict]:
    """The cases of the suite: kernel()'s own sizes, then each whole-number size kernel() takes at every size of
    SIZES (the others at their defaults), then its own sizes at every value range of SCALES and every dtype of
    DTYPES."""
    launch = KernelLaunch.from_file(path)
    sizes = {n: p.default for n, p in inspect.signature(launch.module.kernel).parameters.items()
             if isinstance(p.default, int) and not isinstance(p.default, bool)}
    cases = [OWN]
    for name, default in sizes.items():
        cases += [{**OWN, "sizes": {name: v}} for v in SIZES if v != default]
    cases += [{**OWN, "scale": s} for s in SCALES]
    cases += [{**OWN, "dtype": d} for d in DTYPES]
    return cases


def validate(fixed: str, original: str, against: AgainstOp | None = None) -> dict:
    """The fixed file over the coverage suite (and the original on the same cases, to say what the fix fixes)."""
    rows, failed_before = [], 0
    said = against.text if against is not None else REFERENCE
    for case in coverage(fixed):
        row, driver = _outcome(fixed, case, against)
        assisted = wrapper_assisted(driver) if driver is not None else None
        if assisted:
            return {"verdict": "refused", "reason": assisted, "fixed": fixed, "original": original, "against": said,
                    "cases": rows}
        if case["dtype"]:
            row["tolerance"] = dict(zip(("rtol", "atol"), tolerance(DTYPES[case["dtype"]])))
        before = _verdict_of(original, case, against)
        failed_before += before != "holds" and not before.startswith(NOT_RUN)
        rows.append({**case, **row, "original": before})
    ran = [r for r in rows if r["verdict"] != NOT_RUN]
    holds = all(r["verdict"] == "holds" for r in ran)
    return {"verdict": "validated" if holds else "rejected", "fixed": fixed, "original": original, "against": said,
            "cases": rows, "casesRun": len(ran), "casesNotRun": len(rows) - len(ran), "originalFails": failed_before}


def _outcome(path: str, case: dict, against: AgainstOp | None) -> tuple[dict, TritonDriver | None]:
    """A case on one file: holds, fails (its headline and line), or not run (why), with the driver that ran it."""
    refused = interpreter_refuses(DTYPES[case["dtype"]]) if case["dtype"] else None
    if refused:
        return {"verdict": NOT_RUN, "reason": refused}, None
    try:
        driver, report = run_launch(path, case, against)
    except AgainstError as exc:  # the user's --against, not the case: said once, as a usage error
        if case == OWN:
            raise
        raise AgainstError(f"{exc} (in the case {_case(case)} of {Path(path).name})") from None
    except CaseNotRun as exc:
        return {"verdict": NOT_RUN, "reason": str(exc)}, None
    except RewindError as exc:
        if case["dtype"]:
            return {"verdict": NOT_RUN, "reason": f"with {case['dtype']} tensors it cannot be checked under the "
                                                  f"Triton interpreter: {exc}"}, None
        return {"verdict": "fails", "headline": f"does not run: {exc}", "line": None}, None
    return {"programs": report.programs, "verdict": "holds" if report.clean else "fails",
            "headline": report.headline(), "line": report.line}, driver


def _verdict_of(path: str, case: dict, against: AgainstOp | None) -> str:
    row, driver = _outcome(path, case, against)
    if row["verdict"] == NOT_RUN:
        return f"{NOT_RUN}: {row['reason']}"
    return row["verdict"] if driver is not None else row["headline"]


def repair(path: str, fixes: list[str], against: AgainstOp | None = None) -> dict:
    report = forensics(path, against)
    return {"original": report.to_dict(), "fixes": [validate(fix, path, against) for fix in fixes]}


def render(command: str, report: dict) -> str:
    if command == "forensics":
        return _render_forensics(report)
    if command == "validate":
        return _render_validation(report)
    lines = [_render_forensics(report["original"]), ""]
    for fix in report["fixes"]:
        lines.append(_render_validation(fix))
    return "\n".join(lines)


def _render_forensics(r: dict) -> str:
    lines = [r["headline"]]
    if r["against"] not in (None, REFERENCE):
        lines.append(f"  compared with {r['against']} in float64")
    for name, w in r["wrong"].items():
        lines.append(f"  {name}: {w['count']} wrong element(s), first {w['elements']}, worst error {w['worstError']:.3g}")
    if r["first"]:
        f = r["first"]
        lines.append(f"  first wrong store: {f['program']} at line {f['line']} (step {f['step']}) into {f['tensor']} "
                     f"{f['elements']}")
    for p in r["patterns"]:
        lines.append(f"  [{p['kind']}] line {p['line']}: {p['message']}")
    return "\n".join(lines)


def _render_validation(r: dict) -> str:
    if r["verdict"] == "refused":
        return f"{Path(r['fixed']).name}: refused: {r['reason']}"
    lines = [f"{Path(r['fixed']).name}: {r['verdict']} over {r['casesRun']} case(s) against {r['against']}; the "
             f"original fails {r['originalFails']} of them"]
    for row in r["cases"]:
        if row["verdict"] == NOT_RUN:
            lines.append(f"  not run at {_case(row)}: {row['reason']}")
        elif row["verdict"] != "holds" or row["dtype"]:
            lines.append(f"  {row['verdict']} at {_case(row)}: {row['headline']} (the original: {row['original']})")
    return "\n".join(lines)


def _case(row: dict) -> str:
    if row["dtype"]:
        rtol, atol = tolerance(DTYPES[row["dtype"]])
        return f"dtype {row['dtype']} (rtol {rtol:g}, atol {atol:g})"
    return f"sizes {row['sizes']} scale {row['scale']:g}"
