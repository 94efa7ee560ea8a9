"""Many ranks benchmark (issue 18): examples/tensor_parallel.py (Megatron style: two blocks, one all_reduce each) on
2 and 4 ranks of one gloo process group, under Rewind against the same program under plain torch.distributed,
side by side in one run.

    python benchmarks/ranks.py            # 2 and 4 ranks, 3 launches each
    python benchmarks/ranks.py --small    # 2 ranks, one launch each: every row, quickly

- Eager: N processes forked from this one (before it runs anything on tensors) join a gloo group and call the model
  (torch.distributed's functional collectives, no Rewind): the slowest rank's median call after one warm-up.
- Rewind: a Coordinator per launch (one rank launcher for the whole run, as a debug session keeps one), `run()` from
  entry to the end: every node run for the first time, checkpointed and checked, each collective crossed through a
  consistent cut. Overhead per node: (Rewind - eager) / the nodes of a rank. Overhead per collective: a one-node
  step of every rank that crosses a collective against one that does not (p50), on a fresh launch: the
  coordinator's fence, match and joint motion, with the collective itself.
- Step back across a collective: from right after a collective, one node back on every rank (back across it).
- Data parallel: examples/data_parallel.py's training step (forward, backward with a gradient all_reduce per
  parameter, SGD's update) under plain torch.distributed (eager autograd and hooks) and under Rewind, and under Rewind
  with the `replicas` check on every parameter (its digests compared across ranks after each motion).
- Mismatch: tests/models/ranks/skipped_collective.py on N ranks (rank 1 skips an all_reduce its peers call): from
  `run()` at entry to the exception stop. The same program under plain torch.distributed hangs (until gloo's
  timeout: 30 minutes by default).
- Pipeline: examples/pipeline_parallel.py (micro-batches passed rank 0 -> 1 -> ... by isend/irecv, then one
  all_reduce), its Stage's forward under plain torch.distributed (the functional isend/irecv run eagerly, each
  output waited for) and under Rewind. Overhead per send/recv pair: a one-node step of every rank that crosses pairs
  against one that crosses nothing (p50), per pair crossed. Step back across a send/recv: from right after a recv
  (its sender right after the send), one node back on every rank: the pair goes back across it together.
- Deadlock: tests/models/ranks/point_to_point.py's `deadlock` (2 ranks, both send first): from `run()` at entry to
  the stop; and the same program under plain torch.distributed on gloo, whose isend returns before its recv is
  posted (so it runs through there).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.utils._pytree import tree_map

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from hardware.frontends.torch_export import load_module  # noqa: E402
from hardware.ranks.coordinator import Coordinator  # noqa: E402
from hardware.ranks.launcher import RankLauncher  # noqa: E402
from hardware.ticks import Direction  # noqa: E402

EXAMPLE = ROOT / "examples" / "tensor_parallel.py"
DATA_PARALLEL = ROOT / "examples" / "data_parallel.py"
PARAMETERS = ["up.weight", "up.bias", "down.weight", "down.bias"]  # data_parallel.MLP's: replicated on every rank
SKIPPED = ROOT / "tests" / "models" / "ranks" / "skipped_collective.py"
PIPELINE = ROOT / "examples" / "pipeline_parallel.py"
POINT_TO_POINT = ROOT / "tests" / "models" / "ranks" / "point_to_point.py"


# -- eager: plain torch.distributed ---------------------------------------------------------------------------
def eager_ms(world_size: int, calls: int, call=None) -> float:
    """The slowest rank's median call, in ms, each rank a process forked from this one; `call(rank, world_size)`
    makes what a rank calls (default: the tensor-parallel model's forward)."""
    told, tell = os.pipe()  # the store's port, once every rank is forked
    reads = []
    for rank in range(world_size):
        read, write = os.pipe()
        if os.fork() == 0:
            os.close(read)
            os.close(tell)
            _eager_rank(rank, world_size, told, calls, write, call or _forward)
        os.close(write)
        reads.append(read)
    # the store only now: a fork while its server thread resolves a rank's address (getnameinfo) copies the
    # resolver's lock held, and that rank hangs in its own connect
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=120))
    os.write(tell, f"{store.port:05d}".encode() * world_size)  # one write: each rank reads its 5 digits whole
    os.close(tell)
    os.close(told)
    medians = []
    for read in reads:
        with os.fdopen(read) as answer:
            medians.append(json.loads(answer.read())["ms"])
    for _ in reads:
        os.wait()
    return max(medians)


def _forward(rank: int, world_size: int, program: Path = EXAMPLE, entry: str = "build"):
    """The model's forward, its outputs waited for: a functional collective's result is a tensor still in flight
    until used (the pipeline's energy), and Rewind runs the wait of each."""
    model, inputs = load_module(program, entry)
    return lambda: tree_map(lambda t: t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t,
                            model(*inputs))


