"""The chip-neutral Program: ordered Nodes over named Values.

A Program is what every driver loads and what the Timeline steps through. It knows nothing of
torch.export (see frontends/) nor of any chip (see drivers/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Literal, Mapping

from hardware.errors import RewindError

ValueKind = Literal["input", "parameter", "buffer", "constant", "intermediate"]
Phase = Literal["forward", "backward", "optimizer"]  # the parts of a training step (an inference pass: forward)


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Frame:
    """One user-code frame of the Python call stack that created a node.

    `module_path` is the module whose forward this frame runs ("" for the root module,
    None for a helper function called inside a forward).
    """

    loc: SourceLoc
    module_path: str | None = None
    module_class: str | None = None


@dataclass(frozen=True)
class Ref:
    """A reference to a Value inside a node's arguments."""

    name: str


@dataclass
class ValueInfo:
    name: str
    kind: ValueKind
    dtype: str
    shape: tuple[int, ...]
    producer: int | None = None  # node index; None for inputs, parameters, buffers, constants
    output_index: int = 0
    target: str | None = None  # the module attribute a parameter or buffer comes from
    last_use: int = -1  # index of the last node that reads it; len(nodes) for program outputs

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass
class Node:
    index: int
    name: str
    op: str  # "aten.linear.default"
    target: Callable[..., Any]
    args: tuple
    kwargs: dict
    outputs: list[str]
    output_indices: tuple[int, ...] = (0,)  # positions of `outputs` in a tuple-returning op's result
    loc: SourceLoc | None = None
    frames: tuple[Frame, ...] = ()
    module_stack: tuple[tuple[str, str], ...] = ()  # (path, class), outermost first
    phase: Phase = "forward"
    step: int = 0  # the training step the node belongs to, from 0 (an inference pass is step 0)
    differentiates: int | None = None  # a backward node: the forward node whose gradient it computes

    @property
    def op_short(self) -> str:
        """`aten.linear` for `aten.linear.default`."""
        parts = self.op.split(".")
        return ".".join(parts[:2]) if len(parts) >= 3 else self.op

    @property
    def module_path(self) -> str:
        return self.module_stack[-1][0] if self.module_stack else ""

    def input_names(self) -> list[str]:
        names = self.__dict__.get("_input_names")
        if names is None:
            found: list[str] = []
            collect_refs((self.args, self.kwargs), found)
            names = self.__dict__["_input_names"] = tuple(dict.fromkeys(found))
        return list(names)

    def bind(self, lookup: Callable[[str], Any]) -> tuple[tuple, dict]:
        """Arguments with every Ref replaced by lookup(name). The Refs' places are found once per node: binding
        runs for every node the Timeline executes, and its cost is host time a GPU waits for."""
        binders = self.__dict__.get("_binders")
        if binders is None:
            binders = self.__dict__["_binders"] = (_Binder(self.args), _Binder(self.kwargs))
        return binders[0](lookup), binders[1](lookup)

    def describe(self) -> str:
        where = f" at {self.loc}" if self.loc else ""
        return f"node {self.index} '{self.name}' ({self.op}){where}"


