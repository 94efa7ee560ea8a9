"""Fixes: what a fixer proposes, as patches of the Program's nodes.

A fix file is Python that defines `PATCHES`, a dict from a node (a node name, an op such as
`aten.exp`, or a module path) to what that node does instead:

    import torch

    def stable_exp(x):                       # called with the node's arguments, as the op receives them
        return torch.exp(x - x.amax(-1, keepdim=True))

    PATCHES = {"exp": stable_exp,            # a function in place of the op
               "sum_1": "float32",           # the node run at another precision
               "layer_norm": {"eps": 1e-3}}  # the node's op with other attributes

A value edit (a patch of the pass's data, not of its code) is an experiment, never a fix.
The repair loop reads every fix's source before running it (provenance/integrity.py).
"""

from __future__ import annotations

import hashlib
import linecache
import types
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from checkpoint.branch import AttributePatch, EditPatch, FunctionPatch, Patch, PrecisionPatch
from hardware.errors import RewindError, raised_in_user_code
from hardware.program import Program
from provenance.experiments import NamedPatch, nodes_named
from provenance.program_edits import ProgramEdit
from provenance.hyperparameters import hyperparameter_patches
from provenance.steps import counterparts, nodes_from_step

Guard = Callable[[], AbstractContextManager]


@dataclass(frozen=True)
class FunctionSource:
    """Where a function patch's code came from: the text of the module that defines it, and its name."""

    file: str
    text: str
    function: str


@dataclass
class Candidate:
    """A candidate fix: patches of nodes, and the source of every function among them; or an edit of a training
    Program (provenance/program_edits.py: nodes inserted, loss scaling or gradient clipping)."""

    name: str
    origin: str  # "fix" (a fixer's file), "learned" (the knowledge base's record), "built-in" (a recipe)
    patches: list[Patch]
    sources: dict[int, FunctionSource] = field(default_factory=dict)  # node index -> its function's source
    note: str = ""
    edit: ProgramEdit | None = None

    def to_dict(self, program: Program) -> dict:
        out = {"name": self.name, "origin": self.origin, "note": self.note,
               "patches": [{"node": program.nodes[p.node].name, "op": program.nodes[p.node].op, **p.to_dict()}
                           for p in self.patches]}
        return {**out, "edit": self.edit.to_dict()} if self.edit is not None else out

    def in_every_step(self, program: Program) -> "Candidate":
        """The same fix of each patched node in every step of a training Program: a fix of a node's code is a fix
        of each step that runs it."""
        patches: dict[int, Patch] = {}
        sources = dict(self.sources)
        for p in self.patches:
            for node in counterparts(program, p.node):
                if node not in patches:
                    patches[node] = replace(p, node=node)
                    if p.node in self.sources:
                        sources[node] = self.sources[p.node]
        return replace(self, patches=list(patches.values()), sources=sources)

    def guarded(self, guard: Guard) -> list[Patch]:
        """The patches, every function among them running under `guard` (the integrity audit)."""
        return [FunctionPatch(p.node, p.fn, p.label, guard) if isinstance(p, FunctionPatch) else p
                for p in self.patches]


def fix_from_text(text: str, file: str, program: Program, guard: Guard | None = None, name: str = "") -> Candidate:
    """A fix file's text as a candidate named `name` (default: the file's name); its module code runs under `guard`."""
    name = name or Path(file).name
    module = run_module(text, file, guard)
    table = module.get("PATCHES")
    if not isinstance(table, dict) or not table:
        raise RewindError(f"{file} must define PATCHES: a dict from a node, op or module path to a function, "
                          "a dtype or a dict of attributes")
    patches: list[Patch] = []
    sources: dict[int, FunctionSource] = {}
    for spec, change in table.items():
        if not isinstance(spec, str):
            raise RewindError(f"{file}: PATCHES keys name nodes (strings), got {spec!r}")
        for node in nodes_named(program, spec):
            if node.index in sources or any(p.node == node.index for p in patches):
                raise RewindError(f"{file}: {node.describe()} is patched twice")
            patches.append(patch_of(program, node.index, change, name))
            if callable(change):
                sources[node.index] = FunctionSource(file, text, _function_name(change, module, file))
    return Candidate(name, "fix", patches, sources)


def patch_of(program: Program, node: int, change: Any, origin: str) -> Patch:
    """The patch a fix file's entry means: a function, a dtype, or a dict of attributes."""
    if callable(change):
        return FunctionPatch(node, change, f"{getattr(change, '__name__', 'a function')} from {origin}")
    if isinstance(change, str):
        return PrecisionPatch(node, floating_dtype(change))
    if isinstance(change, dict):
        return AttributePatch.of(program.nodes[node], change)
    raise RewindError(f"{origin}: what {program.nodes[node].describe()} does instead must be a function, a dtype "
                      f"or a dict of attributes, got {type(change).__name__}")


def floating_dtype(name: str) -> str:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise RewindError(f"'{name}' is not a floating-point dtype (float64, float32, float16, bfloat16)")
    return name


# The fix sources registered with linecache, by file: the same file (a pseudo file is named by its text's hash)
# replaces its entry, and the last open Session's close drops them all (forget_sources).
_SOURCES: dict[str, tuple] = {}


