"""`rewind forensics model.py [--entry train_step --steps N] [--reference torch:cpu:float64] [--json]
[--html report.html]`: one-shot numerical forensics.

Runs the model, localizes and classifies what went wrong, searches for a precision fix, and
prints a report (or JSON for agents); `--html` also writes it as one self-contained page to send
(provenance/report_html.py). Exit status: 0 when the pass is clean, 1 when a problem
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
from hardware.session import LaunchOptions, Session
from provenance.ablation import DEFAULT_MAX_TRIALS
from hardware.jsonable import json_safe
from provenance.investigation import investigate, render
from provenance.reference import DEFAULT_REFERENCE, save_values
from provenance import report_html

EXIT_CLEAN, EXIT_PROBLEM, EXIT_ERROR = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_pass_arguments(parser)
    parser.add_argument("--no-ablate", action="store_true", help="skip the search for a precision fix")
    parser.add_argument("--max-trials", type=int, default=DEFAULT_MAX_TRIALS, help="ablation trials at most")
    parser.add_argument("--save-reference", metavar="PATH", help="also save the reference's values to PATH")
    parser.add_argument("--html", metavar="PATH", help="also write the report to PATH as one self-contained HTML page "
                        "(the chart and the sortable per-node table inline, nothing fetched)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing file at --save-reference or --html PATH")


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
    session = Session()
    reference = args.reference if args.reference.startswith("torch:") else absolute(args.reference)  # or a file
    session.launch(LaunchOptions(absolute(args.model), entry=args.entry, steps=args.steps, driver=args.driver,
                                 budget_mb=args.budget_mb, reference=reference, rtol=args.rtol, atol=args.atol))
    return session


def absolute(path: str) -> str:
    """A path the user gave, from the folder the command runs in: the report names the file it used."""
    return os.path.abspath(path) if path else path


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rewind forensics", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
