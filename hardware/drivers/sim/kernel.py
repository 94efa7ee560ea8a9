"""A node lowered for the sim chip: one instruction stream per core, and the builder lowerings use.

DRAM holds every Program value at an address fixed at load (the MemoryPlan) and a scratch arena
that each node reuses for cross-core partial results. Each core's local memory is a bump
allocator reset between work items (every item waits for its stores first, so reuse is ordered).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

from hardware.drivers.sim.chip import ChipConfig
from hardware.drivers.sim.isa import Access, Buffer, Instr
from hardware.errors import UnsupportedOpError
from hardware.program import Node, Program, ValueInfo

ALIGN = 64
_DTYPES = {
    "float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2, "int64": np.int64,
    "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_,
}


def np_dtype(name: str) -> np.dtype:
    dtype = _DTYPES.get(name)
    if dtype is None:
        raise UnsupportedOpError(f"the sim chip has no {name} type (it has {', '.join(_DTYPES)})")
    return np.dtype(dtype)


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class MemoryPlan:
    """Every Program value's DRAM buffer, then the scratch arena."""

    def __init__(self, config: ChipConfig, program: Program):
        self.config = config
        self.buffers: dict[str, Buffer] = {}
        top = 0
        for info in program.values.values():
            buf = _dram_buffer(config, len(self.buffers), top, np_dtype(info.dtype), info.shape, info.name)
            buf.value, buf.elements = info.name, tuple((0, s) for s in rows_cols(info.shape))
            self.buffers[info.name] = buf
            top = _align(top + max(buf.nbytes, 1))
        self.scratch_base = top
        self.scratch_bytes = 0

    @property
    def dram_bytes(self) -> int:
        return self.scratch_base + self.scratch_bytes


def _dram_buffer(config: ChipConfig, ident: int, offset: int, dtype: np.dtype, shape, label: str) -> Buffer:
    return Buffer(ident, "DRAM", None, offset, config.dram_base + offset, dtype, tuple(shape), label)


def rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    """The 2-D view every lowering uses: [product of leading dims, last dim]."""
    if not shape:
        return 1, 1
    return math.prod(shape[:-1]), int(shape[-1])


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, in elements."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


@dataclass
class Kernel:
    node: int
    programs: list[list[Instr]]  # per core
    barriers: dict[int, int]  # barrier id -> arrivals it waits for
    barrier_gang: dict[int, int]
    semaphores: int
    inputs: list[Buffer]  # DRAM buffers of the node's input values
    outputs: list[Buffer]  # DRAM buffers of its outputs, in node.outputs order
    scratch: list[Buffer]
    local_used: list[int]  # bytes of each core's local memory the kernel uses (from 0)
    tiles: list[Buffer] = field(default_factory=list)

    def write_set(self) -> list[tuple[str, int | None, int, int]]:
        """Byte ranges (space, core, start, stop) the kernel may write: its node-start checkpoint covers them."""
        out = [("DRAM", None, b.offset, b.offset + b.nbytes) for b in self.outputs + self.scratch]
        out += [("local", core, 0, used) for core, used in enumerate(self.local_used) if used]
        return out

    def instruction_count(self) -> int:
        return sum(len(p) for p in self.programs)


