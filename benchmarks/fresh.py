"""What the benchmarks compare Rewind with: the same work done by a fresh Python process."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time


def fresh_runs(code: str, repeats: int) -> tuple[float, str]:
    """Run `code` in `repeats` fresh interpreters: the median wall time, and the last one's stdout."""
    times, out = [], ""
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        times.append(time.perf_counter() - started)
        out = done.stdout
    return statistics.median(times), out


def print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        print(f"{name:<{width}}  {text}")
