"""Training benchmark (issue 17): examples/train_gpt.py's training step (examples/gpt.py's GPT, next-token loss,
AdamW, a batch of its own for each step) under Rewind against the same training in eager PyTorch, every ratio
measured side by side in one run.

    python benchmarks/training.py           # the issue's figures: 100 steps, a ring budget of 25% of their writes
    python benchmarks/training.py --small   # 10 steps, and no overhead row for the wider model

- Overhead: a Session whose ring holds every write (each write a checkpointable tick, checked for NaN/Inf) continues
  through `--overhead-steps` steps, against eager `loss.backward(); opt.step()`; the same for the GPT at width 256,
  4 x 128 tokens (nodes that do more work). Where the time goes: the node times of each phase (forward, backward,
  optimizer) beside eager's, and the host's bookkeeping between the nodes (`--profile`: cProfile's top entries).
- Memory: the `--steps` run, launched as `rewind debug` launches it (a checkpoint at each step start), its ring
  budget `--budget-share` of what the run writes: the bytes the step-start checkpoints hold (parameters and optimizer
  state), how many stay whole, the ring's peak.
- Step back: one node back from random ticks of that run, alone and with every live value read after it; p50/p95
  in mean eager node times.
- Experiment loop: on that run, stopped at its end, the learning rate changed from step `--patch-step` on (the
  optimizer patch the DAP `addPatch` makes with `fromStep`: the learning-rate node of each step from there,
  `lr_step<k>`, writing the new rate), the later steps replayed, their losses read, the change undone. Each
  cycle tries another rate, so nothing is remembered from the cycle before. Against a fresh process training
  `--steps` steps eagerly with the same change (the cheapest rerun), and a fresh process relaunching Rewind with it
  (export, launch, patch, run). The loss curves of the loop, the eager rerun and the relaunch are compared.
Both sides use the same torch threads (default 1: on a shared 2-core machine a second thread makes small ops wait).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import itertools
import platform
import pstats
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, its own folder leads the import path, and benchmarks/triton.py would shadow the triton package
# (torch's optimizers import it): the benchmarks are imported as the package they are.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import train_gpt  # noqa: E402
from gpt import GPT  # noqa: E402

from benchmarks.engine import step_back_latencies, timed  # noqa: E402
from benchmarks.fresh import fresh_runs  # noqa: E402
from hardware.frontends.torch_train import TRAIN_ENTRY, TrainingStep, load_program, training_program  # noqa: E402
from hardware.program import Program  # noqa: E402
from hardware.session import LaunchOptions, Session  # noqa: E402
from provenance.fixes import named_patch  # noqa: E402

EXAMPLE = ROOT / "examples" / "train_gpt.py"
WIDE = dict(vocab=512, width=256, heads=4, depth=2, tokens=128, batch=4)  # the same GPT, nodes that do more work
PHASES = ("forward", "backward", "optimizer")
EVERYTHING_MB = float(1 << 20)  # a ring budget no run here reaches: every write stays retained
TARGET_SHARE = 0.25  # the issue's: step-start checkpoints of 100 steps within 25% of what the run writes
BRANCH = "lr"

FRESH_EAGER = """
import itertools, sys, torch
torch.set_num_threads({threads})
sys.path[:0] = [{examples!r}]
import train_gpt
model, _, loss_fn, optimizer = train_gpt.train_step()
losses = []
for k, (inputs, target) in enumerate(itertools.islice(train_gpt.batches(), {steps})):
    if k == {from_step}:
        for group in optimizer.param_groups:
            group["lr"] = {lr!r}
    loss = loss_fn(model(inputs), target)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
print(*map(repr, losses[{from_step}:]))
"""

FRESH_REWIND = """
import sys
sys.path[:0] = [{root!r}]
from benchmarks.training import relaunched
print(*map(repr, relaunched({steps}, {from_step}, {lr!r}, {budget_mb!r}, {threads})))
"""


# -- what is trained ---------------------------------------------------------------------------------------
@dataclass
class Training:
    """A model, its optimizer, its loss and a batch for each step: what eager PyTorch and the Program both run."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable
    batches: list[tuple[torch.Tensor, torch.Tensor]]

    def eager(self) -> dict[str, float]:
        """Train one pass over the batches: the seconds of each phase."""
        seconds = dict.fromkeys(PHASES, 0.0)
        for inputs, target in self.batches:
            started = time.perf_counter()
            loss = self.loss_fn(self.model(inputs), target)
            forward = time.perf_counter()
            loss.backward()
            backward = time.perf_counter()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            done = time.perf_counter()
            for phase, spent in zip(PHASES, (forward - started, backward - forward, done - backward)):
                seconds[phase] += spent
        return seconds


