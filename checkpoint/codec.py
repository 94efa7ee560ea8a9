"""Bytes for tensors and Programs: what checkpoint tiers and trace files store.

Tensors are raw element bytes compressed with lz4 plus dtype and shape. Programs are plain
msgpack-able structures; a node's op is stored by name (`aten.linear.default`) and resolved
back to the torch op when a trace is opened.

What is decoded here may come from a file someone else made: nothing read is ever called,
imported or looked up by name in an open namespace. Dtypes, devices, layouts and memory
formats come from fixed tables; an op name resolves only to an operator registered with
torch's dispatcher; every field is checked for its type and range before it is used, and a
tensor's size is checked against what its record can hold before anything is allocated.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any, get_args

import lz4.block
import torch

from hardware import optimizer_ops  # noqa: F401  (it registers rewind::adam_update: a trace's nodes may name it)
from hardware import random_ops  # noqa: F401  (it registers rewind::seeded_*: dropout's nodes, say)
from hardware.errors import RewindError
from hardware.program import Frame, Node, Phase, Program, Ref, SourceLoc, ValueInfo

MAX_TENSOR_BYTES = 2**31 - 1  # lz4 block limit
MAX_NDIM = 64  # torch's own limit on a tensor's dimensions
LZ4_MAX_RATIO = 255  # an lz4 block cannot expand more than this (plus a few bytes of end literals)
MAX_ARG_DEPTH = 32  # nesting of a node's arguments (lists, tuples, dicts): far above what export produces

# Element types by name: the names `str(dtype)` writes (and a few aliases). Looked up in this table only.
_DTYPE_NAMES = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
                "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
                "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
                "half", "float", "double", "short", "int", "long", "cfloat", "cdouble", "chalf")
DTYPES: dict[str, torch.dtype] = {n: d for n in _DTYPE_NAMES if isinstance(d := getattr(torch, n, None), torch.dtype)}
LAYOUTS: dict[str, torch.layout] = {str(v).removeprefix("torch."): v for v in (
    torch.strided, torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)}
MEMORY_FORMATS: dict[str, torch.memory_format] = {str(v).removeprefix("torch."): v for v in (
    torch.contiguous_format, torch.channels_last, torch.channels_last_3d, torch.preserve_format)}
_DEVICE = re.compile(r"(cpu|cuda|meta|mps|xpu|hip|privateuseone)(:\d{1,4})?")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
_VALUE_KINDS = ("input", "parameter", "buffer", "constant", "intermediate")
_PHASES = get_args(Phase)


def dtype_of(name: str) -> torch.dtype:
    dtype = DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise RewindError(f"unknown dtype {shown(name)}")
    return dtype


def shown(value: Any, limit: int = 80) -> str:
    """A value from a file, quoted and cut short, for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def encode_tensor(tensor: torch.Tensor, compress: bool = True) -> dict:
    t = tensor.detach().contiguous().cpu()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""  # a 0-d tensor has no byte view
    if len(raw) > MAX_TENSOR_BYTES:
        raise RewindError(f"tensor of {len(raw)} bytes is over the {MAX_TENSOR_BYTES}-byte frame limit")
    data = lz4.block.compress(raw, store_size=False) if compress and raw else raw
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "nbytes": len(raw),
            "lz4": bool(compress and raw), "data": data}


def check_shape(shape: Any, what: str = "shape", limit: int = MAX_TENSOR_BYTES) -> tuple[int, ...]:
    """A shape from a file: a list of at most MAX_NDIM non-negative ints with at most `limit` elements."""
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM:
        raise RewindError(f"{what} {shown(shape)} is not a list of at most {MAX_NDIM} sizes")
    if not all(type(s) is int and 0 <= s <= limit for s in shape):
        raise RewindError(f"{what} {shown(shape)} holds a size that is not an integer in 0..{limit}")
    numel = 1
    for s in shape:
        numel = min(numel * s, limit + 1)  # stays over the limit once over it (until a 0 makes it empty)
    if numel > limit:
        raise RewindError(f"{what} {shown(shape)} has more than {limit} elements")
    return tuple(shape)


