"""Fast-forward (issue 33): a continue to the end with fast-forward (the default) against the same Session keeping
every value as it runs, against eager and the node-by-node floor, side by side in one run, interleaved.

    python benchmarks/fast_forward.py [--device cpu|cuda] [--repeats 9] [--samples 30]

Two models, both examples/gpt.py: tiny tensors (12 layers, width 16, 4 tokens), where each figure is host time per
node, and the engine benchmark's size (6 layers, width 512, 256 tokens), where the device's work counts too. For each
mode: the continue's time as a multiple of eager, what the checkpoint ring holds at the end, and step back p95 (one
node back from random ticks, every live value read after it) in node times, which is what fast-forward trades away:
a value it did not keep is recomputed from the checkpoint before it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import gpt  # noqa: E402
from benchmarks.engine import node_by_node, step_back_latencies, timed  # noqa: E402
from hardware.drivers.torch import TorchDriver  # noqa: E402
from hardware.frontends.torch_export import export_program  # noqa: E402
from hardware.session import LaunchOptions, Session  # noqa: E402

MODELS = {"tiny": dict(depth=12, vocab=64, width=16, heads=2, tokens=4, batch=1),
          "engine": dict(depth=6, vocab=1024, width=512, heads=8, tokens=256)}
MODES = {"fast-forward": True, "every value kept as it runs": False}


def rows_for(name: str, device: str, repeats: int, samples: int) -> list[tuple[str, str]]:
    model, inputs = gpt.build(**MODELS[name])
    program = export_program(model, inputs, "gpt")
    model, inputs = model.to(device).eval(), tuple(i.to(device) for i in inputs)
    driver = TorchDriver.from_spec(f"torch:{device}")
    initial = driver.load(program)
    nodes = len(program.nodes)
    sessions = {mode: Session() for mode in MODES}

    def launch(mode: str) -> Session:
        s = sessions[mode]
        s.launch(LaunchOptions("gpt.py", driver=f"torch:{device}", budget_mb=4096, fast_forward=MODES[mode]),
                 program=program)  # a relaunch: launching is not timed
        return s

    def eager() -> None:
        with torch.no_grad():
            model(*inputs)

    times: dict[str, list[float]] = {"eager": [], "node by node floor": [], **{m: [] for m in MODES}}
    for _ in range(repeats + 1):  # interleaved; the first round warms each up and is dropped
        times["eager"].append(timed(eager, device))
        times["node by node floor"].append(timed(lambda: node_by_node(program, driver, initial), device))
        for mode in MODES:
            s = launch(mode)
            times[mode].append(timed(s.run, device))
    median = {k: statistics.median(v[1:]) for k, v in times.items()}
    node_s = median["eager"] / nodes
    out = [(f"{name}: model", f"examples/gpt.py {MODELS[name]}: {nodes} nodes, device {device}")]
    for k, seconds in median.items():
        out.append((f"{name}: continue to the end, {k}", f"{seconds / nodes * 1e6:.1f} us per node, "
                                                         f"{seconds / median['eager']:.2f}x eager"))
    for mode in MODES:
        s = launch(mode)
        s.run()
        held = s.tl.ring.used
        p50, p95 = step_back_latencies(s, samples, device)
        out.append((f"{name}: {mode}: ring at the end, step back p50/p95",
                    f"{held / 2**20:.2f} MiB; {p50 / 1e3 / node_s:.1f} / {p95 / 1e3 / node_s:.1f} node times "
                    f"({s.tl.recomputed} values recomputed)"))
    for s in sessions.values():
        s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--models", default=",".join(MODELS), help=f"which of {', '.join(MODELS)}")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| measure | figure |\n|---|---|")
    for name in args.models.split(","):
        for measure, figure in rows_for(name, args.device, args.repeats, args.samples):
            print(f"| {measure} | {figure} |")


if __name__ == "__main__":
    main()
