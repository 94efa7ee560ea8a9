"""Experiments benchmark: one patch-measure-undo cycle at the last quarter of the example model, versus
rebuilding and rerunning the patched model from a fresh process.

The patch: every layer norm from the one nearest the three-quarter mark of the pass on (in the last
blocks and the final norm) with another epsilon, an attribute patch. The cycle, on a Session stopped
at the end of its pass: add the patch (its branch is installed: restore the state before the first
patched node, re-execute to the end), measure the branch (the outputs against the reference and the
original, and every node from the patch point on against the reference, with its time), and undo
(restore the original). Each cycle tries another epsilon, as a user would, so nothing measured is
remembered from the cycle before. Measuring the outputs alone is timed too (interleaved): that is
what the fresh process measures. The fresh process does what a user does without Rewind: start
Python, build the model, set those epsilons, run it, and compare its logits with the saved reference
and original logits. Both sides use the same number of torch threads (default 1: on a shared 2-core
machine a second thread makes small ops wait for the other core). Usage:
    python benchmarks/experiments.py [--depth 8 --width 512 --tokens 256 | --as-built] [--repeats 5]
                                     [--threads 1]
(--as-built: the example model exactly as examples/gpt.py's build() makes it.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import gpt  # noqa: E402

from benchmarks.fresh import fresh_runs, print_rows  # noqa: E402
from checkpoint.branch import AttributePatch  # noqa: E402
from hardware.frontends.torch_export import export_program  # noqa: E402
from hardware.session import LaunchOptions, Session  # noqa: E402
from provenance.experiments import NamedPatch  # noqa: E402

EPS = 1e-3

FRESH = """
import sys, torch
torch.set_num_threads({threads})
sys.path[:0] = [{root!r}, {examples!r}]
import gpt
model, (ids,) = gpt.build(**{cfg!r})
model.eval()
for path in {paths!r}:
    model.get_submodule(path).eps = {eps!r}
with torch.no_grad():
    logits = model(ids)
saved = torch.load({saved!r})
print(float((logits.double() - saved["reference"]).abs().max()), float((logits - saved["original"]).abs().max()))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--as-built", action="store_true", help="gpt.build() with its own defaults (a tiny model)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = {} if args.as_built else dict(depth=args.depth, width=args.width, heads=8, tokens=args.tokens, vocab=1024)
    model, inputs = gpt.build(**cfg)

    program = export_program(model, inputs, "gpt")
    session = Session()
    session.launch(LaunchOptions("gpt.py", driver="torch:cpu", budget_mb=4096), program=program)
    session.run()
    reference = session.forensics.reference  # one-time, as in a forensics session
    norms = [n for n in program.nodes if n.op_short == "aten.layer_norm"]
    mark = min(norms, key=lambda n: abs(n.index - 0.75 * len(program.nodes)))
    norms = [n for n in norms if n.index >= mark.index]
    ex = session.experiments
    output = program.outputs[0]
    original = session.tensor(output, session.end).clone()

    full, outputs_only, back = [], [], []
    for i in range(args.repeats + 1):  # interleaved: the two kinds of cycle see the same machine
        # each cycle another epsilon (as a user tries them): no measurement is remembered from the last one
        full.append(_cycle(ex, _patch(norms, EPS * (1 + i / 100)), nodes=True))
        t = time.perf_counter()
        session.tensor(output, session.end)  # the original's outputs back: recomputed on demand, digest-checked
        back.append(time.perf_counter() - t)
        outputs_only.append(_cycle(ex, _patch(norms, EPS * (1 - i / 100)), nodes=False))
    assert torch.equal(session.tensor(output, session.end), original) and not session.tl.nondeterminism

    with tempfile.TemporaryDirectory() as tmp:
        saved = str(Path(tmp) / "logits.pt")
        torch.save({"reference": reference.value(output), "original": original}, saved)
        code = FRESH.format(root=str(ROOT), examples=str(ROOT / "examples"), cfg=cfg, eps=EPS, saved=saved,
                            paths=[n.module_path for n in norms], threads=torch.get_num_threads())
        fresh_s, out = fresh_runs(code, args.repeats // 2)
    fresh_reference, fresh_original = (float(x) for x in out.split())

    first, measured = full[0][0], full[0][1]  # the first cycle's epsilon is the fresh process's
    steady, add_s, measure_s, undo_s = (statistics.median(c[0][i] for c in full[1:]) for i in range(4))
    lean, _, lean_measure_s, _ = (statistics.median(c[0][i] for c in outputs_only[1:]) for i in range(4))
    (out_row,) = measured["outputs"]
    rows = [
        ("model", f"GPT depth {len(model.blocks)} width {model.ln_f.normalized_shape[0]} tokens {inputs[0].shape[1]}: "
                  f"{len(program.nodes)} nodes; patched: {', '.join(n.module_path for n in norms)} (eps {EPS:g}); "
                  f"{len(measured['nodes'])} nodes measured from the patch point (tick {measured['tick']}); "
                  f"{torch.get_num_threads()} torch thread(s)"),
        ("cycle (steady)", f"{steady * 1e3:.0f} ms: add + re-execute {add_s * 1e3:.0f} ms, measure "
                           f"{measure_s * 1e3:.0f} ms (outputs and every node), undo {undo_s * 1e3:.0f} ms"),
        ("first cycle", f"{first[0] * 1e3:.0f} ms (also measures the original pass from the patch point once)"),
        ("original outputs after the undo", f"{statistics.median(back[1:]) * 1e3:.0f} ms (recomputed on demand from "
                                            "the checkpoint before the patch, digest-checked)"),
        ("cycle, outputs only", f"{lean * 1e3:.0f} ms (measure {lean_measure_s * 1e3:.0f} ms: what the fresh "
                                "process measures)"),
        ("branch outputs", f"max |error| vs the reference {out_row['reference']['maxAbs']:.3g}, "
                           f"vs the original {out_row['original']['maxAbs']:.3g}"),
        ("fresh process with the change", f"{fresh_s:.2f} s (max |error| vs the reference {fresh_reference:.3g}, "
                                          f"vs the original {fresh_original:.3g})"),
        ("ratio", f"fresh process / cycle = {fresh_s / steady:.1f}x (first cycle: {fresh_s / first[0]:.1f}x; "
                  f"outputs only: {fresh_s / lean:.1f}x)"),
    ]
    print_rows(rows)


def _patch(norms: list, eps: float) -> NamedPatch:
    return NamedPatch("eps", tuple(AttributePatch.of(n, {"eps": eps}) for n in norms))


def _cycle(ex, patch: NamedPatch, nodes: bool) -> tuple[tuple[float, float, float, float], dict]:
    """Patch, measure, undo: ((total, add, measure, undo) seconds, the measurement)."""
    started = time.perf_counter()
    ex.add("eps", patch)
    added = time.perf_counter()
    measured = ex.measure("eps", nodes)
    done_measuring = time.perf_counter()
    ex.restore()
    ex.remove("eps", "eps")
    undone = time.perf_counter()
    return (undone - started, added - started, done_measuring - added, undone - done_measuring), measured


if __name__ == "__main__":
    main()
