"""Numerical forensics requests (documented in docs/protocol.md): compareWithReference, firstDivergence,
ablatePrecision. The work is the engine's (provenance/forensics.py, provenance/ablation.py); each
request reports progress from its start, since the reference pass and ablation trials take a while."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, model_validator

from dap_server.events import working
from dap_server.frames import check_thread
from dap_server.requests import StrictArguments, request
from hardware.errors import RewindError
from hardware.program import Node
from provenance.ablation import DEFAULT_MAX_TRIALS, ablate, search
from provenance.experiments import nodes_named
from provenance.origins import trace_origin, traced_dict
from provenance.writelog import NO_SOURCE

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it

MAX_ROWS = 100_000


class CompareWithReferenceArguments(StrictArguments):
    start: int = Field(0, ge=0)  # first tick
    count: int | None = Field(None, ge=0, le=MAX_ROWS)  # ticks (default: to the end)
    introduced: bool = False  # also rerun each node on the reference's inputs
    threadId: int | None = None  # with ranks: the rank asked (docs/ranks.md, "Many ranks"); else only checked


@request("compareWithReference")
def compare_with_reference(adapter: "RequestContext", args: CompareWithReferenceArguments) -> dict:
    """The per-node table: each floating output of each node against the reference; with `introduced`, each row's
    `verdict`: `within` tolerance, `introduced` (the node makes that error on the reference's inputs) or `inherited`
    (its inputs brought it)."""
    check_thread(adapter, args.threadId)
    with working(adapter, "Comparing with the reference"):
        f = adapter.session.forensics
        rows = f.table(args.start, args.count, args.introduced)
        outputs = [c.to_dict() for c in f.outputs()]
    for row in rows:
        if row["source"] is None:
            row["sourceReason"] = NO_SOURCE
        if args.introduced:
            row["verdict"] = "within" if row["within"] else "introduced" if not row["introduced"]["within"] \
                else "inherited"
    return {"reference": f.spec, "rows": rows, "outputs": outputs, "trials": list(f.unrun)}


class FirstDivergenceArguments(StrictArguments):
    start: int = Field(0, ge=0)  # look from this tick on
    origin: bool = True  # trace the error upstream to where it was introduced (a few ablations)


@request("firstDivergence")
def first_divergence(adapter: "RequestContext", args: FirstDivergenceArguments) -> dict:
    """The first node whose error beyond tolerance it introduced (or where accumulated error crosses it)."""
    with working(adapter, "Looking for the first divergence"):
        f = adapter.session.forensics
        found = f.first_divergence(args.start)
    if found is None:
        return {"reference": f.spec, "divergence": None, "divergenceReason": f"no node from tick {args.start} on "
                "leaves the reference's tolerance by error it introduced or that crosses the line there",
                "trials": list(f.unrun)}
    if not args.origin:
        return {"reference": f.spec, "divergence": {**found.to_dict(), "origin": None,
                                                    "originReason": "not asked for (origin: false)"},
                "trials": list(f.unrun)}
    with working(adapter, "Tracing the error upstream"):
        origin, note = trace_origin(f, found)
    return {"reference": f.spec, "divergence": traced_dict(found, origin, note), "trials": list(f.unrun)}


class AblatePrecisionArguments(StrictArguments):
    nodes: list[str] | None = None  # node names, ops or module paths (blocks.3.attn)
    span: list[str] | None = Field(None, min_length=2, max_length=2)  # first and last node of a span
    search: bool = False  # find a small set of nodes that fixes the outputs
    dtype: str | None = None  # default: one step wider than each node's own
    maxTrials: int = Field(DEFAULT_MAX_TRIALS, ge=1, le=10_000)

    @model_validator(mode="after")
    def _one_choice(self) -> "AblatePrecisionArguments":
        chosen = [name for name in ("nodes", "span", "search") if getattr(self, name)]
        if len(chosen) != 1:
            raise ValueError("give exactly one of nodes, span or search: true")
        return self


@request("ablatePrecision")
def ablate_precision(adapter: "RequestContext", args: AblatePrecisionArguments) -> dict:
    """Run nodes at higher precision from the checkpoint before them, measure the outputs, restore."""
    with working(adapter, "Precision ablation"):
        f = adapter.session.forensics
        if args.search:
            searched = search(f, args.dtype, args.maxTrials).to_dict()
            if searched["found"] is None:
                searched["foundReason"] = searched["note"] or f"no set of nodes tried in {searched['trials']} " \
                                                              "trial(s) fixed the outputs"
            return {"search": searched, "trials": list(f.unrun)}
        nodes = _span(adapter, args.span) if args.span else _named(adapter, args.nodes)
        return {"ablation": ablate(f, nodes, args.dtype).to_dict()}


def _named(adapter: "RequestContext", specs: list[str]) -> list[Node]:
    found = {n.index: n for spec in specs for n in nodes_named(adapter.session.program, spec)}
    return [found[i] for i in sorted(found)]


def _span(adapter: "RequestContext", span: list[str]) -> list[Node]:
    first, last = (_named(adapter, [name])[0 if i == 0 else -1].index for i, name in enumerate(span))
    if last < first:
        raise RewindError(f"the span's last node '{span[1]}' runs before its first '{span[0]}'")
    program = adapter.session.program
    return [n for n in program.nodes[first:last + 1] if adapter.session.forensics.floating_outputs(n)]