def decode_tensor(obj: Any, device: str | torch.device = "cpu") -> torch.Tensor:
    """A tensor record back to a tensor. Every field is checked first, and the declared size against what the
    record's bytes can hold: nothing is allocated for a size the record cannot back."""
    if not isinstance(obj, dict):
        raise RewindError(f"corrupt tensor record: not a map but {shown(obj)}")
    for key in ("dtype", "shape", "nbytes", "data"):
        if key not in obj:
            raise RewindError(f"corrupt tensor record: no '{key}'")
    try:
        dtype = dtype_of(obj["dtype"])
        shape = check_shape(obj["shape"])
    except RewindError as exc:
        raise RewindError(f"corrupt tensor record: {exc}") from None
    nbytes, data, compressed = obj["nbytes"], obj["data"], obj.get("lz4", False)
    if not isinstance(compressed, bool):
        raise RewindError(f"corrupt tensor record: 'lz4' is {shown(compressed)}, not true or false")
    if not isinstance(data, (bytes, bytearray)):
        raise RewindError("corrupt tensor record: its data are not bytes")
    numel = 1
    for s in shape:
        numel *= s
    expected = numel * dtype.itemsize
    if type(nbytes) is not int or nbytes != expected or nbytes > MAX_TENSOR_BYTES:
        raise RewindError(f"corrupt tensor record: {shown(nbytes)} bytes declared for shape {list(shape)} of "
                          f"{obj['dtype']} ({expected} bytes)")
    if compressed:
        if nbytes > LZ4_MAX_RATIO * len(data) + 64:
            raise RewindError(f"corrupt tensor record: {nbytes} bytes declared, more than {len(data)} compressed "
                              f"bytes can hold")
        try:
            raw = lz4.block.decompress(data, uncompressed_size=nbytes) if nbytes else b""
        except lz4.block.LZ4BlockError:
            raise RewindError(f"corrupt tensor record: its {len(data)} compressed bytes do not decompress to "
                              f"{nbytes} bytes") from None
    else:
        raw = bytes(data)
    if len(raw) != nbytes:
        raise RewindError(f"corrupt tensor record: {len(raw)} bytes for shape {list(shape)} of {obj['dtype']}")
    if not raw:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).to(device)


# -- Programs ----------------------------------------------------------------------------------
def encode_arg(obj: Any) -> Any:
    if isinstance(obj, Ref):
        return {"$ref": obj.name}
    if isinstance(obj, torch.dtype):
        return {"$dtype": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"$device": str(obj)}
    if isinstance(obj, torch.layout):
        return {"$layout": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.memory_format):
        return {"$memory_format": str(obj).removeprefix("torch.")}
    if isinstance(obj, tuple):
        return {"$tuple": [encode_arg(o) for o in obj]}
    if isinstance(obj, list):
        return [encode_arg(o) for o in obj]
    if isinstance(obj, dict):
        return {"$dict": {str(k): encode_arg(v) for k, v in obj.items()}}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise RewindError(f"cannot store a node argument of type {type(obj).__name__}: {obj!r}")


def decode_arg(obj: Any, depth: int = 0) -> Any:
    """A node argument back from its stored form: plain values, containers (nested at most MAX_ARG_DEPTH deep) and
    the tagged torch objects, each taken from a fixed table."""
    if depth > MAX_ARG_DEPTH:
        raise RewindError(f"node argument nests deeper than {MAX_ARG_DEPTH} levels")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [decode_arg(o, depth + 1) for o in obj]
    if not isinstance(obj, dict) or len(obj) != 1:
        raise RewindError(f"corrupt node argument {shown(obj)}")
    (tag, value), = obj.items()
    if tag == "$ref":
        if not isinstance(value, str) or not value:
            raise RewindError(f"corrupt value reference {shown(value)}")
        return Ref(value)
    if tag == "$dtype":
        return dtype_of(value)
    if tag == "$device":
        if not isinstance(value, str) or not _DEVICE.fullmatch(value):
            raise RewindError(f"unknown device {shown(value)}")
        return torch.device(value)
    if tag in ("$layout", "$memory_format"):
        table = LAYOUTS if tag == "$layout" else MEMORY_FORMATS
        found = table.get(value) if isinstance(value, str) else None
        if found is None:
            raise RewindError(f"unknown {tag[1:].replace('_', ' ')} {shown(value)}")
        return found
    if tag == "$tuple" and isinstance(value, list):
        return tuple(decode_arg(o, depth + 1) for o in value)
    if tag == "$dict" and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: decode_arg(v, depth + 1) for k, v in value.items()}
    raise RewindError(f"corrupt node argument {shown(obj)}")


