"""Turn a user's PyTorch file into a Program with torch.export.

The file defines a callable (default `build`) returning `(nn.Module, inputs)`: the inputs a tuple of
positional arguments (or one tensor), or a dict of keyword arguments (`{"input_ids": ..., "attention_mask":
...}`), so a Hugging Face model is debugged as it is, with no wrapper. Program inputs are named by the forward's
parameters or the keywords given; outputs returned by name (a `ModelOutput`'s `logits`, a dict's keys) are
named so. Each node keeps the user-code frames of its stack trace (torch's own package and the standard library
are skipped; libraries such as transformers are the user's code too) and its module stack (`blocks.2.attn`).
An export that fails for a known cause says what to change. A training step (`train_step()`) is
torch_train.py's, which shares the helpers here.
"""

from __future__ import annotations

import enum
import importlib.util
import inspect
import io
import keyword
import linecache
import logging
import operator
import os
import re
import sys
import sysconfig
import tokenize
import traceback
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, Protocol, Union

import torch
from torch.export import ExportedProgram
from torch.export._tree_utils import reorder_kwargs
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind
from torch.utils import _pytree as pytree

from hardware.errors import ProgramLoadError, echo, os_reason, raised_in_user_code
from hardware.program import Frame, Node, Program, Ref, SourceLoc, ValueInfo

_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\s]+)')
# Frames skipped as not the user's: torch's own package folder, and the standard library (but not the libraries
# installed inside its folder, as an interpreter outside a virtual environment keeps its site-packages).
_TORCH_ROOT = os.path.realpath(os.path.dirname(torch.__file__))
_STDLIB_ROOT = os.path.realpath(sysconfig.get_paths()["stdlib"])
_LIBRARY_FOLDERS = ("site-packages", "dist-packages")
# Rewind's own code that calls the user's (this file, a training step's wrapper): not the user's either.
_FRONTENDS = os.path.dirname(os.path.realpath(__file__))
# What an input may hold: tensors are the Program's inputs; the rest are fixed at export (as torch.export takes them).
_FIXED_INPUT_TYPES = (bool, int, float, str, type(None), enum.Enum, torch.nn.Module, torch.ScriptObject)
Inputs = Union[tuple, dict]  # positional inputs, or keyword inputs by name
# Ops that check metadata and produce nothing a user debugs.
_DROPPED_OPS = ("aten._assert_tensor_metadata", "aten._assert_async", "aten.sym_constrain_range")


def load_module(path: str | os.PathLike, entry: str = "build") -> tuple[torch.nn.Module, Inputs]:
    """Import the user's file and call its entry; every failure names its cause. The inputs come back as a tuple
    (positional) or a dict (keyword inputs by name)."""
    with user_file(path) as module:
        result = call_entry(module, entry)
    return module_and_inputs(result, entry, Path(path))


