"""One whole forensic investigation of a pass, as the one-shot command runs it, in words or as JSON.

Run to the end; find where the first NaN/Inf that is a problem was born (one that reaches an
output, or that the reference does not share: a -inf written on purpose and discarded by a
`where` before any output, as T5's log(0), is reported as absorbed and is no problem) and where
the pass first left its reference; trace a divergence upstream to the node that introduced its
error (provenance/origins.py); classify them; show how the error grew and where it reached the
outputs; and, when the outputs are off, search for the nodes whose higher precision fixes them.
The `headline` names the root cause in one sentence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

from hardware.errors import RewindError
from hardware.program import Node
from provenance.ablation import DEFAULT_MAX_TRIALS, Search, search
from provenance.births import Birth, node_dict
from provenance.compare import Comparison
from provenance.forensics import Finding, Forensics, WithForensics
from provenance.reference import check_spec
from provenance.trajectory import trajectory
from provenance.origins import Origin, headline, op_name, trace_origin, traced_dict, where, worst

T = TypeVar("T")


@dataclass
class Investigation:
    program: str
    driver: str
    reference: str
    nodes: int
    nonfinite: Finding | None  # the first NaN/Inf birth that is a problem
    divergence: Finding | None
    outputs: list[Comparison]
    ablation: Search | None
    absorbed: list[Birth] = field(default_factory=list)  # NaN/Inf written on purpose: absorbed, the reference's too
    origin: Origin | None = None  # where the divergence's error was introduced, when upstream of it
    origin_note: str = ""  # how the origin was confirmed, or why there is none
    trials: list[dict] = field(default_factory=list)  # what could not run: {"node", "trial", "ran": False, "why"}
    trajectory: list[dict] = field(default_factory=list)  # a training run's drift from a free-running reference

    @property
    def problem(self) -> bool:
        return self.nonfinite is not None or self.divergence is not None or not all(c.within for c in self.outputs)

    @property
    def headline(self) -> str:
        """The root cause in one sentence: the earliest of the NaN/Inf birth and the divergence's origin."""
        if not self.problem:
            unchecked = [t["trial"] for t in self.trials if t["node"] is None]
            if unchecked:
                return f"no problem found, but {'; '.join(unchecked)} could not run (see the trials)"
            return "clean" + (f" ({_absorbed_count(self.absorbed)} written on purpose and absorbed before any "
                              "output, as in the reference)" if self.absorbed else "")
        if self.divergence is None and self.nonfinite is None:
            return "the outputs are beyond tolerance of the reference, though no single node diverges from it"
        divergence = self.divergence and _divergence_headline(self.divergence, self.origin)
        nonfinite = self.nonfinite and _nonfinite_headline(self.nonfinite)
        if divergence is None or nonfinite is None:
            return divergence or nonfinite
        return f"{divergence}; then {nonfinite}" if self._divergence_first else nonfinite

    @property
    def root(self) -> Node | None:
        """The node the headline names first: the divergence's origin, or the NaN/Inf birth when that came earlier."""
        if not self.problem or (self.divergence is None and self.nonfinite is None):
            return None
        if self.nonfinite is None or (self.divergence is not None and self._divergence_first):
            return self.origin.node if self.origin else self.divergence.node
        return self.nonfinite.node

    @property
    def _divergence_first(self) -> bool:
        return (self.origin.tick if self.origin else self.divergence.tick) < self.nonfinite.tick

    def to_dict(self) -> dict:
        return {"program": self.program, "driver": self.driver, "reference": self.reference, "nodes": self.nodes,
                "problem": self.problem, "headline": self.headline, "root": node_dict(self.root) if self.root else None,
                **({} if self.root else {"rootReason": "no problem found" if not self.problem else
                                         "the outputs are off though no single node diverges"}),
                "nonfinite": self.nonfinite.to_dict() if self.nonfinite else None,
                **({} if self.nonfinite else {"nonfiniteReason": _no_nonfinite(self.absorbed)}),
                "absorbed": [{**b.to_dict(), "referenceHasIt": True} for b in self.absorbed],
                "divergence": self._divergence_dict(),
                **({} if self.divergence else {"divergenceReason": "no node leaves the reference by more than its "
                                                                   "tolerance"}),
                "outputs": [c.to_dict() for c in self.outputs],
                "trials": self.trials, "trajectory": self.trajectory,
                "ablation": self.ablation.to_dict() if self.ablation else None,
                **({} if self.ablation else {"ablationReason": "the outputs are within tolerance, or ablation was "
                                                               "not asked for (--no-ablate)"})}

    def _divergence_dict(self) -> dict | None:
        return traced_dict(self.divergence, self.origin, self.origin_note) if self.divergence else None


