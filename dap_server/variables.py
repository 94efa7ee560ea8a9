"""scopes, variables, setVariable: tensors as DAP variables, paged, with where they live and who wrote them.

Scopes: the node's inputs and outputs, the frame's arguments and locals, the live values, in a training step each
parameter's gradient in the step shown (`Gradients`: `grad(l1.weight)`, which evaluate reads back), the parameters.

A tensor's value string shows dtype, shape, device, min/max/mean and NaN/Inf counts (from the
write log, so showing it costs no pass over the data). Its children are `location`,
`provenance` and `stats`, then its elements paged through `indexedVariables`: rows of the first
dimension, each a slice with rows of its own, down to single elements that setVariable edits.

Variable references live in one table cleared on every resume. A container names Program values,
not tensors, so after an edit (a new tick) it shows the edited contents.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from dap_server.failures import ExpiredReference
from dap_server.memory import memory_reference
from dap_server.requests import Arguments, capability, request
from hardware.errors import RewindError, echo

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it

MAX_UNPAGED = 1000  # children returned when the client asks for "all" of a huge dimension
MAX_PAGE = 10_000  # children one `variables` request may ask for
_PREVIEW = 4
_REF_LIMIT = 2**31 - 1


class VariableTable:
    """variablesReference -> container, for one stop."""

    def __init__(self) -> None:
        self._containers: dict[int, Any] = {}
        self._next = 1

    def add(self, container: Any) -> int:
        ref = self._next
        self._next = self._next + 1 if self._next < _REF_LIMIT else 1
        self._containers[ref] = container
        return ref

    def get(self, ref: int) -> Any:
        container = self._containers.get(ref)
        if container is None:
            raise ExpiredReference(f"variablesReference {ref} is unknown or expired (references last one stop)")
        return container

    def clear(self) -> None:
        self._containers.clear()


# -- formatting ---------------------------------------------------------------------------------------
def number(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def describe(dtype: str, shape: tuple[int, ...], device: str, stats: dict | None, scalar: Any = None) -> str:
    head = f"{dtype}{list(shape)} {device}"
    if scalar is not None:
        return f"{head} = {number(scalar)}"
    return f"{head} {stats_text(stats)}" if stats else head


def stats_text(stats: dict) -> str:
    return (f"min={number(stats['min'])} max={number(stats['max'])} mean={number(stats['mean'])} "
            f"nan={stats['nan']} inf={stats['inf']}")


def preview(tensor: torch.Tensor) -> str:
    """The first elements of a slice, read without copying the slice."""
    first = tensor
    while first.dim() > 1:
        first = first[0]
    items = [number(v) for v in first[:_PREVIEW].tolist()]
    more = ", …" if first.shape[0] > _PREVIEW else ""
    inner = "[" + ", ".join(items) + more + "]"
    for _ in range(tensor.dim() - 1):
        inner = f"[{inner}, …]"
    return f"{_dtype(tensor)}{list(tensor.shape)} {inner}"


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _index_text(index: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(i) for i in index) + "]"


# -- variables -------------------------------------------------------------------------------------------
def value_variable(adapter: "RequestContext", name: str, value: str, evaluate_name: str, role: str = "") -> dict:
    """A Program value at the position as a variable (a placeholder if it is not written yet)."""
    session = adapter.session
    info = session.program.values[value]
    kind = f"{role} " if role else ""
    try:
        stats = session.value_stats(value)
        tensor = session.tensor(value)
    except RewindError:
        return {"name": name, "value": f"<not written yet: {info.dtype}{list(info.shape)}>",
                "type": f"{kind}{info.dtype}{list(info.shape)}", "variablesReference": 0, "evaluateName": evaluate_name}
    root = TensorRoot(evaluate_name, value, None)
    return {"name": name, "type": f"{kind}{info.dtype}{list(info.shape)}",
            "memoryReference": memory_reference(value), **_tensor_fields(adapter, root, tensor, stats)}


def result_variable(adapter: "RequestContext", name: str, tensor: torch.Tensor, evaluate_name: str) -> dict:
    """An expression's result (not Program memory): stats and elements, no location or writer."""
    root = TensorRoot(evaluate_name, None, tensor)
    stats = adapter.session.tensor_stats(tensor) if tensor.numel() else None
    return {"name": name, "type": f"{_dtype(tensor)}{list(tensor.shape)}",
            **_tensor_fields(adapter, root, tensor, stats)}


