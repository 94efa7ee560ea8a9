"""Engine benchmark: checkpointing overhead, step-back latency, experiment loop.

Every ratio is measured side by side in one run. Usage:
    python benchmarks/engine.py [--device cpu|cuda] [--depth 6 --width 512 --tokens 256]
"""

from __future__ import annotations

import argparse
import os
import random
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

from hardware.frontends.torch_export import export_program  # noqa: E402
from hardware.session import Direction, LaunchOptions, Session  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)  # the device benchmarked (`cuda:1` is not the current device)


def timed(fn, device: str) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


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
    args = ap.parse_args()
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

    eager()  # warm up
    probe = session_with(1 << 20)
    probe.run()
    intermediate = probe.tl.ring.used
    del probe
    quarter_mb = intermediate / 4 / 2**20

    eager_t, full_t, quarter_t = [], [], []
    for _ in range(args.repeats):
        eager_t.append(timed(eager, device))
        s = session_with(1 << 20)
        full_t.append(timed(s.run, device))
        del s
        s = session_with(quarter_mb)
        quarter_t.append(timed(s.run, device))
    nodes = len(program.nodes)
    eager_s = statistics.median(eager_t)
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
    replay = statistics.median(timed(lambda: s.tl.reexecute_from(at), device) for _ in range(args.repeats))
    fresh_cmd = [sys.executable, "-c", (
        "import sys, torch; torch.set_num_threads({threads}); sys.path[:0]=[{root!r},{ex!r}]; import gpt; "
        "from hardware.frontends.torch_export import export_program; "
        "m,i=gpt.build(**{cfg!r}); p=export_program(m,i,'gpt'); m=m.to({dev!r}).eval(); "
        "i=tuple(x.to({dev!r}) for x in i)\nwith torch.no_grad(): m(*i)"
    ).format(root=str(ROOT), ex=str(ROOT / "examples"), cfg=cfg, dev=device, threads=torch.get_num_threads())]
    t = time.perf_counter()
    subprocess.run(fresh_cmd, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    fresh = time.perf_counter() - t

    rows = [
        ("model", f"GPT depth {cfg['depth']} width {cfg['width']} tokens {cfg['tokens']}: {nodes} nodes, "
                  f"{intermediate / 2**20:.0f} MiB of intermediates, device {device}, "
                  f"{torch.get_num_threads()} torch thread(s)"),
        ("export (one-time)", f"{export_s:.2f} s"),
        ("eager forward", f"{eager_s * 1e3:.1f} ms; mean node time {node_ms:.3f} ms"),
        ("session run, budget holds every value", f"{statistics.median(full_t) * 1e3:.1f} ms = "
                                                   f"{statistics.median(full_t) / eager_s:.2f}x eager (target <= 1.3x)"),
        ("session run, budget 25% of intermediates", f"{statistics.median(quarter_t) * 1e3:.1f} ms = "
                                                     f"{statistics.median(quarter_t) / eager_s:.2f}x eager (target <= 1.6x)"),
        ("step back at random ticks, 25% budget", f"p50 {p50:.2f} ms ({p50 / node_ms:.1f} node times), "
                                                  f"p95 {p95:.2f} ms ({p95 / node_ms:.1f} node times) (target p95 <= 20)"),
        ("experiment loop: restore 75% + replay", f"{replay * 1e3:.1f} ms vs fresh process {fresh:.2f} s = "
                                                  f"{fresh / replay:.0f}x faster (target >= 20x)"),
    ]
    print_rows(rows)


if __name__ == "__main__":
    main()