class _Unavailable:
    """The target of a well-formed op name this torch does not register (a custom op whose library is not
    loaded, an op of a newer torch): the trace's recorded values stand in for it; running it says why not."""

    unavailable_op = True

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        raise RewindError(f"op {self.name} is not available in this torch build")


# Attributes of torch.ops that are not operator namespaces: its methods (import_module, load_library) and state.
_NOT_NAMESPACES = (frozenset(n for n in dir(type(torch.ops)) if not n.startswith("__"))
                   | {"higher_order", "loaded_libraries", "_dir"})


@functools.lru_cache(maxsize=4096)
def resolve_op(name: str) -> Any:
    """`aten.linear.default` -> torch.ops.aten.linear.default, an operator overload registered with torch's
    dispatcher. The name must be three plain identifiers (no dunders) and is looked up in the dispatcher's
    registry before any attribute of torch.ops is touched, so no name reaches torch.ops' own methods
    (import_module, load_library). An op may be a dunder (`aten.__and__.Tensor`, what `&` exports as), its
    namespace or overload not. A well-formed name this torch does not register gives a stand-in that says so when
    called; anything else raises RewindError."""
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) != 3 or not all(_IDENTIFIER.fullmatch(p) for p in parts) or parts[0].startswith("__") \
            or parts[2].startswith("__"):
        raise RewindError("not a registered torch operator")
    ns, packet, overload = parts
    if ns in _NOT_NAMESPACES or packet in ("name", "_dir"):
        raise RewindError("not a registered torch operator")
    try:
        op, overloads = torch._C._jit_get_operation(f"{ns}::{packet}")
    except RuntimeError:
        op, overloads = None, None
    if op is None or ("" if overload == "default" else overload) not in (overloads or ()):
        if packet.startswith("__"):  # only a registered dunder is an op (`aten.__class__` is torch.ops' own)
            raise RewindError("not a registered torch operator")
        return _Unavailable(name)
    try:
        namespace = getattr(torch.ops, ns)
        if not isinstance(namespace, torch._ops._OpNamespace):
            raise RewindError("not a registered torch operator")
        target = getattr(getattr(namespace, packet), overload)
    except (AttributeError, RuntimeError):
        return _Unavailable(name)
    if not isinstance(target, torch._ops.OpOverload) or str(target) != name:
        raise RewindError("not a registered torch operator")
    return target


def _loc(loc: SourceLoc | None) -> list | None:
    return [loc.file, loc.line, loc.function] if loc else None


def _unloc(obj: Any, what: str) -> SourceLoc | None:
    if obj is None:
        return None
    if (not isinstance(obj, list) or len(obj) != 3 or not isinstance(obj[0], str) or type(obj[1]) is not int
            or not 0 <= obj[1] < 2**31 or not isinstance(obj[2], str)):
        raise RewindError(f"{what} has a malformed source location {shown(obj)}")
    return SourceLoc(obj[0], obj[1], obj[2])


