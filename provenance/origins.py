"""The root cause of a divergence: where upstream the error was introduced, and which nodes amplified it.

The first node beyond tolerance is often not where the error came from: a `cos` computes exactly
what it is given, and what it is given (positions counted in float16 beyond 2048) is off by a whole
radian; a `sub` gives back a small value that the `add` before it rounded away against a large one.
Each of those upstream nodes is within its own relative tolerance; what matters is its error in
absolute terms against what the divergent value is sensitive to (its own absolute tolerance).

So: measure what each node upstream introduces alone (its rerun on the reference's inputs), rank
the nodes by that absolute error over the divergent value's absolute tolerance, and confirm the
best few with two precision ablations each: the nodes from the candidate down to the divergence
at higher precision fix the outputs (or cut their error most), the same nodes without the
candidate do not. A confirmed candidate is the origin; the nodes on the way whose error grew are
its amplifiers, each with the factor measured. The walk is bounded: MAX_UPSTREAM nodes measured,
MAX_CANDIDATES confirmed (two ablations each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hardware.errors import RewindError
from hardware.program import Node
from provenance.ablation import Ablation, ablate, wider_dtype
from provenance.births import node_dict
from provenance.compare import Comparison, abs_tolerance
from provenance.forensics import Finding, Forensics
from provenance.lineage import descendants, lineage
from provenance.patterns import Match, classify, times
from provenance.steps import op_name

MAX_UPSTREAM = 32  # nodes upstream of a divergence whose introduced error is measured
MAX_CANDIDATES = 2  # upstream nodes confirmed by ablation, two ablations each
SENSITIVE = 1.0  # a candidate's absolute error must reach this many of the divergent value's tolerances
GROWTH = 2.0  # a node on the way amplifies when the error (x tolerance) at least doubles there


@dataclass(frozen=True)
class Amplifier:
    node: Node
    tick: int
    factor: float  # the error (x tolerance) after the node over the largest before it on the way

    def to_dict(self) -> dict:
        return {**node_dict(self.node), "tick": self.tick, "factor": self.factor, "growth": times(self.factor)}


@dataclass
class Origin:
    """Where a divergence's error was introduced upstream of the first node beyond tolerance."""

    node: Node
    tick: int
    introduced: Comparison  # the node alone, rerun on the reference's inputs
    sensitivity: float  # its absolute error over the divergent value's absolute tolerance
    with_origin: Ablation  # the nodes from the origin to the divergence at higher precision
    without_origin: Ablation | None  # the same nodes but the origin (None: there were no others)
    match: Match | None = None
    amplified_by: list[Amplifier] = field(default_factory=list)

    @property
    def confirmed(self) -> bool:
        fixed_here = self.with_origin.fixed and not (self.without_origin and self.without_origin.fixed)
        cut = worst(self.with_origin.after)
        return fixed_here or (math.isfinite(cut) and cut * GROWTH <= worst(self.without_after))

    @property
    def without_after(self) -> list[Comparison]:
        return self.without_origin.after if self.without_origin else self.with_origin.before

    def to_dict(self) -> dict:
        return {**node_dict(self.node), "tick": self.tick, "introduced": self.introduced.to_dict(),
                "sensitivity": self.sensitivity, "confirmed": self.confirmed,
                "confirmation": {"withOrigin": _trial(self.with_origin.nodes, self.with_origin),
                                 "withoutOrigin": _trial(self.without_origin.nodes, self.without_origin)
                                 if self.without_origin else None,
                                 **({} if self.without_origin else
                                    {"withoutOriginReason": "no other node on the way can run wider"}),
                                 "before": worst(self.with_origin.before)},
                "pattern": self.match.to_dict() if self.match else None,
                **({} if self.match else {"patternReason": "none of the known failure patterns matches"})}


def trace_origin(forensics: Forensics, found: Finding) -> tuple[Origin | None, str]:
    """The confirmed origin upstream of a divergence `found`, and in words why (or why there is none); traced once
    per finding and branch (the report, the problems and the firstDivergence request all ask)."""
    patches = forensics.timeline.patches
    key = (found.kind, found.tick, tuple(sorted(patches.items(), key=lambda kv: kv[0])))
    if key not in forensics.origins:
        forensics.origins[key] = _traced(forensics, found)
    return forensics.origins[key]


def _traced(forensics: Forensics, found: Finding) -> tuple[Origin | None, str]:
    if found.kind != "divergence" or found.observed is None:
        return None, "only a divergence is traced upstream"
    if all(c.within for c in forensics.outputs()):
        return None, "the outputs are within tolerance: no ablation can confirm an origin upstream"
    ranked = _candidates(forensics, found)
    if not ranked:
        return None, (f"no node upstream introduces an error `{op_name(found.node)}` is sensitive "
                      "to: it introduced the error itself")
    for node, sensitivity in ranked[:MAX_CANDIDATES]:
        try:
            origin = _confirm(forensics, found, node, sensitivity)
        except RewindError as exc:  # this candidate cannot be confirmed: said, and the next one is tried
            forensics.not_run(node, "confirmation as the origin", exc)
            continue
        if origin.confirmed:
            origin.match = _classify(forensics, node)
            origin.amplified_by = amplifiers(forensics, origin.node, found)
            return origin, f"confirmed by precision ablation of {len(origin.with_origin.nodes)} node(s)"
    tried = ", ".join(n.name for n, _ in ranked[:MAX_CANDIDATES])
    return None, f"no upstream node's precision explains the outputs' error (tried {tried}): the error is introduced here"


