"""`rewind forensics model.py [--entry train_step --steps N] [--reference torch:cpu:float64] [--json]
[--html report.html] [--ranks N]`: one-shot numerical forensics.

Runs the model, localizes and classifies what went wrong, searches for a precision fix, and
prints a report (or JSON for agents); `--html` also writes it as one self-contained page to send
(provenance/report_html.py). With `--ranks N`, runs the model as N ranks of one torch.distributed
process group and compares each rank with a float64 reference of the same ranks (docs/ranks.md,
"Forensics per rank"). Exit status: 0 when the pass is clean, 1 when a problem
is found, 2 when the model, the options or a file to write cannot be used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

from checkpoint.safe_files import TargetExists, check_target
from hardware.errors import RewindError
from hardware.events import Output
from hardware.ranks.coordinator import Coordinator, CutStop
from hardware.session import LaunchOptions, Session
from provenance.ablation import DEFAULT_MAX_TRIALS
from hardware.jsonable import json_safe
from provenance.investigation import _ratio, investigate, render
from provenance.reference import DEFAULT_REFERENCE, save_values
from provenance import report_html

EXIT_CLEAN, EXIT_PROBLEM, EXIT_ERROR = 0, 1, 2
RANK_TIMEOUT_S = 600.0  # a rank's whole pass, or its reference pass, answers within it (a large model takes minutes)
# The options a pass of ranks cannot take yet, with their defaults: the ranks run on the CPU with gloo, compared with
# a float64 reference of the same ranks at the tolerances of each value's dtype, and no precision search runs.
NOT_WITH_RANKS = (("driver", "--driver", "auto"), ("reference", "--reference", DEFAULT_REFERENCE),
                  ("rtol", "--rtol", None), ("atol", "--atol", None), ("max_trials", "--max-trials", DEFAULT_MAX_TRIALS),
                  ("save_reference", "--save-reference", None), ("html", "--html", None))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_pass_arguments(parser)
    parser.add_argument("--no-ablate", action="store_true", help="skip the search for a precision fix")
    parser.add_argument("--max-trials", type=int, default=DEFAULT_MAX_TRIALS, help="ablation trials at most")
    parser.add_argument("--save-reference", metavar="PATH", help="also save the reference's values to PATH")
    parser.add_argument("--html", metavar="PATH", help="also write the report to PATH as one self-contained HTML page "
                        "(the chart and the sortable per-node table inline, nothing fetched)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing file at --save-reference or --html PATH")
    parser.add_argument("--ranks", type=int, metavar="N",
                        help="run the model as N ranks of one torch.distributed process group and compare each "
                             "rank with a float64 reference of the same ranks (docs/ranks.md, \"Forensics per rank\")")


def add_pass_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, where its pass runs, its reference and tolerances, and JSON output (shared with `rewind repair`)."""
    parser.add_argument("model", help="the model file: its entry returns (torch.nn.Module, inputs)")
    parser.add_argument("--entry", default="build", help="the function in the file that builds the model (train_step: "
                        "its training step)")
    parser.add_argument("--steps", type=int, default=1, help="training steps to run (with --entry train_step)")
    parser.add_argument("--driver", default="auto", help="where the pass runs: auto, torch:cpu, torch:cuda[:N]")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE,
                        help="the known-good pass: a driver such as torch:cpu:float64, a trace, or saved values")
    parser.add_argument("--rtol", type=float, default=None, help="relative tolerance (default: by dtype)")
    parser.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: by dtype)")
    parser.add_argument("--budget-mb", type=float, default=1024.0, help="checkpoint memory per pass")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (for agents)")


def launch(args: argparse.Namespace) -> Session:
    """A Session with the model's pass loaded as the arguments say."""
    notes = _LaunchNotes()
    session = Session(notes)
    reference = args.reference if args.reference.startswith("torch:") else absolute(args.reference)  # or a file
    session.launch(LaunchOptions(absolute(args.model), entry=args.entry, steps=args.steps, driver=args.driver,
                                 budget_mb=args.budget_mb, reference=reference, rtol=args.rtol, atol=args.atol))
    notes.open = False
    return session


class _LaunchNotes:
    """What the launch says (the entry a file without build() runs, a cached program discarded), on stderr beside
    the report; what the investigation finds later is the report's to say."""

    def __init__(self) -> None:
        self.open = True

    def __call__(self, event: object) -> None:
        if self.open and isinstance(event, Output):
            sys.stderr.write(event.text)


