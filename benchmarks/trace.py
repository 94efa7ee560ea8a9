"""Trace benchmark: write throughput, compression ratio, and time to the first stop on a large trace.

    python benchmarks/trace.py [--depth 10 --width 1024 --tokens 512] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import gpt  # noqa: E402

from benchmarks.engine import print_rows  # noqa: E402
from hardware.frontends.torch_export import export_program  # noqa: E402
from hardware.session import LaunchOptions, LineSpec, Session  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=10)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    cfg = dict(depth=args.depth, width=args.width, heads=16, tokens=args.tokens, vocab=1024)
    model, inputs = gpt.build(**cfg)
    program = export_program(model, inputs, "gpt")
    path = Path(args.dir) / "rewind-bench.rwtrace"
    budget = 256.0  # MiB: the ring evicts; the trace keeps everything

    def plain_run() -> float:
        plain = Session()
        plain.launch(LaunchOptions("gpt.py", driver="torch:cpu", budget_mb=budget), program=program)
        t = time.perf_counter()
        plain.run()
        return time.perf_counter() - t

    plain_run()  # warm up the allocator
    run_s = plain_run()
    rec = Session()
    rec.launch(LaunchOptions("gpt.py", driver="torch:cpu", budget_mb=budget, record=str(path)), program=program)
    t = time.perf_counter()
    rec.run()
    rec.close()
    rec_s = time.perf_counter() - t
    writer = rec.tl.recorder
    raw, size = writer.bytes_raw, path.stat().st_size
    del rec

    os.sync()
    t = time.perf_counter()
    trace = Session()
    trace.launch(LaunchOptions(trace=str(path), budget_mb=budget, stop_on_entry=True))
    trace.start()
    first_stop = time.perf_counter() - t
    file = next(iter(trace.program.source_files))
    middle_line = next(n.loc.line for n in trace.program.nodes[len(trace.program.nodes) // 2:] if n.loc)
    trace.set_line_breakpoints(file, [LineSpec(middle_line)])
    t = time.perf_counter()
    stop = trace.run()
    for name in trace.live_values():
        trace.tensor(name)
    middle = time.perf_counter() - t

    rows = [
        ("model", f"GPT depth {cfg['depth']} width {cfg['width']} tokens {cfg['tokens']}: {len(program.nodes)} nodes"),
        ("trace size", f"{size / 2**30:.2f} GiB on disk for {raw / 2**30:.2f} GiB of tensors: "
                       f"compression ratio {raw / size:.2f}"),
        ("recording", f"run {run_s:.2f} s without, {rec_s:.2f} s with = {rec_s / run_s:.2f}x"),
        ("write throughput", f"{raw / 2**20 / writer.seconds:.0f} MiB/s of tensor bytes "
                             f"(compress + write + flush, {writer.seconds:.2f} s in the writer)"),
        ("open to first stop", f"{first_stop * 1e3:.0f} ms (stop on entry)"),
        ("then to a breakpoint", f"{middle * 1e3:.0f} ms (tick {stop.tick}, every live value loaded, "
                                  f"parameters included)"),
    ]
    print_rows(rows)
    path.unlink()


if __name__ == "__main__":
    main()
