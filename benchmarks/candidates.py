"""The candidates table (issue 29): on each planted candidate of tests/models/candidates/, whether `rewind compare`'s
headline names the planted line (found by its text, never a number), the kernel pattern, the seconds of the
comparison; then its fix: clean under `compare`, and for a function the coverage suite's cases, how many pass and
the seconds of `rewind validate --function`. Runs in this process, one candidate after another. Prints a Markdown
table for benchmarks/RESULTS.md.

    python benchmarks/candidates.py
"""

from __future__ import annotations

import platform
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The repository, not this folder, first: a script here named as a package torch imports would shadow it.
sys.path[0] = str(ROOT)

from provenance.candidates.cli import validate_function  # noqa: E402
from provenance.candidates.comparison import Request, compare_sides  # noqa: E402

HERE = ROOT / "tests" / "models" / "candidates"
REF = str(HERE / "reference.py")
# candidate, its function (None: a model file), the reference, the planted line's text (None: refused)
CASES = [
    ("blocked_attention.py", "blocked_attention", f"{REF}:sdpa_attention", "acc = acc + p @ vb"),
    ("tail_block.py", "tail_attention", f"{REF}:sdpa_attention", "for start in range(0, k.shape[0] - BLOCK + 1"),
    ("off_by_one.py", "offset_attention", f"{REF}:sdpa_attention", "k[start:start + BLOCK - 1]"),
    ("layer_norm.py", "layer_norm", f"{REF}:layer_norm", "mean = x.mean(dim=0, keepdim=True)"),
    ("attention_refactor.py", None, str(HERE / "attention_model.py"), "q = self.k_proj(x)"),
    ("norm_port.py", None, str(HERE / "norm_model.py"), "torch.rsqrt(power + self.eps)"),
    ("wrapper_attention.py", "tiled_attention", f"{REF}:sdpa_attention", None),
]


def planted_line(file: str, text: str) -> int:
    return next(i for i, line in enumerate((HERE / file).read_text().splitlines(), 1) if text in line)


def timed(work):
    started = time.monotonic()
    result = work()
    return result, time.monotonic() - started


def row(file: str, function: str | None, against: str, text: str | None) -> str:
    report, seconds = timed(lambda: compare_sides(Request(str(HERE / file), against, function)))
    if text is None:
        right = report["verdict"] == "refused"
        headline = "refused, call named" if right and "line" in report["reason"] else report["verdict"]
    else:
        right = (report.get("source") or {}).get("line") == planted_line(file, text)
        headline = f"line {report['source']['line']}" if report.get("source") else "no line"
    pattern = (report.get("pattern") or {}).get("pattern", "—")
    fixed = file.replace(".py", "_fixed.py")
    if text is None or not (HERE / fixed).is_file():
        return f"| {file} | {headline} | {'yes' if right else 'NO'} | {pattern} | {seconds:.1f} | — | — | — |"
    clean, _ = timed(lambda: compare_sides(Request(str(HERE / fixed), against, function)))
    if function is None:
        return (f"| {file} | {headline} | {'yes' if right else 'NO'} | {pattern} | {seconds:.1f} | "
                f"{clean['verdict']} | — | — |")
    suite, suite_s = timed(lambda: validate_function(Request(str(HERE / fixed), against, function)))
    passed = sum(c["passed"] for c in suite["cases"])
    return (f"| {file} | {headline} | {'yes' if right else 'NO'} | {pattern} | {seconds:.1f} | {clean['verdict']} | "
            f"{passed}/{len(suite['cases'])} | {suite_s:.1f} |")


def main() -> None:
    warnings.filterwarnings("ignore")
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}")
    print("| candidate | headline | right | pattern | compare s | fix under compare | fix's coverage cases passed | "
          "validate s |")
    print("|---|---|---|---|---|---|---|---|")
    for case in CASES:
        print(row(*case), flush=True)


if __name__ == "__main__":
    main()