@contextmanager
def user_file(path: str | os.PathLike) -> Iterator[ModuleType]:
    """The user's file imported, with its folder first on sys.path while inside (as `python file.py` would run it);
    a missing file or a failing import is a ProgramLoadError naming its cause."""
    file = Path(path)
    try:
        found = file.is_file()
    except (OSError, ValueError) as exc:  # a name too long, a NUL: the OS cannot even look
        raise ProgramLoadError(f"program file {echo(str(file), 200)} cannot be opened: {os_reason(exc)}") from None
    if not found:
        raise ProgramLoadError(f"program file not found: {file}")
    spec = importlib.util.spec_from_file_location(f"rewind_user_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ProgramLoadError(f"cannot import {file}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    with _importing_from(file.parent):
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise ProgramLoadError(f"importing {file} failed: {raised_in_user_code(exc, file)}") from exc
        yield module  # its entries may import too: with the file's folder still on sys.path


def call_entry(module: ModuleType, entry: str, returns: str = "(module, inputs)") -> Any:
    """What the entry of an imported user file returns; a missing entry or a failing call names its cause."""
    file = module.__file__
    fn = getattr(module, entry, None)
    if fn is None:
        raise ProgramLoadError(f"{file} defines no '{entry}' (the entry that returns {returns})")
    if not callable(fn):
        raise ProgramLoadError(f"'{entry}' in {file} is not callable")
    given = rank_arguments(fn, f"{entry}() in {file}")
    try:
        return fn(**given)
    except Exception as exc:
        raise ProgramLoadError(f"calling {entry}() in {file} failed: {raised_in_user_code(exc, file)}") from exc


def rank_arguments(fn: Callable, whose: str) -> dict[str, int]:
    """`rank` and `world_size` for an entry that takes them (`build(rank, world_size)`): the rank this process is
    of its torch.distributed process group (a session of many ranks, hardware/ranks/), and how many there are."""
    wanted = [n for n in positional_names(fn) if n in ("rank", "world_size")]
    if not wanted:
        return {}
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise ProgramLoadError(f"{whose} takes {' and '.join(wanted)}: it builds one rank of many, so launch it "
                               "with ranks (launch argument ranks: N, or rewind debug --ranks N)")
    found = {"rank": torch.distributed.get_rank(), "world_size": torch.distributed.get_world_size()}
    return {n: found[n] for n in wanted}


def module_and_inputs(result: Any, entry: str, file: Path) -> tuple[torch.nn.Module, Inputs]:
    """An entry's `(module, inputs)` checked: the inputs a tuple (one tensor made one), or a dict by keyword."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ProgramLoadError(
            f"{entry}() in {file} must return (torch.nn.Module, tuple_of_inputs) or (torch.nn.Module, "
            f"dict_of_keyword_inputs), got {type(result).__name__}"
        )
    model, inputs = result
    if not isinstance(model, torch.nn.Module):
        raise ProgramLoadError(f"{entry}() in {file} returned {type(model).__name__} where a torch.nn.Module belongs")
    return model, checked_inputs(inputs, f"{entry}() in {file} returned")


def checked_inputs(inputs: Any, whose: str) -> Inputs:
    """Inputs as a tuple of positional inputs (one tensor made one) or a dict of keyword inputs; `whose` says where
    they came from (`train_step() in model.py returned`)."""
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(inputs, dict):
        odd = [k for k in inputs if not (isinstance(k, str) and k.isidentifier())]
        if odd:
            raise ProgramLoadError(f"{whose} a dict of inputs with the key {echo(repr(odd[0]))}; "
                                   "its keys are the forward's keyword names, such as 'input_ids'")
    elif not isinstance(inputs, tuple):
        raise ProgramLoadError(f"{whose} inputs of type {type(inputs).__name__}; a tuple belongs "
                               "(positional inputs), or a dict of keyword inputs such as {'input_ids': ...}")
    return inputs


@contextmanager
def _importing_from(folder: Path) -> Iterator[None]:
    """Run a user's file with its folder first on sys.path, as `python file.py` would. Afterwards sys.path is
    exactly what it was (the same list, whatever the file did to it), and the modules imported from the folders
    put there (the file's own, and any it added itself) are dropped from sys.modules: a file loaded later from
    another folder imports its own `layers.py`, not this one's. A folder that was on sys.path before keeps its
    modules."""
    saved = list(sys.path)
    before = set(sys.modules)
    sys.path.insert(0, str(folder.resolve()))
    try:
        yield
    finally:
        importable = {_real(p) for p in saved}
        added = {_real(p) for p in sys.path} - importable
        sys.path[:] = saved
        dropped = {name: mod for name, mod in list(sys.modules.items())
                   if name not in before and _imported_from(name, mod) in added}
        hooks = LOAD_HOOKS.get()
        if hooks is not None:
            hooks.imported([f for f in (getattr(m, "__file__", None) for m in dropped.values()) if isinstance(f, str)])
        for name in dropped:
            del sys.modules[name]


def _real(entry: str) -> str:
    return os.path.realpath(entry or os.getcwd())


def _imported_from(name: str, module: Any) -> str | None:
    """The sys.path folder a module was found in: its file's folder, up one level per package above it."""
    file = getattr(module, "__file__", None)
    if not isinstance(file, str):
        return None
    levels = name.count(".") + (1 if os.path.basename(file).startswith("__init__.") else 0)
    folder = os.path.realpath(os.path.dirname(file))
    for _ in range(levels):
        folder = os.path.dirname(folder)
    return folder


def export_program(model: torch.nn.Module, inputs: Inputs, name: str = "program") -> Program:
    """The Program of `model` on `inputs` (a tuple of positional inputs or a dict of keyword inputs)."""
    model = model.eval()
    args, kwargs = split_inputs(inputs)
    check_input_types(model, args, kwargs)
    with torch.no_grad():
        hooks = LOAD_HOOKS.get()
        return hooks.program(model, args, kwargs, name) if hooks is not None else fresh_program(model, args, kwargs,
                                                                                                 name)


def fresh_program(model: torch.nn.Module, args: tuple, kwargs: dict, name: str) -> Program:
    """The Program of an export of `model` made now (no cache)."""
    exported = export(model, args, kwargs, name)
    return program_from_export(exported, tensor_inputs(exported, args, kwargs), name, model)


def split_inputs(inputs: Inputs) -> tuple[tuple, dict]:
    """(positional inputs, keyword inputs)."""
    return (tuple(inputs), {}) if not isinstance(inputs, dict) else ((), dict(inputs))


def export(model: torch.nn.Module, args: tuple, kwargs: dict, name: str,
           user_model: torch.nn.Module | None = None) -> ExportedProgram:
    """torch.export of `model`, functional, with the ops users wrote kept; a failure is a ProgramLoadError saying
    why in terms of `user_model` (default: `model`; the user's own where `model` wraps it)."""
    try:
        with quiet_export() as failure:
            try:
                # An empty decomposition table functionalises (in-place writes to buffers become buffer
                # mutation outputs) while keeping the ops users wrote: aten.linear, aten.layer_norm, ...
                exported = torch.export.export(model, args, kwargs)
                regions = autocast_regions(exported)
                return with_region_lines(exported.run_decompositions({}), regions)
            except Exception as exc:
                failure.append(exc)
                raise
    except Exception as exc:
        refused = next((e for e in _causes(exc) if isinstance(e, ProgramLoadError)), None)
        if refused is not None:  # Rewind's own words, raised from inside the traced forward
            raise refused from None
        raise ProgramLoadError(f"torch.export failed for {name}: "
                               f"{export_failure(exc, user_model or model)}") from exc


def autocast_regions(ep: ExportedProgram) -> list[dict[str, dict]]:
    """The meta (user line, module stack) of each node inside each `torch.autocast` region of `ep`, in graph order:
    export holds a region as a higher-order op over a submodule, and decomposing inlines it with the submodule's
    generated code as the nodes' stack (no user line, the root module)."""
    regions = []
    for fx in ep.graph.nodes:
        if fx.op == "call_function" and getattr(fx.target, "__name__", "") == "wrap_with_autocast":
            sub = next((getattr(ep.graph_module, a.target) for a in fx.args if getattr(a, "op", None) == "get_attr"),
                       None)
            if sub is not None:
                regions.append({n.name: n.meta for n in sub.graph.nodes if n.op == "call_function"})
    return regions


_GENERATED_LINE = re.compile(r'File "<eval_with_key>\.(\d+)", line \d+, in forward\n\s+(\w+) = ')


def with_region_lines(ep: ExportedProgram, regions: list[dict[str, dict]]) -> ExportedProgram:
    """`ep` with each node an autocast region inlined given the user line and module stack of the op it came from
    (its casts too: they are placed at the op they feed)."""
    if not regions:
        return ep
    seen: dict[str, int] = {}  # each region's generated code, numbered in the order its nodes come
    feeds = {name for region in regions for name, meta in region.items() if "_to_copy" not in name}
    outputs = {s.arg.name for s in ep.graph_signature.output_specs}
    for fx in ep.graph.nodes:
        m = _GENERATED_LINE.search(fx.meta.get("stack_trace") or "")
        if m is None:
            continue
        region = seen.setdefault(m[1], len(seen))
        meta = regions[region].get(m[2]) if region < len(regions) else None
        if meta is not None:
            for key in ("stack_trace", "nn_module_stack"):
                if meta.get(key):
                    fx.meta[key] = meta[key]
            if fx.target is torch.ops.aten._to_copy.default and m[2] in feeds and fx.name not in outputs:
                fx._rename(f"{m[2]}_cast")  # a cast autocast inserted: named after the op it feeds (`linear_cast`)
    return ep


class LoadHooks(Protocol):
    """What watches and serves the load of a model file under way (hardware/session/program_cache.py)."""

    def program(self, model: torch.nn.Module, args: tuple, kwargs: dict, name: str) -> Program:
        """Instead of fresh_program() in export_program: its result for these arguments."""

    def imported(self, files: list[str]) -> None:
        """The files of the modules the user's file imported from its folder and the folders it put on sys.path."""


# The hooks of the load under way, if any: a ContextVar, so one load's, no other's.
LOAD_HOOKS: ContextVar[LoadHooks | None] = ContextVar("rewind_load_hooks", default=None)


def load_program(path: str | os.PathLike, entry: str = "build") -> Program:
    model, inputs = load_module(path, entry)
    return export_program(model, inputs, name=Path(path).stem)


def program_from_export(ep: ExportedProgram, inputs: tuple, name: str, model: torch.nn.Module) -> Program:
    """`inputs`: the tensors among the user's inputs, in the exported order (numbers, strings and None given as
    inputs were fixed at export and are no values of the Program). Parameters, buffers and tensor attributes are
    `model`'s own (the ones export saw; a cached program holds placeholders), constants made in forward `ep`'s."""
    sig = ep.graph_signature
    state = dict(ep.state_dict)
    state.update(ep.constants)
    state.update(model_tensors(model))
    values: dict[str, ValueInfo] = {}
    initial: dict[str, Any] = {}
    user_inputs = iter(inputs)
    kinds = {
        InputKind.PARAMETER: "parameter",
        InputKind.BUFFER: "buffer",
        InputKind.CONSTANT_TENSOR: "constant",
        InputKind.USER_INPUT: "input",
    }
    for spec in sig.input_specs:
        if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument):
            continue  # a number, string or None: part of the graph now
        kind = kinds.get(spec.kind)
        if kind is None:
            raise ProgramLoadError(f"unsupported exported input kind {spec.kind} for '{spec.arg.name}'")
        tensor = next(user_inputs) if kind == "input" else state[spec.target]
        if not isinstance(tensor, torch.Tensor):
            raise ProgramLoadError(f"input '{spec.arg.name}' is a {type(tensor).__name__}; only tensors are supported")
        tensor = tensor.detach()
        values[spec.arg.name] = ValueInfo(spec.arg.name, kind, _dtype(tensor.dtype), tuple(tensor.shape), target=spec.target)
        initial[spec.arg.name] = tensor

    nodes: list[Node] = []
    getitem_of: dict[str, list] = {}
    fx_nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
    rename = _named_outputs(ep, {n.name for n in fx_nodes}, {n.name for n in ep.graph.nodes})
    for fx in fx_nodes:
        converted = convert_node(fx, len(nodes), getitem_of, rename)
        if converted is not None:
            nodes.append(converted[0])
            values.update(converted[1])

    outputs = [rename.get(s.arg.name, s.arg.name) for s in sig.output_specs if s.kind == OutputKind.USER_OUTPUT]
    mutations = {s.arg.name: _placeholder_for(sig, s.target) for s in sig.output_specs
                 if s.kind == OutputKind.BUFFER_MUTATION}
    for out in outputs + list(mutations):
        if out not in values:
            raise ProgramLoadError(f"program output '{out}' is not a tensor computed by the graph")
    return Program(name=name, nodes=nodes, values=values, initial=initial, outputs=outputs,
                   buffer_mutations=mutations, source_files=source_files(nodes))


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of a module by its path: parameters, buffers and plain tensor attributes (which export lifts as
    constants), as export names them."""
    found = {f"{prefix}.{k}" if prefix else k: v for prefix, module in model.named_modules(remove_duplicate=False)
             for k, v in vars(module).items() if isinstance(v, torch.Tensor)}
    found.update(model.named_buffers(remove_duplicate=False))
    found.update(model.named_parameters(remove_duplicate=False))
    return found


def source_files(nodes: list[Node]) -> dict[str, str]:
    """The text of every user source file the nodes' frames name."""
    files = sorted({f.loc.file for n in nodes for f in n.frames})
    return {f: Path(f).read_text(errors="replace") for f in files if Path(f).is_file()}


def convert_node(fx: torch.fx.Node, index: int, getitem_of: dict[str, list], rename: dict[str, str],
                 module_stack: dict | None = None) -> tuple[Node, dict[str, ValueInfo]] | None:
    """The Node of one fx call at `index` (named as the fx node) and the Values it writes; None for what is no node
    of its own (a getitem, a metadata check). `rename`: fx name -> Value name where they differ; `getitem_of`
    collects each tuple-returning node's output names; `module_stack`: the node's nn_module_stack (default: its
    own)."""
    if fx.target is operator.getitem:
        return None
    op = _op_name(fx.target)
    if op.startswith(_DROPPED_OPS):
        return None
    if isinstance(fx.target, torch._ops.OpOverload) and fx.target._schema.is_mutable:
        raise ProgramLoadError(f"node '{fx.name}' runs the in-place op {op}, which export did not functionalise")
    outputs = [rename.get(o, o) if o is not None else None for o in _output_names(fx)]
    getitem_of[fx.name] = outputs
    stack = (fx.meta.get("nn_module_stack") or {}) if module_stack is None else module_stack
    frames = _user_frames(fx.meta.get("stack_trace") or "", stack)
    node = Node(
        index=index,
        name=fx.name,
        op=op,
        target=fx.target,
        args=_convert_args(fx.args, getitem_of, rename),
        kwargs=_convert_args(dict(fx.kwargs), getitem_of, rename),
        outputs=[o for o in outputs if o is not None],
        output_indices=tuple(i for i, o in enumerate(outputs) if o is not None),
        loc=frames[-1].loc if frames else None,
        frames=tuple(frames),
        module_stack=tuple((p, c) for p, c in stack.values()),
    )
    metas = fx.meta.get("val")
    metas = metas if isinstance(metas, (list, tuple)) else [metas]
    values: dict[str, ValueInfo] = {}
    for i, (out, meta) in enumerate(zip(outputs, metas)):
        if out is None:
            continue
        if not isinstance(meta, torch.Tensor):
            raise ProgramLoadError(
                f"node '{fx.name}' ({op}) produces a {type(meta).__name__}; only tensor outputs are supported"
            )
        values[out] = ValueInfo(out, "intermediate", _dtype(meta.dtype), tuple(int(s) for s in meta.shape),
                                producer=index, output_index=i)
    return node, values


def _placeholder_for(sig, buffer_target: str) -> str:
    for spec in sig.input_specs:
        if spec.target == buffer_target:
            return spec.arg.name
    raise ProgramLoadError(f"mutated buffer '{buffer_target}' has no input")


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # aten.linear.default
    return getattr(target, "__qualname__", None) or str(target)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _output_names(fx) -> list:
    """A tuple-producing node's outputs are its getitem users (None where unused, and where the op gave None: a
    backward op computes only the gradients asked for)."""
    val = fx.meta.get("val")
    if not isinstance(val, (list, tuple)):
        return [fx.name]
    names: list = [None] * len(val)
    for user in fx.users:
        if user.target is operator.getitem and val[user.args[1]] is not None:
            names[user.args[1]] = user.name
    return names


def _convert_args(obj: Any, getitem_of: dict[str, list], rename: dict[str, str]) -> Any:
    if isinstance(obj, torch.fx.Node):
        if obj.target is operator.getitem:
            return Ref(getitem_of[obj.args[0].name][obj.args[1]])
        return Ref(rename.get(obj.name, obj.name))
    if isinstance(obj, tuple):
        return tuple(_convert_args(o, getitem_of, rename) for o in obj)
    if isinstance(obj, list):
        return [_convert_args(o, getitem_of, rename) for o in obj]
    if isinstance(obj, dict):
        return {k: _convert_args(v, getitem_of, rename) for k, v in obj.items()}
    return obj


def _inside(path: str, folder: str) -> bool:
    """Is `path` the folder or inside it? (Not merely named with it as a prefix: torchvision is not torch.)"""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _is_user_file(path: str) -> bool:
    """Code the user debugs: their own files and any library's (transformers, torchvision, ...), not torch's own
    package nor the standard library."""
    if path.startswith("<"):
        return False
    real = os.path.realpath(path)
    if _inside(real, _TORCH_ROOT) or _inside(real, _FRONTENDS):
        return False
    if _inside(real, _STDLIB_ROOT):
        return os.path.relpath(real, _STDLIB_ROOT).split(os.sep, 1)[0] in _LIBRARY_FOLDERS
    return True


def _user_frames(stack_trace: str, module_stack: dict) -> list[Frame]:
    """User frames, outermost first, each tagged with the module whose forward it runs."""
    modules = [(p, c.rsplit(".", 1)[-1]) for p, c in module_stack.values() if not c.startswith("torch.")]
    frames: list[Frame] = []
    current: tuple[str | None, str | None] = (None, None)
    for m in _FRAME_RE.finditer(stack_trace):
        file, line, func = m["file"], int(m["line"]), m["func"]
        if not _is_user_file(file):
            continue
        if func == "forward" and modules:
            current = modules.pop(0)
        frames.append(Frame(SourceLoc(os.path.realpath(file), line, func), current[0], current[1]))
    return frames


# -- inputs and outputs as the user gave and named them ---------------------------------------------------------

def positional_names(fn: Callable) -> list[str]:
    """The names of a function's parameters that can be given by position ([] when Python cannot read them)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature Python can read
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _input_labels(model: torch.nn.Module, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """Each top-level input with the name the user knows it by: its keyword, or the forward's parameter."""
    params = positional_names(model.forward)
    ordinal = ("first", "second", "third", "fourth", "fifth")
    labels = []
    for i, value in enumerate(args):
        nth = ordinal[i] if i < len(ordinal) else f"#{i + 1}"
        labels.append((f"'{params[i]}' (the {nth} positional input)" if i < len(params) else
                       f"the {nth} positional input", value))
    labels += [(f"'{k}'", v) for k, v in kwargs.items()]
    return labels


def check_input_types(model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Refuse, naming the input, what torch.export cannot take (a numpy array, an image, a custom object)."""
    for label, value in _input_labels(model, args, kwargs):
        for path, leaf in pytree.tree_flatten_with_path(value)[0]:
            if isinstance(leaf, (torch.Tensor, *_FIXED_INPUT_TYPES)):
                continue
            kind = type(leaf)
            where = f" at {pytree.keystr(path)}" if path else ""
            tip = " (torch.from_numpy(...) makes it a tensor)" if kind.__module__.split(".")[0] == "numpy" else ""
            raise ProgramLoadError(
                f"input {label}{where} is a {kind.__module__}.{kind.__qualname__}{tip}, which torch.export cannot "
                "take: an input is a tensor, or a tuple, list or dict of tensors; numbers, booleans, strings and "
                "None are accepted too (fixed at export)")


def tensor_inputs(ep: ExportedProgram, args: tuple, kwargs: dict) -> tuple:
    """The tensors among the inputs, in the order of the exported program's user inputs."""
    in_spec = ep.call_spec.in_spec
    if kwargs and in_spec is not None:
        kwargs = reorder_kwargs(kwargs, in_spec)
    return tuple(t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))


def _named_outputs(ep: ExportedProgram, produced: set[str], taken: set[str]) -> dict[str, str]:
    """Graph output name -> the name the model returned it by (`logits` of a ModelOutput, a dict's key,
    `past_key_values_0_key`); outputs returned by position keep the graph's names."""
    spec = ep.call_spec.out_spec
    names = [s.arg.name for s in ep.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    if spec is None or spec.num_leaves != len(names):
        return {}
    markers = [torch.empty(0) for _ in names]  # one distinct object per output, to find it again by identity
    try:
        rebuilt = pytree.tree_unflatten(markers, spec)
        paths = pytree.tree_flatten_with_path(rebuilt)[0]
    except Exception:  # a returned type that cannot be rebuilt from placeholders: keep the graph's names
        return {}
    index = {id(m): i for i, m in enumerate(markers)}
    rename: dict[str, str] = {}
    taken = set(taken)
    for path, leaf in paths:
        i = index.get(id(leaf))
        if i is None:
            continue
        parts = [_key_name(k) for k in path]
        if not any(isinstance(p, str) for p in parts):
            continue
        new = "_".join(str(p) for p in parts)
        old = names[i]
        if (old in produced and old not in rename and new.isidentifier() and not keyword.iskeyword(new)
                and not new.startswith("_") and new not in taken):
            rename[old] = new
            taken.add(new)
    return rename


def _key_name(key: Any) -> str | int:
    if isinstance(key, pytree.MappingKey):
        return key.key if isinstance(key.key, (str, int)) else str(key.key)
    if isinstance(key, pytree.GetAttrKey):
        return key.name
    if isinstance(key, pytree.SequenceKey):
        return key.idx
    return re.sub(r"\W", "", str(key)) or "x"


# -- export failures with a known cause, in the user's terms ------------------------------------------------------

class _HeldRecords(logging.Filter):
    """Holds a logger's records back (to pass them on later, or not)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


@contextmanager
def quiet_export() -> Iterator[list]:
    """torch reports a failing export on its own (the partial graph printed to stderr twice, a data-dependent guard
    logged), and the error Rewind raises says why, once. So what export writes to stderr and what torch's shape
    logger logs is held back: afterwards stderr is written out without the partial graph, and the log records are
    passed on only when the export succeeded (so is what fake tensors log of a failing op: its stack). The list it
    yields takes the failure, if any."""
    loggers = [logging.getLogger(name) for name in ("torch.fx.experimental.symbolic_shapes",
                                                    "torch._subclasses.fake_tensor")]
    records, saved, held = _HeldRecords(), sys.stderr, io.StringIO()
    failure: list = []
    for logger in loggers:
        logger.addFilter(records)
    sys.stderr = held
    try:
        yield failure
    finally:
        sys.stderr = saved
        for logger in loggers:
            logger.removeFilter(records)
        text = held.getvalue()
        graph = getattr(failure[0], "partial_fx_graph", None) if failure else None
        if graph is not None and str(graph).strip():
            text = text.replace(str(graph) + "\n", "").replace(str(graph), "")
        if text.strip():
            saved.write(text)
        if not failure:
            for record in records.records:
                logging.getLogger(record.name).handle(record)


def export_failure(exc: BaseException, model: torch.nn.Module) -> str:
    """Why torch.export refused the model and what to change, for the causes users meet; else torch's words."""
    text = str(exc).strip()
    found = re.search(r"Found <class '([\w.]+)'> in output", text)
    if found:
        cls = found[1].rsplit(".", 1)[-1]
        config = getattr(model, "config", None)
        if "cache" in cls.lower() and hasattr(config, "use_cache"):
            return (f"the model returns a {cls} (its key/value cache for generation), which is not a tensor: "
                    f"set use_cache=False in its config (model.config.use_cache = False, or "
                    f"{type(config).__name__}(..., use_cache=False)), or pass use_cache=False among the inputs")
        if "cache" in cls.lower():
            return (f"the model returns a {cls} (a cache), which is not a tensor: return the cache's tensors, or "
                    "leave the cache out of the outputs")
        return (f"the model returns a {cls}, which is not a tensor: return tensors, or tuples, lists, dicts or "
                "dataclasses of them")
    if _data_dependent(exc) or "data-dependent" in text:
        where = _user_line(exc, text)
        return (f"{where}decides on a tensor's values (data-dependent control flow), which torch.export cannot "
                "trace: compute both branches and pick with torch.where, or use torch.cond, or decide on a static "
                "shape or a Python value instead")
    unsupported = re.search(r"Unsupported input type <class '([\w.]+)'>", text)
    if unsupported:
        return (f"an input is a {unsupported[1]}, which torch.export cannot take: an input is a tensor, or a tuple, "
                "list or dict of tensors; numbers, booleans, strings and None are accepted too (fixed at export)")
    return text or "no reason given"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _data_dependent(exc: BaseException) -> bool:
    # Imported here: symbolic_shapes imports sympy (about half a second), which a cached launch never needs.
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    return any(isinstance(e, GuardOnDataDependentSymNode) for e in _causes(exc))


def _user_line(exc: BaseException, text: str) -> str:
    """`model.py:8 \\`if x.sum() > 0:\\` `: the line of the user's code (or a library's) that raised, if known."""
    for e in _causes(exc):
        frames = [f for f in traceback.extract_tb(e.__traceback__) if _is_user_file(f.filename)]
        if frames:
            file, line = frames[-1].filename, frames[-1].lineno or 0
            code = _without_comment(frames[-1].line or linecache.getline(file, line))
            return f"{os.path.basename(file)}:{line} `{code}` " if code else f"{os.path.basename(file)}:{line} "
    found = re.search(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', text)
    if found:
        return f"{os.path.basename(found[1])}:{found[2]} `{_without_comment(found[3])}` "
    return "the model "


def _without_comment(line: str) -> str:
    """A line of source as code: `if x.sum() > 0:` of `if x.sum() > 0:  # why`."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if token.type == tokenize.COMMENT:
                return line.strip()[: token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):  # a line that is not whole code on its own (an open bracket)
        pass
    return line.strip()
