"""The planted-bug table: on every planted model, does forensics' headline name the planted line, does the
repair loop validate a fix, and are the cheats rejected?

For each model: `investigate` (provenance/investigation.py) gives the headline and the root node, checked
against the line marked `# BUG` in the model file; the repair loop (provenance/repair.py) then tries the
knowledge base's suggestions (a fresh knowledge base: only the built-in recipes) on the default input sets,
and, for the models with a NaN/Inf at an output, a masking cheat made for the model (the node writing the
output, its NaN/Inf replaced by zeros); the log-of-softmax model also gets its float64 band-aid and a patch
that returns float64. Prints a Markdown table for benchmarks/RESULTS.md.

    python benchmarks/planted.py [--quick]     (--quick: 1 seed, scales 0.125 and 8, no shape sets)
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hardware.session import LaunchOptions, Session  # noqa: E402
from provenance.inputs import DEFAULT_SCALES, InputPlan  # noqa: E402
from provenance.investigation import investigate  # noqa: E402
from provenance.knowledge import KnowledgeBase  # noqa: E402
from provenance.repair import FixText, RepairLoop  # noqa: E402

MODELS = ROOT / "tests" / "models"
FIXES = MODELS / "fixes"
MARKER = "# BUG"


@dataclass(frozen=True)
class Case:
    path: Path
    entry: str = "build"
    cheats: tuple[str, ...] = ()  # fix files in tests/models/fixes/ that must be rejected

    @property
    def label(self) -> str:
        return self.path.stem + ("" if self.entry == "build" else f":{self.entry}")


CASES = [Case(MODELS / "forensics" / f"{name}.py") for name in (
    "softmax_overflow", "rsqrt_no_epsilon", "log_domain", "sqrt_domain", "cancellation", "bf16_accumulation",
    "masked_row", "half_positions", "swamping", "half_overflow", "half_reduction")] + [
    Case(MODELS / "forensics" / "log_of_softmax.py", cheats=("softmax_in_float64.py", "softmax_returns_float64.py")),
    Case(MODELS / "repair" / "rms_norm_no_eps.py", cheats=("nan_to_zero.py",)),
    Case(MODELS / "repair" / "rms_norm_no_eps.py", "build_with_bias", cheats=("nan_to_zero.py",)),
    Case(MODELS / "repair" / "gated_experts.py"),
]

MASK = '''import torch


def masked(*args, **kwargs):
    """{op}, its NaN/Inf replaced by zeros: hides the problem at the output, prevents nothing."""
    return torch.nan_to_num(torch.ops.{op}(*args, **kwargs), nan=0.0, posinf=0.0, neginf=0.0)


PATCHES = {{"{node}": masked}}
'''


def marked_line(path: Path) -> int | None:
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if MARKER in text:
            return number
    return None


def launched(case: Case) -> Session:
    session = Session()
    session.launch(LaunchOptions(str(case.path), entry=case.entry, driver="torch:cpu", budget_mb=256))
    return session


def masking_cheat(session: Session, inv) -> FixText | None:
    """For a NaN/Inf that reaches an output: the output's writer with nan_to_num around it."""
    if inv.nonfinite is None or all(c.nonfinite == 0 for c in inv.outputs):
        return None
    program = session.program
    writer = program.nodes[program.values[program.outputs[0]].producer]
    text = MASK.format(op=writer.op, node=writer.name)
    return FixText(text, f"<mask {writer.name}>", f"nan_to_num at {writer.name} (masking)")


def row(case: Case, plan: InputPlan) -> dict:
    started = time.perf_counter()
    session = launched(case)
    inv = investigate(session, ablate=False)
    planted = marked_line(case.path)
    root = inv.root
    line = root.loc.line if root is not None and root.loc and Path(root.loc.file) == case.path else None
    with tempfile.TemporaryDirectory() as scratch:
        knowledge = KnowledgeBase(Path(scratch) / "fixes.json")
        fixed = RepairLoop(session, knowledge, plan=plan).run([], suggest=True)
        cheats = [FixText((FIXES / c).read_text(), str(FIXES / c)) for c in case.cheats]
        mask = masking_cheat(session, inv)
        cheats += [mask] if mask else []
        verdicts = []
        for cheat in cheats:
            report = RepairLoop(session, KnowledgeBase(Path(scratch) / "cheats.json"), plan=plan).run([cheat],
                                                                                                   suggest=False)
            attempt = report["attempts"][0]
            broken = (attempt["validation"] or {}).get("rules") or [attempt["reason"]]
            verdicts.append((cheat.label, attempt["verdict"], "; ".join(broken)))
    session.close()
    return {"model": case.label, "headline": inv.headline, "line": line, "planted": planted,
            "right": line is not None and line == planted, "fix": fixed["fix"]["name"] if fixed["fix"] else None,
            "fixVerdict": fixed["verdict"], "attempts": len(fixed["attempts"]), "cheats": verdicts,
            "seconds": time.perf_counter() - started}


def table(rows: list[dict]) -> str:
    out = ["| model | headline names line | planted line | origin right | fix validated (attempts) | cheats rejected "
           "| s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        fix = f"{r['fix']} ({r['attempts']})" if r["fix"] else f"none: {r['fixVerdict']} ({r['attempts']})"
        cheats = "; ".join(f"{label}: {'REJECTED' if verdict == 'rejected' else 'ACCEPTED'} ({rules})"
                           for label, verdict, rules in r["cheats"]) or "—"
        out.append(f"| {r['model']} | {r['line']} | {r['planted']} | {'yes' if r['right'] else 'NO'} | {fix} "
                   f"| {cheats} | {r['seconds']:.1f} |")
    return "\n".join(out)


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, scales 0.125 and 8, no shape sets")
    args = parser.parse_args()
    plan = InputPlan(seeds=1, scales=(0.125, 8.0), shapes=0) if args.quick else InputPlan(scales=DEFAULT_SCALES)
    rows = []
    for case in CASES:
        rows.append(row(case, plan))
        r = rows[-1]
        print(f"{r['model']}: {r['headline']}", file=sys.stderr, flush=True)
    print(f"Planted models, {time.strftime('%Y-%m-%d')}, {platform.machine()} {platform.processor() or ''} "
          f"Python {platform.python_version()}, input sets: {plan}")
    print(table(rows))
    right = sum(r["right"] for r in rows)
    fixed = sum(r["fix"] is not None for r in rows)
    cheats = [c for r in rows for c in r["cheats"]]
    rejected = sum(verdict == "rejected" for _, verdict, _ in cheats)
    print(f"\norigin right {right}/{len(rows)}; fix validated {fixed}/{len(rows)}; cheats rejected "
          f"{rejected}/{len(cheats)}")


if __name__ == "__main__":
    main()