def _training_step(rank: int, world_size: int):
    from examples import data_parallel  # deferred: only the data-parallel rows import the example
    model, (x, y), loss, optimizer = data_parallel.train_step(rank, world_size)

    def step():
        with torch.enable_grad():
            optimizer.zero_grad()
            loss(model(x), y).backward()
            optimizer.step()
    return step


def _eager_rank(rank: int, world_size: int, told: int, calls: int, write: int, call) -> None:
    code = 1
    try:
        port = int(os.read(told, 5))
        tcp = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timedelta(seconds=120))
        dist.init_process_group("gloo", store=tcp, rank=rank, world_size=world_size)
        once = call(rank, world_size)
        times = []
        with torch.no_grad():
            for _ in range(calls + 1):
                dist.barrier()
                t = time.perf_counter()
                once()
                times.append((time.perf_counter() - t) * 1e3)
        os.write(write, json.dumps({"ms": statistics.median(times[1:])}).encode())
        dist.barrier()  # no rank leaves while a peer still receives from it (gloo's isend does not wait for that)
        dist.destroy_process_group()
        code = 0
    finally:
        os._exit(code)


# -- Rewind ---------------------------------------------------------------------------------------------------
def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1e3, out


def launcher_of(world_size: int, launcher: RankLauncher, launches: list[float]):
    """Launches a program on `world_size` ranks (a Coordinator), the time of each added to `launches`."""
    def launch(program: Path, **options) -> Coordinator:
        ms, c = timed(lambda: Coordinator(str(program), world_size, launcher=launcher, **options))
        launches.append(ms)
        return c
    return launch


def rewind_rows(world_size: int, launcher: RankLauncher, repeats: int, samples: int,
                launches: list[float]) -> dict:
    """Every Rewind figure for `world_size` ranks; the time of each launch is added to `launches`."""
    launch = launcher_of(world_size, launcher, launches)
    runs = []
    for i in range(repeats):
        with launch(EXAMPLE) as c:
            runs.append(timed_run(c, _ended))
            if i == 0:  # the program's shape and the step-back samples: from one launch
                nodes, collectives = c.states()[0]["end"], c.collectives(0)
                back = step_back_across(c, samples)
    with launch(EXAMPLE) as c:
        steps = node_steps(c)
    plain, crossing = statistics.median(steps["plain"]), statistics.median(steps["collective"])
    mismatch = [run_ms(launch, SKIPPED, lambda stop: stop.reason == "exception" and stop.finding)
                for _ in range(repeats)]
    train = statistics.median(run_ms(launch, DATA_PARALLEL, _ended, entry="train_step") for _ in range(repeats))
    replicas = statistics.median(run_ms(launch, DATA_PARALLEL, _ended, entry="train_step", replicas=PARAMETERS)
                                 for _ in range(repeats))
    return {"run": statistics.median(runs), "nodes": nodes, "train": train, "replicas": replicas,
            "collectives": len(collectives), "back": back, "plain": plain, "crossing": crossing,
            "mismatch": statistics.median(mismatch)}


def pipeline_rows(world_size: int, launcher: RankLauncher, repeats: int, samples: int,
                  launches: list[float]) -> dict:
    """The pipeline example's Rewind figures for `world_size` ranks, and on 2 ranks the planted deadlock's."""
    launch = launcher_of(world_size, launcher, launches)
    runs = []
    for i in range(repeats):
        with launch(PIPELINE) as c:
            runs.append(timed_run(c, _ended))
            if i == 0:  # the program's shape and the step-back samples: from one launch
                ends = sorted(s["end"] for s in c.states().values())
                pairs = sum(len(x.p2p) for r in range(world_size) for x in c.collectives(r)) // 2  # a send and a recv
                back = step_back_across_recv(c, samples)
    with launch(PIPELINE) as c:
        steps = node_steps(c)
    plain = statistics.median(steps["plain"])
    per_pair = statistics.median((ms - plain) / crossed for ms, crossed in steps["pairs"])
    deadlock = [run_ms(launch, POINT_TO_POINT, lambda stop: stop.reason == "exception" and
                       "no rank can go on" in stop.description, entry="deadlock")
                for _ in range(repeats if world_size == 2 else 0)]  # the planted model is one of 2 ranks
    return {"run": statistics.median(runs), "nodes": (ends[0], ends[-1]), "back": back, "plain": plain,
            "pairs": pairs, "crossing": statistics.median(ms for ms, _ in steps["pairs"]), "per_pair": per_pair,
            "deadlock": statistics.median(deadlock) if deadlock else None}


