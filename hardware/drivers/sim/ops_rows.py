"""Lowerings that reduce along the last dimension(s): softmax, layer norm, RMS norm, sum, mean, amax.

Tensor parallel across a gang: gangs take blocks of rows, the cores of a gang split the columns.
A row statistic is a cross-core reduction: each core stores its partial to a DRAM scratch area,
the gang meets at a barrier, then each core loads every partial and reduces them itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hardware.drivers.sim.isa import Access, Buffer
from hardware.drivers.sim.kernel import KernelBuilder, box_index, box_text, chunks, lowers, split
from hardware.drivers.sim.ops_pointwise import store_box
from hardware.errors import UnsupportedOpError
from hardware.program import Ref

F32 = np.float32


@dataclass
class RowItem:
    """One core's share of a block of rows: rows [r0, r1) x its columns [c0, c1)."""

    b: KernelBuilder
    core: int
    slot: int  # the core's place in its gang's reduction
    width: int  # cores reducing together
    gang: int
    r0: int
    r1: int
    c0: int
    c1: int
    tag: int

    @property
    def rows(self) -> int:
        return self.r1 - self.r0

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.c1 - self.c0

    def tile(self, shape=None, dtype=F32, value: str | None = None) -> Buffer:
        return self.b.tile(self.core, shape or self.shape, dtype, value)

    def load(self, name: str, cols: int, value: bool = True) -> Buffer:
        """This item's box of a [rows, cols] DRAM value (a [1, cols] vector when `value` is False)."""
        buf = self.b.dram(name)
        r0, r1 = (self.r0, self.r1) if value else (0, 1)
        tile = self.b.tile(self.core, (r1 - r0, self.c1 - self.c0), buf.dtype, name,
                           ((r0, r1), (self.c0, self.c1)) if value else ())
        idx = box_index(r0, r1, self.c0, self.c1, cols)
        self.b.load(self.core, tile, Access(buf, idx.ravel(), box_text(name, r0, r1, self.c0, self.c1)), self.tag)
        return tile

    def emit(self, op: str, dst, *srcs, imm: tuple = ()) -> Buffer:
        self.b.emit(self.core, op, dst, srcs, imm)
        return dst

    def wait(self) -> None:
        self.b.emit(self.core, "dma.wait", tag=self.tag)

    def reduce(self, op: str, x: Buffer, scratch: Buffer, barrier: int) -> Buffer:
        """The whole-row `op` of x across the gang: partial -> scratch -> barrier -> every partial -> reduce."""
        part = self.emit(f"red.{op}", self.tile((self.rows, 1)), x)
        total_rows = scratch.shape[1]
        mine = self.slot * total_rows + np.arange(self.r0, self.r1)
        self.b.store(self.core, Access(scratch, mine, f"{scratch.label}[{self.slot}, {self.r0}:{self.r1}]"), part,
                     self.tag)
        self.wait()
        self.b.emit(self.core, "bar", tag=barrier)
        every = np.arange(self.width)[None, :] * total_rows + np.arange(self.r0, self.r1)[:, None]
        parts = self.tile((self.rows, self.width))
        self.b.load(self.core, parts, Access(scratch, every.ravel(), f"{scratch.label}[:, {self.r0}:{self.r1}]"),
                    self.tag)
        self.wait()
        return self.emit(f"red.{op}", self.tile((self.rows, 1)), parts)


