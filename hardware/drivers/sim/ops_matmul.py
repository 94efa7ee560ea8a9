"""Lowerings of matrix products: linear, matmul, mm, bmm, addmm.

Tensor parallel: gangs take blocks of output rows (per batch), the cores of a gang split the
output columns, each core reducing over all of K in chunks. When K is much longer than the
output is wide, the gang splits K instead: the gang's first core stores the bias, signals a
semaphore, and every core adds its partial product into DRAM with an atomic add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hardware.drivers.sim.isa import Access, Buffer
from hardware.drivers.sim.kernel import KernelBuilder, box_text, chunks, lowers, split
from hardware.drivers.sim.ops_pointwise import gather
from hardware.errors import UnsupportedOpError
from hardware.program import Ref

K_CHUNK = 128
F32 = np.float32


@dataclass
class Product:
    """out[batch] = a[batch] @ b[batch] (+ bias), every operand as a map from its [batch, rows, cols] positions
    to its flat elements."""

    a: str
    a_map: np.ndarray  # [batch, M, K]
    b: str
    b_map: np.ndarray  # [batch, K, N]
    bias: str | None
    bias_map: np.ndarray | None  # [batch, M, N]
    out: str

    @property
    def dims(self) -> tuple[int, int, int, int]:
        batch, m, k = self.a_map.shape
        return batch, m, k, self.b_map.shape[2]


def _elements(shape) -> np.ndarray:
    return np.arange(math.prod(shape), dtype=np.int64).reshape(shape)


def _product(b: KernelBuilder, a: Ref, w: Ref, bias, out: str, transpose_w: bool) -> Product:
    a_shape, w_shape = b.info(a.name).shape, b.info(w.name).shape
    if len(a_shape) < 2 and not transpose_w or len(w_shape) < 2:
        raise UnsupportedOpError(f"{b.node.describe()}: products of 1-D operands are not lowered")
    a_map = _elements(a_shape)
    w_map = _elements(w_shape)
    if transpose_w:  # linear: x [..., K] @ W[N, K]^T
        a_map = a_map.reshape(1, -1, a_shape[-1])
        w_map = w_map.T[None]
    else:
        batch = np.broadcast_shapes(a_shape[:-2], w_shape[:-2])
        a_map = np.broadcast_to(a_map, batch + a_shape[-2:]).reshape(-1, *a_shape[-2:])
        w_map = np.broadcast_to(w_map, batch + w_shape[-2:]).reshape(-1, *w_shape[-2:])
    batch, m, k = a_map.shape
    bias_map = None
    if isinstance(bias, Ref):
        bias_map = np.broadcast_to(_elements(b.info(bias.name).shape), (m, w_map.shape[2]))
        bias_map = np.broadcast_to(bias_map, (batch, m, w_map.shape[2]))
    return Product(a.name, a_map, w.name, w_map, bias.name if isinstance(bias, Ref) else None, bias_map, out)


@lowers("aten.linear.default")
def linear(b: KernelBuilder) -> None:
    args = list(b.node.args) + [None]
    lower_product(b, _product(b, args[0], args[1], args[2], b.node.outputs[0], transpose_w=True))


@lowers("aten.matmul.default", "aten.mm.default", "aten.bmm.default")
def matmul(b: KernelBuilder) -> None:
    lower_product(b, _product(b, b.node.args[0], b.node.args[1], None, b.node.outputs[0], transpose_w=False))


@lowers("aten.addmm.default")
def addmm(b: KernelBuilder) -> None:
    node = b.node
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        raise UnsupportedOpError(f"{node.describe()}: addmm with beta or alpha other than 1 is not lowered")
    lower_product(b, _product(b, node.args[1], node.args[2], node.args[0], node.outputs[0], transpose_w=False))


def lower_product(b: KernelBuilder, p: Product) -> None:
    batch, m, k, n = p.dims
    gangs, per = b.config.gangs, b.config.cores_per_gang
    blocks = [(i, r0, r1) for i in range(batch) for r0, r1 in split(m, max(1, gangs // batch))]
    split_k = k >= 4 * n and per > 1 and k >= 2 * per
    for number, (i, r0, r1) in enumerate(blocks):
        gang = number % gangs
        if split_k:
            _split_k(b, p, gang, i, r0, r1)
        else:
            for slot, (c0, c1) in enumerate(split(n, per)):
                _columns(b, p, gang * per + slot, i, r0, r1, c0, c1)


def _limits(b: KernelBuilder, k: int, cols: int) -> tuple[int, int, int]:
    """(K chunk, column chunk, row chunk) so that a work item's tiles fit."""
    kc = min(k, K_CHUNK)
    nc = max(1, min(cols, b.tile_elements // kc))
    return kc, nc, max(1, b.tile_elements // max(kc, nc))


def _columns(b: KernelBuilder, p: Product, core: int, i: int, r0: int, r1: int, c0: int, c1: int) -> None:
    _, _, k, _ = p.dims
    kc, nc, mr = _limits(b, k, c1 - c0)
    for ca, cb in chunks(c0, c1, nc):
        for ra, rb in chunks(r0, r1, mr):
            tag = b.new_tag(core)
            acc = _partial(b, p, core, i, ra, rb, ca, cb, 0, k, tag)
            if p.bias is not None:
                bias = b.tile(core, acc.shape, b.dram(p.bias).dtype, p.bias)
                b.load(core, bias, gather(b.dram(p.bias), p.bias_map[i, ra:rb, ca:cb]), tag)
                b.emit(core, "dma.wait", tag=tag)
                b.emit(core, "vec.add", acc, (acc, bias))
            out = b.dram(p.out)
            result = acc if out.dtype == acc.dtype else _convert(b, core, acc, out)
            b.store(core, _out_box(p, out, i, ra, rb, ca, cb), result, tag)
            b.emit(core, "dma.wait", tag=tag)
            b.release(core)


def _partial(b: KernelBuilder, p: Product, core: int, i: int, ra: int, rb: int, ca: int, cb: int,
             k0: int, k1: int, tag: int) -> Buffer:
    """acc[ra:rb, ca:cb] = sum over K chunks of a[i, ra:rb, k] @ b[i, k, ca:cb] (float32 accumulator)."""
    kc = min(k1 - k0, K_CHUNK)
    a_buf, b_buf = b.dram(p.a), b.dram(p.b)
    acc = b.tile(core, (rb - ra, cb - ca), F32, p.out, ((ra, rb), (ca, cb)) if p.a_map.shape[0] == 1 else ())
    a_tile = b.tile(core, (rb - ra, kc), a_buf.dtype, p.a)
    b_tile = b.tile(core, (kc, cb - ca), b_buf.dtype, p.b)
    for ka, kb in chunks(k0, k1, kc):
        a_t, b_t = (a_tile, b_tile) if kb - ka == kc else (b.tile(core, (rb - ra, kb - ka), a_buf.dtype, p.a),
                                                          b.tile(core, (kb - ka, cb - ca), b_buf.dtype, p.b))
        b.load(core, a_t, gather(a_buf, p.a_map[i, ra:rb, ka:kb]), tag)
        b.load(core, b_t, gather(b_buf, p.b_map[i, ka:kb, ca:cb]), tag)
        b.emit(core, "dma.wait", tag=tag)
        b.emit(core, "mm.acc" if ka > k0 else "mm", acc, (a_t, b_t))
    return acc


def _convert(b: KernelBuilder, core: int, acc: Buffer, out: Buffer) -> Buffer:
    result = b.tile(core, acc.shape, out.dtype, out.label, acc.elements)
    b.emit(core, "cvt", result, (acc,))
    return result


def _out_box(p: Product, out: Buffer, i: int, ra: int, rb: int, ca: int, cb: int) -> Access:
    _, m, _, n = p.dims
    idx = (i * m + np.arange(ra, rb))[:, None] * n + np.arange(ca, cb)[None, :]
    return Access(out, idx.ravel(), box_text(out.label, i * m + ra, i * m + rb, ca, cb))


def _split_k(b: KernelBuilder, p: Product, gang: int, i: int, r0: int, r1: int) -> None:
    _, _, k, n = p.dims
    per = b.config.cores_per_gang
    parts = split(k, per)
    kc, nc, mr = _limits(b, max(k1 - k0 for k0, k1 in parts), n)
    out = b.dram(p.out)
    for ca, cb in chunks(0, n, nc):
        for ra, rb in chunks(r0, r1, mr):
            sem = b.semaphore()
            box = _out_box(p, out, i, ra, rb, ca, cb)
            for slot, (k0, k1) in enumerate(parts):
                core = gang * per + slot
                tag = b.new_tag(core)
                if slot == 0:
                    _store_initial(b, p, core, i, ra, rb, ca, cb, box, tag)
                    b.emit(core, "sig", tag=sem, imm=(len(parts) - 1,))
                acc = _partial(b, p, core, i, ra, rb, ca, cb, k0, k1, tag)
                if slot:
                    b.emit(core, "wait", tag=sem)
                b.emit(core, "atom.add", box, (acc,))
                b.release(core)


def _store_initial(b: KernelBuilder, p: Product, core: int, i: int, ra: int, rb: int, ca: int, cb: int,
                   box: Access, tag: int) -> None:
    """The bias (or zeros) the gang's atomic adds accumulate onto."""
    out = b.dram(p.out)
    init = b.tile(core, (rb - ra, cb - ca), out.dtype, p.out)
    if p.bias is None:
        b.emit(core, "fill", init, imm=(0,))
    else:
        bias = b.tile(core, init.shape, b.dram(p.bias).dtype, p.bias)
        b.load(core, bias, gather(b.dram(p.bias), p.bias_map[i, ra:rb, ca:cb]), tag)
        b.emit(core, "dma.wait", tag=tag)
        b.emit(core, "cvt", init, (bias,))
    b.store(core, box, init, tag)
    b.emit(core, "dma.wait", tag=tag)