def absolute(path: str) -> str:
    """A path the user gave, from the folder the command runs in: the report names the file it used."""
    return os.path.abspath(path) if path else path


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    if args.ranks is not None:
        return run_ranks(args)
    try:
        for target in (args.save_reference, args.html):  # refused before the run, not after
            if target:
                check_target(target, args.overwrite, report_html.model_files(absolute(args.model), {}))
        session = launch(args)
        found = investigate(session, ablate=not args.no_ablate, max_trials=args.max_trials)
        if args.save_reference:
            save_values(session.forensics.reference, args.save_reference, args.overwrite)
        if args.html:
            report_html.write(args.html, report_html.gather(session, found), args.overwrite,
                              report_html.model_files(absolute(args.model), session.program.source_files))
    except TargetExists as exc:
        print(f"rewind forensics: {exc.path} exists and is kept; --overwrite replaces it", file=sys.stderr)
        return EXIT_ERROR
    except RewindError as exc:
        print(f"rewind forensics: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(json_safe(found.to_dict()), indent=2, allow_nan=False))
    else:
        print(render(found, session.program.source_files))
    return EXIT_PROBLEM if found.problem else EXIT_CLEAN


# -- --ranks N ----------------------------------------------------------------------------------------------------
def run_ranks(args: argparse.Namespace) -> int:
    """Every rank of the program to its end, then forensics per rank (hardware/ranks/forensics.py): the rank and
    line that introduced an error, and the collective that carried it to the other ranks."""
    model = absolute(args.model)
    try:
        given = [flag for name, flag, default in NOT_WITH_RANKS if getattr(args, name) != default]
        if given:
            raise RewindError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} not supported with --ranks "
                              "yet: the ranks run on the CPU and are compared with a float64 reference of the same "
                              "ranks (docs/ranks.md, \"Forensics per rank\")")
        with Coordinator(model, args.ranks, entry=args.entry, budget_mb=args.budget_mb, steps=args.steps,
                         timeout_s=RANK_TIMEOUT_S) as ranks:
            stop = ranks.run()
            found = ranks.forensics() if stop.reason == "end" else stopped_early(stop)
    except RewindError as exc:
        print(f"rewind forensics: {exc}", file=sys.stderr)
        return EXIT_ERROR
    found["problem"] = found["headline"] is not None
    if args.json:
        print(json.dumps(json_safe(found), indent=2, allow_nan=False))
    else:
        print(render_ranks(model, args.ranks, found))
    return EXIT_PROBLEM if found["problem"] else EXIT_CLEAN


def stopped_early(stop: CutStop) -> dict:
    """The answer when the ranks stopped before their end (collectives that do not match, a rank that does not
    answer): that is the problem, and no pass can be compared."""
    why = "the ranks stopped before the end of the program: their passes cannot be compared with the reference"
    return {"reference": DEFAULT_REFERENCE, "ranks": [], "divergence": None, "divergenceReason": why,
            "headline": stop.description, "stop": {"reason": stop.reason, "description": stop.description}}


def render_ranks(model: str, world_size: int, found: dict) -> str:
    """The report of forensics per rank in words: the root, then each rank's first divergence."""
    lines = [f"Rewind forensics: {model} ({world_size} ranks, reference {found['reference']})", "",
             f"Root cause: {found['headline'] or 'none: ' + found['divergenceReason']}", ""]
    if "stop" in found:
        lines += [f"{found['divergenceReason'][0].upper()}{found['divergenceReason'][1:]}.", ""]
    for each in found["ranks"]:
        lines += _rank_finding(each) + [""]
    return "\n".join(lines + ["Verdict: " + ("problem found" if found["headline"] is not None else "clean")])


def _rank_finding(each: dict) -> list[str]:
    d = each["divergence"]
    if d is None:
        return [f"Rank {each['rank']}: no divergence ({each['divergenceReason']})"]
    where = f"{os.path.basename(d['source']['file'])}:{d['source']['line']}" if d["source"] else "no source line"
    first = f", first at {d['firstIndex']}" if d["firstIndex"] is not None else ""
    out = [f"Rank {each['rank']}: first divergence at {where}",
           f"  node {d['node']} ({d['op']}) '{d['value']}' has {d['count']} element(s) beyond tolerance{first}"]
    if d["observed"]:
        o = d["observed"]
        out.append(f"  against the reference: max abs {o['maxAbs']:.3g}, error {_ratio(o['error'])} (x tolerance)")
    c = d["carriedBy"]
    if c is None:
        out.append(f"  {d['carriedByReason']}")
    else:
        inputs = "; ".join(f"rank {i['rank']} '{i['value']}' "
                           f"{'within tolerance' if i['within'] else _ratio(i['error']) + ' x tolerance'}"
                           for i in c["inputs"] if i["value"] is not None)
        out.append(f"  carried in by {c['collective']} #{c['number']} at {c['source']} from rank"
                   f"{'s' if len(c['from']) > 1 else ''} {', '.join(map(str, c['from']))} (its inputs: {inputs})")
    if d["pattern"]:
        p = d["pattern"]
        out += [f"  pattern: {p['title']} [{p['pattern']}]", f"    {p['reason']}", f"  fix: {p['fix']}"]
    if d["growth"]:
        steps = ", ".join(f"{g['node']} {_ratio(g['error'])}" for g in d["growth"])
        out.append(f"  error growth downstream (x tolerance): {steps}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rewind forensics", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
