"""Startup (issue 19): how long Rewind takes to be of use, against `import torch` measured in the same run.

    python benchmarks/startup.py                  # examples/gpt.py, three rounds, medians
    python benchmarks/startup.py --quick          # examples/mlp.py, one round, no forensics rows (the tests)

Each figure is a fresh process run as a user runs it: `python -c "import torch"` (the floor); `rewind debug MODEL -x
SCRIPT` with a script that shows where the launch stopped and quits (the console launches stopped on entry: its first
stop), once with the program cache empty (the export) and once more (the cached program); `rewind forensics MODEL`
the same two ways; and `rewind debug` once more with its engine forked by an engine pool (`rewind pool`,
dap_server/pool/) started once for the run, whose own start is a row of its own. Each round empties the cache first;
the rounds take their steps in the same order, and a figure is the median of its rounds. The cache lives in a
temporary folder for the run ($REWIND_CACHE_DIR), so the model's folder is left as it was. Also measured: the console
client's own imports (`python -X importtime -c "import dap_server.cli"`), which must not include torch, and whether
the second runs loaded the entry the first wrote.
Targets: a second debug launch <= 4 s and <= 1.5x `import torch`, a second forensics run <= 6 s.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dap_server import pool  # noqa: E402
from hardware.frontends.cache_folder import CACHE_DIR_ENV, NO_CACHE_ENV, CacheFolder  # noqa: E402

REWIND = [sys.executable, "-c", "import sys; from dap_server.cli import main; sys.exit(main())"]
TARGETS = {"debug": 4.0, "forensics": 6.0}  # seconds, for the second run
LAUNCH_RATIO = 1.5  # a second debug launch to its first stop, against import torch (issue 33)


def timed_run(command: list[str], env: dict) -> float:
    """Seconds a command takes, start to exit; a failing command stops the benchmark, saying what it printed."""
    start = time.perf_counter()
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if run.returncode not in (0, 1):  # forensics exits 1 for a model with a problem: still a full run
        sys.exit(f"{' '.join(command[3:] or command)} failed ({run.returncode}):\n{run.stdout[-2000:]}"
                 f"{run.stderr[-2000:]}")
    return seconds


def commands(model: str, script: Path) -> dict[str, list[str]]:
    return {"floor": [sys.executable, "-c", "import torch"],
            "debug": [*REWIND, "debug", model, "-x", str(script)],
            "forensics": [*REWIND, "forensics", model]}


def rounds(model: str, tools: list[str], count: int, workdir: Path) -> tuple[dict[str, list[float]], list[str]]:
    """Each round: the floor, then each tool with the cache emptied and once more. Also what the cache did."""
    script = workdir / "stop.rewind"
    script.write_text("where\nquit\n")
    cache = workdir / "cache"
    env = {k: v for k, v in os.environ.items() if k not in (NO_CACHE_ENV, pool.POOL_VARIABLE)} | \
        {CACHE_DIR_ENV: str(cache)}
    run = commands(model, script)
    times: dict[str, list[float]] = {}
    notes = []
    log = workdir / "pool.log"
    with open(log, "wb") as said:
        start = time.perf_counter()
        warm = pool.spawn(str(workdir / "engines.sock"), env, verbose=True, stderr=said.fileno())
        if not pool.wait_ready(warm, 120):
            sys.exit(f"the engine pool did not start:\n{log.read_text()[-2000:]}")
        times["pool start"] = [time.perf_counter() - start]
        pooled = env | {pool.POOL_VARIABLE: str(workdir / "engines.sock")}
        try:
            for _ in range(count):
                times.setdefault("floor", []).append(timed_run(run["floor"], env))
                for tool in tools:
                    folder = CacheFolder(cache)
                    for entry in folder.entries():
                        folder.remove(entry.path)
                    times.setdefault(f"{tool} first", []).append(timed_run(run[tool], env))
                    written = folder.entries()
                    times.setdefault(f"{tool} second", []).append(timed_run(run[tool], env))
                    notes.append(cache_note(tool, written, folder.entries()))
                    if tool == "debug":
                        times.setdefault("debug pooled", []).append(timed_run(run[tool], pooled))
        finally:
            warm.terminate()
            warm.wait(60)
    forked = log.read_text().count("forked for a session")
    if forked != count:
        sys.exit(f"the pooled launches took {forked} engines from the pool, not {count}:\n{log.read_text()[-2000:]}")
    notes.append(f"pool: each pooled launch's engine was forked by the pool ({forked} of {count})")
    return times, notes


def cache_note(tool: str, written: list, after: list) -> str:
    """What the cache did between a tool's first and second run (the entry the first wrote, loaded by the
    second: its use time moves, no other is written)."""
    if len(written) != 1:
        return f"{tool}: the first run wrote {len(written)} entries, not 1"
    if [e.path for e in after] != [written[0].path]:
        return f"{tool}: the second run wrote an entry of its own (something keyed changed in between)"
    if after[0].used <= written[0].used:
        return f"{tool}: the second run did not load the entry the first wrote"
    return f"{tool}: the first run wrote 1 entry ({written[0].size / 1024:.0f} KiB), the second loaded it"


def console_imports() -> tuple[float, bool]:
    """The console client's import time (python -X importtime, in seconds) and whether torch is among its imports."""
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", "import dap_server.cli"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    lines = [line.split("|") for line in run.stderr.splitlines() if line.startswith("import time:")]
    total = sum(int(parts[0].split(":")[1]) for parts in lines[1:] if len(parts) == 3)  # self times, in µs
    return total / 1e6, any(parts[2].strip() == "torch" for parts in lines if len(parts) == 3)


