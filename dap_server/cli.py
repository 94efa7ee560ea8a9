"""The `rewind` command: `rewind debug model.py` opens the console on a model; `rewind forensics model.py`
runs the one-shot numerical forensics (provenance/forensics_cli.py); `rewind repair model.py --fix fix.py`
runs the repair loop (provenance/repair_cli.py); `rewind validate fixed.py --original model.py` validates an edited
copy of a model (provenance/validate_cli.py); `rewind compare CANDIDATE --against REF` compares a candidate with a
trusted implementation, and `validate`/`repair --function` validate and repair a candidate function
(provenance/candidates/, docs/compare.md); `rewind cache list|clear` shows or empties the program cache
(docs/cache.md); `rewind pool` runs the engine pool, which forks sessions' engines warm (docs/engine-pool.md).

`rewind debug` is a client of the server, which runs the model: this process never imports torch. The other tools
run the model here, and are imported only when chosen."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

from dap_server import console
from dap_server.pool import __main__ as pool_main
from hardware.errors import RewindError, echo, os_reason
from hardware.frontends.cache_folder import NO_CACHE_ENV, CacheFolder

NO_CACHE_HELP = f"export the model's program afresh, neither using nor writing the program cache (as {NO_CACHE_ENV}=1)"


def _forensics_cli() -> ModuleType:
    from provenance import forensics_cli  # deferred: imports torch, which only this command needs
    return forensics_cli


def _repair_cli() -> ModuleType:
    from provenance import repair_cli  # deferred: imports torch, which only this command needs
    return repair_cli


def _validate_cli() -> ModuleType:
    from provenance import validate_cli  # deferred: imports torch, which only this command needs
    return validate_cli


def _compare_cli() -> ModuleType:
    from provenance.candidates import cli  # deferred: imports torch, which only this command needs
    return cli


class _ValidateFunction:
    """`rewind validate --function NAME CANDIDATE --against REF`: a candidate function on a coverage suite
    (provenance/candidates/cli.py); without --function, an edited copy of a model (provenance/validate_cli.py)."""

    __doc__ = "validate a candidate function against a reference function on a generated coverage suite"
    add_arguments = staticmethod(lambda parser: _compare_cli().add_arguments(parser))
    run = staticmethod(lambda args: _compare_cli().run_validate(args))


class _RepairFunction:
    """`rewind repair --function NAME CANDIDATE --against REF --fix FILE`: the repair loop on a candidate function,
    each fix validated by the coverage suite (provenance/candidates/cli.py)."""

    __doc__ = "repair a candidate function: each fix file validated on the coverage suite against the reference"
    add_arguments = staticmethod(lambda parser: _compare_cli().add_repair_arguments(parser))
    run = staticmethod(lambda args: _compare_cli().run_repair(args))


def _tool(name: str, load: Callable[[], ModuleType], argv: list[str]):
    """The chosen tool's module; with --function, validate and repair work on a candidate function."""
    if "--function" in argv and name in ("validate", "repair"):
        return {"validate": _ValidateFunction, "repair": _RepairFunction}[name]
    return load()


def _kernel_command(argv: list[str]) -> bool:
    """forensics, validate or repair with --entry kernel: a Triton kernel file (docs/kernels.md)."""
    return bool(argv) and argv[0] in ("forensics", "validate", "repair") and (
        "--entry=kernel" in argv or any(a == "--entry" and b == "kernel" for a, b in zip(argv, argv[1:])))


def _against_without_kernel(argv: list[str]) -> bool:
    """forensics, validate or repair of a model with --against: the op a Triton kernel is compared with, which a
    model has no use for (validate and repair --function take --against REF, the trusted function)."""
    return bool(argv) and argv[0] in ("forensics", "validate", "repair") and "--function" not in argv and any(
        a == "--against" or a.startswith("--against=") for a in argv)


def _kernel_commands() -> ModuleType:
    from hardware.drivers.triton import commands  # deferred: imports torch and Triton, which only a kernel needs
    return commands