def _tensor_fields(adapter: "RequestContext", root: "TensorRoot", tensor: torch.Tensor, stats: dict | None) -> dict:
    scalar = tensor.item() if tensor.dim() == 0 else None
    named = 3 if root.value is not None else 1
    ref = adapter.variables.add(TensorSlice(root, ()))
    fields = {"value": describe(_dtype(tensor), tuple(tensor.shape), str(tensor.device), stats, scalar),
              "variablesReference": ref, "namedVariables": named, "evaluateName": root.evaluate_name}
    if tensor.dim():
        fields["indexedVariables"] = tensor.shape[0]
    return fields


@dataclass(frozen=True)
class Entry:
    name: str  # what the user sees: `scores` or `div`
    value: str  # the Program value
    role: str = ""  # "input", "output" in a node's scope
    expression: str = ""  # what evaluates to it, when not its name (an argument its frame has since rebound)


@dataclass
class Values:
    """A list of Program values: a scope."""

    entries: list[Entry]

    def named(self, adapter: "RequestContext") -> list[dict]:
        return [value_variable(adapter, e.name, e.value, e.expression or e.name, e.role) for e in self.entries]

    def indexed_count(self, adapter: "RequestContext") -> int:
        return 0

    def assign(self, adapter: "RequestContext", name: str, text: str) -> dict:
        entry = next((e for e in self.entries if e.name == name), None)
        if entry is None:
            raise RewindError(f"no variable '{echo(name)}' in this scope")
        tensor = adapter.session.tensor(entry.value)
        if tensor.dim():
            raise RewindError(f"'{name}' has {tensor.dim()} dimensions: expand it and set one element")
        return _set_element(adapter, entry.value, (), text)


@dataclass(frozen=True)
class TensorRoot:
    evaluate_name: str
    value: str | None  # the Program value, or None for an expression's result
    tensor: torch.Tensor | None  # the result itself when there is no Program value

    def get(self, adapter: "RequestContext") -> torch.Tensor:
        return adapter.session.tensor(self.value) if self.value is not None else self.tensor


@dataclass
class TensorSlice:
    """tensor[index]: named children at the root, rows of the next dimension as indexed children."""

    root: TensorRoot
    index: tuple[int, ...]

    def named(self, adapter: "RequestContext") -> list[dict]:
        if self.index:
            return []
        if self.root.value is None:
            tensor = self.root.get(adapter)
            return [_fields_variable(adapter, "stats", adapter.session.tensor_stats(tensor))]
        value, session = self.root.value, adapter.session
        return [_fields_variable(adapter, "location", session.locate(value).to_dict()),
                _fields_variable(adapter, "provenance", session.provenance(value)),
                _fields_variable(adapter, "stats", session.value_stats(value))]

    def indexed_count(self, adapter: "RequestContext") -> int:
        tensor = self.root.get(adapter)
        return tensor.shape[len(self.index)] if tensor.dim() > len(self.index) else 0

    def indexed(self, adapter: "RequestContext", start: int, stop: int) -> list[dict]:
        part = self.root.get(adapter)[self.index] if self.index else self.root.get(adapter)
        out = []
        for i in range(start, stop):
            index = self.index + (i,)
            evaluate_name = f"{self.root.evaluate_name}{_index_text(index)}"
            child = part[i]
            if child.dim() == 0:
                out.append({"name": f"[{i}]", "value": number(child.item()), "type": _dtype(child),
                            "variablesReference": 0, "evaluateName": evaluate_name})
            else:
                out.append({"name": f"[{i}]", "value": preview(child), "type": f"{_dtype(child)}{list(child.shape)}",
                            "variablesReference": adapter.variables.add(TensorSlice(self.root, index)),
                            "indexedVariables": child.shape[0], "evaluateName": evaluate_name})
        return out

    def assign(self, adapter: "RequestContext", name: str, text: str) -> dict:
        if self.root.value is None:
            raise RewindError("an expression's result is not program memory: set an element of a program value")
        digits = name[1:-1].strip() if name.startswith("[") and name.endswith("]") else ""
        if not (digits.isascii() and digits.isdigit()):
            raise RewindError(f"'{echo(name)}' is not an element: set one of the indexed children ([0], [1], ...)")
        index = self.index + (int(digits),)
        return _set_element(adapter, self.root.value, index, text)


