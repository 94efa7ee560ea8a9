"""Precision ablation: run nodes at higher precision on a branch of the timeline and measure the outputs.

`ablate` restores the state before the first chosen node (the Timeline's checkpoints and
retained values: no re-export, no rerun from the start), re-executes from there with those
nodes at higher precision, compares the outputs with the reference before and after, and
undoes the branch, so the original pass comes back bit for bit. `search` finds a small set
of nodes that brings the outputs within tolerance: nodes ranked by the error they introduce,
the top 1, 2, 4, ... tried until one set fixes the outputs, then pruned one chunk at a time
(lowest-ranked first) while the rest still fixes them. The set is wherever the culprits are:
not a prefix or a suffix of the graph.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from checkpoint.branch import PrecisionPatch
from hardware.errors import RewindError
from hardware.program import Node
from provenance.compare import Comparison
from provenance.forensics import Forensics, is_floating

WIDER = {"bfloat16": "float32", "float16": "float32", "float32": "float64"}
DEFAULT_MAX_TRIALS = 64


@dataclass
class Ablation:
    nodes: list[Node]
    dtypes: list[str]  # the precision each node ran at
    before: list[Comparison]  # the outputs against the reference, as the pass ran
    after: list[Comparison]  # the outputs with the nodes at higher precision
    seconds: float

    @property
    def fixed(self) -> bool:
        return all(c.within for c in self.after)

    def to_dict(self) -> dict:
        return {"nodes": [{"node": n.name, "op": n.op, "dtype": d, "source": str(n.loc) if n.loc else None}
                          for n, d in zip(self.nodes, self.dtypes)],
                "before": [c.to_dict() for c in self.before], "after": [c.to_dict() for c in self.after],
                "fixed": self.fixed, "seconds": self.seconds}


@dataclass
class Search:
    found: Ablation | None  # the smallest fixing set found; None when none fixes the outputs
    trials: int
    before: list[Comparison]
    note: str = ""
    tried: list[dict] = field(default_factory=list)  # every trial: nodes and whether it fixed the outputs

    def to_dict(self) -> dict:
        return {"found": self.found.to_dict() if self.found else None, "trials": self.trials,
                "before": [c.to_dict() for c in self.before], "note": self.note, "tried": self.tried}


def wider_dtype(forensics: Forensics, node: Node) -> str | None:
    """One step up from the widest floating dtype the node reads or writes; None when nothing is wider."""
    values = forensics.program.values
    floats = {values[n].dtype for n in node.input_names() + node.outputs if is_floating(values[n].dtype)}
    if not floats or "float64" in floats:
        return None
    return WIDER["float32"] if "float32" in floats else WIDER["float16"]


def ablate(forensics: Forensics, nodes: list[Node], dtype: str | None = None,
           before: list[Comparison] | None = None) -> Ablation:
    """Run `nodes` at `dtype` (default: one step wider than each node's) from the checkpoint before them."""
    if not nodes:
        raise RewindError("choose at least one node to run at higher precision")
    dtypes = [dtype or wider_dtype(forensics, n) for n in nodes]
    for node, d in zip(nodes, dtypes):
        if d is None:
            raise RewindError(f"{node.describe()} computes nothing in a precision lower than float64")
    before = before if before is not None else forensics.outputs()
    tl = forensics.timeline
    started = time.perf_counter()
    branch = tl.branch(PrecisionPatch(n.index, d) for n, d in zip(nodes, dtypes))
    try:
        report = forensics.progress(f"replaying with {len(nodes)} node(s) at higher precision")
        for tick in range(tl.frontier, tl.end):
            tl.seek(tick + 1)
            report(tick, tl.end)
        after = forensics.outputs()
    finally:
        tl.unbranch(branch)
    return Ablation(list(nodes), dtypes, before, after, time.perf_counter() - started)


def search(forensics: Forensics, dtype: str | None = None, max_trials: int = DEFAULT_MAX_TRIALS) -> Search:
    """A small set of nodes that, at higher precision, brings the outputs within tolerance."""
    before = forensics.outputs()
    if all(c.within for c in before):
        return Search(None, 0, before, "the outputs are already within tolerance of the reference")
    ranked = _ranked(forensics, dtype)
    result = Search(None, 0, before)

    def fixes(nodes: list[Node]) -> bool:
        """Try a set; every set that fixes the outputs is smaller than the one before (grow stops at the
        first, prune only removes), so the latest is the one to report."""
        if result.trials >= max_trials:
            raise _OutOfTrials
        result.trials += 1
        chosen = sorted(nodes, key=lambda n: n.index)
        try:
            trial = ablate(forensics, chosen, dtype, before)
        except RewindError as exc:  # one trial that cannot run is said, and the search goes on without it
            result.tried.append({"nodes": [n.name for n in chosen], "fixed": False, "ran": False, "why": str(exc)})
            forensics.not_run(None, f"precision ablation of {', '.join(n.name for n in chosen)}", exc)
            return False
        result.tried.append({"nodes": [n.name for n in trial.nodes], "fixed": trial.fixed})
        if trial.fixed:
            result.found = trial
        return trial.fixed

    try:
        chosen = _grow(ranked, fixes)
        if chosen is None:
            result.note = (f"no set of nodes at higher precision brings the outputs within tolerance "
                           f"(all {len(ranked)} tried): precision is not the cause")
            return result
        _prune(chosen, fixes)
    except _OutOfTrials:
        result.note = f"stopped after {max_trials} trials; the set found may not be the smallest"
    return result


class _OutOfTrials(Exception):
    pass


def _ranked(forensics: Forensics, dtype: str | None) -> list[Node]:
    """Nodes that can run wider, by the error they introduce (worst first)."""
    candidates = [n for n in forensics.program.nodes if (dtype or wider_dtype(forensics, n)) and
                  forensics.floating_outputs(n)]
    report = forensics.progress("measuring the error each node introduces")
    blame = {}
    for i, node in enumerate(candidates):
        blame[node.index] = max(c.error for c in forensics.introduced(node))
        report(i, len(candidates))
    return sorted(candidates, key=lambda n: (-blame[n.index], n.index))


def _grow(ranked: list[Node], fixes) -> list[Node] | None:
    """The top 1, 2, 4, ... ranked nodes until a set fixes the outputs."""
    size = 1
    while True:
        chosen = ranked[:size]
        if fixes(chosen):
            return chosen
        if size >= len(ranked):
            return None
        size = min(2 * size, len(ranked))


def _prune(chosen: list[Node], fixes) -> None:
    """Drop chunks of the lowest-ranked nodes while the rest still fixes the outputs, halving the chunk."""
    chosen = list(reversed(chosen))  # lowest-ranked first
    chunk = len(chosen) // 2
    while chunk >= 1:
        i = 0
        while i < len(chosen) and len(chosen) > 1:
            rest = chosen[:i] + chosen[i + chunk:]
            if rest and fixes(rest):
                chosen = rest
            else:
                i += chunk
        chunk //= 2
