"""`rewind repair model.py [--fix fix.py ...] [--json]`: the repair loop in one command.

Runs forensics on the model, then tries each fix file in order (or, without --fix or with
--suggest, the knowledge base's suggestions), validating each on the example inputs and on
generated ones, and prints the verdict with its evidence (JSON for agents). A fix that validates
is recorded in the knowledge base and written into the model's source as a unified diff. Exit
status: 0 when a fix validated or there is nothing to repair, 1 when no candidate validated, 2
when the model, a fix file or the options cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

from hardware.errors import RewindError
from hardware.jsonable import json_safe
from provenance.forensics_cli import EXIT_CLEAN, EXIT_ERROR, EXIT_PROBLEM, absolute, add_pass_arguments, launch
from provenance.inputs import DEFAULT_SCALES, DEFAULT_SEEDS, DEFAULT_SHAPES, InputPlan
from provenance.knowledge import KnowledgeBase
from provenance.repair import DEFAULT_ATTEMPTS, DEFAULT_SECONDS, FixText, RepairLimits, RepairLoop
from provenance.source_edits import source_fields


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_pass_arguments(parser)
    add_loop_arguments(parser)


def add_loop_arguments(parser: argparse.ArgumentParser) -> None:
    """The fixes to try, the loop's limits and its input sets (shared with the console's `repair`)."""
    parser.add_argument("--fix", action="append", default=[], metavar="FIX.py",
                        help="a fix file defining PATCHES (repeat to try several, in order)")
    parser.add_argument("--suggest", action="store_true",
                        help="after the given fixes, try the knowledge base's (the default without --fix)")
    parser.add_argument("--knowledge", metavar="PATH", help="the knowledge base file (default: in the user's cache)")
    parser.add_argument("--max-attempts", type=int, default=DEFAULT_ATTEMPTS, help="candidates tried at most")
    add_validation_arguments(parser)


def add_validation_arguments(parser: argparse.ArgumentParser) -> None:
    """The input sets a fix is validated on, and the time it may take (shared with `rewind validate`)."""
    parser.add_argument("--time-limit", type=float, default=DEFAULT_SECONDS,
                        help="seconds for the whole loop (rewind validate: for the validation)")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="input sets drawn with new seeds")
    parser.add_argument("--scales", type=_scales, default=DEFAULT_SCALES,
                        help="value ranges: the example inputs scaled by these factors (comma separated)")
    parser.add_argument("--shapes", type=int, default=DEFAULT_SHAPES, help="input sets of other shapes (re-exported)")


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        fixes = [FixText(Path(f).read_text(), str(Path(f).resolve())) for f in _existing(args.fix)]
        loop = RepairLoop(launch(args), KnowledgeBase(absolute(args.knowledge) if args.knowledge else None),
                          RepairLimits(args.max_attempts, args.time_limit),
                          InputPlan(args.seeds, tuple(args.scales), args.shapes))
        report = with_source_diffs(loop.run(fixes, suggest=args.suggest or not fixes), loop)
    except RewindError as exc:
        print(f"rewind repair: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(report, indent=2, allow_nan=False) if args.json else render(report))
    return EXIT_CLEAN if report["verdict"] in ("validated", "clean") else EXIT_PROBLEM


def with_source_diffs(report: dict, loop: RepairLoop) -> dict:
    """The verdict with the validated fix written into the model's source: a unified diff per file, and the
    patches the source cannot say (provenance/source_edits.py)."""
    fix = next((a.fix for a in loop.attempts if a.verdict == "validated"), None)
    return {**report, **json_safe(source_fields(loop.session.program, fix))}


def render(report: dict) -> str:
    lines = [f"Rewind repair: {report['program']} on {report['driver']}, reference {report['reference']}", ""]
    lines += [f"Finding: {describe_finding(f)}" for f in report["findings"]]
    for i, a in enumerate(report["attempts"], 1):
        lines.append(f"Attempt {i}: {a['candidate']['name']}: {a['verdict'].upper()}: {a['reason']}")
        lines += [f"  refused: {v['what']} ({Path(v['file']).name}:{v['line']})" for v in a["integrity"]["violations"]]
        lines += describe_checks(a["validation"] or {})
    recorded = report["knowledge"]["recorded"]
    if recorded:
        lines.append(f"Recorded in the knowledge base ({report['knowledge']['path']}): {recorded['pattern']} -> "
                     f"{recorded['name']} (validated {recorded['validations']} time(s))")
    lines += describe_source_diffs(report)
    lines += ["", f"Verdict: {report['verdict']}: {report['reason']}"]
    return "\n".join(lines)


def describe_checks(validation: dict) -> list[str]:
    """One line per input set of a validation: ok or FAILED, and the worst output error or why it failed."""
    lines = []
    for check in validation.get("checks", []):
        worst = max((o["error"] for o in check["outputs"]), key=_number, default=None)
        detail = check["error"] or f"worst output error {_ratio(worst)} x tolerance"
        if not check["within"] and check["error"] is None:
            detail = f"{check['reason']}; {detail}"
        lines.append(f"  {check['inputs']['name']}: {'ok' if check['within'] else 'FAILED'} ({detail})")
    return lines


def describe_source_diffs(report: dict) -> list[str]:
    """The validated fix as diffs of the model's source, and the patches they leave out (with why)."""
    lines = []
    if report["sourceDiffs"]:
        lines += ["", "The fix in your source (`git apply` or `patch -p1` applies it here; `rewind validate COPY.py "
                  "--original MODEL.py` checks an edited copy):"]
        for d in report["sourceDiffs"]:
            lines += d["diff"].rstrip("\n").splitlines() + [f"note: {n}" for n in d["notes"]]
    lines += [_not_in_source(group) for group in _same_reason(report["notInSource"])]
    return lines


def _same_reason(patches: list[dict]) -> list[list[dict]]:
    """The patches left out of the source, those left out for the same reason together (a loop's 384 additions at
    one line are one line of the report, not 384), in the order first seen."""
    groups: dict[tuple, list[dict]] = {}
    for p in patches:
        groups.setdefault((p["op"], p["kind"], p["why"]), []).append(p)
    return list(groups.values())


def _not_in_source(group: list[dict]) -> str:
    first = group[0]
    nodes = first["node"] if len(group) == 1 else (
        f"{first['node']}, {group[1]['node']}" if len(group) == 2 else
        f"{len(group)} nodes ({first['node']} ... {group[-1]['node']})")
    return f"Not in the source: {nodes} ({first['op']}, {first['kind']}): {first['why']}"


def describe_finding(f: dict) -> str:
    """One finding as the verdict lists it: what, where, which node, which pattern."""
    where = f"{Path(f['source']['file']).name}:{f['source']['line']}" if f["source"] else "no source line"
    pattern = f["pattern"]["pattern"] if f["pattern"] else "no known pattern"
    return f"{f['kind']} at {where}, node {f['node']} ({f['op']}): {pattern}"


def _scales(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"scales are numbers separated by commas, got '{text}'") from None


def _existing(paths: list[str]) -> list[str]:
    for p in paths:
        if not Path(p).is_file():
            raise RewindError(f"fix file not found: {p}")
    return paths


def _number(x) -> float:
    return float("inf") if isinstance(x, str) else x


def _ratio(x) -> str:
    return x if isinstance(x, str) else f"{x:.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rewind repair", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