def timed_run(c: Coordinator, ok: Callable[[Any], bool]) -> float:
    """The time of running every rank of `c` on to its stop, which must be the one the figure is about (`ok`)."""
    ms, stop = timed(c.run)
    assert ok(stop), stop
    return ms


def run_ms(launch: Callable[..., Coordinator], program: Path, ok: Callable[[Any], bool], **options) -> float:
    """The time of running a fresh launch of `program` on to its stop (timed_run)."""
    with launch(program, **options) as c:
        return timed_run(c, ok)


def _ended(stop: Any) -> bool:
    return stop.reason == "end"


def node_steps(c: Coordinator) -> dict[str, list]:
    """One-node steps of every rank from entry until every rank is at its end (each node run for the first time),
    timed: "plain" those that cross nothing, "collective" those that cross a collective of the process group,
    "pairs" (ms, send/recv pairs crossed) those that cross sends and recvs only."""
    found: dict[str, list] = {"plain": [], "collective": [], "pairs": []}
    while any(s["tick"] < s["end"] for s in c.states().values()):
        before = c.states()
        ms, _ = timed(lambda: c.step(Direction.FORWARD, "node"))
        crossed = [x for r, s in c.states().items() for x in c.collectives(r)[before[r]["passed"]:s["passed"]]]
        if not crossed:
            found["plain"].append(ms)
        elif all(x.point_to_point for x in crossed):
            found["pairs"].append((ms, sum(d == "send" for x in crossed for d, *_ in x.p2p)))
        else:
            found["collective"].append(ms)
    return found


def step_back_across(c: Coordinator, samples: int) -> tuple[float, float]:
    """p50 and p95 of one node back on every rank from right after a collective (back across it), in ms."""
    lat = []
    for i in range(samples):
        k = i % len(c.collectives(0))
        for r in range(c.world_size):  # each rank right after it (a goto leaves the others in the same segment)
            c.goto(c.collectives(r)[k].tick + 1, r)
        ms, _ = timed(lambda: c.step(Direction.REVERSE, "node"))
        assert all(s["passed"] == k for s in c.states().values())
        lat.append(ms)
    return p50_p95(lat)


def step_back_across_recv(c: Coordinator, samples: int) -> tuple[float, float]:
    """p50 and p95 of one node back on every rank from right after a recv, its sender right after the send (each
    recv in turn): the receiving rank goes back across its recv, with its sender back across the send."""
    recvs = [(b, x) for b in range(c.world_size) for x in c.collectives(b)
             if any(d == "recv" for d, *_ in x.p2p)]
    lat = []
    for i in range(samples):
        b, recv = recvs[i % len(recvs)]
        (a, number), = ((q, m) for q, m in c.partners(b, recv.number).items() if q != b)
        c.goto(c.collectives(a)[number - 1].tick + 1, a)  # the sender first: its goto may move the receiver
        c.goto(recv.tick + 1, b)
        ms, _ = timed(lambda: c.step(Direction.REVERSE, "node", rank=b))
        assert c.states()[b]["passed"] == recv.number - 1 and c.states()[a]["passed"] == number - 1, c.states()
        lat.append(ms)
    return p50_p95(lat)