def _candidates(forensics: Forensics, found: Finding) -> list[tuple[Node, float]]:
    """Nodes upstream that can run wider, by their introduced absolute error over what the divergent value is
    sensitive to, worst first; errors within a factor of two of each other rank upstream first (a node that
    reads a rounded value reruns on it rounded again and shows the same error as the node that rounded it)."""
    program, value = forensics.program, found.observed.value
    rtol, atol = forensics.tolerance.for_dtype(forensics.precision[value])
    tolerance = abs_tolerance(forensics.reference.value(value), rtol, atol)
    upstream = [program.nodes[i] for i in lineage(program, value, MAX_UPSTREAM + 1).nodes if i != found.node.index]
    scored = []
    for node in upstream:
        if wider_dtype(forensics, node) is None or not forensics.floating_outputs(node):
            continue
        error = max((c.max_abs for c in forensics.introduced(node)), default=0.0)
        sensitivity = error / tolerance if tolerance > 0 else (math.inf if error > 0 else 0.0)
        if sensitivity >= SENSITIVE:
            scored.append((node, sensitivity))
    return sorted(scored, key=lambda s: (-math.floor(math.log2(s[1])) if math.isfinite(s[1]) else -math.inf,
                                         s[0].index))


def _confirm(forensics: Forensics, found: Finding, node: Node, sensitivity: float) -> Origin:
    way = [n for n in _way(forensics, node, found.node) if wider_dtype(forensics, n) is not None]
    before = forensics.outputs()
    with_origin = ablate(forensics, way, before=before)
    others = [n for n in way if n.index != node.index]
    without_origin = ablate(forensics, others, before=before) if others else None
    introduced = max(forensics.introduced(node), key=lambda c: c.max_abs)
    return Origin(node, forensics.timeline.node_tick[node.index], introduced, sensitivity, with_origin, without_origin)


def _way(forensics: Forensics, origin: Node, to: Node) -> list[Node]:
    """The nodes on the paths from `origin` to `to`, both included, in execution order."""
    program = forensics.program
    feeding = {i for name in to.outputs for i in lineage(program, name).nodes}
    between = [i for i in descendants(program, origin.index) if i in feeding and i != to.index]
    return [origin] + [program.nodes[i] for i in between] + [to]


def amplifiers(forensics: Forensics, origin: Node, found: Finding) -> list[Amplifier]:
    """The nodes from the origin to the divergence where the observed error (x tolerance) at least doubles."""
    last = _observed_error(forensics, origin)
    out = []
    for node in _way(forensics, origin, found.node)[1:]:
        error = _observed_error(forensics, node)
        if error >= GROWTH * last:
            out.append(Amplifier(node, forensics.timeline.node_tick[node.index],
                                 error / last if last > 0 else math.inf))
            last = error
    return out


def _observed_error(forensics: Forensics, node: Node) -> float:
    return max((c.error for c in forensics.observed(node)), default=0.0)


def _classify(forensics: Forensics, node: Node) -> Match | None:
    tick = forensics.timeline.node_tick[node.index]
    observed = max(forensics.observed(node), key=lambda c: c.error)
    introduced = {c.value: c for c in forensics.introduced(node)}[observed.value]
    return classify(forensics.evidence("divergence", tick, node, observed.value, observed, introduced))


def headline(origin: Origin, found: Finding) -> str:
    """In words: "error introduced at rotary.py:13 by `arange`, amplified 261x by `cos` at rotary.py:15"."""
    text = f"error introduced at {where(origin.node)} by `{op_name(origin.node)}`{_title(origin.match)}"
    steps = [f"{times(a.factor)} by `{op_name(a.node)}` at {where(a.node)}"
             f"{_title(found.match) if a.node.index == found.node.index else ''}" for a in origin.amplified_by]
    return text + (", amplified " + ", then ".join(steps) if steps else "")


def traced_dict(found: Finding, origin: Origin | None, note: str) -> dict:
    """A divergence as JSON with its traced origin and amplifiers (or the reason it has no origin)."""
    out = {**found.to_dict(), "origin": origin.to_dict() if origin else None,
           "amplifiedBy": [a.to_dict() for a in origin.amplified_by] if origin else []}
    if origin is None:
        out["originReason"] = note
    else:
        out["headline"] = headline(origin, found)
    return out


def _title(match: Match | None) -> str:
    return f" ({match.pattern.title})" if match else ""


def where(node: Node) -> str:
    """A node's place for a person: file name and line."""
    return f"{node.loc.file.rsplit('/', 1)[-1]}:{node.loc.line}" if node.loc else f"node '{node.name}'"


def worst(comparisons: list[Comparison]) -> float:
    """The worst error (x tolerance) among outputs."""
    return max((c.error for c in comparisons), default=0.0)


def _trial(nodes: list[Node], ablation: Ablation) -> dict:
    return {"nodes": [n.name for n in nodes], "after": worst(ablation.after), "fixed": ablation.fixed}
