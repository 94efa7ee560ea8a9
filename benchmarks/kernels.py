"""Triton kernel benchmark: interpreter time per program under the debugger (the triton driver's recorded run:
every operation a step, every access recorded, the checks made) against the plain Triton interpreter on the same
launch, side by side in one run; and step-back latency inside the launch (p50, p95).

Usage:
    python benchmarks/kernels.py [--rows 256] [--cols 1000] [--repeats 3] [--samples 40]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hardware.drivers.triton import KernelLaunch, TritonDriver  # noqa: E402
from hardware.session import Direction, LaunchOptions, Session  # noqa: E402

SOFTMAX = ROOT / "tests" / "models" / "kernels" / "softmax_fixed.py"


def launch_file(rows: int, cols: int) -> Path:
    """The fixed softmax kernel at the benchmark's size (its kernel() defaults changed, nothing else)."""
    text = SOFTMAX.read_text().replace("def kernel(rows=4, cols=10):", f"def kernel(rows={rows}, cols={cols}):")
    folder = Path(tempfile.mkdtemp(prefix="rewind-triton-bench-"))
    path = folder / "softmax_bench.py"
    path.write_text(text)
    return path


def plain(launch: KernelLaunch) -> float:
    tensors = {a.name: a.value.clone() for a in launch.tensors}
    start = time.perf_counter()
    launch.run_plainly(tensors)
    return time.perf_counter() - start


def debugged(launch: KernelLaunch) -> tuple[float, int]:
    driver = TritonDriver(launch)
    start = time.perf_counter()
    record = driver.first_run()
    return time.perf_counter() - start, record.steps


def step_back(path: Path, samples: int) -> list[float]:
    """Seconds of one instruction step back at random positions inside the launch, with the launch put in the state
    there (what a client's stackTrace after the stop asks for: the replay from the nearest quiescent step)."""
    session = Session()
    session.launch(LaunchOptions(program=str(path), entry="kernel", stop_on_entry=True))
    session.motion.start()
    cursor = session.instructions.cursor
    steps = len(cursor.schedule(0))
    rng = random.Random(0)
    out = []
    for _ in range(samples):
        k = rng.randrange(2, steps)
        cursor.walk(Direction.FORWARD, lambda sched, k=k: __import__("numpy").array([k]))
        session.motion.step(Direction.REVERSE, "instruction")  # the first step back from a fresh position
        cursor.chip()
        start = time.perf_counter()
        session.motion.step(Direction.REVERSE, "instruction")
        cursor.chip()
        out.append(time.perf_counter() - start)
        session.motion.goto(0)
    session.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--cols", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    path = launch_file(args.rows, args.cols)
    launch = KernelLaunch.from_file(path)
    plain(launch)  # warm: the interpreter rewrites the kernel once
    plains, debugs, steps = [], [], 0
    for _ in range(args.repeats):  # alternated, so both see the same machine
        plains.append(plain(launch))
        seconds, steps = debugged(launch)
        debugs.append(seconds)
    p, d = min(plains), min(debugs)
    programs = launch.programs
    print(f"softmax {args.rows}x{args.cols} (BLOCK {launch.arguments[-1].value}), {programs} programs, "
          f"{steps} steps ({steps // programs} per program)")
    print(f"plain interpreter      {p:8.3f} s  {1e3 * p / programs:7.3f} ms/program")
    print(f"under the debugger     {d:8.3f} s  {1e3 * d / programs:7.3f} ms/program")
    print(f"ratio                  {d / p:8.2f}x")
    back = sorted(step_back(launch_file(min(args.rows, 64), args.cols), args.samples))
    p50 = statistics.median(back)
    p95 = back[min(len(back) - 1, int(0.95 * len(back)))]
    print(f"step back (1 op, {len(back)} samples, {min(args.rows, 64)} programs): p50 {1e3 * p50:.2f} ms, "
          f"p95 {1e3 * p95:.2f} ms")


if __name__ == "__main__":
    main()