def encode_program(program: Program) -> dict:
    return {
        "name": program.name,
        "nodes": [{
            "name": n.name, "op": n.op, "args": encode_arg(n.args), "kwargs": encode_arg(n.kwargs),
            "outputs": n.outputs, "output_indices": list(n.output_indices), "loc": _loc(n.loc),
            "frames": [[_loc(f.loc), f.module_path, f.module_class] for f in n.frames],
            "module_stack": [list(m) for m in n.module_stack],
            "phase": n.phase, "step": n.step, "differentiates": n.differentiates,
        } for n in program.nodes],
        "values": [[v.name, v.kind, v.dtype, list(v.shape), v.producer, v.output_index, v.target]
                   for v in program.values.values()],
        "outputs": program.outputs,
        "buffer_mutations": program.buffer_mutations,
        "source_files": program.source_files,
        "step_starts": program.step_starts, "losses": program.losses, "gradients": program.gradients,
        "optimizer": program.optimizer,
    }


def _str_list(obj: Any, what: str) -> list[str]:
    if not isinstance(obj, list) or not all(isinstance(s, str) for s in obj):
        raise RewindError(f"{what} is not a list of names: {shown(obj)}")
    return obj


def _str_map(obj: Any, what: str) -> dict[str, str]:
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise RewindError(f"{what} is not a map of names to names")
    return obj


def _decode_value(v: Any, count: int) -> ValueInfo:
    if not isinstance(v, list) or len(v) != 7 or not isinstance(v[0], str) or not v[0]:
        raise RewindError(f"value record {shown(v)} is malformed")
    name, kind, dtype, shape, producer, output_index, target = v
    what = f"value '{name}'"
    if kind not in _VALUE_KINDS:
        raise RewindError(f"{what} has unknown kind {shown(kind)}")
    dtype_of(dtype)
    shape = check_shape(shape, f"{what} has shape", 2**48)
    if producer is not None and (type(producer) is not int or not 0 <= producer < count):
        raise RewindError(f"{what} names producer node {shown(producer)}, which the program does not have "
                          f"({count} nodes)")
    if (producer is None) != (kind != "intermediate"):
        raise RewindError(f"{what} is of kind {kind} but {'has' if producer is not None else 'lacks'} a producer node")
    if type(output_index) is not int or not 0 <= output_index < 2**16:
        raise RewindError(f"{what} has output index {shown(output_index)}")
    if target is not None and not isinstance(target, str):
        raise RewindError(f"{what} has target {shown(target)}")
    return ValueInfo(name, kind, dtype, shape, producer, output_index, target)


def _decode_node(i: int, n: Any, values: dict[str, ValueInfo]) -> Node:
    if not isinstance(n, dict) or not isinstance(n.get("name"), str):
        raise RewindError(f"node {i} is malformed")
    what = f"node {i} '{n['name']}'"
    for key in ("op", "args", "kwargs", "outputs", "output_indices", "loc", "frames", "module_stack"):
        if key not in n:
            raise RewindError(f"{what} has no '{key}'")
    op = n["op"]
    if not isinstance(op, str):
        raise RewindError(f"{what} names op {shown(op)}, which is not a registered torch operator")
    try:
        target = resolve_op(op)
    except RewindError:
        raise RewindError(f"{what} names op {shown(op)}, which is not a registered torch operator") from None
    try:
        args, kwargs = decode_arg(n["args"]), decode_arg(n["kwargs"])
    except RewindError as exc:
        raise RewindError(f"{what}: {exc}") from None
    if not isinstance(args, tuple) or not isinstance(kwargs, dict):
        raise RewindError(f"{what} has malformed arguments")
    refs: list[str] = []
    _refs((args, kwargs), refs)
    for ref in refs:
        info = values.get(ref)
        if info is None or (info.producer is not None and info.producer >= i):
            raise RewindError(f"{what} reads '{ref}', which the program does not define before it")
    outputs = _str_list(n["outputs"], f"{what}'s outputs")
    indices = n["output_indices"]
    if (not isinstance(indices, list) or len(indices) != len(outputs)
            or not all(type(x) is int and 0 <= x < 2**16 for x in indices)):
        raise RewindError(f"{what} has malformed output indices {shown(indices)}")
    for out in outputs:
        info = values.get(out)
        if info is None or info.producer != i:
            raise RewindError(f"{what} writes '{out}', which the program's values do not say it produces")
    frames = n["frames"]
    if not isinstance(frames, list):
        raise RewindError(f"{what} has malformed frames")
    decoded_frames = []
    for f in frames:
        if (not isinstance(f, list) or len(f) != 3 or f[0] is None
                or not all(x is None or isinstance(x, str) for x in f[1:])):
            raise RewindError(f"{what} has a malformed frame {shown(f)}")
        decoded_frames.append(Frame(_unloc(f[0], what), f[1], f[2]))
    stack = n["module_stack"]
    if not isinstance(stack, list) or not all(isinstance(m, list) and len(m) == 2
                                              and all(isinstance(x, str) for x in m) for m in stack):
        raise RewindError(f"{what} has a malformed module stack")
    # A training step's fields; a trace written before them holds inference passes: forward nodes of step 0.
    phase, step, differentiates = n.get("phase", "forward"), n.get("step", 0), n.get("differentiates")
    if phase not in _PHASES or type(step) is not int or not 0 <= step < 2**31:
        raise RewindError(f"{what} has a malformed phase {shown(phase)} or step {shown(step)}")
    if differentiates is not None and (phase != "backward" or type(differentiates) is not int
                                       or not 0 <= differentiates < i):
        raise RewindError(f"{what} differentiates node {shown(differentiates)}, not a forward node before it")
    return Node(index=i, name=n["name"], op=op, target=target, args=args, kwargs=kwargs, outputs=list(outputs),
                output_indices=tuple(indices), loc=_unloc(n["loc"], what), frames=tuple(decoded_frames),
                module_stack=tuple(tuple(m) for m in stack), phase=phase, step=step, differentiates=differentiates)