def _set_element(adapter: "RequestContext", value: str, index: tuple[int, ...], text: str) -> dict:
    session = adapter.session
    tensor = session.tensor(value)
    if len(index) != tensor.dim():
        raise RewindError(f"{value}{_index_text(index)} is a slice of {tensor.dim() - len(index)} dimension(s): "
                          "expand it and set one element")
    new = session.evaluate(text)
    if isinstance(new, torch.Tensor):
        if new.numel() != 1:
            raise RewindError(f"'{echo(text)}' is a tensor of {new.numel()} elements; an element takes one number")
        new = new.item()
    if not isinstance(new, (int, float, bool)):
        raise RewindError(f"'{echo(text)}' is not a number")
    session.set_element(value, index, float(new) if isinstance(new, float) else new)
    adapter.resume(lambda: session.after_edit(value), "Editing")  # the edit is a step: the client hears the stop
    element = session.tensor(value)[index] if index else session.tensor(value)
    return {"value": number(element.item()), "type": _dtype(element), "variablesReference": 0}


@dataclass
class Fields:
    """A dict or list shown as variables: a Placement, a provenance record, stats."""

    data: dict | list

    def named(self, adapter: "RequestContext") -> list[dict]:
        items = self.data.items() if isinstance(self.data, dict) else ((f"[{i}]", v) for i, v in enumerate(self.data))
        return [_fields_variable(adapter, str(k), v) for k, v in items]

    def indexed_count(self, adapter: "RequestContext") -> int:
        return 0

    def assign(self, adapter: "RequestContext", name: str, text: str) -> dict:
        raise RewindError(f"'{echo(name)}' is read-only: it describes a value, it is not one")


_HEX_KEYS = {"address", "storage"}


def _fields_variable(adapter: "RequestContext", name: str, data: Any) -> dict:
    if isinstance(data, (dict, list)) and data:
        return {"name": name, "value": _summary(name, data), "variablesReference": adapter.variables.add(Fields(data)),
                "namedVariables": len(data)}
    if isinstance(data, int) and not isinstance(data, bool) and name in _HEX_KEYS:
        text = f"0x{data:x}"
    else:
        text = number(data)
    return {"name": name, "value": text, "variablesReference": 0}


def _summary(name: str, data: dict | list) -> str:
    """One line for a record: where a value lives, who wrote it, its stats."""
    if isinstance(data, list):
        return f"[{len(data)} items]"
    if "shards" in data:
        shards = data["shards"]
        first = shards[0]
        where = f"{first['space']} 0x{first['address']:x} on {first['chip']} ({first['nbytes']} bytes)"
        return where if len(shards) == 1 else f"{len(shards)} shards, first: {where}"
    if "lastWriter" in data:
        return _writer(data["lastWriter"], data.get("kind", ""))
    if {"min", "max", "mean", "nan", "inf"} <= data.keys():
        return stats_text(data)
    return "{" + ", ".join(list(data)[:4]) + (", …}" if len(data) > 4 else "}")


def _writer(record: dict | None, kind: str) -> str:
    if record is None:
        return f"not written before this tick ({kind or 'initial'} value)"
    where = f" at {record['source']['file'].rsplit('/', 1)[-1]}:{record['source']['line']}" if record["source"] else ""
    who = f"{record['op']} '{record['node']}'" if record["node"] else "a user edit"
    return f"written by {who}{where}, tick {record['tick']}"