def table(model: str, times: dict[str, list[float]], notes: list[str], imports: tuple[float, bool]) -> list[str]:
    floor = statistics.median(times["floor"])
    rows = [("`python -c \"import torch\"` (the floor)", floor, "1.00x")]
    for key, values in times.items():
        if key == "floor":
            continue
        tool, which = key.split()
        seconds = statistics.median(values)
        ratio = f"{seconds / floor:.2f}x"
        if key == "pool start":
            rows.append(("the engine pool's own start (`rewind pool`, once, before the launches)", seconds, ratio))
            continue
        if which in ("second", "pooled"):
            target = TARGETS[tool]
            ratio += f" (target <= {target:g} s: {'met' if seconds <= target else 'MISSED'}"
            if tool == "debug":  # issue 33's, by ratio: the floor measured in the same run
                ratio += f"; <= {LAUNCH_RATIO:g}x import torch: {'met' if seconds <= LAUNCH_RATIO * floor else 'MISSED'}"
            ratio += ")"
        what = "to its first stop and out" if tool == "debug" else "the whole report"
        cache = {"first": "the cache empty: the export", "second": "the program cache filled by the first",
                 "pooled": "the cache filled, its engine forked by the pool"}[which]
        rows.append((f"`rewind {tool} {model}`, {what}, {which} ({cache})", seconds, ratio))
    lines = ["| measure | seconds | x import torch |", "|---|---|---|"]
    lines += [f"| {what} | {seconds:.2f} | {ratio} |" for what, seconds, ratio in rows]
    seconds, has_torch = imports
    lines.append(f"| the console client's imports (`python -X importtime -c \"import dap_server.cli\"`) | "
                 f"{seconds:.2f} | torch {'IMPORTED' if has_torch else 'not imported'} |")
    lines.append(f"| program cache | - | {'; '.join(sorted(set(notes)))} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="examples/mlp.py, one round, no forensics rows")
    ap.add_argument("--rounds", type=int, help="rounds whose medians are the figures (default 3; --quick: 1)")
    args = ap.parse_args(argv)
    count = args.rounds or (1 if args.quick else 3)
    if count < 1:
        ap.error("--rounds is a whole number, 1 or more")
    model = "examples/mlp.py" if args.quick else "examples/gpt.py"
    tools = ["debug"] if args.quick else ["debug", "forensics"]
    with tempfile.TemporaryDirectory(prefix="rewind-startup-") as workdir:
        times, notes = rounds(model, tools, count, Path(workdir))
    print(f"Startup, {model}, {count} round(s), medians; {datetime.date.today()}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}\n")
    print("\n".join(table(model, times, notes, console_imports())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
