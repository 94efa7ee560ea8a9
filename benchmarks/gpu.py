"""GPU benchmark (issue 7): the torch driver on the chip, every figure measured side by side in one run.

    python3 benchmarks/gpu.py --out gpu.md                    # one NVIDIA GPU: 12 layers, width 1024, 8 x 512 tokens
    python3 benchmarks/gpu.py --device cpu --small --out x.md # the same script end to end on a CPU, a small model

Two configurations of the checkpoint ring run on either device: the device tier (a preallocated pool,
copies on a side stream, checks read back 64 writes at a time) and by reference with each write's
checks read back at once (the CPU's defaults). Prints a markdown table row by row as it measures and
keeps --out up to date, so a run cut short still leaves its rows; a measurement that fails becomes a
FAILED row naming the error and the others still run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

from hardware.determinism import current, make_deterministic  # noqa: E402

CAVEATS = make_deterministic().caveats  # before CUDA starts: cuBLAS reads its workspace config once

import torch  # noqa: E402

import gpt  # noqa: E402
from benchmarks.engine import step_back_latencies, timed  # noqa: E402
from benchmarks.host import host_rows, node_by_node  # noqa: E402
from hardware.drivers.torch import checks as torch_checks  # noqa: E402
from hardware.drivers.torch import TorchDriver  # noqa: E402
from hardware.frontends.torch_export import export_program  # noqa: E402
from hardware.session import LaunchOptions, Session  # noqa: E402

FULL = dict(vocab=1024, width=1024, heads=16, depth=12, tokens=512, batch=8)
SMALL = dict(vocab=256, width=128, heads=4, depth=2, tokens=64, batch=2)
MEDIUM = dict(vocab=1024, width=512, heads=8, depth=6, tokens=256, batch=1)  # benchmarks/engine.py's model
DEVICE_TIER = dict(device_pool=True, check_batch=64)
BY_REFERENCE = dict(device_pool=False, check_batch=1)


def median_time(fn, device: str, repeats: int) -> float:
    return statistics.median(timed(fn, device) for _ in range(repeats))


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.device, self.repeats = args.device, args.repeats
        self.cfg = SMALL if args.small else MEDIUM if args.medium else FULL
        model, inputs = gpt.build(**self.cfg)
        t = time.perf_counter()
        self.program = export_program(model, inputs, "gpt")
        self.export_s = time.perf_counter() - t
        self.model = model.to(self.device).eval()
        self.inputs = tuple(i.to(self.device) for i in inputs)
        self.driver = TorchDriver.from_spec(f"torch:{self.device}")
        self.initial = self.driver.load(self.program)
        self.nodes = len(self.program.nodes)

    def session(self, budget: int, host: int = 0, **options) -> Session:
        s = Session()
        s.launch(LaunchOptions("gpt.py", driver=f"torch:{self.device}", budget_mb=budget / 2**20,
                               host_mb=host / 2**20, **options), program=self.program)
        return s

    def eager(self) -> None:
        with torch.no_grad():
            self.model(*self.inputs)

    def node_by_node(self) -> None:
        node_by_node(self.program, self.driver, self.initial)

    def run_session(self, budget: int, host: int = 0, repeats: int | None = None, **options) -> tuple[float, Session]:
        times, s = [], None
        for _ in range(repeats or self.repeats):
            s = None
            gc.collect()  # the last session goes, its blocks stay cached: each repeat runs warm, as eager does
            s = self.session(budget, host, **options)
            times.append(timed(s.run, self.device))
        return statistics.median(times), s


def step_back(bench: Bench, s: Session, samples: int, node_ms: float) -> str:
    """p50/p95 of a one-node step back from random ticks, every live value materialised; how they came back."""
    tl = s.tl
    recomputed, loaded = tl.recomputed, tl.loaded
    p50, p95 = step_back_latencies(s, samples, bench.device)
    return (f"p50 {p50:.2f} ms, p95 {p95:.2f} ms ({p95 / node_ms:.1f} mean node times); "
            f"{tl.recomputed - recomputed} versions recomputed, {tl.loaded - loaded} loaded from the host tier")


def fresh_process_s(bench: Bench) -> float:
    code = ("import sys, torch; sys.path[:0]=[{root!r},{ex!r}]; import gpt; "
            "from hardware.frontends.torch_export import export_program; "
            "m,i=gpt.build(**{cfg!r}); p=export_program(m,i,'gpt'); m=m.to({dev!r}).eval(); "
            "i=tuple(x.to({dev!r}) for x in i)\nwith torch.no_grad(): m(*i)\n"
            "if {dev!r}.startswith('cuda'): torch.cuda.synchronize()"
            ).format(root=str(ROOT), ex=str(ROOT / "examples"), cfg=bench.cfg, dev=bench.device)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return time.perf_counter() - t


def check_costs(bench: Bench) -> dict[str, float]:
    """ms per GB of the on-device checks, on one large tensor of the model's dtype."""
    nbytes = (1 << 30) if bench.device.startswith("cuda") else (64 << 20)
    x = torch.randn(nbytes // 4, device=bench.device)
    gb = nbytes / 2**30
    loops = 10 if bench.device.startswith("cuda") else 3

    def per_gb(fn) -> float:
        fn()
        return median_time(lambda: [fn() for _ in range(loops)], bench.device, 3) / loops / gb * 1e3

    return {
        "digest (one pass, wrapping int64 sum)": per_gb(lambda: torch_checks.word_sum(x)),
        "min/max + sum (a NaN or Inf shows in them)": per_gb(lambda: (torch.aminmax(x), x.sum())),
        "every write's checks, left on the device (batched path)": per_gb(lambda: torch_checks.pack(x)),
        "every write's checks, read back at once (immediate path)": per_gb(lambda: torch_checks.inspect(x)),
        "NaN/Inf counts, only for a write that shows one": per_gb(
            lambda: (torch.count_nonzero(torch.isnan(x)), torch.count_nonzero(torch.isinf(x)))),
    }


class Report:
    """The table, printed and saved row by row as it is measured: a run cut short still shows what it got. A stage
    that fails becomes a row naming its error (its traceback goes to stderr) and the stages after it still run."""

    def __init__(self, device: str, out: str | None):
        self.out = Path(out) if out else None
        name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else \
            f"{platform.machine()} CPU, {os.cpu_count()} cores"
        self.lines = [f"GPU benchmark (benchmarks/gpu.py), {datetime.date.today().isoformat()}, device {device}: "
                      f"{name}, torch {torch.__version__}", "", "| measure | figure |", "|---|---|"]
        print("\n".join(self.lines), flush=True)
        self._save()

    def row(self, name: str, figure: str) -> None:
        self.add(f"| {name} | {figure} |")

    def add(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)
        self._save()

    @contextlib.contextmanager
    def stage(self, name: str):
        try:
            yield
        except Exception as exc:  # one failed measurement must not cost the others (a GPU run is one shot)
            traceback.print_exc()
            self.row(name, f"FAILED: {type(exc).__name__}: {exc}")

    def _save(self) -> None:
        if self.out is not None:
            self.out.write_text("\n".join(self.lines) + "\n")


def measure(bench: Bench, samples: int, report: Report) -> None:
    device, cfg, row = bench.device, bench.cfg, report.row
    with report.stage("eager forward"):
        bench.eager()
        eager_s = median_time(bench.eager, device, bench.repeats * 2)
        node_ms = eager_s / bench.nodes * 1e3
        row("export (one-time)", f"{bench.export_s:.2f} s")
        row("eager forward", f"{eager_s * 1e3:.1f} ms ({node_ms * 1e3:.1f} us of device time per node: a session whose "
                             "host time per node, at the end of this table, exceeds it is host-bound)")
    with report.stage("node by node, no checkpoints, no checks"):
        interp_s = median_time(bench.node_by_node, device, bench.repeats)
        row("node by node, no checkpoints, no checks", f"{interp_s * 1e3:.1f} ms = {interp_s / eager_s:.2f}x eager")
    with report.stage("model"):
        probe = bench.session(1 << 40, **BY_REFERENCE)
        probe.run()
        intermediate = probe.tl.ring.used
        del probe
        ample = int(intermediate * 1.1) + (64 << 20)
        row("model", f"examples/gpt.py: {cfg['depth']} layers, width {cfg['width']}, {cfg['heads']} heads, batch "
                     f"{cfg['batch']} x {cfg['tokens']} tokens, float32; {bench.nodes} nodes, "
                     f"{_size(intermediate)} of intermediates")
    with report.stage("continuous checkpointing, device tier"):
        tier_s, tier = bench.run_session(ample, **DEVICE_TIER)
        row("continuous checkpointing, device tier", f"{tier_s * 1e3:.1f} ms = {tier_s / eager_s:.2f}x eager "
                                                     "(target <= 1.10x)")
        pool, checked = tier.tl.ring.pool, sum(1 for r in tier.tl.log if r.kind != "view")
        row("device tier: copies, host syncs for checks",
            f"{pool.copies} copies, {_size(pool.bytes_copied)} into the pool, {pool.waits} of them waited for by the "
            f"compute stream; {tier.tl.checks.readbacks} readbacks for {checked} checked writes (at once: {checked})")
        del pool  # the pool's buffer goes with the session
        nondet = tier.tl.replay_check(int(tier.end * 0.75))
        found_ops = dict(tier.tl.driver.watch.found) if tier.tl.driver.watch else {}
        del tier
        row("ops without a deterministic kernel", ", ".join(f"{op} ({k})" for op, k in found_ops.items()) or "none")
        row("replay digest check, last quarter", f"{len(nondet)} mismatches" +
            (f" (first: {nondet[0]})" if nondet else ""))
    with report.stage("continuous checkpointing, by reference, checks at once"):
        ref_s = bench.run_session(ample, **BY_REFERENCE)[0]
        row("continuous checkpointing, by reference, checks at once",
            f"{ref_s * 1e3:.1f} ms = {ref_s / eager_s:.2f}x eager ({ref_s / tier_s:.2f}x the device tier)")
    with report.stage("budget 25% of intermediates"):
        evict_s, evicting = bench.run_session(intermediate // 4, host=2 * intermediate, repeats=2, **DEVICE_TIER)
        row("budget 25% of intermediates (evicts, spills to pinned host + lz4)",
            f"{evict_s * 1e3:.1f} ms = {evict_s / eager_s:.2f}x eager; {evicting.tl.ring.evictions} evictions, "
            f"{evicting.tl.tiers.staged} spilled")
        row("step back at random ticks, 25% budget", step_back(bench, evicting, samples, node_ms) +
            " (target p95 <= 5 ms)")
        evicting.close()
        del evicting
    with report.stage("step back, 25% budget, always loading from the host tier"):
        loading = bench.session(intermediate // 4, 2 * intermediate, **DEVICE_TIER)
        loading.run()
        loading.tl.store.recompute_rather_than_load = lambda key: False  # the ablation: lower tiers first, as before
        row("step back at the same ticks, 25% budget, a spilled version always loaded, never recomputed",
            step_back(bench, loading, samples, node_ms))
        loading.close()
        del loading
    with report.stage("restore at 75% + replay the last quarter"):
        free(device)
        s = bench.session(ample, **DEVICE_TIER)
        s.run()
        at = int(s.end * 0.75)
        replay_s = median_time(lambda: s.tl.reexecute_from(at), device, bench.repeats)
        s = None  # its pool goes with it
        free(device)
        fresh_s = fresh_process_s(bench)
        row("restore at 75% + replay the last quarter", f"{replay_s * 1e3:.1f} ms vs fresh process export + run "
                                                        f"{fresh_s:.2f} s = {fresh_s / replay_s:.0f}x faster "
                                                        "(target >= 100x)")
    with report.stage("check cost"):
        for name, ms in check_costs(bench).items():
            row(f"check cost: {name}", f"{ms:.2f} ms per GB")
    with report.stage("determinism"):
        row("determinism", ", ".join(f"{k}={v}" for k, v in current().to_dict().items()) +
            "".join(f"; caveat: {c}" for c in CAVEATS))
    with report.stage("host time per node"):
        for name, figure in host_rows(device, cfg["depth"], bench.repeats):
            row(name, figure)


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--small", action="store_true", help="a small model (for a CPU check that the script runs)")
    ap.add_argument("--medium", action="store_true", help="benchmarks/engine.py's model (a CPU run of the table)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--samples", type=int, default=40, help="step-back samples")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run with --device cpu --small to check the script on a CPU")
    started = time.perf_counter()
    report = Report(args.device, args.out)
    with report.stage("setting up (export, load)"):
        measure(Bench(args), args.samples, report)
    report.add(f"\n(whole benchmark: {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
