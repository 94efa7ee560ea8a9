"""Breakpoints: source lines, functions (node, op, module path), data (writes to a value), exceptions (NaN, Inf,
a training run's loss spike).

One bad breakpoint comes back `verified: false` with the reason; it never fails the batch.
A line with no node binds to the next line of the same function that has one. A source or function breakpoint's
`mode` (Rewind's own field: forward, backward, both; default the launch's `breakpointMode`) says whether it stops
in a training step's forward nodes, the backward nodes that differentiate them, or both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from dap_server.requests import Arguments, capability, request
from dap_server.sources import SourceRef, source_path
from dap_server.variables import Entry, TensorSlice, Values, stats_text
from hardware.errors import RewindError, brief, echo
from hardware.ranks.numerics import REPLICAS
from hardware.session.breakpoints import DataSpec, FunctionSpec, LineSpec
from hardware.session.exception_filters import LOSS_SPIKE, SPIKE_FACTOR, check_condition

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it
    from hardware.session.breakpoints import Breakpoint

EXCEPTION_FILTERS = [
    {"filter": "nan", "label": "NaN written", "default": True,
     "description": "Stop after the first write that produces a NaN its inputs did not carry"},
    {"filter": "inf", "label": "±Inf written", "default": False,
     "description": "Stop after the first write that produces a ±Inf its inputs did not carry"},
    {"filter": "nonfinite-output", "label": "NaN/Inf reaching an output", "default": False,
     "description": "Stop only after a write that produces a NaN or ±Inf its inputs did not carry and that reaches "
                    "a program output (not one written on purpose and discarded on the way, as by a torch.where)"},
    {"filter": "divergence", "label": "Divergence from the reference", "default": False,
     "description": "Stop after the node where the pass first leaves its reference (launch option `reference`, "
                    "default torch:cpu:float64) by more than its tolerance"},
]
EXCEPTION_FILTERS += [
    {"filter": "race", "label": "Data race (many-core chip)", "default": False,
     "description": "Stop right after two units access the same memory, at least one writing, with nothing "
                    "ordering them (sim chip: barriers, semaphores, DMA waits)"},
    {"filter": "access", "label": "Bad access (Triton kernel)", "default": False,
     "description": "Stop right after a kernel operation that touches lanes outside every tensor without a mask, "
                    "stores a value a masked-off lane's padding decided, or reads what no program wrote"},
    {"filter": "hang", "label": "Hang (many-core chip)", "default": False,
     "description": "Stop when every live unit of a node is blocked, with the wait-for graph"},
    {"filter": LOSS_SPIKE, "label": "Loss spike (training)", "default": False,
     "description": "Stop at the start of a training step whose loss is more than k times the median of the losses "
                    "before it: the end of the step before the spike",
     "supportsCondition": True,
     "conditionDescription": f"k=N: a loss more than N times the running median is a spike (k={SPIKE_FACTOR:g} "
                             "without a condition)"},
]
EXCEPTION_KINDS = {"nan": "NaN", "inf": "Inf", "divergence": "Divergence", "race": "Race", "hang": "Hang",
                   "access": "Bad access",
                   LOSS_SPIKE: "LossSpike", REPLICAS: "Replicas"}  # exceptionInfo typeName, stopped text
_SAID_IN_EVIDENCE = ("race", "hang", "access", LOSS_SPIKE, REPLICAS)  # findings whose evidence says it all
DEFAULT_EXCEPTION_FILTERS = {f["filter"] for f in EXCEPTION_FILTERS if f["default"]}


def _breakpoint(adapter: "RequestContext", bp: "Breakpoint", source: SourceRef | None = None,
                line: int | None = None) -> dict:
    out: dict[str, Any] = {"id": bp.id, "verified": bp.verified}
    if bp.message:
        out["message"] = brief(bp.message)
    if source is not None:
        out["source"] = source.model_dump(exclude_none=True)
        out["line"] = adapter.client_line(bp.line if bp.verified else line)
    return out


def changed_line_breakpoints(adapter: "RequestContext") -> None:
    """After launch binds breakpoints set before it to lines, tell the client where they ended up."""
    for path, bps in adapter.session.line_breakpoints.items():
        for bp in bps:
            adapter.emit("breakpoint", {"reason": "changed",
                                        "breakpoint": _breakpoint(adapter, bp, SourceRef(path=path), bp.line)})


class SourceBreakpoint(Arguments):
    line: int
    column: int | None = None
    condition: str | None = None
    hitCondition: str | None = None
    logMessage: str | None = None
    mode: Any = None  # Rewind's own: forward, backward, both; anything else is one unverified breakpoint


class SetBreakpointsArguments(Arguments):
    source: SourceRef
    breakpoints: list[SourceBreakpoint] | None = None
    lines: list[int] | None = None
    sourceModified: bool = False


@request("setBreakpoints")
@capability("supportsConditionalBreakpoints")
@capability("supportsHitConditionalBreakpoints")
@capability("supportsLogPoints")
def set_breakpoints(adapter: "RequestContext", args: SetBreakpointsArguments) -> dict:
    wanted = args.breakpoints if args.breakpoints is not None else [SourceBreakpoint(line=n) for n in args.lines or []]
    specs = [LineSpec(adapter.engine_line(b.line), b.condition, b.hitCondition, b.logMessage, b.mode) for b in wanted]
    bps = adapter.session.set_line_breakpoints(source_path(args.source), specs)
    return {"breakpoints": [_breakpoint(adapter, bp, args.source, spec.line) for bp, spec in zip(bps, specs)]}


class FunctionBreakpoint(Arguments):
    name: str
    condition: str | None = None
    hitCondition: str | None = None
    mode: Any = None  # as a SourceBreakpoint's


class SetFunctionBreakpointsArguments(Arguments):
    breakpoints: list[FunctionBreakpoint]


@request("setFunctionBreakpoints")
@capability("supportsFunctionBreakpoints")
def set_function_breakpoints(adapter: "RequestContext", args: SetFunctionBreakpointsArguments) -> dict:
    """Node names (`softmax_1`), ops (`aten.softmax`), module paths (`blocks.2.attn`, `model.layers.1.mlp`) and
    module classes (`LlamaRMSNorm`)."""
    specs = [FunctionSpec(b.name, b.condition, b.hitCondition, b.mode) for b in args.breakpoints]
    return {"breakpoints": [_breakpoint(adapter, bp) for bp in adapter.session.set_function_breakpoints(specs)]}


class ExceptionFilterOptions(Arguments):
    filterId: str
    condition: str | None = None


class SetExceptionBreakpointsArguments(Arguments):
    filters: list[str]
    filterOptions: list[ExceptionFilterOptions] | None = None


@request("setExceptionBreakpoints")
@capability("exceptionBreakpointFilters", EXCEPTION_FILTERS)
def set_exception_breakpoints(adapter: "RequestContext", args: SetExceptionBreakpointsArguments) -> dict:
    """Filters by name, or with options: loss-spike's `condition` is k=N. One unknown filter or bad condition is
    one unverified breakpoint (that filter left off); the others are set."""
    known = {f["filter"] for f in EXCEPTION_FILTERS}
    asked = [(f, None) for f in args.filters] + [(o.filterId, o.condition) for o in args.filterOptions or []]
    answers, chosen, conditions = [], set(), {}
    for name, condition in asked:
        why = f"unknown filter '{echo(name)}' (known: {', '.join(sorted(known))})" if name not in known else None
        if why is None and condition is not None:
            try:
                check_condition(name, condition)
                conditions[name] = condition
            except RewindError as exc:
                why = brief(str(exc))
        if why is None:
            chosen.add(name)
        answers.append({"verified": True} if why is None else {"verified": False, "message": why})
    adapter.session.set_exception_filters(chosen, conditions)
    return {"breakpoints": answers}


class ExceptionInfoArguments(Arguments):
    threadId: int


@request("exceptionInfo")
@capability("supportsExceptionInfoRequest")
def exception_info(adapter: "RequestContext", args: ExceptionInfoArguments) -> dict:
    adapter.require_launched()
    d = adapter.session.exception_info()
    kind = EXCEPTION_KINDS[d.filter]
    first = list(d.first_index) if d.first_index is not None else None
    inputs = "\n".join(f"  {name}: {stats_text(stats)}" for name, stats in d.inputs.items())
    what = "element(s) beyond tolerance of the reference in" if d.filter == "divergence" else f"{kind} written to"
    trace = (f"{d.count} {what} '{d.value}', first at index {first}\n"
             f"by node '{d.node}' ({d.op}) at {d.source or 'no source line'}\ninputs:\n{inputs or '  none'}")
    if d.filter in _SAID_IN_EVIDENCE:  # the units involved, the losses: in the evidence
        trace = d.description()
    return {"exceptionId": d.filter, "description": d.description(), "breakMode": "always",
            "details": {"message": d.description(), "typeName": kind, "fullTypeName": d.op, "evaluateName": d.value,
                        "stackTrace": trace, "node": d.node, "source": d.source, "count": d.count,
                        "firstIndex": first, "inputs": d.inputs, "evidence": _wire_evidence(d.evidence)}}


def _wire_evidence(evidence: dict) -> dict:
    """A race's evidence names the memory it touched as `addressRange`, the protocol's word for a span."""
    if "addresses" not in evidence:
        return evidence
    return {("addressRange" if key == "addresses" else key): value for key, value in evidence.items()}


class DataBreakpointInfoArguments(Arguments):
    name: str
    variablesReference: int | None = None
    frameId: int | None = None


@request("dataBreakpointInfo")
@capability("supportsDataBreakpoints")
def data_breakpoint_info(adapter: "RequestContext", args: DataBreakpointInfoArguments) -> dict:
    """A whole value can be watched for writes; its data id is its Program value name."""
    adapter.require_launched()
    try:
        value = _watchable(adapter, args)
    except RewindError as exc:
        return {"dataId": None, "description": brief(str(exc))}
    return {"dataId": value, "description": f"write to '{args.name}' ({value})", "accessTypes": ["write"],
            "canPersist": True}


def _watchable(adapter: "RequestContext", args: DataBreakpointInfoArguments) -> str:
    if not args.variablesReference:
        return adapter.resolve_value(args.name, adapter.frame_level(args.frameId))
    container = adapter.variables.get(args.variablesReference)
    if isinstance(container, Values):
        entry: Entry | None = next((e for e in container.entries if e.name == args.name), None)
        if entry is not None:
            return entry.value
    if isinstance(container, TensorSlice) and container.root.value is not None and not container.index:
        raise RewindError(f"'{args.name}' is part of '{container.root.value}': watch the whole value")
    raise RewindError(f"'{args.name}' is not a value that can be watched for writes")


class DataBreakpoint(Arguments):
    dataId: str
    accessType: Literal["read", "write", "readWrite"] | None = None
    condition: str | None = None
    hitCondition: str | None = None


class SetDataBreakpointsArguments(Arguments):
    breakpoints: list[DataBreakpoint]


@request("setDataBreakpoints")
def set_data_breakpoints(adapter: "RequestContext", args: SetDataBreakpointsArguments) -> dict:
    """Writes only: reads are not observed (a read leaves nothing in the write log)."""
    writes = [b for b in args.breakpoints if b.accessType in (None, "write")]
    bps = iter(adapter.session.set_data_breakpoints(
        [DataSpec(b.dataId, b.condition, b.hitCondition) for b in writes]))
    return {"breakpoints": [_breakpoint(adapter, next(bps)) if b.accessType in (None, "write") else
                            {"verified": False, "message": f"'{b.accessType}' is not watched: only writes are"}
                            for b in args.breakpoints]}


class BreakpointLocationsArguments(Arguments):
    source: SourceRef
    line: int
    endLine: int | None = None
    column: int | None = None
    endColumn: int | None = None


@request("breakpointLocations")
@capability("supportsBreakpointLocationsRequest")
def breakpoint_locations(adapter: "RequestContext", args: BreakpointLocationsArguments) -> dict:
    """The lines in the range where a node runs (where a breakpoint would bind as asked)."""
    adapter.require_launched()
    first = adapter.engine_line(args.line)
    last = adapter.engine_line(args.endLine) if args.endLine is not None else first
    lines = adapter.session.program.lines_in(source_path(args.source))
    return {"breakpoints": [{"line": adapter.client_line(n)} for n in lines if first <= n <= last]}