# -- requests -------------------------------------------------------------------------------------------------
class ScopesArguments(Arguments):
    frameId: int


_PARAMETER_KINDS = ("parameter", "buffer", "constant")


@request("scopes")
def scopes(adapter: "RequestContext", args: ScopesArguments) -> dict:
    adapter.require_launched()
    level = adapter.frame_level(args.frameId)
    session = adapter.session
    program = session.program
    out = []
    node = session.frame_node()  # the node the top frame shows: about to run, or the writer after a write stop
    if level == 0 and node is not None:
        entries = [Entry(n, n, "input") for n in node.input_names()] + [Entry(n, n, "output") for n in node.outputs]
        # the operands of the op about to run, as a machine debugger's registers are an instruction's
        out.append(_scope(adapter, f"Node {node.name} ({node.op_short})", entries, "registers"))
    arguments = session.frame_arguments(level)  # the frame's parameters, as it was called
    names = session.source_names(level=level)  # its variables now, parameters included, as Python's locals()
    if arguments:
        entries = [Entry(k, v, expression="" if names.get(k) == v else v) for k, v in arguments.items()]
        out.append(_scope(adapter, "Arguments", entries, "arguments"))
    out.append(_scope(adapter, "Locals", [Entry(k, v) for k, v in names.items()], "locals"))
    live = [n for n in session.live_values() if program.values[n].kind not in _PARAMETER_KINDS]
    # The whole program's values, growing with the model: fetched when the user opens them, not on every stop.
    out.append(_scope(adapter, "Live values", [Entry(n, n) for n in live], None, expensive=True))
    gradients = session.gradients()  # a training step's, by parameter: `grad(l1.weight)` evaluates to one
    if gradients:
        entries = [Entry(f"grad({path})", value, "gradient") for path, value in gradients.items()]
        out.append(_scope(adapter, "Gradients", entries, None, expensive=True))
    params = [n for n, info in program.values.items() if info.kind in _PARAMETER_KINDS]
    out.append(_scope(adapter, "Parameters", [Entry(n, n) for n in params], None, expensive=True))
    return {"scopes": out}


def _scope(adapter: "RequestContext", name: str, entries: list[Entry], hint: str | None, expensive: bool = False) -> dict:
    scope = {"name": name, "variablesReference": adapter.variables.add(Values(entries)),
             "namedVariables": len(entries), "expensive": expensive}
    if hint:
        scope["presentationHint"] = hint
    return scope


class VariablesArguments(Arguments):
    variablesReference: int
    filter: Literal["indexed", "named"] | None = None
    start: int = 0
    count: int = 0
    format: dict | None = None


@request("variables")
def variables(adapter: "RequestContext", args: VariablesArguments) -> dict:
    if args.start < 0 or args.count < 0:
        raise RewindError(f"variables: start ({args.start}) and count ({args.count}) cannot be negative")
    if args.count > MAX_PAGE:
        raise RewindError(f"variables: count {args.count} is more than one page ({MAX_PAGE}): ask in pages")
    container = adapter.variables.get(args.variablesReference)
    start, count = args.start, args.count
    named = [] if args.filter == "indexed" else container.named(adapter)
    if args.filter == "named":
        return {"variables": named[start:start + count] if count else named[start:]}
    total_indexed = container.indexed_count(adapter)
    offset = len(named) if args.filter is None else 0  # without a filter: named children, then indexed ones
    want = count or MAX_UNPAGED
    out = named[start:start + want] if args.filter is None else []
    first = max(0, start - offset)
    last = min(total_indexed, first + want - len(out))
    if last > first:
        out += container.indexed(adapter, first, last)
    return {"variables": out}


class SetVariableArguments(Arguments):
    variablesReference: int
    name: str
    value: str
    format: dict | None = None


@request("setVariable")
@capability("supportsSetVariable")
def set_variable(adapter: "RequestContext", args: SetVariableArguments) -> dict:
    """Change one element: a recorded edit on the timeline, undone by stepping back over it."""
    adapter.require_launched()
    return adapter.variables.get(args.variablesReference).assign(adapter, args.name, args.value)
