"""Bytes for tensors and Programs: what checkpoint tiers and trace files store.

Tensors are raw element bytes compressed with lz4 plus dtype and shape. Programs are plain
msgpack-able structures; a node's op is stored by name (`aten.linear.default`) and resolved
back to the torch op when a trace is opened.
"""

from __future__ import annotations

from typing import Any

import lz4.block
import torch

from hardware.errors import RewindError
from hardware.program import Frame, Node, Program, Ref, SourceLoc, ValueInfo

MAX_TENSOR_BYTES = 2**31 - 1  # lz4 block limit


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise RewindError(f"unknown dtype '{name}'")
    return dtype


def encode_tensor(tensor: torch.Tensor, compress: bool = True) -> dict:
    t = tensor.detach().contiguous().cpu()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""  # a 0-d tensor has no byte view
    if len(raw) > MAX_TENSOR_BYTES:
        raise RewindError(f"tensor of {len(raw)} bytes is over the {MAX_TENSOR_BYTES}-byte frame limit")
    data = lz4.block.compress(raw, store_size=False) if compress and raw else raw
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "nbytes": len(raw),
            "lz4": bool(compress and raw), "data": data}


def decode_tensor(obj: dict, device: str | torch.device = "cpu") -> torch.Tensor:
    try:
        dtype, shape, nbytes = dtype_of(obj["dtype"]), [int(s) for s in obj["shape"]], int(obj["nbytes"])
        data = obj["data"]
        if obj.get("lz4"):
            raw = lz4.block.decompress(data, uncompressed_size=nbytes)
        else:
            raw = bytes(data)
    except (KeyError, TypeError, ValueError, lz4.block.LZ4BlockError) as exc:
        raise RewindError(f"corrupt tensor record: {type(exc).__name__}: {exc}") from None
    expected = torch.empty(0, dtype=dtype).element_size()
    numel = 1
    for s in shape:
        numel *= s
    if len(raw) != nbytes or nbytes != numel * expected:
        raise RewindError(f"corrupt tensor record: {len(raw)} bytes for shape {shape} of {obj['dtype']}")
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


def decode_arg(obj: Any) -> Any:
    if isinstance(obj, list):
        return [decode_arg(o) for o in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) != 1:
        raise RewindError(f"corrupt node argument {obj!r}")
    (tag, value), = obj.items()
    if tag == "$ref":
        return Ref(value)
    if tag == "$dtype":
        return dtype_of(value)
    if tag == "$device":
        return torch.device(value)
    if tag in ("$layout", "$memory_format"):
        return getattr(torch, value)
    if tag == "$tuple":
        return tuple(decode_arg(o) for o in value)
    if tag == "$dict":
        return {k: decode_arg(v) for k, v in value.items()}
    raise RewindError(f"corrupt node argument tag {tag!r}")


def resolve_op(name: str) -> Any:
    """`aten.linear.default` -> torch.ops.aten.linear.default; an unknown op raises when called."""
    parts = name.split(".")
    try:
        ns, packet, overload = parts
        return getattr(getattr(getattr(torch.ops, ns), packet), overload)
    except (ValueError, AttributeError, RuntimeError):
        def unavailable(*_args, **_kwargs):
            raise RewindError(f"op {name} is not available in this torch build")
        return unavailable


def _loc(loc: SourceLoc | None) -> list | None:
    return [loc.file, loc.line, loc.function] if loc else None


def _unloc(obj: list | None) -> SourceLoc | None:
    return SourceLoc(obj[0], int(obj[1]), obj[2]) if obj else None


def encode_program(program: Program) -> dict:
    return {
        "name": program.name,
        "nodes": [{
            "name": n.name, "op": n.op, "args": encode_arg(n.args), "kwargs": encode_arg(n.kwargs),
            "outputs": n.outputs, "output_indices": list(n.output_indices), "loc": _loc(n.loc),
            "frames": [[_loc(f.loc), f.module_path, f.module_class] for f in n.frames],
            "module_stack": [list(m) for m in n.module_stack],
        } for n in program.nodes],
        "values": [[v.name, v.kind, v.dtype, list(v.shape), v.producer, v.output_index, v.target]
                   for v in program.values.values()],
        "outputs": program.outputs,
        "buffer_mutations": program.buffer_mutations,
        "source_files": program.source_files,
    }


def decode_program(obj: dict, initial: dict[str, Any]) -> Program:
    try:
        nodes = [Node(index=i, name=n["name"], op=n["op"], target=resolve_op(n["op"]), args=decode_arg(n["args"]),
                      kwargs=decode_arg(n["kwargs"]), outputs=list(n["outputs"]),
                      output_indices=tuple(n["output_indices"]), loc=_unloc(n["loc"]),
                      frames=tuple(Frame(_unloc(f[0]), f[1], f[2]) for f in n["frames"]),
                      module_stack=tuple(tuple(m) for m in n["module_stack"]))
                 for i, n in enumerate(obj["nodes"])]
        values = {v[0]: ValueInfo(v[0], v[1], v[2], tuple(v[3]), v[4], v[5], v[6]) for v in obj["values"]}
        return Program(name=obj["name"], nodes=nodes, values=values, initial=initial, outputs=list(obj["outputs"]),
                       buffer_mutations=dict(obj["buffer_mutations"]), source_files=dict(obj["source_files"]))
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise RewindError(f"corrupt program record: {type(exc).__name__}: {exc}") from None