def p50_p95(lat: list[float]) -> tuple[float, float]:
    lat = sorted(lat)
    return lat[len(lat) // 2], lat[max(0, int(len(lat) * 0.95) - 1)]


# -- the table --------------------------------------------------------------------------------------------------
def table(sizes: list[int], eager: dict[str, dict[int, float]], rewind: dict[int, dict], pipeline: dict[int, dict],
          launches: dict[int, list[float]]) -> str:
    """`eager`: plain torch.distributed's times, by program ("forward", "training", "pipeline", "deadlock")."""
    def row(name: str, cell) -> str:
        return f"| {name} | " + " | ".join(cell(n) for n in sizes) + " |"

    r, p, training = rewind, pipeline, eager["training"]
    two_ranks_only = "-: a model of 2 ranks"
    lines = [
        "| measure | " + " | ".join(f"{n} ranks" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
        row("model", lambda n: f"examples/tensor_parallel.py: {r[n]['nodes']} nodes, {r[n]['collectives']} "
                               "all_reduce per rank"),
        row("first launch: the rank launcher's start, then the ranks", lambda n: f"{launches[n][0] / 1e3:.1f} s"
            if n == sizes[0] else "-"),
        row("launch: ranks forked, each exporting its program (median of the others)",
            lambda n: f"{statistics.median(launches[n][n == sizes[0]:]) / 1e3:.2f} s"),
        row("eager forward, plain torch.distributed (slowest rank, median)",
            lambda n: f"{eager['forward'][n]:.2f} ms"),
        row("Rewind: run to the end (first execution, consistent cuts)",
            lambda n: f"{r[n]['run']:.1f} ms ({r[n]['run'] / eager['forward'][n]:.1f}x eager)"),
        row("overhead per node", lambda n: f"{(r[n]['run'] - eager['forward'][n]) / r[n]['nodes']:.2f} ms"),
        row("one-node step of every rank, p50", lambda n: f"{r[n]['plain']:.2f} ms"),
        row("one-node step across a collective, p50", lambda n: f"{r[n]['crossing']:.2f} ms"),
        row("overhead per collective (the difference)", lambda n: f"{r[n]['crossing'] - r[n]['plain']:.2f} ms"),
        row("step back across a collective, p50 / p95",
            lambda n: f"{r[n]['back'][0]:.2f} / {r[n]['back'][1]:.2f} ms"),
        row("data-parallel training step, plain torch.distributed (slowest rank, median)",
            lambda n: f"{training[n]:.2f} ms"),
        row("Rewind: the training step to the end", lambda n: f"{r[n]['train']:.1f} ms "
                                                              f"({r[n]['train'] / training[n]:.1f}x eager)"),
        row("the same with the replicas check on every parameter",
            lambda n: f"{r[n]['replicas']:.1f} ms ({r[n]['replicas'] / r[n]['train']:.2f}x without)"),
        row("planted skipped collective: entry to the stop (median)", lambda n: f"{r[n]['mismatch']:.1f} ms"),
        row("the same program, plain torch.distributed", lambda n: "hangs (until gloo's timeout)"),
        row("pipeline model", lambda n: f"examples/pipeline_parallel.py: {p[n]['nodes'][0]}-{p[n]['nodes'][1]} "
                                        f"nodes a rank, {p[n]['pairs']} send/recv pairs, 1 all_reduce"),
        row("pipeline: eager forward, plain torch.distributed (slowest rank, median)",
            lambda n: f"{eager['pipeline'][n]:.2f} ms"),
        row("pipeline: Rewind run to the end",
            lambda n: f"{p[n]['run']:.1f} ms ({p[n]['run'] / eager['pipeline'][n]:.1f}x eager)"),
        row("pipeline: one-node step of every rank, p50", lambda n: f"{p[n]['plain']:.2f} ms"),
        row("pipeline: one-node step across send/recv pairs, p50", lambda n: f"{p[n]['crossing']:.2f} ms"),
        row("overhead per send/recv pair (the difference, per pair crossed, p50)",
            lambda n: f"{p[n]['per_pair']:.2f} ms"),
        row("step back across a send/recv (a rank one node back across its recv), p50 / p95",
            lambda n: f"{p[n]['back'][0]:.2f} / {p[n]['back'][1]:.2f} ms"),
        row("planted p2p deadlock (both ranks send first): entry to the stop (median)",
            lambda n: f"{p[n]['deadlock']:.1f} ms" if n == 2 else two_ranks_only),
        row("the same program, plain torch.distributed on gloo (median)",
            lambda n: f"runs through: {eager['deadlock'][n]:.2f} ms (its isend does not wait for the recv)"
            if n == 2 else two_ranks_only),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="2 ranks, one launch: every row, quickly")
    parser.add_argument("--repeats", type=int, default=3, help="launches per figure (default 3; --small: 1)")
    parser.add_argument("--samples", type=int, default=20, help="steps back timed (default 20; --small: 4)")
    parser.add_argument("--calls", type=int, default=20, help="eager calls timed per rank (default 20; --small: 3)")
    args = parser.parse_args(argv)
    if args.small:
        args.repeats, args.samples, args.calls = 1, 4, 3
    for name in ("repeats", "samples", "calls"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} is a number of times, at least 1")
    sizes = [2] if args.small else [2, 4]
    calls = {"forward": _forward, "training": _training_step,
             "pipeline": functools.partial(_forward, program=PIPELINE),
             "deadlock": functools.partial(_forward, program=POINT_TO_POINT, entry="deadlock")}
    # first: forked before this process runs anything; the deadlock model is one of 2 ranks
    eager = {name: {n: eager_ms(n, args.calls, call) for n in (sizes if name != "deadlock" else [2])}
             for name, call in calls.items()}
    launches: dict[int, list[float]] = {n: [] for n in sizes}
    launcher = RankLauncher()  # its start is part of the first launch's time
    try:
        rewind = {n: rewind_rows(n, launcher, args.repeats, args.samples, launches[n]) for n in sizes}
        pipeline = {n: pipeline_rows(n, launcher, args.repeats, args.samples, launches[n]) for n in sizes}
    finally:
        launcher.close()
    print(f"Many ranks on {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, gloo; "
          f"{datetime.date.today()}; {args.repeats} launch(es) per figure\n")
    print(table(sizes, eager, rewind, pipeline, launches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
