"""Forensics benchmark: precision ablation of the last quarter of the example model through restore,
versus re-running the model with that change from a fresh process.

The ablation runs every node of the last quarter of the blocks (and the final norm and head) in
float64 on a branch of the timeline: restore the state before them, replay to the outputs, compare
the outputs with the reference, undo. The fresh process does what a user does without Rewind: start
Python, build the model, run it with those blocks in float64, compare its logits with the saved
reference logits. Both measured in this run. Usage:
    python benchmarks/forensics.py [--depth 8 --width 512 --tokens 256] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import gpt  # noqa: E402

from benchmarks.engine import print_rows  # noqa: E402
from hardware.frontends.torch_export import export_program  # noqa: E402
from hardware.session import LaunchOptions, Session  # noqa: E402
from provenance.ablation import ablate  # noqa: E402

FRESH = """
import sys, time, torch
sys.path[:0] = [{root!r}, {examples!r}]
import gpt
model, (ids,) = gpt.build(**{cfg!r})
model.eval()
with torch.no_grad():
    x = model.embed(ids) + model.pos[: ids.shape[1]]
    for block in model.blocks[:{first}]:
        x = block(x)
    x = x.double()
    for block in model.blocks[{first}:]:
        x = block.double()(x)
    logits = model.head.double()(model.ln_f.double()(x)).float()
reference = torch.load({reference!r})
print(float((logits.double() - reference).abs().max()))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cfg = dict(depth=args.depth, width=args.width, heads=8, tokens=args.tokens, vocab=1024)
    first_block = args.depth - args.depth // 4

    model, inputs = gpt.build(**cfg)
    program = export_program(model, inputs, "gpt")
    session = Session()
    session.launch(LaunchOptions("gpt.py", driver="torch:cpu", budget_mb=4096), program=program)
    t = time.perf_counter()
    session.run()
    run_s = time.perf_counter() - t
    f = session.forensics
    t = time.perf_counter()
    reference = f.reference
    reference_s = time.perf_counter() - t
    span = [n for n in program.nodes[_first_node(program, first_block):] if f.floating_outputs(n)]
    session.goto(session.end)

    ablations, rematerialise = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        result = ablate(f, span, "float64")
        ablations.append(time.perf_counter() - t)
        t = time.perf_counter()
        session.tensor(program.outputs[0], session.end)  # the original outputs back, recomputed and digest-checked
        rematerialise.append(time.perf_counter() - t)
    assert not session.tl.nondeterminism

    with tempfile.TemporaryDirectory() as tmp:
        ref_path = str(Path(tmp) / "logits.pt")
        torch.save(reference.value(program.outputs[0]), ref_path)
        code = FRESH.format(root=str(ROOT), examples=str(ROOT / "examples"), cfg=cfg, first=first_block,
                            reference=ref_path)
        fresh = []
        for _ in range(max(1, args.repeats // 2)):
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                 env={**os.environ, "PYTHONWARNINGS": "ignore"})
            fresh.append(time.perf_counter() - t)
    fresh_error = float(out.stdout.strip())

    ablation_s, back_s, fresh_s = (statistics.median(x) for x in (ablations, rematerialise, fresh))
    before, after = max(c.max_abs for c in result.before), max(c.max_abs for c in result.after)
    rows = [
        ("model", f"GPT depth {cfg['depth']} width {cfg['width']} tokens {cfg['tokens']}: {len(program.nodes)} nodes; "
                  f"ablated: blocks {first_block}.. + ln_f + head = {len(span)} nodes in float64"),
        ("session run (one-time)", f"{run_s:.2f} s"),
        ("reference pass torch:cpu:float64 (one-time)", f"{reference_s:.2f} s"),
        ("ablation through restore", f"{ablation_s * 1e3:.0f} ms (branch, replay {len(span)} nodes, compare, undo); "
                                     f"output max |error| {before:.3g} -> {after:.3g}"),
        ("  + original outputs recomputed after undo", f"{back_s * 1e3:.0f} ms"),
        ("fresh process with the change", f"{fresh_s:.2f} s (max |error| {fresh_error:.3g})"),
        ("ratio", f"fresh process / ablation = {fresh_s / ablation_s:.1f}x; "
                  f"/ (ablation + recompute) = {fresh_s / (ablation_s + back_s):.1f}x"),
    ]
    print_rows(rows)


def _first_node(program, block: int) -> int:
    prefix = f"blocks.{block}."
    return next(n.index for n in program.nodes if n.module_path.startswith(prefix) or n.module_path == prefix[:-1])


if __name__ == "__main__":
    main()