def example(steps: int) -> Training:
    """examples/train_gpt.py's train_step() and the first `steps` of its batches()."""
    model, _, loss_fn, optimizer = train_gpt.train_step()
    return Training(model, optimizer, loss_fn, list(itertools.islice(train_gpt.batches(), steps)))


def wide(steps: int) -> Training:
    torch.manual_seed(0)
    model = GPT(WIDE["vocab"], WIDE["width"], WIDE["heads"], WIDE["depth"], context=WIDE["tokens"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    batches = [train_gpt._batch(k, WIDE["vocab"], WIDE["tokens"], WIDE["batch"]) for k in range(steps)]
    return Training(model, optimizer, train_gpt.next_token_loss, batches)


def example_program(steps: int) -> Program:
    """The Program `rewind debug examples/train_gpt.py --entry train_step --steps N` runs."""
    return load_program(EXAMPLE, TRAIN_ENTRY, steps)


def program_of(training: Training, name: str) -> Program:
    step = TrainingStep(training.model, training.batches[0], training.loss_fn, training.optimizer)
    return training_program(step, name, len(training.batches), training.batches)


# -- sessions ----------------------------------------------------------------------------------------------
def launched(program: Program, budget_mb: float) -> Session:
    session = Session()
    session.launch(LaunchOptions(str(EXAMPLE), entry=TRAIN_ENTRY, steps=len(program.step_starts), driver="torch:cpu",
                                 budget_mb=budget_mb), program=program)
    return session


def debuggable_run(program: Program) -> tuple[float, dict[str, float], int]:
    """A Session retaining every write continues to the end of `program`: wall seconds, node seconds by phase, bytes
    retained."""
    session = launched(program, EVERYTHING_MB)
    wall = timed(session.run, "cpu")
    tl = session.tl
    by_phase = dict.fromkeys(PHASES, 0.0)
    for tick, seconds in tl.seconds.items():
        by_phase[tl.node_at(tick).phase] += seconds
    return wall, by_phase, tl.ring.used


def lr_patch(program: Program, from_step: int, lr: float):
    """AdamW's learning rate `lr` from step `from_step` on, as addPatch makes it (`optimizer`, `fromStep`)."""
    return named_patch(program, BRANCH, None, optimizer={"lr": lr}, from_step=from_step,
                       model=(str(EXAMPLE), TRAIN_ENTRY))


def loss_curve(session: Session, program: Program, from_step: int) -> list[float]:
    return [float(session.tensor(name, session.end)) for name in program.losses[from_step:]]


def cycle(session: Session, program: Program, from_step: int, lr: float) -> tuple[list[float], list[float]]:
    """Change the learning rate from `from_step` (replaying the steps after it), read the loss curve, undo:
    ([total, make the patch, add it + replay, read, undo] seconds, the curve)."""
    ex = session.experiments
    marks = [time.perf_counter()]
    patch = lr_patch(program, from_step, lr)
    marks.append(time.perf_counter())
    ex.add(BRANCH, patch)
    marks.append(time.perf_counter())
    curve = loss_curve(session, program, from_step)
    marks.append(time.perf_counter())
    ex.restore()
    ex.remove(BRANCH, BRANCH)
    marks.append(time.perf_counter())
    return [marks[-1] - marks[0]] + [b - a for a, b in zip(marks, marks[1:])], curve


def relaunched(steps: int, from_step: int, lr: float, budget_mb: float, threads: int) -> list[float]:
    """What a fresh process relaunching Rewind with the change does: export, launch, patch, run to the end."""
    torch.set_num_threads(threads)
    program = example_program(steps)
    session = launched(program, budget_mb)
    session.experiments.add(BRANCH, lr_patch(program, from_step, lr))
    session.run()
    return loss_curve(session, program, from_step)


# -- the figures -------------------------------------------------------------------------------------------
def overhead(training: Training, program: Program, repeats: int) -> dict:
    """The same steps trained eagerly and continued through in a Session: medians per step."""
    steps = len(program.step_starts)
    training.eager()  # warm-up
    eager_runs, runs = [], []
    for _ in range(repeats):  # interleaved: both sides see the same machine
        eager_runs.append(training.eager())
        runs.append(debuggable_run(program))
    eager_phases = {p: statistics.median(r[p] for r in eager_runs) / steps for p in PHASES}
    return {"eager": sum(eager_phases.values()), "eager_phases": eager_phases,
            "session": statistics.median(r[0] for r in runs) / steps,
            "session_phases": {p: statistics.median(r[1][p] for r in runs) / steps for p in PHASES},
            "step_bytes": runs[0][2] / steps, "nodes": len(program.nodes) / steps}


def memory(session: Session, program: Program) -> dict:
    """What the step-start checkpoints hold: each retained version counted once."""
    ring = session.tl.ring
    starts = set(program.step_starts)
    kept = {t: cp for t, cp in ring.checkpoints.items() if t in starts}
    pins = {key for cp in kept.values() for key in cp.pins if key in ring}
    state = sum(program.initial[name].nbytes for name in set(program.buffer_mutations.values()))
    return {"kept": len(kept), "whole": sum(not cp.thinned for cp in kept.values()),
            "held": sum(ring.get(key).nbytes for key in pins), "state": state, "peak": ring.peak,
            "budget": ring.budget, "evictions": ring.evictions}


def experiment_loop(session: Session, program: Program, from_step: int, repeats: int) -> dict:
    steps, threads = len(program.step_starts), torch.get_num_threads()
    lr = train_gpt.train_step()[3].param_groups[0]["lr"]
    tried = [lr / 10 * (1 + i / 100) for i in range(repeats + 1)]  # the first is the fresh processes' change
    original = loss_curve(session, program, from_step)
    cycles = [cycle(session, program, from_step, rate) for rate in tried]
    eager_s, eager_out = fresh_runs(FRESH_EAGER.format(threads=threads, examples=str(ROOT / "examples"), steps=steps,
                                                       from_step=from_step, lr=tried[0]), repeats)
    rewind_s, rewind_out = fresh_runs(FRESH_REWIND.format(root=str(ROOT), steps=steps, from_step=from_step,
                                                          lr=tried[0], budget_mb=session.tl.ring.budget / 2**20,
                                                          threads=threads), 1)
    steady = [c[0] for c in cycles[1:]] or [cycles[0][0]]
    return {"first": cycles[0][0][0], "cycle": [statistics.median(c[i] for c in steady) for i in range(5)],
            "curve": cycles[0][1], "eager_s": eager_s, "eager_curve": [float(x) for x in eager_out.split()],
            "rewind_s": rewind_s, "rewind_curve": [float(x) for x in rewind_out.split()], "original": original}


def profile(program: Program, top: int = 12) -> str:
    """cProfile's top entries (by own time) of one debuggable run."""
    profiler = cProfile.Profile()
    profiler.runcall(debuggable_run, program)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# -- the table ---------------------------------------------------------------------------------------------
def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def met(ok: bool) -> str:
    return "met" if ok else "missed"


def model_rows(program: Program, export_s: float) -> list[tuple[str, str, str]]:
    step0 = Counter(n.phase for n in program.nodes if n.step == 0)
    params = sum(program.initial[p].numel() for p in program.gradients[0])
    return [
        ("model", f"examples/train_gpt.py: GPT depth 2, width 32, 4 heads, vocab 64, batch 2 x 16 tokens, AdamW; "
                  f"{params:,} parameters; {sum(step0.values())} nodes a step "
                  f"({', '.join(f'{step0[p]} {p}' for p in PHASES)}); {torch.get_num_threads()} torch thread(s)", ""),
        ("export (one-time)", f"{export_s:.2f} s for {len(program.step_starts)} steps ({len(program.nodes):,} nodes)",
         ""),
    ]


def overhead_rows(o: dict, label: str) -> list[tuple[str, str, str]]:
    ratio = o["session"] / o["eager"]
    host = o["session"] - sum(o["session_phases"].values())
    rows = [(f"{label}: debuggable step, every write checkpointable",
             f"{ms(o['session'])} against eager {ms(o['eager'])} = **{ratio:.2f}x**", f"<= 2x: {met(ratio <= 2)}")]
    rows += [(f"{label}: {p}", f"Session's {p} nodes {ms(o['session_phases'][p])}, eager {ms(o['eager_phases'][p])}",
              "") for p in PHASES]
    rows.append((f"{label}: the host between nodes",
                 f"{ms(host)} ({host / o['session']:.0%} of the Session's step; "
                 f"{host / o['nodes'] * 1e6:.0f} us a node)", ""))
    return rows


def long_rows(m: dict, run_s: float, steps: int, backs: dict[str, tuple[float, float]],
              o: dict) -> list[tuple[str, str, str]]:
    written, node_s = o["step_bytes"] * steps, o["eager"] / o["nodes"]
    within = m["held"] <= TARGET_SHARE * written and m["kept"] == steps and m["peak"] <= m["budget"]
    budget = "every write retained" if m["budget"] >= EVERYTHING_MB * 2**20 else \
        f"budget {mib(m['budget'])} = {m['budget'] / written:.0%} of what they write"
    return [
        (f"{steps} steps: run", f"{ms(run_s / steps)} a step = {run_s / steps / o['session']:.2f}x a step retaining "
                                f"every write ({budget}: {mib(written)}); {m['evictions']:,} versions evicted", ""),
        ("step-start checkpoints", f"{m['kept']} of {steps} step starts, {m['whole']} whole (not thinned), holding "
                                   f"{mib(m['held'])} = {m['held'] / written:.1%} of what the run writes (parameters "
                                   f"and optimizer state: {mib(m['state'])} a step); ring peak {mib(m['peak'])}",
         f"within {TARGET_SHARE:.0%}: {met(within)}"),
    ] + [(f"step back at random ticks{how}", f"p50 {p50:.2f} ms ({p50 / 1e3 / node_s:.0f} node times), p95 "
                                             f"{p95:.2f} ms (**{p95 / 1e3 / node_s:.0f} node times**; mean eager node "
                                             f"{node_s * 1e6:.1f} us)", "") for how, (p50, p95) in backs.items()]


def experiment_rows(e: dict, steps: int, from_step: int) -> list[tuple[str, str, str]]:
    total, make, replay, read, undo = e["cycle"]
    eager_ratio, rewind_ratio = e["eager_s"] / total, e["rewind_s"] / total
    same = e["curve"] == e["eager_curve"] == e["rewind_curve"]
    gap = max(abs(a - b) for a, b in zip(e["curve"], e["eager_curve"]))
    return [
        (f"experiment loop: lr from step {from_step} of {steps}",
         f"{ms(total)}: make the patch (the lr node of each step from there) {ms(make)}, add it + replay "
         f"{steps - from_step} steps {ms(replay)}, read the loss curve {ms(read)}, undo {ms(undo)}; first cycle "
         f"{ms(e['first'])}", ""),
        ("fresh process: eager training with the change", f"{e['eager_s']:.2f} s = **{eager_ratio:.1f}x** the loop",
         f">= 10x: {met(eager_ratio >= 10)}"),
        ("fresh process: Rewind relaunched with the change",
         f"{e['rewind_s']:.2f} s = **{rewind_ratio:.1f}x** the loop (export, launch, patch, run)", ""),
        ("loss curves", f"loop, eager rerun and relaunch {'the same, bit for bit' if same else 'differ'} (max "
                        f"|loop - eager| {gap:.3g}); step {steps - 1}: {e['curve'][-1]:.4f} with the change, "
                        f"{e['original'][-1]:.4f} without", ""),
    ]


def print_table(rows: list[tuple[str, str, str]]) -> None:
    print(f"{datetime.date.today()} · {platform.machine()} · {platform.processor() or 'cpu'} · torch "
          f"{torch.__version__} · Python {platform.python_version()}\n")
    print("| measure | figure | target |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="10 steps, no overhead row for the wider model")
    ap.add_argument("--steps", type=int, help="steps of the long run (default 100; --small: 10)")
    ap.add_argument("--patch-step", type=int, help="the step the learning rate changes from (default: 80%% of steps)")
    ap.add_argument("--budget-share", type=float, default=TARGET_SHARE,
                    help="the long run's ring budget, a share of what it writes (1 or more: every write retained)")
    ap.add_argument("--overhead-steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--samples", type=int, default=40, help="step-back positions")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top entries of a debuggable run")
    args = ap.parse_args()
    args.steps = args.steps or (10 if args.small else 100)
    args.patch_step = round(0.8 * args.steps) if args.patch_step is None else args.patch_step
    if not 2 <= args.steps or not 1 <= args.patch_step < args.steps or not 1 <= args.overhead_steps <= args.steps \
            or min(args.repeats, args.samples, args.threads) < 1 or not args.budget_share > 0:
        ap.error("give at least 2 steps, a patch step from 1 to steps - 1, overhead steps from 1 to steps, a budget "
                 "share above 0, and repeats, samples and threads of at least 1")
    return args


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    export_s = time.perf_counter()
    program = example_program(args.steps)
    export_s = time.perf_counter() - export_s
    short = example_program(args.overhead_steps)
    o = overhead(example(args.overhead_steps), short, args.repeats)
    rows = model_rows(program, export_s) + overhead_rows(o, "examples/train_gpt.py")
    if not args.small:
        training = wide(args.overhead_steps)
        rows += overhead_rows(overhead(training, program_of(training, "wide_gpt"), args.repeats),
                              f"width {WIDE['width']}, {WIDE['batch']} x {WIDE['tokens']} tokens")
    written = o["step_bytes"] * args.steps
    session = launched(program, EVERYTHING_MB if args.budget_share >= 1 else args.budget_share * written / 2**20)
    run_s = timed(session.run, "cpu")
    m = memory(session, program)
    backs = {how: step_back_latencies(session, args.samples, "cpu", read_live)
             for how, read_live in ((", one node", False), (", one node, then every live value read", True))}
    session.goto(session.end)
    e = experiment_loop(session, program, args.patch_step, args.repeats)
    print_table(rows + long_rows(m, run_s, args.steps, backs, o)
                + experiment_rows(e, args.steps, args.patch_step))
    if args.profile:
        print(f"\ncProfile of one debuggable run of {args.overhead_steps} steps, by own time:\n")
        print(profile(short))


if __name__ == "__main__":
    main()
