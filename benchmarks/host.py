"""Host time per node: what the debugger costs the host for each node, with the device's work made negligible.

    python benchmarks/host.py [--device cpu|cuda] [--depth 12] [--repeats 15]

A GPU runs asynchronously: continuous checkpointing costs nothing extra on it as long as the host
issues each node (the kernel, its checks, its checkpoint copy, the bookkeeping) faster than the
device runs it. This measures the host's side alone, on examples/gpt.py with tiny tensors (width
16, 4 tokens), so each figure is host microseconds per node; compare it with the device time per
node of the real model (benchmarks/gpu.py prints both). Every configuration is measured side by
side in one run, interleaved, on one thread.
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
from benchmarks.engine import timed  # noqa: E402
from hardware.drivers.torch import TorchDriver  # noqa: E402
from hardware.frontends.torch_export import export_program  # noqa: E402
from hardware.session import LaunchOptions, Session  # noqa: E402

TINY = dict(vocab=64, width=16, heads=2, tokens=4, batch=1)
CONFIGS = {  # Session launch options of each configuration
    "session, by reference, checks read back at once": dict(device_pool=False, check_batch=1),
    "session, device tier (pool copies, checks batched by 64)": dict(device_pool=True, check_batch=64),
}


def node_by_node(program, driver: TorchDriver, initial: dict) -> None:
    """The driver running the Program one node at a time, each value freed after its last use (what a torch.fx
    Interpreter does): no checkpoints, no checks, no write log."""
    env = dict(initial)
    for node in program.nodes:
        args, kwargs = node.bind(env.__getitem__)
        env.update(zip(node.outputs, driver.execute(node, args, kwargs)))
        for name in node.input_names():
            if program.values[name].last_use == node.index and name not in initial:
                env.pop(name, None)


def host_rows(device: str, depth: int, repeats: int) -> list[tuple[str, str]]:
    model, inputs = gpt.build(depth=depth, **TINY)
    program = export_program(model, inputs, "gpt")
    model, inputs = model.to(device).eval(), tuple(i.to(device) for i in inputs)
    driver = TorchDriver.from_spec(f"torch:{device}")
    initial = driver.load(program)
    nodes = len(program.nodes)

    def eager() -> None:
        with torch.no_grad():
            model(*inputs)

    def session(options: dict):
        s = Session()
        s.launch(LaunchOptions("gpt.py", driver=f"torch:{device}", budget_mb=256, **options), program=program)
        return s.run  # launching (the pool's allocation, the load) is not per node

    runs = {"eager forward (per node of the Program)": lambda: eager,
            "node by node, no checkpoints, no checks": lambda: lambda: node_by_node(program, driver, initial),
            **{name: (lambda o=options: session(o)) for name, options in CONFIGS.items()}}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats + 2):  # interleaved, so load on the machine falls on every configuration alike
        for name, make in runs.items():
            times[name].append(timed(make(), device))
    per_node = {name: statistics.median(t[2:]) / nodes * 1e6 for name, t in times.items()}
    base = per_node["node by node, no checkpoints, no checks"]
    rows = [("model", f"examples/gpt.py, {depth} layers, width {TINY['width']}, {TINY['tokens']} tokens: "
                      f"{nodes} nodes, device {device}")]
    rows += [(f"host time per node: {name}", f"{us:.1f} us" + (f" ({us - base:+.1f} us over node by node)"
                                                               if name in CONFIGS else ""))
             for name, us in per_node.items()]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| measure | figure |\n|---|---|")
    for name, figure in host_rows(args.device, args.depth, args.repeats):
        print(f"| {name} | {figure} |")


if __name__ == "__main__":
    main()
