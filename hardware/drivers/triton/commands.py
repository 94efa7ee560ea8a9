"""`rewind forensics|validate|repair FILE --entry kernel`: the one-shot tools on a Triton kernel file.

forensics: the launch against the file's reference(), the wrong elements, the program and line, the patterns.
validate: a fixed kernel file over a coverage suite (each size kernel() takes, at tails, powers of two and not,
block multiples; inputs at other value ranges): it holds where every case matches its reference with no check
firing, and it is never a wrapper that computes the answer outside the kernel. repair: forensics of the original,
then each fix validated against it (the cases the original fails are said).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

from hardware.drivers.triton.driver import TritonDriver
from hardware.drivers.triton.forensics import KernelReport, investigate, wrapper_assisted
from hardware.drivers.triton.launch import KERNEL_ENTRY, KernelLaunch
from hardware.errors import RewindError

EXIT_CLEAN, EXIT_PROBLEM, EXIT_ERROR = 0, 1, 2
SIZES = (1, 7, 16, 17, 31, 32, 33, 64, 100)  # tails, powers of two and not, block multiples and one past
SCALES = (1e-3, 1e3)  # the inputs' value ranges besides their own


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"rewind {argv[0]}", description=__doc__.splitlines()[0])
    parser.add_argument("kernel", help="the kernel file: kernel() returns (jit_function, grid, args, kwargs)")
    parser.add_argument("--entry", default=KERNEL_ENTRY, choices=[KERNEL_ENTRY])
    parser.add_argument("--json", action="store_true", help="print one JSON object (for agents)")
    if argv[0] == "validate":
        parser.add_argument("--original", required=True, metavar="KERNEL.py", help="the kernel file it fixes")
    if argv[0] == "repair":
        parser.add_argument("--fix", required=True, action="append", metavar="FIXED.py",
                            help="a candidate fix of the kernel file (may be given more than once)")
    args = parser.parse_args(argv[1:])
    try:
        if argv[0] == "forensics":
            report = forensics(args.kernel).to_dict()
            ok = report["clean"]
        elif argv[0] == "validate":
            report = validate(args.kernel, args.original)
            ok = report["verdict"] == "validated"
        else:
            report = repair(args.kernel, args.fix)
            ok = any(f["verdict"] == "validated" for f in report["fixes"])
    except RewindError as exc:
        print(f"rewind {argv[0]}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(report, indent=2, allow_nan=False) if args.json else render(argv[0], report))
    return EXIT_CLEAN if ok else EXIT_PROBLEM


def run_launch(path: str, sizes: dict | None = None, scale: float = 1.0) -> tuple[TritonDriver, KernelReport]:
    launch = KernelLaunch.from_file(path, sizes or {})
    if scale != 1.0:
        launch.scale_inputs(scale)
    driver = TritonDriver(launch)
    driver.first_run()
    return driver, investigate(driver)


def forensics(path: str) -> KernelReport:
    return run_launch(path)[1]


def coverage(path: str) -> list[dict]:
    """The cases of the suite: kernel()'s own sizes, then each whole-number size kernel() takes at every size of
    SIZES (the others at their defaults), then its own sizes at every value range of SCALES."""
    launch = KernelLaunch.from_file(path)
    sizes = {n: p.default for n, p in inspect.signature(launch.module.kernel).parameters.items()
             if isinstance(p.default, int) and not isinstance(p.default, bool)}
    cases = [{"sizes": {}, "scale": 1.0}]
    for name, default in sizes.items():
        cases += [{"sizes": {name: v}, "scale": 1.0} for v in SIZES if v != default]
    cases += [{"sizes": {}, "scale": s} for s in SCALES]
    return cases


def validate(fixed: str, original: str) -> dict:
    """The fixed file over the coverage suite (and the original on the same cases, to say what the fix fixes)."""
    cases = coverage(fixed)
    rows, failed_before = [], 0
    for case in cases:
        try:
            driver, report = run_launch(fixed, case["sizes"], case["scale"])
        except RewindError as exc:
            rows.append({**case, "verdict": "fails", "headline": f"does not run: {exc}", "line": None,
                         "original": _verdict_of(original, case)})
            continue
        assisted = wrapper_assisted(driver)
        if assisted:
            return {"verdict": "refused", "reason": assisted, "fixed": fixed, "original": original, "cases": rows}
        before = _verdict_of(original, case)
        failed_before += before != "holds"
        rows.append({**case, "programs": report.programs, "verdict": "holds" if report.clean else "fails",
                     "headline": report.headline(), "line": report.line, "original": before})
    holds = all(r["verdict"] == "holds" for r in rows)
    return {"verdict": "validated" if holds else "rejected", "fixed": fixed, "original": original,
            "cases": rows, "casesRun": len(rows), "originalFails": failed_before}


def _verdict_of(path: str, case: dict) -> str:
    try:
        return "holds" if run_launch(path, case["sizes"], case["scale"])[1].clean else "fails"
    except RewindError as exc:
        return f"does not run: {exc}"


def repair(path: str, fixes: list[str]) -> dict:
    report = forensics(path)
    return {"original": report.to_dict(), "fixes": [validate(fix, path) for fix in fixes]}


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
    lines = [f"{Path(r['fixed']).name}: {r['verdict']} over {r['casesRun']} case(s); the original fails "
             f"{r['originalFails']} of them"]
    for row in r["cases"]:
        if row["verdict"] != "holds":
            lines.append(f"  fails at sizes {row['sizes']} scale {row['scale']:g}: {row['headline']}")
    return "\n".join(lines)

