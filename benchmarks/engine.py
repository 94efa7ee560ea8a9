"""Engine benchmark: checkpointing overhead, step-back latency, experiment loop.

Every ratio is measured side by side in one run, the configurations interleaved. Usage:
    python benchmarks/engine.py [--device cpu|cuda] [--depth 6 --width 512 --tokens 256] [--threads 1]
                                [--checks fused,torch]

The floor is keeping every value and nothing else: the exported graph run op by op through the driver, every
output kept. Each configuration's runs relaunch one Session, as a user's restart does: a relaunch gives back the
memory of the run before (Timeline.close), so a repeated run computes into pages already mapped. The minor page
faults of each run (resource.getrusage) are counted beside its time, and those of each replay of the experiment
loop. The Session runs with each way of making the CPU's checks (hardware/tensor_checks.CHECKS: the
fused kernel and torch operations, or those --checks names); on a GPU both rows run the device's own checks.
The torch operations' float64 temporaries disturb the runs after them in the same process (the allocator's
state, the caches): compare the fused rows of a run with --checks fused too.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import gpt  # noqa: E402

from hardware import tensor_checks  # noqa: E402
from hardware.drivers.torch import TorchDriver  # noqa: E402
from hardware.frontends.torch_export import export_program  # noqa: E402
from hardware.session import Direction, LaunchOptions, Session  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)  # the device benchmarked (`cuda:1` is not the current device)


def minor_faults() -> int:
    """Minor page faults of this process so far (pages it touched for the first time since they were mapped)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed(fn, device: str) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def node_by_node(program, driver: TorchDriver, initial: dict, keep: bool = False) -> None:
    """The driver running the Program one node at a time: no checkpoints, no checks, no write log. Each value is
    freed after its last use (what a torch.fx Interpreter does), or with `keep` every value is kept (the floor of
    a debugger that keeps them all)."""
    env = dict(initial)
    for node in program.nodes:
        args, kwargs = node.bind(env.__getitem__)
        env.update(zip(node.outputs, driver.execute(node, args, kwargs)))
        for name in () if keep else node.input_names():
            if program.values[name].last_use == node.index and name not in initial:
                env.pop(name, None)


