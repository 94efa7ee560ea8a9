"""The `rewind` command: `rewind debug model.py` opens the console on a model; `rewind forensics model.py`
runs the one-shot numerical forensics (provenance/forensics_cli.py); `rewind repair model.py --fix fix.py`
runs the repair loop (provenance/repair_cli.py); `rewind validate fixed.py --original model.py` validates an edited
copy of a model (provenance/validate_cli.py)."""

from __future__ import annotations

import argparse
import os
import sys

from dap_server import console
from provenance import forensics_cli, repair_cli, validate_cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rewind", description="Rewind: a time-travel debugger for AI accelerators.")
    commands = parser.add_subparsers(dest="command", required=True)
    debug = commands.add_parser("debug", help="debug a model in the console",
                                description="Debug a model file (it defines build() -> (module, inputs)).")
    debug.add_argument("program", nargs="?", help="the model's Python file (or --trace FILE)")
    debug.add_argument("--driver", default="auto", help="auto, torch:cpu, torch:cuda, torch:cuda:N (default auto)")
    debug.add_argument("--entry", default="build", help="the function returning (module, inputs) (default build)")
    debug.add_argument("--steps", type=int, help="with --entry train_step: training steps to run (default 1)")
    debug.add_argument("-x", dest="script", metavar="FILE", help="run the commands in FILE, then exit")
    debug.add_argument("--json", action="store_true", help="print one JSON object per command (for agents)")
    debug.add_argument("--trace", metavar="FILE", help="open a recorded trace instead: no device needed")
    debug.add_argument("--record", metavar="FILE", help="record every step of the run to a trace file")
    debug.add_argument("--overwrite", action="store_true",
                       help="with --record: replace an existing FILE (asked at a terminal, refused otherwise)")
    forensics = commands.add_parser("forensics", help="find, classify and fix a numerical problem in one shot",
                                    description=forensics_cli.__doc__.splitlines()[0])
    forensics_cli.add_arguments(forensics)
    repair = commands.add_parser("repair", help="validate candidate fixes and record the ones that hold",
                                 description=repair_cli.__doc__.splitlines()[0])
    repair_cli.add_arguments(repair)
    validate = commands.add_parser("validate", help="validate an edited copy of a model against the original",
                                   description=validate_cli.__doc__.splitlines()[0])
    validate_cli.add_arguments(validate)
    args = parser.parse_args(argv)
    if args.command == "forensics":
        return forensics_cli.run(args)
    if args.command == "repair":
        return repair_cli.run(args)
    if args.command == "validate":
        return validate_cli.run(args)
    if (args.program is None) == (args.trace is None):
        parser.error("give a model file, or --trace FILE (not both)")
    if args.overwrite and not args.record:
        parser.error("--overwrite replaces an existing --record FILE: give --record too")
    overwrite = args.overwrite
    if args.record and not overwrite and os.path.isfile(args.record) and not os.path.islink(args.record):
        interactive = sys.stdin.isatty() and not args.json and not args.script
        if not (interactive and console.ask_yes_no(f"{args.record} exists: replace it? [y/N] ")):
            print(f"rewind debug: {args.record} exists and is kept; --overwrite replaces it", file=sys.stderr)
            return 2
        overwrite = True
    target = {"trace": args.trace} if args.trace else {"program": args.program, "record": args.record,
                                                        "overwrite": overwrite or None, "steps": args.steps}
    return console.run(target, args.driver, args.entry, args.script, args.json)
