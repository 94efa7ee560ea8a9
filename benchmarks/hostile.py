"""Hostile-input benchmark: seeded, longer runs of the DAP server's hostile-input test families.

    .venv/bin/python benchmarks/hostile.py [--seed 0] [--quick] [--out FILE] [--only FAMILY,...] [--timeout 30]

Every input goes through the wire to a real `python -m dap_server` (stdio, or TCP on 127.0.0.1 only), and
prints one markdown table, a row per family:

  framing      malformed frames (bad, huge, negative, 5000-digit lengths, invalid UTF-8 and JSON, 1000-level
               nesting, non-objects, missing seq/command, oversized bodies, header junk, split writes), seeded
               random ones too, over stdio and TCP, each followed by a `threads` request
  requests     every registered request with seeded extreme arguments, before launch, stopped on entry and at
               the end of tests/models/hostile.py
  expressions  `evaluate` escapes (dunders, imports writing a marker file, a marker module, lambdas,
               comprehensions, f-strings, walrus, starred, format strings) and cost bombs, `threads` answered
               while the bombs run
  traces       a recorded trace damaged: truncated at every frame boundary and at random offsets, bytes
               flipped, frames rewritten with crafted fields (with correct CRCs), compression bombs, op names
               that reach torch.ops.import_module / load_library; each launched and debugged
  files        kill -9 of the server and of the engine in the middle of saveTrace and of a recording onto an
               existing file (seeded timings); saves onto the open trace, a FIFO, a folder, through a symlink
  programs     each build() of tests/models/hostile.py over stdio and TCP; then `build` launches
  concurrent   idle, slowloris and mid-frame-disconnecting TCP clients beside a normal one; the front's RSS
               over 20 sequential sessions

Columns: handled = every request of the input answered with a success or a clear error, and `threads` answered
afterwards (and nothing below happened); crash = the server process exited or a connection died unexpectedly;
hang = no answer within --timeout or `threads` not answered; internal-error leak = a response message, error
body, `output` text, `stopped` description or progress text naming a Python exception class (or "internal
error", "Traceback") that the input itself did not contain; code executed = a marker file or the marker module
appeared, or an escape expression was evaluated instead of refused; files lost = an existing file changed or
removed without `overwrite: true`, or left torn (not the old bytes and not a trace that opens).

Everything written goes to a temporary folder (removed at the end unless --keep), the servers' caches too. Up
to 5 failures per family are printed below the table, each with what to send to reproduce it.

The families live in benchmarks/hostile_families/ (framing.py, requests.py, expressions.py, traces.py, files.py,
programs.py, tcp.py for `concurrent`), what they share in benchmarks/hostile_families/common.py.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hostile_families import expressions, files, framing, programs, requests, tcp, traces  # noqa: E402
from hostile_families.common import COUNTS, Crash, Ctx, Family, Hang, SetupError, Tally  # noqa: E402

FAMILIES = {"framing": framing, "requests": requests, "expressions": expressions, "traces": traces, "files": files,
            "programs": programs, "concurrent": tcp}  # the order they run and are reported in
COLUMNS = ["family", "inputs tried", "handled", "crashes", "hangs", "internal-error leaks", "code executed",
           "files lost"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a short run (a minute or two)")
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("--only", help=f"comma-separated families: {','.join(FAMILIES)}")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds an answer may take (default 30)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--examples", type=int, default=5, help="failures shown per family (default 5)")
    parser.add_argument("--verbose", action="store_true", help="print each input's time and verdict on stderr")
    args = parser.parse_args(argv)
    args.chosen = list(FAMILIES) if not args.only else [f.strip() for f in args.only.split(",") if f.strip()]
    unknown = [f for f in args.chosen if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; known: {list(FAMILIES)}")
    return args


def run_family(ctx: Ctx, key: str) -> Family:
    module = FAMILIES[key]
    fam = Family(ctx, key, module.TITLE, module.BUDGET_S)
    began = time.monotonic()
    print(f"[hostile] {key} ...", file=sys.stderr, flush=True)
    try:
        module.run(fam)
    except (Crash, Hang, SetupError) as exc:
        fam.setup_failed(key, exc)
    t = fam.tally
    print(f"[hostile] {key}: {t.tried} inputs, {t.handled} handled in {time.monotonic() - began:.0f} s",
          file=sys.stderr, flush=True)
    return fam


def row(title: str, t: Tally) -> str:
    return f"| {title} | " + " | ".join(str(getattr(t, name)) for name in COUNTS) + " |"


def table(families: list[Family]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    total = Tally("**total**")
    for fam in families:
        lines.append(row(fam.tally.title, fam.tally))
        for name in COUNTS:
            setattr(total, name, getattr(total, name) + getattr(fam.tally, name))
    return lines + [row(total.title, total)]


def run_line(ctx: Ctx, wall_s: float, args: argparse.Namespace) -> str:
    cpu = platform.processor() or platform.machine()
    return (f"Run {datetime.datetime.now().isoformat(timespec='seconds')} on {platform.platform()} "
            f"({cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}), seed {ctx.seed}"
            f"{', --quick' if ctx.quick else ''}{', --only ' + args.only if args.only else ''}, timeout "
            f"{ctx.timeout:g} s, {wall_s:.0f} s wall; marker library for load_library payloads "
            f"{'built' if ctx.marker_so else 'not built (no C compiler): those payloads cannot show execution'}.")


def failures_and_notes(ctx: Ctx, fam: Family, examples: int) -> list[str]:
    t = fam.tally
    if not (t.failures or fam.notes or fam.cut_short):
        return []
    lines = ["", f"**{t.title}**"]
    if fam.cut_short:
        lines.append(f"- {fam.cut_short} inputs left out: the family's time budget ran out")
    for outcome in t.failures[:examples]:
        lines.append(f"- [{', '.join(outcome.kinds())}] {outcome.label}: {outcome.detail()[:700]}")
        lines.append(f"  - repro (seed {ctx.seed}, `--only {fam.key}`): {outcome.repro[:900]}")
    if len(t.failures) > examples:
        lines.append(f"- … and {len(t.failures) - examples} more failures")
    for note in fam.notes[:8]:
        lines.append(f"- note: {note[:400]}")
    if len(fam.notes) > 8:
        lines.append(f"- … and {len(fam.notes) - 8} more notes")
    return lines


def report(ctx: Ctx, families: list[Family], wall_s: float, args: argparse.Namespace) -> str:
    lines = table(families) + ["", run_line(ctx, wall_s, args)]
    if ctx.rss_line:
        lines += ["", ctx.rss_line]
    for fam in families:
        lines += failures_and_notes(ctx, fam, args.examples)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = Ctx(args)
    started = time.monotonic()
    families: list[Family] = []
    try:
        for key in [f for f in FAMILIES if f in args.chosen]:
            families.append(run_family(ctx, key))
    finally:
        ctx.cleanup()
    text = report(ctx, families, time.monotonic() - started, args)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates from the inputs, escaped
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