def investigate(session: WithForensics, ablate: bool = True, max_trials: int = DEFAULT_MAX_TRIALS,
                origin: bool = True, drift: bool = True) -> Investigation:
    """The whole investigation; `origin: False` skips tracing the divergence upstream (its ablations) and `drift:
    False` a training run's free-running trajectory (a second reference pass), for callers that need the findings
    only (the repair loop)."""
    f = session.forensics
    f.record_to_end()  # what the pass cannot run is the program's own failure, not one of an analysis
    check_spec(f.spec)  # and a reference that names nothing usable is the options' (both: exit 2)
    nonfinite = _degrading(f, "the search for the first NaN/Inf", f.first_nonfinite, None)
    if nonfinite is not None:
        _degrading(f, "the NaN/Inf's comparison with the reference", lambda: f.with_reference(nonfinite), None)
    absorbed = [b for b in _degrading(f, "the NaN/Inf births", f.births, []) if _degrading(
        f, f"the reference's value of {b.value}", lambda: f.harmless(b), False)]
    divergence = _degrading(f, "the search for the first divergence", f.first_divergence, None)
    traced, note = (_degrading(f, "the trace of the divergence upstream", lambda: trace_origin(f, divergence),
                               (None, "not traced: it could not run (see trials)"))
                    if divergence and origin else (None, "not traced"))
    outputs = _degrading(f, "the outputs' comparison with the reference", f.outputs, [])
    needs_fix = not all(c.within for c in outputs)
    found = _degrading(f, "the precision search", lambda: search(f, max_trials=max_trials), None) \
        if ablate and needs_fix else None
    budget = int((session.options.budget_mb if session.options else 1024) * 2**20)
    curve = _degrading(f, "the free-running reference's trajectory", lambda: trajectory(
        f.spec, session.program, budget, lambda n: f.test_value(n, session.tl.end),
        f.progress("free-running reference"), f.collectives), []) if drift else []
    return Investigation(session.options.program, session.tl.driver.name, f.spec, len(session.program.nodes),
                         nonfinite, divergence, outputs, found, absorbed, traced, note, list(f.unrun), curve)


def _degrading(f: Forensics, what: str, work: Callable[[], T], otherwise: T) -> T:
    """`work()`, or `otherwise` when it cannot run: said among the report's trials, and the rest of the report
    stands (an analysis degrades, never ends the report)."""
    try:
        return work()
    except RewindError as exc:
        f.not_run(None, what, exc)
        return otherwise


def _divergence_headline(found: Finding, origin: Origin | None) -> str:
    if origin is not None:
        return headline(origin, found)
    how = ("error introduced" if found.introduced is not None and not found.introduced.within
           else "error accumulated beyond tolerance")
    title = f" ({found.match.pattern.title})" if found.match else ""
    return f"{how} {found.where('by')}{title}"


def _nonfinite_headline(found: Finding) -> str:
    what = "NaN" if found.details.filter == "nan" else "Inf"
    title = f" ({found.match.pattern.title})" if found.match else ""
    return f"{found.details.count} {what} born {found.where()}{title}"


def _no_nonfinite(absorbed: list[Birth]) -> str:
    if absorbed:
        return ("every NaN/Inf of this pass is written on purpose: absorbed before any output, and the reference "
                "has it too (see absorbed)")
    return "no node wrote a NaN/Inf its inputs did not carry, but for infinities given as constants (masks)"


def _absorbed_count(absorbed: list[Birth]) -> str:
    return f"{len(absorbed)} NaN/Inf birth{'s' if len(absorbed) > 1 else ''}"


# -- in words ----------------------------------------------------------------------------------------------