# The tools that run the model in this process: help, how to load the module that parses and runs them, and
# whether they launch a session (whose program may come from the program cache).
TOOLS: dict[str, tuple[str, Callable[[], ModuleType], bool]] = {
    "forensics": ("find, classify and fix a numerical problem in one shot", _forensics_cli, True),
    "repair": ("validate candidate fixes and record the ones that hold", _repair_cli, True),
    "validate": ("validate an edited copy of a model against the original", _validate_cli, False),
    "compare": ("compare a candidate model or function with a trusted one, down to the line where they part",
                _compare_cli, False),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if _kernel_command(argv):
        return _kernel_commands().main(argv)
    if _against_without_kernel(argv):
        print(f"rewind {argv[0]}: --against OP compares a Triton kernel's outputs with a torch op: it needs "
              "--entry kernel and a kernel file (docs/kernels.md)",
              file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="rewind", description="Rewind: a time-travel debugger for AI accelerators.")
    commands = parser.add_subparsers(dest="command", required=True)
    debug = commands.add_parser("debug", help="debug a model in the console",
                                description="Debug a model file (it defines build() -> (module, inputs)).")
    debug.add_argument("program", nargs="?", help="the model's Python file (or --trace FILE)")
    debug.add_argument("--driver", default="auto", help="auto, torch:cpu, torch:cuda, torch:cuda:N (default auto)")
    debug.add_argument("--entry", default="build", help="the function returning (module, inputs) (default build)")
    debug.add_argument("--steps", type=int, help="with --entry train_step: training steps to run (default 1)")
    debug.add_argument("--ranks", type=int, metavar="N",
                       help="run the model as N ranks of one torch.distributed process group (docs/ranks.md)")
    debug.add_argument("--rdzv", metavar="HOST:PORT",
                       help="with --ranks: where the ranks meet (default: $MASTER_ADDR:$MASTER_PORT, else a free "
                            "port on 127.0.0.1)")
    debug.add_argument("--join", metavar="HOST:PORT",
                       help="with --ranks: start no rank here; ranks started by torchrun on any host join at "
                            "HOST:PORT (docs/ranks.md, \"Several hosts\")")
    debug.add_argument("--replicas", nargs="+", action="extend", metavar="NAME",
                       help="with --ranks: values that must stay identical on every rank (variables, values, "
                            "parameter paths or patterns such as 'l1.*'); the session stops where they first differ "
                            "(docs/ranks.md, \"Replicas\")")
    debug.add_argument("-x", dest="script", metavar="FILE", help="run the commands in FILE, then exit")
    debug.add_argument("--json", action="store_true", help="print one JSON object per command (for agents)")
    debug.add_argument("--trace", metavar="FILE", help="open a recorded trace instead: no device needed")
    debug.add_argument("--record", metavar="FILE", help="record every step of the run to a trace file")
    debug.add_argument("--overwrite", action="store_true",
                       help="with --record: replace an existing FILE (asked at a terminal, refused otherwise)")
    debug.add_argument("--no-cache", action="store_true", help=NO_CACHE_HELP)
    chosen = argv[0] if argv else None
    for name, (summary, load, cached) in TOOLS.items():
        tool = commands.add_parser(name, help=summary)
        if name == chosen:  # only the chosen tool is imported (and so parses its arguments)
            module = _tool(name, load, argv)
            tool.description = module.__doc__.splitlines()[0]
            module.add_arguments(tool)
            if cached and not isinstance(module, type):  # a candidate function is exported afresh
                tool.add_argument("--no-cache", action="store_true", help=NO_CACHE_HELP)
            tool.set_defaults(run=module.run)
    add_cache_command(commands)
    pool_command = commands.add_parser("pool", help="fork debug sessions' engines from one warm process",
                                       description=pool_main.DESCRIPTION)
    pool_main.add_arguments(pool_command)
    args = parser.parse_args(argv)
    if getattr(args, "no_cache", False):  # read here by the tools, and by the server and engines started from here
        os.environ[NO_CACHE_ENV] = "1"
    if args.command in TOOLS:
        return args.run(args)
    if args.command == "cache":
        return run_cache(args)
    if args.command == "pool":
        return pool_main.run_pool(args)
    if (args.program is None) == (args.trace is None):
        parser.error("give a model file, or --trace FILE (not both)")
    if args.overwrite and not args.record:
        parser.error("--overwrite replaces an existing --record FILE: give --record too")
    if args.replicas and args.ranks is None and args.trace is None:
        parser.error("--replicas compares values across ranks: give --ranks N too (or --trace with the index of "
                     "many ranks' traces)")
    overwrite = args.overwrite
    if args.record and not overwrite and os.path.isfile(args.record) and not os.path.islink(args.record):
        interactive = sys.stdin.isatty() and not args.json and not args.script
        if not (interactive and console.ask_yes_no(f"{args.record} exists: replace it? [y/N] ")):
            print(f"rewind debug: {args.record} exists and is kept; --overwrite replaces it", file=sys.stderr)
            return 2
        overwrite = True
    target = {"trace": args.trace} if args.trace else {"program": args.program, "record": args.record,
                                                        "overwrite": overwrite or None, "steps": args.steps,
                                                        "ranks": args.ranks, "rendezvous": args.rdzv,
                                                        "join": args.join}
    target["replicas"] = args.replicas  # a trace too: the index of many ranks' traces checks them post-mortem
    return console.run(target, args.driver, args.entry, args.script, args.json)


# -- rewind cache ------------------------------------------------------------------------------------------------

def add_cache_command(commands: argparse._SubParsersAction) -> None:
    cache = commands.add_parser("cache", help="list or clear the program cache",
                                description="The program cache: the exported programs of model files, kept in "
                                            ".rewind/programs/ beside them (or $REWIND_CACHE_DIR); docs/cache.md.")
    cache.add_argument("action", choices=("list", "clear"), help="list: the entries; clear: remove them")
    cache.add_argument("place", nargs="?", default=".",
                       help="a model file (its entries only) or the folder it is in (every entry); default: here")
    cache.add_argument("--json", action="store_true", help="list: print the entries as JSON (for agents)")


def run_cache(args: argparse.Namespace) -> int:
    place = Path(args.place)
    try:
        if not place.exists():
            raise RewindError(f"there is no model file or folder {echo(repr(args.place), 200)}")
        folder = CacheFolder.beside(place)
        entries = folder.entries(model=None if place.is_dir() else place)
    except (OSError, ValueError) as exc:  # a name the system cannot even look up
        print(f"rewind cache: {echo(repr(args.place), 200)} cannot be read: {os_reason(exc)}", file=sys.stderr)
        return 2
    except RewindError as exc:
        print(f"rewind cache: {exc}", file=sys.stderr)
        return 2
    if args.action == "clear":
        removed = sum(folder.remove(entry.path) for entry in entries)
        print(f"removed {removed} cached program{'s' if removed != 1 else ''} from {folder.path}")
        if removed < len(entries):
            print(f"rewind cache: {len(entries) - removed} could not be removed", file=sys.stderr)
            return 1
        return 0
    if args.json:
        print(json.dumps({"folder": str(folder.path), "entries": [e.to_dict() for e in entries]}, indent=2))
        return 0
    for entry in entries:
        print(entry.describe())
    total = sum(e.size for e in entries)
    print(f"{len(entries)} cached program{'s' if len(entries) != 1 else ''}, {total / 2**20:.1f} MiB, in "
          f"{folder.path}")
    return 0
