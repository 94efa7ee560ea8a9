"""Lowerings where every output element depends on input elements at one place: elementwise math,
casts, masks, fills, layout copies (view, transpose, cat, ...) and embedding lookups.

The output, viewed as [rows, last dim], is cut into boxes dealt to all cores. For each box a
core loads the input elements it needs (a DMA gather: broadcasting and layout changes are just
index patterns), computes into an output tile and stores it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from hardware.drivers.sim.isa import Access, Buffer
from hardware.drivers.sim.kernel import (KernelBuilder, box_index, box_text, chunks, lowers, rows_cols, split)
from hardware.errors import UnsupportedOpError
from hardware.program import Ref

Box = tuple[int, int, int, int]  # rows [r0, r1) x columns [c0, c1) of the [rows, last dim] view


@dataclass
class Operand:
    value: str | None  # None: an immediate
    index: np.ndarray | None = None  # output flat index -> flat element of `value`
    scalar: Any = None


def operand(b: KernelBuilder, arg: Any, out_shape: tuple[int, ...]) -> Operand:
    if isinstance(arg, Ref):
        shape = b.info(arg.name).shape
        return Operand(arg.name, np.broadcast_to(np.arange(math.prod(shape), dtype=np.int64).reshape(shape),
                                                 out_shape).reshape(-1))
    if isinstance(arg, (bool, int, float)):
        return Operand(None, scalar=arg)
    raise UnsupportedOpError(f"{b.node.describe()}: argument {arg!r} is neither a tensor nor a number")


def boxes(b: KernelBuilder, rows: int, cols: int) -> list[tuple[int, Box]]:
    """(core, box) work items covering a [rows, cols] output, every box small enough for a tile."""
    units = b.config.cores
    row_parts = max(1, min(rows, units))
    col_parts = max(1, min(cols, units // row_parts))
    limit = b.tile_elements
    out = []
    for i, (r0, r1) in enumerate(split(rows, row_parts)):
        for j, (c0, c1) in enumerate(split(cols, col_parts)):
            core = (i * col_parts + j) % units
            for ca, cb in chunks(c0, c1, limit):
                out += [(core, (ra, rb, ca, cb)) for ra, rb in chunks(r0, r1, limit // (cb - ca))]
    return out


def gather(buffer: Buffer, index: np.ndarray) -> Access:
    """Elements of a DRAM buffer by flat index; described as a box of its [rows, last dim] view (or a box
    read transposed) when it is one."""
    grid = index.reshape(index.shape if index.ndim == 2 else (1, index.size))
    box = _box(grid, rows_cols(buffer.shape)[1])
    if box is not None:
        return Access(buffer, index.ravel(), box_text(buffer.label, *box), ((box[0], box[1]), (box[2], box[3])))
    box = _box(grid.T, rows_cols(buffer.shape)[1])
    if box is not None:
        return Access(buffer, index.ravel(), box_text(buffer.label, *box) + ".T")
    return Access(buffer, index.ravel(), f"{buffer.label}[gather of {index.size}]")


def _box(grid: np.ndarray, cols: int) -> Box | None:
    if not grid.size:
        return None
    h, w = grid.shape
    r0, c0 = divmod(int(grid[0, 0]), cols)
    if c0 + w <= cols and np.array_equal(grid, box_index(r0, r0 + h, c0, c0 + w, cols)):
        return r0, r0 + h, c0, c0 + w
    return None


def store_box(b: KernelBuilder, core: int, out: Buffer, tile: Buffer, box: Box, tag: int) -> None:
    r0, r1, c0, c1 = box
    _, cols = rows_cols(out.shape)
    b.store(core, Access(out, box_index(r0, r1, c0, c1, cols).ravel(), box_text(out.label, *box)), tile, tag)
    b.emit(core, "dma.wait", tag=tag)
    b.release(core)


Compute = Callable[[int, Buffer, list, Box], None]  # (core, result tile, sources, box)


def pointwise(b: KernelBuilder, out_name: str, operands: list[Operand], compute: Compute) -> None:
    out = b.dram(out_name)
    rows, cols = rows_cols(out.shape)
    for core, box in boxes(b, rows, cols):
        r0, r1, c0, c1 = box
        idx = box_index(r0, r1, c0, c1, cols)
        tag = b.new_tag(core)
        sources: list = []
        for op in operands:
            if op.value is None:
                sources.append(op.scalar)
                continue
            src = b.dram(op.value)
            tile = b.tile(core, idx.shape, src.dtype, op.value)
            b.load(core, tile, gather(src, op.index[idx]), tag)
            sources.append(tile)
        if any(isinstance(s, Buffer) for s in sources):
            b.emit(core, "dma.wait", tag=tag)
        result = b.tile(core, idx.shape, out.dtype, out_name, ((r0, r1), (c0, c1)))
        compute(core, result, sources, box)
        store_box(b, core, out, result, box, tag)


def _elementwise(b: KernelBuilder, args: list, compute: Compute) -> None:
    shape = b.info(b.node.outputs[0]).shape
    pointwise(b, b.node.outputs[0], [operand(b, a, shape) for a in args], compute)


# -- elementwise math ----------------------------------------------------------------------------------
_UNARY = {"relu": "relu", "silu": "silu", "sigmoid": "sigmoid", "exp": "exp", "tanh": "tanh", "neg": "neg",
          "rsqrt": "rsqrt", "sqrt": "sqrt", "abs": "abs", "bitwise_not": "not", "logical_not": "not"}


@lowers(*(f"aten.{name}.default" for name in _UNARY), "aten.gelu.default")
def unary(b: KernelBuilder) -> None:
    node = b.node
    name = node.op.split(".")[1]
    op = _UNARY.get(name, "gelu")
    if name == "gelu":
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        op = {"none": "gelu", "tanh": "gelu_tanh"}[approximate]
    _elementwise(b, [node.args[0]], lambda core, dst, s, box: b.emit(core, f"vec.{op}", dst, (s[0],)))


_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "max", "minimum": "min",
           "pow": "pow", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne",
           "logical_and": "and", "logical_or": "or", "rsub": "sub", "clamp_max": "min", "clamp_min": "max"}


@lowers(*(f"aten.{n}.{o}" for n in ("add", "sub", "mul", "div") for o in ("Tensor", "Scalar")),
        *(f"aten.{n}.{o}" for n in ("lt", "le", "gt", "ge", "eq", "ne") for o in ("Tensor", "Scalar")),
        "aten.maximum.default", "aten.minimum.default", "aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor",
        "aten.logical_and.default", "aten.logical_or.default", "aten.rsub.Scalar", "aten.clamp_max.default",
        "aten.clamp_min.default")
def binary(b: KernelBuilder) -> None:
    node = b.node
    name = node.op.split(".")[1]
    if node.op == "aten.div.Tensor_mode" or node.kwargs.get("rounding_mode"):
        raise UnsupportedOpError(f"{node.describe()}: division with a rounding mode is not lowered")
    lhs, rhs = node.args[0], node.args[1]
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
    if name == "rsub":
        lhs, rhs = rhs, lhs
    op = _BINARY[name]

    def compute(core: int, dst: Buffer, s: list, box: Box) -> None:
        a, c = (s[1], s[0]) if name == "rsub" else (s[0], s[1])
        if alpha != 1:  # a + alpha * c: scale first, in a wide tile
            scaled = b.tile(core, dst.shape, np.float32)
            b.emit(core, "vec.mul", scaled, (c, float(alpha)))
            c = scaled
        b.emit(core, f"vec.{op}", dst, (a, c))

    _elementwise(b, [rhs, lhs] if name == "rsub" else [lhs, rhs], compute)


@lowers("aten.masked_fill.Scalar", "aten.masked_fill.Tensor", "aten.where.self")
def select(b: KernelBuilder) -> None:
    node = b.node
    if node.op == "aten.where.self":
        _elementwise(b, list(node.args[:3]), lambda core, dst, s, box: b.emit(core, "sel", dst, (s[0], s[1], s[2])))
        return
    x, mask, value = node.args[:3]
    _elementwise(b, [x, mask, value], lambda core, dst, s, box: b.emit(core, "sel", dst, (s[1], s[2], s[0])))


@lowers("aten._to_copy.default")
def convert(b: KernelBuilder) -> None:
    _elementwise(b, [b.node.args[0]], lambda core, dst, s, box: b.emit(core, "cvt", dst, (s[0],)))


@lowers("aten.tril.default", "aten.triu.default")
def triangle(b: KernelBuilder) -> None:
    node = b.node
    diagonal = node.args[1] if len(node.args) > 1 else node.kwargs.get("diagonal", 0)
    shape = b.info(node.outputs[0]).shape
    if len(shape) < 2:
        raise UnsupportedOpError(f"{node.describe()}: tril/triu needs at least 2 dimensions")
    upper = node.op.startswith("aten.triu")

    def compute(core: int, dst: Buffer, s: list, box: Box) -> None:
        b.emit(core, "mask.tri", dst, (s[0],), imm=(int(diagonal), box[0], box[2], shape[-2], upper))

    _elementwise(b, [node.args[0]], compute)


_FILLS = {"aten.ones.default": lambda a: 1, "aten.zeros.default": lambda a: 0, "aten.full.default": lambda a: a[1],
          "aten.ones_like.default": lambda a: 1, "aten.zeros_like.default": lambda a: 0,
          "aten.full_like.default": lambda a: a[1], "aten.scalar_tensor.default": lambda a: a[0]}


@lowers(*_FILLS)
def fill(b: KernelBuilder) -> None:
    value = _FILLS[b.node.op](b.node.args)
    pointwise(b, b.node.outputs[0], [], lambda core, dst, s, box: b.emit(core, "fill", dst, imm=(value,)))


# -- layout: the op itself, run on element indices, says where each output element comes from -----------
_LAYOUT = ("view.default", "_unsafe_view.default", "transpose.int", "t.default", "permute.default", "expand.default",
           "slice.Tensor", "select.int", "unsqueeze.default", "squeeze.dim", "squeeze.dims", "squeeze.default",
           "clone.default", "alias.default", "detach.default", "split.Tensor", "split_with_sizes.default",
           "unbind.int", "cat.default", "slice_scatter.default", "copy.default", "repeat.default", "flip.default")
_SOURCE_BITS = 40


def sources(b: KernelBuilder) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """For each output: (input number, flat element of that input) of every output element.

    This is the compiler's address generation: the layout op applied to tensors of element indices
    (tagged with their input's number) moves indices exactly as it moves elements. No arithmetic
    on values happens here."""
    node = b.node
    names = node.input_names()

    def indices(name: str) -> torch.Tensor:
        shape = b.info(name).shape
        tag = names.index(name) << _SOURCE_BITS
        return (torch.arange(math.prod(shape), dtype=torch.int64) + tag).reshape(shape)

    args, kwargs = node.bind(indices)
    result = node.target(*args, **kwargs)
    results = [result] if isinstance(result, torch.Tensor) else [result[i] for i in node.output_indices]
    out = {}
    for name, tensor in zip(node.outputs, results):
        flat = tensor.contiguous().reshape(-1).numpy()
        out[name] = (flat >> _SOURCE_BITS, flat & ((1 << _SOURCE_BITS) - 1))
    return names, out


@lowers(*(f"aten.{op}" for op in _LAYOUT))
def layout_copy(b: KernelBuilder) -> None:
    names, maps = sources(b)
    for out_name, (which, element) in maps.items():
        out = b.dram(out_name)
        bad = sorted({names[j] for j in np.unique(which) if b.dram(names[j]).dtype != out.dtype})
        if bad:
            raise UnsupportedOpError(f"{b.node.describe()}: inputs {', '.join(bad)} have another dtype than the output")
        rows, cols = rows_cols(out.shape)
        for core, box in boxes(b, rows, cols):
            _copy_box(b, core, out, box, which, element, names)


def _copy_box(b: KernelBuilder, core: int, out: Buffer, box: Box, which, element, names: list[str]) -> None:
    r0, r1, c0, c1 = box
    idx = box_index(r0, r1, c0, c1, rows_cols(out.shape)[1])
    tag = b.new_tag(core)
    tile = b.tile(core, idx.shape, out.dtype, out.label, ((r0, r1), (c0, c1)))
    ids, elems = which[idx], element[idx]
    for j in np.unique(ids):
        mask = ids == j
        src = gather(b.dram(names[j]), elems if mask.all() else elems[mask].reshape(1, -1))
        dst = Access(tile) if mask.all() else Access(tile, np.flatnonzero(mask.ravel()), f"{tile.label}[part]")
        b.emit(core, "dma.ld", dst, (src,), tag=tag)
    b.emit(core, "dma.wait", tag=tag)
    store_box(b, core, out, tile, box, tag)


@lowers("aten.embedding.default", "aten.index.Tensor")
def embedding(b: KernelBuilder) -> None:
    """Rows of a table picked by indices (embedding; x[ids] on the first dimension). Gangs take blocks of
    indices, the cores of a gang take columns; a gather DMA reads the table rows."""
    node = b.node
    if node.op == "aten.index.Tensor":
        table_arg, picks = node.args[0], node.args[1]
        if len(picks) != 1 or not isinstance(picks[0], Ref) or b.info(picks[0].name).dtype not in ("int64", "int32"):
            raise UnsupportedOpError(f"{node.describe()}: indexing is lowered for one integer index tensor on the "
                                     "first dimension only")
        ids_arg = picks[0]
    else:
        table_arg, ids_arg = node.args[0], node.args[1]
    table, ids, out = b.dram(table_arg.name), b.dram(ids_arg.name), b.dram(node.outputs[0])
    if len(table.shape) < 1:
        raise UnsupportedOpError(f"{node.describe()}: the table must have at least one dimension")
    width, per = math.prod(table.shape[1:]), b.config.cores_per_gang
    for gang, (r0, r1) in enumerate(split(ids.numel, b.config.gangs)):
        for j, (c0, c1) in enumerate(split(width, per)):
            core = gang * per + j
            for ra, rb in chunks(r0, r1, b.tile_elements // (c1 - c0)):
                tag = b.new_tag(core)
                rows = b.tile(core, (rb - ra,), ids.dtype, ids.label)
                b.load(core, rows, Access(ids, np.arange(ra, rb), f"{ids.label}[{ra}:{rb}]"), tag)
                b.emit(core, "dma.wait", tag=tag)
                tile = b.tile(core, (rb - ra, c1 - c0), table.dtype, out.label, ((ra, rb), (c0, c1)))
                b.emit(core, "dma.gather", tile, (Access(table), rows), imm=(c0, c1), tag=tag)
                b.emit(core, "dma.wait", tag=tag)
                index = box_index(ra, rb, c0, c1, width)  # the output viewed as [indices, table row]
                b.store(core, Access(out, index.ravel(), box_text(out.label, ra, rb, c0, c1)), tile, tag)
                b.emit(core, "dma.wait", tag=tag)
                b.release(core)
