"""What a refactor of the engine costs: the same debugging session timed on this tree and on an earlier revision.

    python benchmarks/floors.py [--base c5ea1fb] [--rounds 5]

The earlier revision is checked out into a temporary git worktree; each round runs the workload once in a fresh
process on each tree, alternating, so both see the same machine. The workload is a session on examples/gpt.py
through the Session API both trees share: launch, run to the end, step back one node at a time, reverse-continue
to the start and continue to the end twenty times with the nan and inf filters on, and read every live value's
stats with the frames at a few positions. Printed: the median seconds of each phase on each tree, and the
ratio new/old.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKLOAD = r"""
import json, sys, time
sys.path[:0] = [sys.argv[1]]
from hardware.session import Direction, LaunchOptions, Session
out = {}
def phase(name, fn):
    t = time.perf_counter(); fn(); out[name] = time.perf_counter() - t
s = Session()
phase("launch", lambda: s.launch(LaunchOptions(program=sys.argv[1] + "/examples/gpt.py", driver="torch:cpu",
                                               budget_mb=2)))
s.set_exception_filters(["nan", "inf"])
phase("run to the end", lambda: s.run())
def back_to_start():
    s.goto(s.end)
    while s.position > 0:
        s.step(Direction.REVERSE, "instruction")
phase("step back from the end to the start, one node at a time", back_to_start)
def round_trips():
    for _ in range(20):
        s.run(Direction.REVERSE)
        s.run()
phase("20 round trips: reverse-continue to the start, continue to the end", round_trips)
def inspect():
    for tick in range(0, s.end, max(1, s.end // 8)):
        s.goto(tick)
        s.frames()
        for name in s.live_values():
            s.value_stats(name)
phase("goto and read every live value", inspect)
s.close()
print(json.dumps(out))
"""


def run_once(tree: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", WORKLOAD, str(tree)], capture_output=True, text=True, cwd=tree,
                          timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the workload failed on {tree}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="c5ea1fb", help="the earlier revision (default: before the floors)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(old), args.base], check=True)
        try:
            times: dict[str, dict[str, list[float]]] = {"new": {}, "old": {}}
            for _ in range(args.rounds):
                for label, tree in (("new", ROOT), ("old", old)):
                    for name, seconds in run_once(tree).items():
                        times[label].setdefault(name, []).append(seconds)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=False)
    print(f"| phase | this tree (s) | {args.base} (s) | new / old |")
    print("|---|---|---|---|")
    for name in times["new"]:
        new, old_ = statistics.median(times["new"][name]), statistics.median(times["old"][name])
        print(f"| {name} | {new:.4f} | {old_:.4f} | {new / old_:.2f} |")
    print(f"\nmedians of {args.rounds} rounds, each tree in a fresh process per round, alternating")


if __name__ == "__main__":
    main()
