"""The precision-mix table (issue 28): on each planted and clean model of tests/models/precision/, the verdict,
whether the headline names the line marked `# BUG` (or is clean where the model is correct), the seconds of
`rewind forensics` and its peak memory. Each model runs in a fresh process (`rewind forensics --json
--no-ablate`), so its peak resident memory is its own. Prints a Markdown table for benchmarks/RESULTS.md.

    python benchmarks/precision.py
"""

from __future__ import annotations

import json
import platform
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRECISION = ROOT / "tests" / "models" / "precision"
TRAINING = ("--entry", "train_step", "--steps", "3")
CASES = [("autocast_clean", (), False), ("half_params", (), False), ("bf16_clean", (), False),
         ("train_tiny_losses", ("--entry", "train_step", "--steps", "20"), False),
         ("autocast_accumulation", (), True), ("autocast_train", TRAINING, True), ("half_params_overflow", (), True)]


def bug_line(path: Path) -> int | None:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if "# BUG" in line:
            return number
    return None


def measure(model: str, launch: tuple[str, ...], planted: bool) -> str:
    path = PRECISION / f"{model}.py"
    started = time.perf_counter()
    rewind = Path(sys.executable).parent / "rewind"
    with tempfile.TemporaryFile("w+") as out:
        child = subprocess.Popen([str(rewind), "forensics", str(path), "--driver", "torch:cpu", "--json",
                                  "--no-ablate", *launch], stdout=out, stderr=subprocess.DEVNULL, cwd=ROOT)
        _, _, usage = os.wait4(child.pid, 0)  # this run's own peak, not the largest child's so far
        seconds = time.perf_counter() - started
        out.seek(0)
        report = json.load(out)
    peak_mb = usage.ru_maxrss / 1024
    line = bug_line(path)
    right = (f"{path.name}:{line}" in report["headline"]) if planted else report["headline"] == "clean"
    verdict = "problem found" if report["problem"] else "clean"
    return (f"| {model} {' '.join(launch)} | {verdict} | {'yes' if right else 'NO'}: {report['headline'][:90]} | "
            f"{seconds:.1f} | {peak_mb:.0f} |")


def main() -> None:
    print(f"{platform.machine()}, {platform.python_version()}\n")
    print("| model | verdict | headline right | seconds | peak MB |")
    print("|---|---|---|---|---|")
    for model, launch, planted in CASES:
        print(measure(model, launch, planted), flush=True)


if __name__ == "__main__":
    main()