def step_back_latencies(s: Session, samples: int, device: str, read_live: bool = True) -> tuple[float, float]:
    """p50 and p95, in ms, of one node step back (granularity instruction) from seeded random ticks, every live value
    read after it (unless not `read_live`)."""
    tl, rng, lat = s.tl, random.Random(0), []
    for _ in range(samples):
        s.goto(rng.randint(1, tl.end))

        def back():
            s.step(Direction.REVERSE, "instruction")
            for name in tl.live() if read_live else ():
                tl.value(name)

        lat.append(timed(back, device) * 1e3)
    lat.sort()
    return lat[len(lat) // 2], lat[max(0, int(len(lat) * 0.95) - 1)]


def print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    for name, text in rows:
        print(f"{name:<{width}}  {text}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--checks", default=",".join(tensor_checks.CHECKS),
                    help=f"ways of making the CPU's checks to run the Session with: {', '.join(tensor_checks.CHECKS)}")
    args = ap.parse_args()
    checks_run = args.checks.split(",")
    for checks in checks_run:
        tensor_checks.use_checks(checks)  # a RewindError naming the ways there are, before anything runs
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    cfg = dict(depth=args.depth, width=args.width, heads=8, tokens=args.tokens, vocab=1024)

    model, inputs = gpt.build(**cfg)
    t0 = time.perf_counter()
    program = export_program(model, inputs, "gpt")
    export_s = time.perf_counter() - t0
    model = model.to(device).eval()
    dev_inputs = tuple(i.to(device) for i in inputs)
    driver = f"torch:{device}"

    def eager():
        with torch.no_grad():
            model(*dev_inputs)

    def session_with(budget_mb: float) -> Session:
        s = Session()
        s.launch(LaunchOptions("gpt.py", driver=driver, budget_mb=budget_mb), program=program)
        return s

    relaunched: dict[tuple[float, str], Session] = {}

    def session_run(budget_mb: float, checks: str):
        s = relaunched.setdefault((budget_mb, checks), Session())
        s.launch(LaunchOptions("gpt.py", driver=driver, budget_mb=budget_mb), program=program)  # not timed
        return lambda: (tensor_checks.use_checks(checks), s.run())

    eager()  # warm up
    probe = session_with(1 << 20)
    probe.run()
    intermediate = probe.tl.ring.used
    probe.close()
    quarter_mb = intermediate / 4 / 2**20
    torch_driver = TorchDriver.from_spec(driver)
    initial = torch_driver.load(program)

    runs = {"eager": lambda: eager, "keep": lambda: lambda: node_by_node(program, torch_driver, initial, keep=True)}
    for checks in checks_run:
        runs[f"full {checks}"] = lambda c=checks: session_run(1 << 20, c)
        runs[f"quarter {checks}"] = lambda c=checks: session_run(quarter_mb, c)
    times: dict[str, list[float]] = {name: [] for name in runs}
    faults: dict[str, list[int]] = {name: [] for name in runs}
    for _ in range(args.repeats + 1):  # interleaved, so load on the machine falls on every configuration alike
        for name, make in runs.items():
            run, before = make(), minor_faults()
            times[name].append(timed(run, device))
            faults[name].append(minor_faults() - before)
    for s in relaunched.values():
        s.close()
    tensor_checks.use_checks(checks_run[0])  # the step back and the experiment loop
    median = {name: statistics.median(t[1:]) for name, t in times.items()}  # the first round warms up
    faulted = {name: round(statistics.median(f[1:])) for name, f in faults.items()}
    nodes = len(program.nodes)
    eager_s = median["eager"]
    node_ms = eager_s / nodes * 1e3

    # Step back at random ticks under the 25% budget.
    s = session_with(quarter_mb)
    s.run()
    p50, p95 = step_back_latencies(s, args.samples, device)
    assert s.tl.ring.peak <= s.tl.ring.budget

    # Experiment loop: restore the tick at 75% and replay to the end vs a fresh process.
    s = session_with(1 << 20)
    s.run()
    at = int(s.end * 0.75)
    replays = []
    for _ in range(args.repeats):
        before = minor_faults()
        replays.append((timed(lambda: s.tl.reexecute_from(at), device), minor_faults() - before))
    replay, replay_faults = statistics.median(t for t, _ in replays), round(statistics.median(f for _, f in replays))
    fresh_cmd = [sys.executable, "-c", (
        "import sys, torch; torch.set_num_threads({threads}); sys.path[:0]=[{root!r},{ex!r}]; import gpt; "
        "from hardware.frontends.torch_export import export_program; "
        "m,i=gpt.build(**{cfg!r}); p=export_program(m,i,'gpt'); m=m.to({dev!r}).eval(); "
        "i=tuple(x.to({dev!r}) for x in i)\nwith torch.no_grad(): m(*i)"
    ).format(root=str(ROOT), ex=str(ROOT / "examples"), cfg=cfg, dev=device, threads=torch.get_num_threads())]
    t = time.perf_counter()
    subprocess.run(fresh_cmd, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    fresh = time.perf_counter() - t

    def versus(name: str, target: str) -> str:
        return (f"{median[name] * 1e3:.1f} ms = {median[name] / eager_s:.2f}x eager, "
                f"{median[name] / median['keep']:.2f}x the floor ({target})")

    rows = [
        ("model", f"GPT depth {cfg['depth']} width {cfg['width']} tokens {cfg['tokens']}: {nodes} nodes, "
                  f"{intermediate / 2**20:.0f} MiB of intermediates, device {device}, "
                  f"{torch.get_num_threads()} torch thread(s)"),
        ("export (one-time)", f"{export_s:.2f} s"),
        ("eager forward", f"{eager_s * 1e3:.1f} ms; mean node time {node_ms:.3f} ms"),
        ("floor: the graph op by op, every value kept", f"{median['keep'] * 1e3:.1f} ms = "
                                                        f"{median['keep'] / eager_s:.2f}x eager"),
        *((f"session run, budget holds every value, {c} checks", versus(f"full {c}", "target <= 1.3x eager"))
          for c in checks_run),
        *((f"session run, budget 25% of intermediates, {c} checks", versus(f"quarter {c}", "target <= 1.25x eager"))
          for c in checks_run),
        ("minor page faults per run", ", ".join([f"eager {faulted['eager']}", f"floor {faulted['keep']}"] + [
            f"session {budget} {c} {faulted[f'{budget} {c}']}" for budget in ("full", "quarter") for c in checks_run])),
        ("step back at random ticks, 25% budget", f"p50 {p50:.2f} ms ({p50 / node_ms:.1f} node times), p95 "
                                                  f"{p95:.2f} ms ({p95 / node_ms:.1f} node times) (target p95 <= 15)"),
        ("experiment loop: restore 75% + replay", f"{replay * 1e3:.1f} ms vs fresh process {fresh:.2f} s = "
                                                  f"{fresh / replay:.0f}x faster (target >= 20x); "
                                                  f"{replay_faults} minor page faults per replay"),
    ]
    print_rows(rows)


if __name__ == "__main__":
    main()