class KernelBuilder:
    """What a lowering writes into: per-core streams, local tiles, DMA tags, barriers, semaphores."""

    def __init__(self, config: ChipConfig, plan: MemoryPlan, program: Program, node: Node):
        self.config, self.plan, self.program, self.node = config, plan, program, node
        cores = config.cores
        self.programs: list[list[Instr]] = [[] for _ in range(cores)]
        self._top = [0] * cores
        self._high = [0] * cores
        self._tags = [0] * cores
        self._ids = 0
        self.tiles: list[Buffer] = []
        self.barriers: dict[int, int] = {}
        self.barrier_gang: dict[int, int] = {}
        self.semaphores = 0
        self.scratch: list[Buffer] = []
        self._scratch_top = plan.scratch_base
        self.tile_elements = config.local_bytes // 64  # a work item's tiles always fit

    # -- values ------------------------------------------------------------------------------
    def info(self, name: str) -> ValueInfo:
        return self.program.values[name]

    def dram(self, name: str) -> Buffer:
        return self.plan.buffers[name]

    def scratch_buffer(self, shape: tuple[int, ...], label: str, dtype=np.float32) -> Buffer:
        """A DRAM area for this node's cross-core partial results (`label` says what it holds)."""
        offset = self._scratch_top
        buf = _dram_buffer(self.config, -1 - len(self.scratch), offset, np.dtype(dtype), shape, label)
        self._scratch_top = _align(offset + buf.nbytes)
        self.plan.scratch_bytes = max(self.plan.scratch_bytes, self._scratch_top - self.plan.scratch_base)
        self.scratch.append(buf)
        return buf

    # -- local memory --------------------------------------------------------------------------
    def tile(self, core: int, shape, dtype, value: str | None = None,
             elements: tuple[tuple[int, int], ...] = ()) -> Buffer:
        c = self.config
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        offset = _align(self._top[core])
        if offset // c.bank_bytes != (offset + max(nbytes, 1) - 1) // c.bank_bytes:
            offset = -(-offset // c.bank_bytes) * c.bank_bytes  # a tile never straddles two banks
        if offset + nbytes > c.local_bytes or nbytes > c.bank_bytes:
            raise UnsupportedOpError(f"{self.node.describe()}: a work item needs more {c.local_name} than core "
                                     f"{core} has ({c.local_bytes} bytes)")
        self._ids += 1
        buf = Buffer(self._ids, c.local_name, core, offset, c.local_address(core, offset), dtype, tuple(shape),
                     f"t{len(self.tiles)}", value, elements)
        self._top[core] = offset + nbytes
        self._high[core] = max(self._high[core], self._top[core])
        self.tiles.append(buf)
        return buf

    def release(self, core: int) -> None:
        """The core's work item is over and every transfer it issued has completed: reuse its tiles."""
        self._top[core] = 0

    # -- instructions ----------------------------------------------------------------------------
    def emit(self, core: int, op: str, dst=None, srcs: tuple = (), imm: tuple = (), tag: int = 0) -> Instr:
        ins = Instr(op, dst, tuple(srcs), tuple(imm), tag)
        self.programs[core].append(ins)
        return ins

    def new_tag(self, core: int) -> int:
        self._tags[core] += 1
        return self._tags[core]

    def load(self, core: int, tile: Buffer, src: Access, tag: int) -> None:
        if src.box and not tile.elements and tile.value == src.buffer.value:
            tile.elements = src.box
        self.emit(core, "dma.ld", tile, (src,), tag=tag)

    def store(self, core: int, dst: Access, tile: Buffer, tag: int) -> None:
        self.emit(core, "dma.st", dst, (tile,), tag=tag)

    def barrier(self, gang: int, count: int) -> int:
        ident = len(self.barriers)
        self.barriers[ident], self.barrier_gang[ident] = count, gang
        return ident

    def semaphore(self) -> int:
        self.semaphores += 1
        return self.semaphores - 1

    def gang_cores(self, gang: int) -> range:
        per = self.config.cores_per_gang
        return range(gang * per, (gang + 1) * per)

    def finish(self) -> Kernel:
        for stream in self.programs:
            stream.append(Instr("halt"))
        node = self.node
        inputs = [self.dram(n) for n in node.input_names()]
        return Kernel(node.index, self.programs, self.barriers, self.barrier_gang, self.semaphores, inputs,
                      [self.dram(n) for n in node.outputs], self.scratch, list(self._high), self.tiles)


def box_index(r0: int, r1: int, c0: int, c1: int, cols: int) -> np.ndarray:
    """Flat indices of rows [r0, r1) x columns [c0, c1) of a [*, cols] matrix, as a 2-D array."""
    return np.arange(r0, r1, dtype=np.int64)[:, None] * cols + np.arange(c0, c1, dtype=np.int64)[None, :]


def box_text(name: str, r0: int, r1: int, c0: int, c1: int) -> str:
    return f"{name}[{r0}:{r1}, {c0}:{c1}]"


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) in at most `parts` contiguous non-empty pieces, as even as possible."""
    parts = max(1, min(parts, n))
    edges = [n * i // parts for i in range(parts + 1)]
    return [(edges[i], edges[i + 1]) for i in range(parts)]


def chunks(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    size = max(1, size)
    return [(s, min(s + size, stop)) for s in range(start, stop, size)]


Lowering = Callable[[KernelBuilder], None]
LOWERINGS: dict[str, Lowering] = {}


def lowers(*ops: str) -> Callable[[Lowering], Lowering]:
    """Register a lowering for ops named like `aten.add.Tensor`."""

    def register(fn: Lowering) -> Lowering:
        for op in ops:
            LOWERINGS[op] = fn
        return fn

    return register
