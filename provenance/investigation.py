"""One whole forensic investigation of a pass, as the one-shot command runs it, in words or as JSON.

Run to the end; find where the first NaN/Inf was born and where the pass first left its
reference; classify both; show how the error grew and where it reached the outputs; and,
when the outputs are off, search for the nodes whose higher precision fixes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from provenance.ablation import DEFAULT_MAX_TRIALS, Search, search
from provenance.compare import Comparison
from provenance.forensics import Finding, WithForensics


@dataclass
class Investigation:
    program: str
    driver: str
    reference: str
    nodes: int
    nonfinite: Finding | None
    divergence: Finding | None
    outputs: list[Comparison]
    ablation: Search | None

    @property
    def problem(self) -> bool:
        return self.nonfinite is not None or self.divergence is not None or not all(c.within for c in self.outputs)

    def to_dict(self) -> dict:
        return {"program": self.program, "driver": self.driver, "reference": self.reference, "nodes": self.nodes,
                "problem": self.problem,
                "nonfinite": self.nonfinite.to_dict() if self.nonfinite else None,
                "divergence": self.divergence.to_dict() if self.divergence else None,
                "outputs": [c.to_dict() for c in self.outputs],
                "ablation": self.ablation.to_dict() if self.ablation else None}


def investigate(session: WithForensics, ablate: bool = True, max_trials: int = DEFAULT_MAX_TRIALS) -> Investigation:
    f = session.forensics
    nonfinite = f.first_nonfinite()
    if nonfinite is not None:
        f.with_reference(nonfinite)
    divergence = f.first_divergence()
    outputs = f.outputs()
    needs_fix = not all(c.within for c in outputs)
    found = search(f, max_trials=max_trials) if ablate and needs_fix else None
    return Investigation(session.options.program, session.tl.driver.name, f.spec, len(session.program.nodes),
                         nonfinite, divergence, outputs, found)


# -- in words ----------------------------------------------------------------------------------------------

def render(inv: Investigation, sources: dict[str, str]) -> str:
    lines = [f"Rewind forensics: {inv.program} ({inv.nodes} nodes on {inv.driver}, reference {inv.reference})", ""]
    if inv.nonfinite:
        lines += _finding("First NaN/Inf", inv.nonfinite, sources)
        if inv.nonfinite.reference_agrees:
            lines.append("  the reference has the same non-finite values: no precision removes them, "
                         "the code must change")
        elif inv.nonfinite.reference_agrees is False:
            lines.append("  the reference is finite here: this pass's precision causes it")
        lines.append("")
    if inv.divergence:
        lines += _finding("First divergence from the reference", inv.divergence, sources)
        lines += _growth(inv.divergence)
        lines.append("")
    if not inv.nonfinite and not inv.divergence:
        lines += ["No NaN/Inf was born in this pass and no node diverges from the reference.", ""]
    lines.append("Outputs against the reference:")
    lines += [f"  {_comparison(c)}" for c in inv.outputs]
    if inv.ablation:
        lines += ["", _ablation(inv.ablation)]
    lines += ["", "Verdict: " + ("problem found" if inv.problem else "clean")]
    return "\n".join(lines)


def _finding(title: str, found: Finding, sources: dict[str, str]) -> list[str]:
    d, node = found.details, found.node
    where = f"{Path(node.loc.file).name}:{node.loc.line}" if node.loc else "no source line"
    code = _source_line(node.loc.file, node.loc.line, sources) if node.loc else ""
    first = f", first at {list(d.first_index)}" if d.first_index is not None else ""
    if found.kind == "nonfinite":
        what = f"wrote {d.count} {'NaN' if d.filter == 'nan' else 'Inf'} into '{d.value}'{first}"
    else:
        what = f"'{d.value}' has {d.count} element(s) beyond tolerance{first}"
    out = [f"{title}: {where}" + (f"    {code}" if code else ""),
           f"  node {node.name} ({node.op}{', in ' + node.module_path if node.module_path else ''}) {what}"]
    out += [f"  input {name}: {_stats(s)}" for name, s in d.inputs.items()]
    if found.observed:
        out.append(f"  against the reference: {_comparison(found.observed)}")
    if found.introduced:
        out.append(f"  introduced by this node alone: error {_ratio(found.introduced.error)} x tolerance "
                   f"({'within' if found.introduced.within else 'beyond'})")
    if found.match:
        m = found.match
        out += [f"  pattern: {m.pattern.title} [{m.pattern.name}]", f"    {m.reason}", f"  fix: {m.pattern.fix}"]
    else:
        out.append("  pattern: none of the known failure patterns matches")
    return out


def _growth(found: Finding) -> list[str]:
    if not found.growth:
        return []
    steps = ", ".join(f"{p['node']} {_ratio(p['error'])}" for p in found.growth)
    return [f"  error growth downstream (x tolerance): {steps}"]


def _ablation(result: Search) -> str:
    if result.found is None:
        return f"Precision ablation ({result.trials} trials): {result.note or 'no fix found'}"
    a = result.found
    nodes = ", ".join(f"{n.name} at {d}" for n, d in zip(a.nodes, a.dtypes))
    before = max(c.error for c in a.before)
    after = max(c.error for c in a.after)
    note = f"; {result.note}" if result.note else ""
    return (f"Precision ablation ({result.trials} trials from checkpoints, no rebuild): running {nodes} brings the "
            f"outputs within tolerance (error {_ratio(before)} -> {_ratio(after)} x tolerance){note}")


def _comparison(c: Comparison) -> str:
    verdict = "within tolerance" if c.within else "BEYOND TOLERANCE"
    bad = f", {c.nonfinite} NaN/Inf" if c.nonfinite else ""
    return (f"'{c.value}' ({c.dtype}): {c.mismatches} of {c.numel} elements beyond tolerance{bad}, max abs "
            f"{c.max_abs:.3g}, rmse {c.rmse:.3g}, cosine {c.cosine:.6f}, error {_ratio(c.error)} x tolerance: "
            f"{verdict}")


def _stats(s: dict) -> str:
    bad = "".join(f", {s[k]} {k.upper() if k == 'nan' else 'Inf'}" for k in ("nan", "inf") if s.get(k))
    return f"min {s['min']:.7g}, max {s['max']:.7g}, mean {s['mean']:.7g}{bad}"


def _ratio(x: float | str) -> str:
    return x if isinstance(x, str) else f"{x:.3g}"


def _source_line(file: str, line: int, sources: dict[str, str]) -> str:
    text = sources.get(file)
    lines = text.splitlines() if text else []
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""