_META = torch.device("meta")


def _check_on_meta(node: Node, values: dict[str, ValueInfo]) -> None:
    """Run the node's operator on meta tensors (shapes and dtypes, no data, nothing allocated) of the values the
    program gives it, and check it writes what the program says: a node a trace describes wrongly is refused
    when the trace opens, not when the node is run again. Factory ops are sent to the meta device too. An op
    with no meta kernel (or a data-dependent output shape) is left to be checked when it runs."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return

    def meta(obj: Any) -> Any:
        if isinstance(obj, Ref):
            info = values[obj.name]
            return torch.empty(info.shape, dtype=DTYPES[info.dtype], device=_META)
        if isinstance(obj, torch.device):
            return _META
        if isinstance(obj, (list, tuple)):
            return type(obj)(meta(o) for o in obj)
        if isinstance(obj, dict):
            return {k: meta(v) for k, v in obj.items()}
        return obj
    args, kwargs = meta(node.args), meta(node.kwargs)
    names = {a.name for a in node.target._schema.arguments}
    if "device" in names:
        kwargs["device"] = _META
    if "pin_memory" in names:
        kwargs["pin_memory"] = None
    what = f"node {node.index} '{node.name}' ({node.op})"
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = node.target(*args, **kwargs)
    except NotImplementedError:
        return
    except (RuntimeError, TypeError, ValueError, IndexError, OverflowError) as exc:
        if "data-dependent" in str(exc) or "data dependent" in str(exc):
            return
        said = (str(exc).strip().splitlines() or ["its arguments do not fit it"])[0]
        raise RewindError(f"{what} cannot run on the arguments the program gives it: {said[:200]}") from None
    results = result if isinstance(result, (list, tuple)) else [result]
    for name, i in zip(node.outputs, node.output_indices):
        out = results[i] if i < len(results) else None
        info = values[name]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != info.shape or out.dtype != DTYPES[info.dtype]:
            got = (f"{str(out.dtype).removeprefix('torch.')}{list(out.shape)}" if isinstance(out, torch.Tensor)
                   else "no tensor")
            raise RewindError(f"{what} writes {got} as '{name}', where the program says {info.dtype}"
                              f"{list(info.shape)}")


def _refs(obj: Any, out: list[str]) -> None:
    if isinstance(obj, Ref):
        out.append(obj.name)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _refs(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            _refs(item, out)


def decode_program(obj: Any, initial: dict[str, Any], run_on_meta: bool = True) -> Program:
    """A stored Program back, every field checked (RewindError naming the node or value and what is wrong); with
    run_on_meta, each node's operator also run on meta tensors to check what it writes (_check_on_meta). Without,
    for a Program this machine's Rewind wrote and sealed (the program cache's: torch's Python meta kernels import
    torch._dynamo, seconds of a launch), a node described wrongly fails when it runs."""
    if not isinstance(obj, dict):
        raise RewindError("corrupt program record: not a map")
    for key in ("name", "nodes", "values", "outputs", "buffer_mutations", "source_files"):
        if key not in obj:
            raise RewindError(f"corrupt program record: no '{key}'")
    if not isinstance(obj["name"], str):
        raise RewindError("corrupt program record: its name is not text")
    nodes, stored = obj["nodes"], obj["values"]
    if not isinstance(nodes, list) or not isinstance(stored, list):
        raise RewindError("corrupt program record: its nodes or values are not lists")
    values: dict[str, ValueInfo] = {}
    for v in stored:
        info = _decode_value(v, len(nodes))
        if info.name in values:
            raise RewindError(f"value '{info.name}' is defined twice")
        values[info.name] = info
    decoded = [_decode_node(i, n, values) for i, n in enumerate(nodes)]
    for node in decoded if run_on_meta else ():
        _check_on_meta(node, values)
    for info in values.values():
        if info.producer is not None and info.name not in decoded[info.producer].outputs:
            raise RewindError(f"value '{info.name}' names node {info.producer} as its producer, which does not "
                              f"write it")
    outputs = _str_list(obj["outputs"], "the program's outputs")
    mutations = _str_map(obj["buffer_mutations"], "the program's buffer mutations")
    for name in list(outputs) + list(mutations):
        if name not in values or values[name].producer is None:
            raise RewindError(f"program output '{name}' is not a value the program computes")
    for buf in mutations.values():
        if buf not in values or values[buf].kind not in ("buffer", "parameter"):  # a training step's update
            raise RewindError(f"buffer mutation writes '{buf}', which is not a buffer of the program")
    sources = _str_map(obj["source_files"], "the program's source files")
    starts, losses, gradients = _training_fields(obj, values, len(decoded))
    optimizer = obj.get("optimizer", "")
    if not isinstance(optimizer, str) or not (optimizer == "" or _IDENTIFIER.fullmatch(optimizer)):
        raise RewindError(f"the program's optimizer {shown(optimizer)} is not the name of a class")
    return Program(name=obj["name"], nodes=decoded, values=values, initial=initial, outputs=list(outputs),
                   buffer_mutations=dict(mutations), source_files=dict(sources), step_starts=starts, losses=losses,
                   gradients=gradients, optimizer=optimizer)


def _training_fields(obj: dict, values: dict[str, ValueInfo], count: int) -> tuple[list, list, list]:
    """A training Program's steps: the first node of each (increasing from 0), its loss and its gradients, all
    values of the program (none in a trace of an inference pass, or written before training steps)."""
    starts = obj.get("step_starts", [])
    if (not isinstance(starts, list) or not all(type(s) is int and 0 <= s < count for s in starts)
            or starts[:1] not in ([], [0]) or starts != sorted(set(starts))):
        raise RewindError(f"the program's step starts {shown(starts)} are not node indices rising from 0")
    losses = _str_list(obj.get("losses", []), "the program's losses")
    gradients = obj.get("gradients", [])
    if not isinstance(gradients, list):
        raise RewindError("the program's gradients are not a list of maps")
    gradients = [_str_map(g, "the program's gradients of a step") for g in gradients]
    named = losses + [n for g in gradients for pair in g.items() for n in pair]
    unknown = next((n for n in named if n not in values), None)
    if unknown is not None:
        raise RewindError(f"the program's losses or gradients name {shown(unknown)}, which is not a value of it")
    if not len(losses) == len(gradients) == len(starts):
        raise RewindError(f"the program has {len(starts)} steps, {len(losses)} losses and {len(gradients)} maps of "
                          "gradients")
    return list(starts), list(losses), [dict(g) for g in gradients]
