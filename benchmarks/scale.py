"""Real model sizes (issue 33): wall time and peak memory of eager, a debug run to the end and `rewind forensics`,
each a fresh process, side by side in one run, against the model's weights.

    python benchmarks/scale.py               # GPT-2 small (124M, its real configuration), 128 tokens
    python benchmarks/scale.py --llama-1b    # also the ~1.1B LLaMA-shaped model (about 7 GiB at its peak)

Peak memory is each process's maximum resident set (os.wait4's rusage), torch's own runtime included; the weights
are the model's parameters and buffers in bytes. Targets: forensics <= 3x the weights' memory.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(__file__).resolve().parent / "scale_models"
REWIND = [sys.executable, "-c", "import sys; from dap_server.cli import main; sys.exit(main())"]
EAGER = ("import sys, torch; sys.path.insert(0, {folder!r}); import {module} as m; model, inputs = m.build(); "
         "weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]); "
         "torch.no_grad().__enter__(); model(**inputs); print(weights)")


def measured(command: list[str], cwd: Path) -> tuple[float, int, str]:
    """(seconds, peak resident bytes, stdout) of one fresh process; a failure stops the benchmark in its words."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=3600)  # reaps it: its rusage is read from the children's below
    seconds = time.perf_counter() - start
    peak = _peak_of(process)
    if process.returncode not in (0, 1):  # forensics exits 1 for a model with a problem: still a full run
        sys.exit(f"{' '.join(command[-4:])} failed ({process.returncode}):\n{out[-2000:]}{err[-2000:]}")
    return seconds, peak, out


def _peak_of(process: subprocess.Popen) -> int:
    """The peak resident set of the process just reaped: RUSAGE_CHILDREN's maximum is over every child so far, so
    each run is measured from an interpreter of its own that starts no other (one())."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def one(kind: str, model: Path, workdir: Path) -> tuple[float, int, str]:
    """One measurement in a process of its own (so the children's maximum is this run's alone)."""
    probe = [sys.executable, __file__, "--one", kind, str(model), str(workdir)]
    run = subprocess.run(probe, cwd=ROOT, capture_output=True, text=True, timeout=4000)
    if run.returncode != 0:
        sys.exit(run.stdout[-2000:] + run.stderr[-2000:])
    seconds, peak, extra = run.stdout.strip().splitlines()[-1].split("\t")
    return float(seconds), int(peak), extra


def run_one(kind: str, model: Path, workdir: Path) -> None:
    script = workdir / "to_end.rewind"
    script.write_text("continue\nquit\n")
    commands = {"eager": [sys.executable, "-c", EAGER.format(folder=str(model.parent), module=model.stem)],
                "debug": [*REWIND, "debug", str(model), "--driver", "torch:cpu", "-x", str(script)],
                "forensics": [*REWIND, "forensics", str(model), "--driver", "torch:cpu"]}
    seconds, peak, out = measured(commands[kind], workdir)
    extra = out.strip().splitlines()[-1] if kind == "eager" else ""
    print(f"{seconds}\t{peak}\t{extra or '-'}")


def rows(model: Path) -> list[str]:
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder)
        os.environ["REWIND_CACHE_DIR"] = str(workdir / "cache")
        eager_s, eager_peak, weights = one("eager", model, workdir)
        weights = int(weights)
        out = [f"| {model.stem}: weights | {weights / 2**30:.2f} GiB | | |",
               f"| eager forward, fresh process | {eager_s:.1f} s | {eager_peak / 2**30:.2f} GiB "
               f"({eager_peak / weights:.1f}x weights) | 1.00x |"]
        for kind, what in (("debug", "`rewind debug`, launch and continue to the end"),
                           ("forensics", "`rewind forensics`, the whole report")):
            seconds, peak, _ = one(kind, model, workdir)
            target = " (target <= 3x: " + ("met" if peak <= 3 * weights else "MISSED") + ")" if kind == "forensics" \
                else ""
            out.append(f"| {what} | {seconds:.1f} s | {peak / 2**30:.2f} GiB ({peak / weights:.1f}x weights){target} "
                       f"| {seconds / eager_s:.2f}x |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-1b", action="store_true", help="also the ~1.1B LLaMA-shaped model")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # internal: one measurement, in its own process
    args = parser.parse_args()
    if args.one:
        kind, model, workdir = args.one
        run_one(kind, Path(model), Path(workdir))
        return
    models = [MODELS / "gpt2_small.py"] + ([MODELS / "llama_1b.py"] if args.llama_1b else [])
    print(f"# benchmarks/scale.py, {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
          f"torch:cpu")
    print("| measure | wall | peak memory | x eager wall |")
    print("|---|---|---|---|")
    for model in models:
        for row in rows(model):
            print(row)


if __name__ == "__main__":
    main()
