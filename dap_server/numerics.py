"""Numerics across ticks (documented in docs/protocol.md): findTick, writeHistory, valueDiff, histogram,
referenceValue. The engine scans (hardware/session/inspection.py), so an agent's question about many ticks is one
request, not one evaluate per tick; these handlers measure the tensors it hands back. A field that is null has
its reason beside it (`tickReason`, `statsReason`, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field

from dap_server.events import working
from dap_server.frames import check_thread
from dap_server.requests import StrictArguments, request
from hardware.errors import RewindError, echo
from hardware.jsonable import json_safe
from provenance.compare import compare

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it
    from hardware.session import Session

MAX_FIND_TICKS = 10_000_000
MAX_WRITES = 100_000
MAX_BINS = 1000
NO_FINITE = "no finite element: min, max and mean are over the finite elements"


class FindTickArguments(StrictArguments):
    expression: str  # true at the tick sought (a tensor: all its elements)
    start: int | None = Field(None, ge=0)  # default: the tick after the position
    maxTicks: int = Field(100_000, ge=1, le=MAX_FIND_TICKS)  # ticks looked at, at most
    threadId: int | None = None  # with ranks: the rank asked (docs/ranks.md, "Many ranks"); else only checked


@request("findTick")
def find_tick(adapter: "RequestContext", args: FindTickArguments) -> dict:
    """The first tick from `start` where the expression holds, as the innermost frame there reads it; a tick where
    a name of it is not defined yet is skipped. The position does not move (the client goes there)."""
    check_thread(adapter, args.threadId)
    session = adapter.session
    start = min(session.position + 1, session.end) if args.start is None else args.start
    with adapter.events.progress(f"Finding where {echo(args.expression)} holds", cancellable=True):
        found = session.find(args.expression, start, args.maxTicks)
    seen = (found.last if found.tick is None else found.tick) - found.first + 1
    body: dict[str, Any] = {"tick": found.tick, "start": found.first, "last": found.last, "scanned": seen,
                            "skipped": found.skipped}
    if found.skip_reason:
        body["skipReason"] = found.skip_reason
    if found.tick is None:
        more = f"; the scan stopped at maxTicks ({args.maxTicks}): look on from tick {found.last + 1}" \
            if found.last < session.end else ""
        body["tickReason"] = f"it holds at no tick from {found.first} to {found.last}{more}"
    return body


class WriteHistoryArguments(StrictArguments):
    name: str  # a source variable (every value it is bound to, anywhere), or `$value`
    maxWrites: int = Field(1000, ge=1, le=MAX_WRITES)
    threadId: int | None = None  # with ranks: the rank asked (docs/ranks.md, "Many ranks"); else only checked


@request("writeHistory")
def write_history(adapter: "RequestContext", args: WriteHistoryArguments) -> dict:
    """Every write over the run to what a name names, oldest first, with each write's stats and digest."""
    check_thread(adapter, args.threadId)
    with working(adapter, f"Reading the writes of {echo(args.name)}"):
        values, writes = adapter.session.history(args.name.strip())
    body = {"values": values, "writes": writes[:args.maxWrites], "total": len(writes)}
    if len(writes) > args.maxWrites:
        body["truncated"] = f"the first {args.maxWrites} of {len(writes)} writes (maxWrites)"
    return body


class ValueDiffArguments(StrictArguments):
    expression: str  # a source variable, `$value` or any expression, read at each tick
    ticks: list[int] = Field(min_length=2, max_length=2)
    threadId: int | None = None  # with ranks: the rank asked (docs/ranks.md, "Many ranks"); else only checked


@request("valueDiff")
def value_diff(adapter: "RequestContext", args: ValueDiffArguments) -> dict:
    """An expression at two ticks (as the innermost frame at each reads it): how they differ, element by element."""
    check_thread(adapter, args.threadId)
    session = adapter.session
    for tick in args.ticks:
        if not 0 <= tick <= session.end:
            raise RewindError(f"tick {tick} is outside the run (0..{session.end})")
    left, right = (_tensor_at(session, args.expression, tick) for tick in args.ticks)
    return {"left": _side(args.ticks[0], left), "right": _side(args.ticks[1], right), **_difference(left, right)}


class HistogramArguments(StrictArguments):
    expression: str  # a source variable, `$value` or any expression, at the position
    frameId: int | None = None
    bins: int = Field(20, ge=1, le=MAX_BINS)


@request("histogram")
def histogram(adapter: "RequestContext", args: HistogramArguments) -> dict:
    """The finite elements of a tensor in equal bins from their min to their max; NaN and each infinity counted
    apart."""
    adapter.require_launched()
    session = adapter.session
    result = _tensor(session.evaluate(args.expression, adapter.frame_level(args.frameId)), args.expression)
    tensor = _host(result)
    finite = tensor[torch.isfinite(tensor)]
    body = {"tick": session.position, **_layout(result), "finite": finite.numel(),
            "nan": int(torch.isnan(tensor).sum()), "posinf": int((tensor == torch.inf).sum()),
            "neginf": int((tensor == -torch.inf).sum())}
    if not finite.numel():
        return {**body, "bins": None, "binsReason": "no finite element to put in bins"}
    lo, hi = float(finite.min()), float(finite.max())
    bins = args.bins if hi > lo else 1  # every element the same: one bin
    counts = torch.histc(finite, bins, lo, hi) if hi > lo else torch.tensor([finite.numel()])
    edges = torch.linspace(lo, hi, bins + 1)
    return {**body, "bins": {"edges": edges.tolist(), "counts": [int(c) for c in counts.tolist()]}}