def render(inv: Investigation, sources: dict[str, str]) -> str:
    lines = [f"Rewind forensics: {inv.program} ({inv.nodes} nodes on {inv.driver}, reference {inv.reference})", "",
             f"Root cause: {inv.headline}", ""]
    if inv.nonfinite:
        lines += _finding("First NaN/Inf", inv.nonfinite, sources)
        if inv.nonfinite.reference_agrees:
            lines.append("  the reference has the same non-finite values: no precision removes them, "
                         "the code must change")
        elif inv.nonfinite.reference_agrees is False:
            lines.append("  the reference is finite here: this pass's precision causes it")
        lines.append("")
    if inv.absorbed:
        lines += ["NaN/Inf written on purpose (the reference has them too; removed before any output, not a problem):"]
        lines += [f"  {_absorbed(b)}" for b in inv.absorbed] + [""]
    if inv.divergence:
        lines += _finding("First divergence from the reference", inv.divergence, sources)
        lines += _origin(inv.origin, inv.origin_note, inv.divergence)
        lines += _growth(inv.divergence)
        lines.append("")
    if not inv.nonfinite and not inv.divergence:
        lines += ["No NaN/Inf that matters was born in this pass and no node diverges from the reference.", ""]
    lines.append("Outputs against the reference:")
    lines += [f"  {_comparison(c)}" for c in inv.outputs]
    if inv.ablation:
        lines += ["", _ablation(inv.ablation)]
    if inv.trajectory:
        worst = max(inv.trajectory, key=lambda p: p["difference"])
        lines += ["", "Trajectory (not a finding: each step above is compared from the program's own state): against "
                  "a float64 run following its own trajectory, the losses part by up to "
                  f"{worst['difference']:.3g} of the loss (step {worst['step']}): " +
                  ", ".join(f"{p['difference']:.2g}" for p in inv.trajectory)]
    if inv.trials:
        lines += ["", "Could not run (the rest of the report stands without them):"]
        lines += [f"  {t['trial']}" + (f" of {t['node']}" if t["node"] else "") + f": {t['why']}" for t in inv.trials]
    lines += ["", "Verdict: " + ("problem found" if inv.problem else "clean")]
    return "\n".join(lines)


def _absorbed(birth: Birth) -> str:
    what = "NaN" if birth.kind == "nan" else "Inf"
    removed = (", ".join(f"`{op_name(n)}` ('{n.name}') at {where(n)}" for n in birth.absorbed_at)
               if birth.absorbed_at else "nothing: no node reads it")
    return f"{birth.count} {what} born at {where(birth.node)} in `{op_name(birth.node)}` ('{birth.node.name}'), removed by {removed}"


def _origin(origin: Origin | None, note: str, found: Finding) -> list[str]:
    if origin is None:
        return [f"  root cause: this node ({note})"]
    cut = origin.with_origin
    without = (f"; without `{op_name(origin.node)}` they stay at {_ratio(worst(origin.without_after))} x tolerance"
               if origin.without_origin else "")
    lines = [f"  root cause upstream: {headline(origin, found)}",
             f"    `{op_name(origin.node)}` ('{origin.node.name}') alone is off by up to {origin.introduced.max_abs:.3g}, "
             f"{origin.sensitivity:.3g} times what the divergent value tolerates",
             f"    confirmed: {len(cut.nodes)} node(s) from it at higher precision take the outputs from "
             f"{_ratio(worst(cut.before))} to {_ratio(worst(cut.after))} x tolerance{without}"]
    if origin.match:
        lines += [f"    pattern: {origin.match.pattern.title} [{origin.match.pattern.name}]",
                  f"      {origin.match.reason}", f"    fix: {origin.match.fix}"]
    return lines


def _finding(title: str, found: Finding, sources: dict[str, str]) -> list[str]:
    d, node, loc = found.details, found.node, found.place
    where = found.where() if node.phase != "forward" else f"{Path(loc.file).name}:{loc.line}" if loc else \
        "no source line"
    code = _source_line(loc.file, loc.line, sources) if loc else ""
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
        out.append(f"  introduced by this node alone: error {_ratio(found.introduced.error)} (x tolerance) "
                   f"({'within' if found.introduced.within else 'beyond'})")
    if found.match:
        m = found.match
        out += [f"  pattern: {m.pattern.title} [{m.pattern.name}]", f"    {m.reason}", f"  fix: {m.fix}"]
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
            f"{c.max_abs:.3g}, rmse {c.rmse:.3g}, {_cosine(c)}, error {_ratio(c.error)} (x tolerance): "
            f"{verdict}")


def _stats(s: dict) -> str:
    bad = "".join(f", {s[k]} {k.upper() if k == 'nan' else 'Inf'}" for k in ("nan", "inf") if s.get(k))
    return f"min {s['min']:.7g}, max {s['max']:.7g}, mean {s['mean']:.7g}{bad}"


def _cosine(c: Comparison) -> str:
    return "cosine undefined (NaN/Inf)" if c.cosine is None else f"cosine {c.cosine:.6f}"


def _ratio(x: float | str) -> str:
    """A multiple of the tolerance in words: never "inf" or "1e+304"."""
    x = float(x)
    return "infinite" if math.isinf(x) else "more than a million" if x > 1e6 else f"{x:.3g}"


def _source_line(file: str, line: int, sources: dict[str, str]) -> str:
    text = sources.get(file)
    lines = text.splitlines() if text else []
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""