def collect_refs(obj: Any, out: list[str]) -> None:
    """Append the name of every Ref in `obj` to `out`, one per place it takes (`x * x` takes x twice), in order."""
    if isinstance(obj, Ref):
        out.append(obj.name)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            collect_refs(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            collect_refs(item, out)


def map_refs(obj: Any, fn: Callable[[Ref], Any]) -> Any:
    """Node arguments with each Ref replaced by `fn(ref)` (tuples, lists and dicts walked)."""
    if isinstance(obj, Ref):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_refs(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: map_refs(v, fn) for k, v in obj.items()}
    return obj


def renamed_refs(obj: Any, rename: Mapping[str, str]) -> Any:
    """Node arguments with each Ref renamed by `rename` (a Ref it does not name stays)."""
    return map_refs(obj, lambda r: Ref(rename.get(r.name, r.name)))


class _Binder:
    """A tuple, list or dict of arguments as a template and the places in it where Refs (or containers holding
    Refs) go."""

    def __init__(self, obj: tuple | list | dict):
        self.as_tuple = isinstance(obj, tuple)  # a tuple's template is a list, made a tuple once filled
        items = list(obj.items() if isinstance(obj, dict) else enumerate(obj))
        self.template = dict(obj) if isinstance(obj, dict) else list(obj)
        self.refs = [(k, v.name) for k, v in items if isinstance(v, Ref)]
        self.nested = [(k, _Binder(v)) for k, v in items if isinstance(v, (tuple, list, dict)) and _has_ref(v)]

    def __call__(self, lookup: Callable[[str], Any]) -> Any:
        out = self.template.copy()
        for k, name in self.refs:
            out[k] = lookup(name)
        for k, binder in self.nested:
            out[k] = binder(lookup)
        return tuple(out) if self.as_tuple else out


def _has_ref(obj: Any) -> bool:
    found: list[str] = []
    collect_refs(obj, found)
    return bool(found)


@dataclass
class Program:
    """Nodes in execution order over Values; `initial` holds inputs, parameters, buffers, constants."""

    name: str
    nodes: list[Node]
    values: dict[str, ValueInfo]
    initial: dict[str, Any]  # value name -> tensor (host copies, as the frontend produced them)
    outputs: list[str]
    buffer_mutations: dict[str, str] = field(default_factory=dict)  # produced value -> buffer value
    source_files: dict[str, str] = field(default_factory=dict)  # path -> text of user source files
    # A training Program (hardware/frontends/torch_train.py); all empty for an inference pass.
    step_starts: list[int] = field(default_factory=list)  # the first node of each step
    losses: list[str] = field(default_factory=list)  # the loss value of each step
    gradients: list[dict[str, str]] = field(default_factory=list)  # per step: parameter value -> its gradient
    optimizer: str = ""  # the optimizer's class, as its update is named (AdamW)

    def __post_init__(self) -> None:
        self._compute_liveness()
        self._by_line: dict[tuple[str, int], list[int]] = {}
        for node in self.nodes:
            for frame in node.frames:
                key = (frame.loc.file, frame.loc.line)
                lst = self._by_line.setdefault(key, [])
                if not lst or lst[-1] != node.index:
                    lst.append(node.index)

    def _compute_liveness(self) -> None:
        for node in self.nodes:
            for name in node.input_names():
                self.values[name].last_use = max(self.values[name].last_use, node.index)
        end = len(self.nodes)
        # A buffer's value at the end is what its last writer wrote (a training run updates each parameter once a
        # step: the earlier updates live until the next step reads them, no longer).
        last_writers = {buffer: value for value, buffer in self.buffer_mutations.items()}
        for name in list(self.outputs) + list(last_writers.values()):
            self.values[name].last_use = end

    def __len__(self) -> int:
        return len(self.nodes)

    def forward_node(self, node: Node) -> Node | None:
        """The forward node a backward node differentiates (None for any other node)."""
        return self.nodes[node.differentiates] if node.differentiates is not None else None

    def nodes_at_line(self, file: str, line: int) -> list[int]:
        """Indices of nodes with a frame at file:line (the innermost or a caller frame)."""
        return self._by_line.get((file, line), [])

    def lines_in(self, file: str) -> list[int]:
        return sorted({ln for (f, ln) in self._by_line if f == file})

    def files(self) -> list[str]:
        return sorted({f for (f, _) in self._by_line})

    def live_at(self, position: int) -> list[str]:
        """Values that exist and are still needed when `position` nodes have run."""
        out = []
        for info in self.values.values():
            born = -1 if info.producer is None else info.producer
            if born < position <= info.last_use or (info.producer is None and info.last_use >= position):
                out.append(info.name)
        return out

    def defined_at(self, position: int) -> Iterator[ValueInfo]:
        """Every value that exists after `position` nodes have run (live or dead)."""
        for info in self.values.values():
            if info.producer is None or info.producer < position:
                yield info

    def with_inputs(self, inputs: Mapping[str, Any]) -> "Program":
        """The same Program over other values of its inputs (same shapes and dtypes: the graph was exported
        for them): a fresh Timeline over it runs the pass on those inputs."""
        for name, value in inputs.items():
            info = self.values.get(name)
            if info is None or info.kind != "input":
                known = ", ".join(n for n, v in self.values.items() if v.kind == "input")
                raise RewindError(f"'{name}' is not an input of {self.name} (its inputs: {known})")
            got = (tuple(value.shape), str(value.dtype).removeprefix("torch."))
            if got != (info.shape, info.dtype):
                raise RewindError(f"input '{name}' must be {info.dtype}{list(info.shape)} as exported, "
                                  f"got {got[1]}{list(got[0])}")
        return replace(self, initial={**self.initial, **inputs})

    def find_nodes(self, spec: str) -> list[int]:
        """Nodes named `spec`, of op `spec` (aten.softmax or aten.softmax.int), or inside the module `spec` names
        (see module_instance)."""
        hits = []
        for node in self.nodes:
            if spec in (node.name, node.op, node.op_short) or self.module_instance(node, spec) is not None:
                hits.append(node.index)
        return hits

    def module_instance(self, node: Node, spec: str) -> str | None:
        """The path of the module named by `spec` that `node` runs inside; None when it runs in none. `spec` is a
        module path as the Program has it (`layers.1.mlp`, or `layers` for all of them), as the user writes it from
        their own variable (`model.layers.1.mlp`, `model.layers[1].mlp`), or a module class (`LlamaRMSNorm`, or
        its qualified name): each instance of the class is a module of its own."""
        kind, key = self._module_spec(spec)
        if kind == "path":
            path = node.module_path
            return key if path == key or path.startswith(key + ".") else None
        if kind == "class":
            for path, cls in node.module_stack:
                if cls == key or cls.rsplit(".", 1)[-1] == key:
                    return path
        return None

    def module_names(self) -> tuple[list[str], list[str]]:
        """The module paths and the module classes (short names) of the Program, in the order nodes meet them."""
        paths = dict.fromkeys(p for n in self.nodes for p, _ in n.module_stack if p)
        classes = dict.fromkeys(c.rsplit(".", 1)[-1] for n in self.nodes for _, c in n.module_stack)
        return list(paths), list(classes)

    def _module_spec(self, spec: str) -> tuple[str, str]:
        """("path", the Program's path), ("class", the name) or ("none", "") for what `spec` names; found once."""
        cache = self.__dict__.setdefault("_module_specs", {})
        found = cache.get(spec)
        if found is None:
            found = cache[spec] = self._resolve_module_spec(spec)
        return found

    def _resolve_module_spec(self, spec: str) -> tuple[str, str]:
        prefixes = self.__dict__.get("_module_prefixes")
        if prefixes is None:
            prefixes = set()
            for node in self.nodes:
                parts = node.module_path.split(".") if node.module_path else []
                prefixes.update(".".join(parts[: i + 1]) for i in range(len(parts)))
            self.__dict__["_module_prefixes"] = prefixes
        text = module_path_text(spec)
        if text in prefixes:
            return "path", text
        if any(spec in (n.name, n.op, n.op_short) for n in self.nodes):
            return "none", ""  # a node or an op (aten.softmax), not a module written some other way
        if text and any(c == text or c.rsplit(".", 1)[-1] == text for n in self.nodes for _, c in n.module_stack):
            return "class", text
        _, _, rest = text.partition(".")  # written from the user's variable: model.layers.1 for layers.1
        if rest in prefixes:
            return "path", rest
        # The end of one path only: layers.1.mlp (or model.layers.1.mlp) for model.model.layers.1.mlp.
        for candidate in [text] + ([rest] if rest[:1].isalpha() else []):
            ends = [p for p in prefixes if candidate and p.endswith("." + candidate)]
            if len(ends) == 1:
                return "path", ends[0]
        return "none", ""


def module_path_text(spec: str) -> str:
    """A module path as typed, in the Program's spelling: `model.layers[1].mlp` is `model.layers.1.mlp`."""
    return re.sub(r"\[\s*(\d+)\s*\]", r".\1", spec.strip())