class ReferenceValueArguments(StrictArguments):
    name: str  # a source variable of the frame, or a Program value (`$value`)
    frameId: int | None = None


@request("referenceValue")
def reference_value(adapter: "RequestContext", args: ReferenceValueArguments) -> dict:
    """The reference's value of a name (its stats), and this pass's at the position against it."""
    value = adapter.resolve_value(args.name, adapter.frame_level(args.frameId))
    session = adapter.session
    f = session.forensics
    with working(adapter, f"Reading the reference's '{value}'"):
        reference = f.reference.value(value)
    body = {"value": value, "reference": f.spec, "tick": session.position,
            "referenceValue": {**_layout(reference), "stats": summary(reference)}}
    try:
        test = f.test_value(value, session.position)
    except RewindError:
        why = _unwritten(session, value)
        return {**body, "pass": None, "passReason": why, "comparison": None, "comparisonReason": why}
    rtol, atol = f.tolerance.for_dtype(f.precision[value])
    comparison = compare(value, session.program.values[value].dtype, test, reference, rtol, atol)
    return {**body, "pass": {**_layout(test), "stats": summary(test)}, "comparison": comparison.to_dict()}


# -- measuring tensors --------------------------------------------------------------------------------------
def summary(tensor: torch.Tensor) -> dict:
    """min, max and mean of the finite elements, and the NaN and Inf counts."""
    t = _host(tensor)
    finite = t[torch.isfinite(t)]
    counts = {"nan": int(torch.isnan(t).sum()), "inf": int(torch.isinf(t).sum())}
    if not finite.numel():
        return {"min": None, "max": None, "mean": None, "statsReason": NO_FINITE, **counts}
    return {"min": float(finite.min()), "max": float(finite.max()), "mean": float(finite.mean()), **counts}


def _difference(left: torch.Tensor, right: torch.Tensor) -> dict:
    left, right = _host(left), _host(right)
    if left.shape != right.shape:
        why = f"the shapes differ: {list(left.shape)} and {list(right.shape)}"
        return {"sameShape": False, "differing": None, "differingReason": why, "maxAbsDiff": None,
                "maxAbsDiffReason": why, "firstDifference": None, "firstDifferenceReason": why}
    same = (left == right) | (torch.isnan(left) & torch.isnan(right))
    differ = ~same
    out: dict[str, Any] = {"sameShape": True, "differing": int(differ.sum())}
    gaps = (left - right).abs()[differ & torch.isfinite(left) & torch.isfinite(right)]
    if gaps.numel():
        out["maxAbsDiff"] = float(gaps.max())
    elif out["differing"]:
        out.update(maxAbsDiff=None, maxAbsDiffReason="every element that differs is NaN or infinite on one side")
    else:
        out["maxAbsDiff"] = 0.0
    if not out["differing"]:
        return {**out, "firstDifference": None, "firstDifferenceReason": "no element differs"}
    flat = int(differ.reshape(-1).nonzero()[0])
    index = [int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(left.shape))]
    out["firstDifference"] = {"index": index, "left": json_safe(float(left.reshape(-1)[flat])),
                              "right": json_safe(float(right.reshape(-1)[flat]))}
    return out


def _tensor_at(session: "Session", expression: str, tick: int) -> torch.Tensor:
    try:
        result = session.evaluate(expression, position=tick)
    except RewindError as exc:
        raise RewindError(f"at tick {tick}: {exc}") from None
    return _tensor(result, expression, f" at tick {tick}")


def _tensor(result: Any, expression: str, where: str = "") -> torch.Tensor:
    """An expression's result as a tensor (a number as a 0-d one); anything else is refused in words."""
    if isinstance(result, (bool, int, float)):
        return torch.tensor(result)
    if not isinstance(result, torch.Tensor) or result.is_complex():
        raise RewindError(f"'{echo(expression)}'{where} is not a tensor of real numbers")
    return result


def _host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", torch.float64)


def _side(tick: int, tensor: torch.Tensor) -> dict:
    return {"tick": tick, **_layout(tensor), "stats": summary(tensor)}


def _layout(tensor: torch.Tensor) -> dict:
    return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape), "numel": tensor.numel()}


def _unwritten(session: "Session", value: str) -> str:
    info = session.program.values[value]
    writer = f": tick {session.tl.node_tick[info.producer]} writes it" if info.producer is not None else ""
    return f"this pass has not written '{value}' yet at tick {session.position}{writer}"
