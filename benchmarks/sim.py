"""Sim chip benchmark: simulated steps per second, node-start checkpoint deltas against full snapshots,
step-back latency at instruction granularity.

Every ratio is measured side by side in one run. Usage:
    python benchmarks/sim.py [--chip sim|sim:npu] [--schedule round-robin|random] [--samples 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hardware.frontends.torch_export import load_program  # noqa: E402
from hardware.session import Direction, LaunchOptions, Session  # noqa: E402

GPT = ROOT / "examples" / "gpt.py"


def launch(program, driver: str, schedule: str = "round-robin") -> Session:
    session = Session()
    options = LaunchOptions(str(GPT), driver=driver)
    if driver.startswith("sim"):
        options.schedule = schedule
    session.launch(options, program=program)
    return session


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def throughput(program, chip: str, schedule: str, repeats: int) -> tuple[Session, dict]:
    """Medians of interleaved runs to the end, each in a fresh session, after one warm-up run of each driver."""
    times: dict[str, list[float]] = {"torch:cpu": [], chip: []}
    for driver in ["torch:cpu", chip] * (repeats + 1):
        session = launch(program, driver, schedule)
        times[driver].append(timed(lambda: session.goto(session.end)))
    sim_s, torch_s = (statistics.median(times[d][1:]) for d in (chip, "torch:cpu"))
    driver = session.tl.driver
    cores = driver.config.cores
    core_steps = sum(int((driver.schedule(n.index).units <= cores).sum()) for n in program.nodes)
    return session, {"nodes": len(program.nodes), "steps": driver.steps_run, "core_steps": core_steps,
                     "sim_s": sim_s, "torch_s": torch_s}


def deltas(session: Session) -> dict:
    driver = session.tl.driver
    starts = [driver.records[n].start for n in driver.order]
    per_node = [s.nbytes for s in starts]
    full = driver.memories.dram.nbytes + driver.memories.local.nbytes
    return {"delta_total": sum(per_node), "delta_mean": statistics.mean(per_node), "delta_max": max(per_node),
            "stored": sum(s.stored for s in starts), "full": full, "full_total": full * len(per_node)}


def probe(session: Session) -> None:
    """Put the chip in the state of the position (as a memory read does)."""
    node = session.tl.node_at(session.position)
    kernel = session.tl.driver.kernels[node.index]
    session.read_address(kernel.outputs[0].address, 4)


def step_latency(session: Session, program, samples: int, rng: random.Random) -> dict:
    back, forward, from_start = [], [], []
    baseline = launch(program, session.tl.driver.name, session.tl.driver.policy)
    baseline.goto(baseline.end)
    for _ in range(samples):
        tick = rng.randrange(len(program.nodes))
        steps = len(session.interleaving(tick))
        k = rng.randrange(2, max(3, steps - 1))
        session.goto(tick)
        for _ in range(k):
            session.step(granularity="instruction")
        probe(session)
        back.append(timed(lambda: (session.step(Direction.REVERSE, "instruction"), probe(session))))
        forward.append(timed(lambda: (session.step(granularity="instruction"), probe(session))))
        from_start.append(timed(lambda: _from_start(baseline, tick, k)))
    return {"back": back, "forward": forward, "from_start": from_start}


def _from_start(session: Session, tick: int, k: int) -> None:
    """What a step back costs without node-start checkpoints: run the chip again from the program's start."""
    tl = session.tl
    tl.forget_from(0)
    tl.seek(tick)
    session.instructions.cursor.chip(tick, k - 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chip", default="sim")
    ap.add_argument("--schedule", default="round-robin")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    program = load_program(GPT)
    session, run = throughput(program, args.chip, args.schedule, args.repeats)
    print(f"chip {args.chip}, schedule {args.schedule}, examples/gpt.py: {run['nodes']} nodes")
    print(f"run to the end (median of {args.repeats}): {run['steps']} steps ({run['core_steps']} core instructions) in {run['sim_s']:.2f} s = "
          f"{run['steps'] / run['sim_s']:.0f} steps/s, {run['core_steps'] / run['sim_s']:.0f} instructions/s; "
          f"torch:cpu {run['torch_s']:.3f} s: the sim takes {run['sim_s'] / run['torch_s']:.1f}x as long")
    d = deltas(session)
    print(f"node-start checkpoints: {d['delta_total'] / 2**20:.2f} MiB for {run['nodes']} nodes (mean "
          f"{d['delta_mean'] / 2**10:.1f} KiB, max {d['delta_max'] / 2**10:.1f} KiB) against a full snapshot of "
          f"{d['full'] / 2**20:.2f} MiB per node ({d['full_total'] / 2**20:.1f} MiB): "
          f"{d['full_total'] / d['delta_total']:.0f}x smaller; held lz4-compressed in {d['stored'] / 2**10:.0f} KiB "
          f"({d['delta_total'] / d['stored']:.1f}x less again)")
    lat = step_latency(session, program, args.samples, random.Random(0))
    med = {k: statistics.median(v) * 1e3 for k, v in lat.items()}
    p95 = {k: sorted(v)[int(0.95 * (len(v) - 1))] * 1e3 for k, v in lat.items()}
    print(f"step back one instruction (+ read memory there): p50 {med['back']:.1f} ms, p95 {p95['back']:.1f} ms; "
          f"step forward: p50 {med['forward']:.1f} ms; back/forward p50 {med['back'] / med['forward']:.1f}x")
    print(f"re-running the chip from the program's start to the same instruction: p50 {med['from_start']:.0f} ms: "
          f"the step back is {med['from_start'] / med['back']:.0f}x faster")


if __name__ == "__main__":
    main()