def run_module(text: str, file: str, guard: Guard | None = None) -> dict[str, Any]:
    """Execute a fix's module text (registered for tracebacks and inspect) and return its namespace."""
    linecache.cache[file] = _SOURCES[file] = (len(text), None, text.splitlines(True), file)
    try:
        code = compile(text, file, "exec")
    except SyntaxError as exc:
        raise RewindError(f"{file}:{exc.lineno}: {exc.msg}") from None
    module = types.ModuleType(f"rewind_fix_{hashlib.sha1(file.encode()).hexdigest()[:8]}")
    module.__file__ = file
    try:
        with guard() if guard is not None else nullcontext():
            exec(code, module.__dict__)
    except RewindError:
        raise
    except Exception as exc:
        raise RewindError(f"running {file} failed: {raised_in_user_code(exc, file)}") from exc
    return module.__dict__


def forget_sources() -> None:
    """Drop the fix sources run_module registered with linecache (an entry someone else put there since stays)."""
    for file, entry in list(_SOURCES.items()):
        if linecache.cache.get(file) is entry:
            del linecache.cache[file]
    _SOURCES.clear()


def function_from(source: FunctionSource, guard: Guard | None = None) -> Callable[..., Any]:
    namespace = run_module(source.text, source.file, guard)
    fn = namespace.get(source.function)
    if not callable(fn):
        raise RewindError(f"{source.file} defines no function '{source.function}'")
    return fn


def text_file(text: str, origin: str) -> str:
    """A stable pseudo file name for source text that came without a file (a DAP request's)."""
    return f"<{origin} {hashlib.sha1(text.encode()).hexdigest()[:10]}>"


def _function_name(fn: Callable[..., Any], module: dict[str, Any], file: str) -> str:
    name = getattr(fn, "__name__", "")
    if module.get(name) is not fn:
        raise RewindError(f"{file}: each function in PATCHES must be defined at the top level of the file "
                          f"('{name or fn!r}' is not)")
    return name


# -- experiments: one patch named by the user (the addPatch request) ---------------------------------------

def named_patch(program: Program, name: str, node: str | None, *, precision: str | None = None,
                function: str | None = None, entry: str | None = None, attributes: dict | None = None,
                edit: dict | None = None, optimizer: dict | None = None, from_step: int | None = None,
                model: tuple[str, str] = ("", "")) -> NamedPatch:
    """A named patch of every node `node` names: exactly one of a precision, a function (module text, with
    `entry` naming the function when it defines several), attributes, an edit of one value's element, or a training
    step's optimizer hyperparameters (`optimizer`: {"lr": 0.01}; the update is traced again from `model`, the file
    and entry the Program came from). `from_step`: in a training Program, the nodes named as each step from that one
    on runs them (a node name names its step's node; an op or a module path every step's)."""
    chosen = [k for k, v in (("precision", precision), ("function", function), ("attributes", attributes),
                             ("edit", edit), ("optimizer", optimizer)) if v is not None]
    if len(chosen) != 1:
        raise RewindError("give exactly one of precision, function, attributes or edit (or, for a training step, "
                          "optimizer)")
    if edit is not None:
        if from_step is not None:
            raise RewindError("an edit sets one element of one value, in the step that writes it: fromStep is for "
                              "patches of nodes")
        return NamedPatch(name, (_edit(program, edit),))
    if optimizer is not None:
        if node is not None:
            raise RewindError("an optimizer's hyperparameters patch the nodes of its update: name no node")
        return NamedPatch(name, tuple(hyperparameter_patches(program, *model, optimizer, from_step or 0)))
    if node is None:
        raise RewindError(f"name the node to patch ({chosen[0]})")
    targets = [n.index for n in nodes_named(program, node)]
    if from_step is not None:
        targets = nodes_from_step(program, targets, from_step)
        if not targets:
            raise RewindError(f"'{node}' names no node that runs in step {from_step} or later")
    if function is not None:
        change: Any = _entry_function(function, entry)
    else:
        change = precision if precision is not None else attributes
    return NamedPatch(name, tuple(patch_of(program, n, change, name) for n in targets))


def _entry_function(text: str, entry: str | None) -> Callable[..., Any]:
    file = text_file(text, "function")
    namespace = run_module(text, file)
    defined = [k for k, v in namespace.items() if isinstance(v, types.FunctionType) and v.__module__ ==
               namespace["__name__"]]
    if entry is None and len(defined) != 1:
        raise RewindError(f"the function text defines {len(defined)} functions ({', '.join(defined) or 'none'}): "
                          "name the one to use with entry")
    name = entry or defined[0]
    if name not in defined:
        raise RewindError(f"the function text defines no function '{name}' (it defines {', '.join(defined)})")
    return namespace[name]


def _edit(program: Program, edit: dict) -> EditPatch:
    value, index, number = edit.get("value"), edit.get("index"), edit.get("set")
    info = program.values.get(value) if isinstance(value, str) else None
    if info is None:
        raise RewindError(f"an edit names a value of the program, got {value!r}")
    if info.producer is None:
        raise RewindError(f"'{value}' is an input of the pass, not a node's output: edit it with setVariable "
                          "(a recorded edit)")
    if not isinstance(index, list) or len(index) != len(info.shape) or not all(
            isinstance(i, int) and 0 <= i < s for i, s in zip(index, info.shape)):
        raise RewindError(f"'{value}' has shape {list(info.shape)}: give an index inside it, got {index!r}")
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        raise RewindError(f"an edit sets a number, got {number!r}")
    return EditPatch(info.producer, value, tuple(index), float(number))