def row_items(b: KernelBuilder, rows: int, cols: int, stages: int):
    """Yield (RowItem, barrier ids) for every work item; each item's `stages` reductions get their own barriers."""
    per = b.config.cores_per_gang
    col_parts = split(cols, per)
    widest = max(c1 - c0 for c0, c1 in col_parts)
    for gang, (ra, rb) in enumerate(split(rows, b.config.gangs)):
        for r0, r1 in chunks(ra, rb, max(1, b.tile_elements // widest)):
            barriers = [b.barrier(gang, len(col_parts)) for _ in range(stages)]
            for slot, (c0, c1) in enumerate(col_parts):
                core = gang * per + slot
                yield RowItem(b, core, slot, len(col_parts), gang, r0, r1, c0, c1, b.new_tag(core)), barriers


def _scratch(b: KernelBuilder, rows: int, cols: int, *what: str) -> list[Buffer]:
    """One [cores, rows] area per reduction stage, for the cores' partial row results."""
    width = len(split(cols, b.config.cores_per_gang))
    return [b.scratch_buffer((width, rows), f"partial {w} of {b.node.name}") for w in what]


def _finish(item: RowItem, out_name: str, result: Buffer) -> None:
    out = item.b.dram(out_name)
    if result.dtype != out.dtype:
        result = item.emit("cvt", item.tile(dtype=out.dtype, value=out_name), result)
    store_box(item.b, item.core, out, result, (item.r0, item.r1, item.c0, item.c1), item.tag)


def _view(b: KernelBuilder, name: str, last: int = 1) -> tuple[int, int]:
    shape = b.info(name).shape
    cols = math.prod(shape[len(shape) - last:])
    return math.prod(shape) // max(cols, 1), cols


@lowers("aten.softmax.int", "aten._softmax.default", "aten._log_softmax.default", "aten.log_softmax.int")
def softmax(b: KernelBuilder) -> None:
    node = b.node
    x, dim = node.args[0].name, node.args[1]
    if dim not in (-1, len(b.info(x).shape) - 1):
        raise UnsupportedOpError(f"{node.describe()}: softmax is lowered along the last dimension only, not {dim}")
    log = "log_softmax" in node.op
    rows, cols = _view(b, x)
    scratch = _scratch(b, rows, cols, "maxima", "sums")
    for item, (first, second) in row_items(b, rows, cols, 2):
        xt = item.load(x, cols)
        item.wait()
        peak = item.reduce("max", xt, scratch[0], first)
        shifted = item.emit("vec.sub", item.tile(), xt, peak)
        e = item.emit("vec.exp", item.tile(), shifted)
        total = item.reduce("sum", e, scratch[1], second)
        if log:
            logs = item.emit("vec.log", item.tile((item.rows, 1)), total)
            result = item.emit("vec.sub", item.tile(), shifted, logs)
        else:
            result = item.emit("vec.div", item.tile(), e, total)
        _finish(item, node.outputs[0], result)


@lowers("aten.layer_norm.default")
def layer_norm(b: KernelBuilder) -> None:
    node = b.node
    x, shape = node.args[0].name, node.args[1]
    weight, bias = (list(node.args[2:4]) + [None, None])[:2]
    eps = node.args[4] if len(node.args) > 4 else 1e-5
    rows, cols = _view(b, x, len(shape))
    scratch = _scratch(b, rows, cols, "sums", "squared deviations")
    for item, (first, second) in row_items(b, rows, cols, 2):
        xt = item.load(x, cols)
        w = item.load(weight.name, cols, value=False) if isinstance(weight, Ref) else None
        bi = item.load(bias.name, cols, value=False) if isinstance(bias, Ref) else None
        item.wait()
        mean = item.emit("vec.mul", item.tile((item.rows, 1)), item.reduce("sum", xt, scratch[0], first), 1.0 / cols)
        centred = item.emit("vec.sub", item.tile(), xt, mean)
        square = item.emit("vec.mul", item.tile(), centred, centred)
        var = item.emit("vec.mul", item.tile((item.rows, 1)), item.reduce("sum", square, scratch[1], second), 1.0 / cols)
        result = _normalise(item, centred, var, eps, w)
        if bi is not None:
            item.emit("vec.add", result, result, bi)
        _finish(item, node.outputs[0], result)


def _normalise(item: RowItem, x: Buffer, mean_square: Buffer, eps: float, weight: Buffer | None) -> Buffer:
    """x * rsqrt(mean_square + eps) (* weight)."""
    item.emit("vec.add", mean_square, mean_square, float(eps))
    scale = item.emit("vec.rsqrt", item.tile((item.rows, 1)), mean_square)
    result = item.emit("vec.mul", item.tile(), x, scale)
    if weight is not None:
        item.emit("vec.mul", result, result, weight)
    return result


@lowers("aten.rms_norm.default")
def rms_norm(b: KernelBuilder) -> None:
    node = b.node
    x, shape = node.args[0].name, node.args[1]
    weight = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
    eps = node.args[3] if len(node.args) > 3 else node.kwargs.get("eps")
    if eps is None:
        eps = float(np.finfo(np.float32).eps) if b.info(x).dtype != "float64" else float(np.finfo(np.float64).eps)
    rows, cols = _view(b, x, len(shape))
    scratch = _scratch(b, rows, cols, "sums of squares")
    for item, (only,) in row_items(b, rows, cols, 1):
        xt = item.load(x, cols)
        w = item.load(weight.name, cols, value=False) if isinstance(weight, Ref) else None
        item.wait()
        square = item.emit("vec.mul", item.tile(), xt, xt)
        mean = item.emit("vec.mul", item.tile((item.rows, 1)), item.reduce("sum", square, scratch[0], only), 1.0 / cols)
        _finish(item, node.outputs[0], _normalise(item, xt, mean, eps, w))


@lowers("aten.sum.dim_IntList", "aten.mean.dim", "aten.amax.default", "aten.sum.default", "aten.mean.default")
def reduction(b: KernelBuilder) -> None:
    """Along trailing dimensions: the gang's first core stores the row results."""
    node = b.node
    x = node.args[0].name
    ndim = len(b.info(x).shape)
    dims = node.args[1] if len(node.args) > 1 and node.args[1] not in (None, []) else list(range(ndim))
    dims = sorted(d % max(ndim, 1) for d in ([dims] if isinstance(dims, int) else dims))
    if dims != list(range(ndim - len(dims), ndim)):
        raise UnsupportedOpError(f"{node.describe()}: reductions are lowered over trailing dimensions only, not {dims}")
    rows, cols = _view(b, x, len(dims))
    op = "max" if "amax" in node.op else "sum"
    scratch = _scratch(b, rows, cols, "maxima" if op == "max" else "sums")
    out = b.dram(node.outputs[0])
    for item, (only,) in row_items(b, rows, cols, 1):
        xt = item.load(x, cols)
        item.wait()
        total = item.reduce(op, xt, scratch[0], only)
        if item.slot:
            item.b.release(item.core)
            continue
        if "mean" in node.op:
            item.emit("vec.mul", total, total, 1.0 / cols)
        result = item.emit("cvt", item.tile((item.rows, 1), out.dtype, out.label), total)
        idx = np.arange(item.r0, item.r1)
        b.store(item.core, Access(out, idx, f"{out.label}[{item.r0}:{item.r1}]"), result, item.tag)
        item.wait()
        b.release(item.core)
