"""Turn a user's PyTorch file into a Program with torch.export.

The file defines a callable (default `build`) returning `(nn.Module, tuple_of_inputs)`.
Each node keeps the innermost user-code frame of its stack trace (torch's own files are
skipped) and its module stack (`blocks.2.attn`).
"""

from __future__ import annotations

import importlib.util
import operator
import os
import re
import sys
import sysconfig
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from hardware.errors import ProgramLoadError, echo, os_reason, raised_in_user_code
from hardware.program import Frame, Node, Program, Ref, SourceLoc, ValueInfo

_FRAME_RE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\s]+)')
_SKIPPED_ROOTS = tuple(
    os.path.realpath(p)
    for p in {os.path.dirname(torch.__file__), sysconfig.get_paths()["stdlib"]}
)
# Ops that check metadata and produce nothing a user debugs.
_DROPPED_OPS = ("aten._assert_tensor_metadata", "aten._assert_async", "aten.sym_constrain_range")


def load_module(path: str | os.PathLike, entry: str = "build") -> tuple[torch.nn.Module, tuple]:
    """Import the user's file and call its entry; every failure names its cause."""
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
        fn = getattr(module, entry, None)
        if fn is None:
            raise ProgramLoadError(f"{file} defines no '{entry}' (the entry that returns (module, inputs))")
        if not callable(fn):
            raise ProgramLoadError(f"'{entry}' in {file} is not callable")
        try:
            result = fn()  # may import too: with the file's folder still on sys.path
        except Exception as exc:
            raise ProgramLoadError(f"calling {entry}() in {file} failed: {raised_in_user_code(exc, file)}") from exc
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ProgramLoadError(
            f"{entry}() in {file} must return (torch.nn.Module, tuple_of_inputs), got {type(result).__name__}"
        )
    model, inputs = result
    if not isinstance(model, torch.nn.Module):
        raise ProgramLoadError(f"{entry}() in {file} returned {type(model).__name__} where a torch.nn.Module belongs")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, tuple):
        raise ProgramLoadError(f"{entry}() in {file} returned inputs of type {type(inputs).__name__}; a tuple belongs")
    return model, inputs


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
        for name, mod in list(sys.modules.items()):
            if name not in before and _imported_from(name, mod) in added:
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


def export_program(model: torch.nn.Module, inputs: tuple, name: str = "program") -> Program:
    model = model.eval()
    try:
        with torch.no_grad():
            # An empty decomposition table functionalises (in-place writes to buffers become buffer
            # mutation outputs) while keeping the ops users wrote: aten.linear, aten.layer_norm, ...
            exported = torch.export.export(model, inputs).run_decompositions({})
    except Exception as exc:
        first = str(exc).strip().splitlines()
        raise ProgramLoadError(
            f"torch.export failed for {name}: {first[0] if first else 'no reason given'}\n{exc}"
        ) from exc
    return program_from_export(exported, inputs, name, model)


def load_program(path: str | os.PathLike, entry: str = "build") -> Program:
    model, inputs = load_module(path, entry)
    return export_program(model, inputs, name=Path(path).stem)


def program_from_export(ep: ExportedProgram, inputs: tuple, name: str, model: torch.nn.Module) -> Program:
    sig = ep.graph_signature
    state = dict(ep.state_dict)
    state.update(ep.constants)
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
    for fx in fx_nodes:
        if fx.target is operator.getitem:
            continue
        op = _op_name(fx.target)
        if op.startswith(_DROPPED_OPS):
            continue
        if isinstance(fx.target, torch._ops.OpOverload) and fx.target._schema.is_mutable:
            raise ProgramLoadError(f"node '{fx.name}' runs the in-place op {op}, which export did not functionalise")
        index = len(nodes)
        outputs = _output_names(fx)
        getitem_of[fx.name] = outputs
        frames = _user_frames(fx.meta.get("stack_trace") or "", fx.meta.get("nn_module_stack") or {})
        node = Node(
            index=index,
            name=fx.name,
            op=op,
            target=fx.target,
            args=_convert_args(fx.args, getitem_of),
            kwargs=_convert_args(dict(fx.kwargs), getitem_of),
            outputs=[o for o in outputs if o is not None],
            output_indices=tuple(i for i, o in enumerate(outputs) if o is not None),
            loc=frames[-1].loc if frames else None,
            frames=tuple(frames),
            module_stack=tuple((p, c) for p, c in (fx.meta.get("nn_module_stack") or {}).values()),
        )
        nodes.append(node)
        metas = fx.meta.get("val")
        metas = metas if isinstance(metas, (list, tuple)) else [metas]
        for i, (out, meta) in enumerate(zip(outputs, metas)):
            if out is None:
                continue
            if not isinstance(meta, torch.Tensor):
                raise ProgramLoadError(
                    f"node '{fx.name}' ({op}) produces a {type(meta).__name__}; only tensor outputs are supported"
                )
            values[out] = ValueInfo(out, "intermediate", _dtype(meta.dtype), tuple(int(s) for s in meta.shape),
                                    producer=index, output_index=i)

    outputs = [s.arg.name for s in sig.output_specs if s.kind == OutputKind.USER_OUTPUT]
    mutations = {s.arg.name: _placeholder_for(sig, s.target) for s in sig.output_specs
                 if s.kind == OutputKind.BUFFER_MUTATION}
    for out in outputs + list(mutations):
        if out not in values:
            raise ProgramLoadError(f"program output '{out}' is not a tensor computed by the graph")
    files = sorted({f.loc.file for n in nodes for f in n.frames})
    sources = {f: Path(f).read_text(errors="replace") for f in files if Path(f).is_file()}
    return Program(name=name, nodes=nodes, values=values, initial=initial, outputs=outputs,
                   buffer_mutations=mutations, source_files=sources)


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
    """A tuple-producing node's outputs are its getitem users (None where unused)."""
    val = fx.meta.get("val")
    if not isinstance(val, (list, tuple)):
        return [fx.name]
    names: list = [None] * len(val)
    for user in fx.users:
        if user.target is operator.getitem:
            names[user.args[1]] = user.name
    return names


def _convert_args(obj: Any, getitem_of: dict[str, list]) -> Any:
    if isinstance(obj, torch.fx.Node):
        if obj.target is operator.getitem:
            return Ref(getitem_of[obj.args[0].name][obj.args[1]])
        return Ref(obj.name)
    if isinstance(obj, tuple):
        return tuple(_convert_args(o, getitem_of) for o in obj)
    if isinstance(obj, list):
        return [_convert_args(o, getitem_of) for o in obj]
    if isinstance(obj, dict):
        return {k: _convert_args(v, getitem_of) for k, v in obj.items()}
    return obj


def _is_user_file(path: str) -> bool:
    real = os.path.realpath(path)
    return not real.startswith(_SKIPPED_ROOTS) and not path.startswith("<")


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
