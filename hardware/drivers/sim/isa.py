"""The sim chip's instruction set: operands, instructions, and their disassembly (docs/sim.md).

Operands are Buffers (a tile in a core's local memory, or a value or scratch area in DRAM)
and Accesses (some elements of a Buffer, by flat index: what a DMA descriptor describes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(eq=False)
class Buffer:
    """An allocation: a tile in a core's local memory, or a value or scratch area in DRAM."""

    id: int
    space: str  # "DRAM", or the local memory's name ("SRAM", "TCM")
    core: int | None  # owner of a local tile
    offset: int  # byte offset in its memory
    address: int  # physical address
    dtype: np.dtype
    shape: tuple[int, ...]
    label: str  # the value's name, "scratch 1" or "t7"
    value: str | None = None  # the Program value whose elements it holds
    elements: tuple[tuple[int, int], ...] = ()  # which elements of `value`: [start, stop) per dimension
    flat: np.ndarray | None = field(default=None, repr=False)  # typed view of its bytes, bound by the driver

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def bind(self, memory: np.ndarray) -> None:
        self.flat = memory[self.offset:self.offset + self.nbytes].view(self.dtype)

    def tile(self) -> np.ndarray:
        return self.flat.reshape(self.shape)


@dataclass(eq=False)
class Access:
    """Elements of a buffer, by flat index (None: all of them, in order)."""

    buffer: Buffer
    index: np.ndarray | None = None
    text: str = ""
    box: tuple[tuple[int, int], ...] = ()  # when the elements are a box of the buffer's [rows, last dim] view

    def describe(self) -> str:
        return self.text or self.buffer.label

    def indices(self) -> np.ndarray | slice:
        return slice(None) if self.index is None else self.index


@dataclass(eq=False)
class Instr:
    op: str
    dst: Buffer | Access | None = None
    srcs: tuple = ()  # Buffers, Accesses, or immediates (float) for binary ops
    imm: tuple = ()
    tag: int = 0  # DMA tag, barrier id or semaphore id

    def text(self) -> str:
        return disassemble(self)


def _operand(x) -> str:
    if isinstance(x, Buffer):
        return x.label
    if isinstance(x, Access):
        return x.describe()
    if isinstance(x, float):
        return f"#{x:.6g}"
    return f"#{x}"


def disassemble(ins: Instr) -> str:
    op = ins.op
    if op in ("dma.ld", "dma.st"):
        return f"{op:<10} {_operand(ins.dst)}, {_operand(ins.srcs[0])}  tag {ins.tag}"
    if op == "dma.gather":
        table, rows = ins.srcs
        return f"{op:<10} {_operand(ins.dst)}, {table.buffer.label}[{rows.label}, {ins.imm[0]}:{ins.imm[1]}]  tag {ins.tag}"
    if op == "dma.wait":
        return f"{op:<10} tag {ins.tag}"
    if op == "bar":
        return f"{op:<10} {ins.tag}"
    if op == "sig":
        return f"{op:<10} sem {ins.tag}, {ins.imm[0]}"
    if op == "wait":
        return f"{op:<10} sem {ins.tag}"
    if op == "halt":
        return op
    operands = ([_operand(ins.dst)] if ins.dst is not None else []) + [_operand(s) for s in ins.srcs]
    operands += [_operand(i) for i in ins.imm]
    return f"{op:<10} " + ", ".join(operands)
