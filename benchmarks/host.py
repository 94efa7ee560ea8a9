"""Host time per node: what the debugger costs the host for each node, with the device's work made negligible.

    python benchmarks/host.py [--device cpu|cuda] [--depth 12] [--repeats 15] [--profile]

A GPU runs asynchronously: continuous checkpointing costs nothing extra on it as long as the host
issues each node (the kernel, its checks, its checkpoint copy, the bookkeeping) faster than the
device runs it. This measures the host's side alone, on examples/gpt.py with tiny tensors (width
16, 4 tokens), so each figure is host microseconds per node; compare it with the device time per
node of the real model (benchmarks/gpu.py prints both). Every configuration is measured side by
side in one run, interleaved, on one thread, with each way of making the CPU's checks
(hardware/tensor_checks.CHECKS). --profile adds where a session's host time goes under cProfile, with
each way of making the checks: microseconds per node in the checks and in the busiest functions.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import gpt  # noqa: E402
from benchmarks.engine import node_by_node, timed  # noqa: E402
from hardware import tensor_checks  # noqa: E402
from hardware.drivers.torch import TorchDriver  # noqa: E402
from hardware.frontends.torch_export import export_program  # noqa: E402
from hardware.session import LaunchOptions, Session  # noqa: E402

TINY = dict(vocab=64, width=16, heads=2, tokens=4, batch=1)
CONFIGS = {  # Session launch options of each configuration
    "session, by reference, checks read back at once": dict(device_pool=False, check_batch=1),
    "session, device tier (pool copies, checks batched by 64)": dict(device_pool=True, check_batch=64),
}


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

    def session(options: dict, checks: str):
        s = Session()
        s.launch(LaunchOptions("gpt.py", driver=f"torch:{device}", budget_mb=256, **options), program=program)
        return lambda: (tensor_checks.use_checks(checks), s.run())  # launching (the pool, the load) is not per node

    sessions = {f"{name}, {checks} checks": (options, checks)
                for name, options in CONFIGS.items() for checks in tensor_checks.CHECKS}
    runs = {"eager forward (per node of the Program)": lambda: eager,
            "node by node, no checkpoints, no checks": lambda: lambda: node_by_node(program, driver, initial),
            **{name: (lambda o=options, c=checks: session(o, c)) for name, (options, checks) in sessions.items()}}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats + 2):  # interleaved, so load on the machine falls on every configuration alike
        for name, make in runs.items():
            times[name].append(timed(make(), device))
    per_node = {name: statistics.median(t[2:]) / nodes * 1e6 for name, t in times.items()}
    base = per_node["node by node, no checkpoints, no checks"]
    rows = [("model", f"examples/gpt.py, {depth} layers, width {TINY['width']}, {TINY['tokens']} tokens: "
                      f"{nodes} nodes, device {device}")]
    rows += [(f"host time per node: {name}", f"{us:.1f} us" + (f" ({us - base:+.1f} us over node by node)"
                                                               if name in sessions else ""))
             for name, us in per_node.items()]
    tensor_checks.use_checks("fused")
    return rows


def profile_rows(device: str, depth: int, runs: int = 7, top: int = 6) -> list[tuple[str, str]]:
    """Where a session's host time goes, per node, under cProfile (which slows Python down, not the kernels), with
    each way of making the checks: the total, the driver's `inspect` with what it calls (a write's checks, read
    back at once), the busiest functions by their own time. Each figure is the median over `runs` runs profiled
    one by one: a run the machine's other work preempts does not move it."""
    model, inputs = gpt.build(depth=depth, **TINY)
    program = export_program(model, inputs, "gpt")
    nodes, rows = len(program.nodes), []

    def session() -> Session:
        s = Session()
        s.launch(LaunchOptions("gpt.py", driver=f"torch:{device}", budget_mb=256, check_batch=1), program=program)
        return s

    def profiled() -> dict:
        s = session()
        profiler = cProfile.Profile()
        profiler.runcall(s.run)
        return pstats.Stats(profiler).stats  # (file, line, function) -> (calls, calls, own s, cumulative s, callers)

    driver_file = str(Path("drivers", "torch", "driver.py"))
    for checks in tensor_checks.CHECKS:
        tensor_checks.use_checks(checks)
        session().run()  # warm: the kernel built or loaded, the first run's allocations made
        profiles = [profiled() for _ in range(runs)]

        def median_us(figure) -> float:
            return statistics.median(figure(p) for p in profiles) / nodes * 1e6

        total = median_us(lambda p: sum(own for _, _, own, _, _ in p.values()))
        checked = median_us(lambda p: sum(v[3] for (file, _, function), v in p.items()
                                          if file.endswith(driver_file) and function == "inspect"))
        rows.append((f"profiled session run, {checks} checks",
                     f"{total:.1f} us per node, of which the driver's inspect (the checks) {checked:.1f} us"))
        busiest = sorted(profiles[0], key=lambda key: -median_us(lambda p: p.get(key, (0, 0, 0))[2]))[:top]
        rows += [(f"{checks} checks, own time: {Path(file).name}:{line} {function}",
                  f"{median_us(lambda p: p.get((file, line, function), (0, 0, 0))[2]):.1f} us per node "
                  f"({profiles[0][file, line, function][0] / nodes:.1f} calls)")
                 for file, line, function in busiest]
    tensor_checks.use_checks("fused")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--profile", action="store_true", help="add where the host time goes (cProfile)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| measure | figure |\n|---|---|")
    rows = host_rows(args.device, args.depth, args.repeats)
    rows += profile_rows(args.device, args.depth) if args.profile else []
    for name, figure in rows:
        print(f"| {name} | {figure} |")


if __name__ == "__main__":
    main()
