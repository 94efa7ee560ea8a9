"""The kernel's memory: the tensors of one launch at addresses of their own, and what each element saw.

Triton pointers are host addresses of the tensors the driver owns; `resolve` turns a block of them into
(tensor, element offsets) and says which lanes fall outside every tensor. The physical address map the
debugger shows (readMemory, disassemble) is a `global` space of its own, one tensor after another.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GLOBAL_BASE = 0x1_0000_0000  # the kernel tensors' physical addresses start here
ALIGN = 256
REDZONE = 4096  # bytes of no tensor after each one, at least


@dataclass
class KernelTensor:
    """One tensor argument of the kernel: its Program value, its host storage and its address in `global`."""

    param: str  # the kernel parameter it is bound to
    value: str  # the Program value that holds it before the launch
    tensor: torch.Tensor  # contiguous, owned by the driver for the run
    address: int  # physical address in `global`

    @property
    def pointer(self) -> int:
        return self.tensor.data_ptr()

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    @property
    def itemsize(self) -> int:
        return self.tensor.element_size()

    def flat(self) -> np.ndarray:
        """The elements as a flat numpy view (bytes viewed as the tensor's dtype; bfloat16 as raw 16-bit words)."""
        raw = self.tensor.view(-1).view(torch.uint8).numpy()
        return raw.view(_numpy_word(self.itemsize)) if self.tensor.dtype == torch.bfloat16 else \
            self.tensor.view(-1).numpy()


def _numpy_word(size: int) -> np.dtype:
    return {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size]


@dataclass(frozen=True)
class Resolved:
    """Where a block of pointers lands: per lane, the tensor index (-1: outside every tensor) and element."""

    tensor: np.ndarray  # int32 per lane
    element: np.ndarray  # int64 per lane (meaningless where tensor is -1)

    @property
    def outside(self) -> np.ndarray:
        return self.tensor < 0


class KernelMemory:
    def __init__(self, tensors: list[KernelTensor]):
        self.tensors = tensors
        order = sorted(range(len(tensors)), key=lambda i: tensors[i].pointer)
        self._order = np.array(order, np.int32)
        self._starts = np.array([tensors[i].pointer for i in order], np.uint64)
        self._ends = np.array([tensors[i].pointer + tensors[i].nbytes for i in order], np.uint64)
        self._sizes = np.array([tensors[i].itemsize for i in order], np.uint64)

    def resolve(self, pointers: np.ndarray) -> Resolved:
        flat = np.asarray(pointers, np.uint64).reshape(-1)
        slot = np.searchsorted(self._starts, flat, side="right").astype(np.int64) - 1
        safe = np.clip(slot, 0, max(len(self._starts) - 1, 0))
        if not len(self._starts):
            return Resolved(np.full(flat.shape, -1, np.int32), np.zeros(flat.shape, np.int64))
        inside = (slot >= 0) & (flat + self._sizes[safe] <= self._ends[safe]) & (flat >= self._starts[safe])
        element = ((flat - self._starts[safe]) // self._sizes[safe]).astype(np.int64)
        tensor = np.where(inside, self._order[safe], -1).astype(np.int32)
        shape = np.shape(pointers)
        return Resolved(tensor.reshape(shape), element.reshape(shape))

    def owned(self) -> dict[str, torch.Tensor]:
        """Parameter name -> the driver's own copy the kernel runs on."""
        return {t.param: t.tensor for t in self.tensors}

    def write(self, tensor: int, offset: int, data: bytes) -> None:
        raw = self.tensors[tensor].tensor.view(-1).view(torch.uint8).numpy()
        raw[offset:offset + len(data)] = np.frombuffer(data, np.uint8)

    def snapshot(self) -> list[np.ndarray]:
        return [t.tensor.view(-1).view(torch.uint8).numpy().copy() for t in self.tensors]

    def restore(self, saved: list[np.ndarray]) -> None:
        for t, raw in zip(self.tensors, saved):
            t.tensor.view(-1).view(torch.uint8).numpy()[:] = raw

    def by_address(self, address: int) -> tuple[int, int] | None:
        """(tensor index, byte offset) of a physical `global` address."""
        for i, t in enumerate(self.tensors):
            if t.address <= address < t.address + t.nbytes:
                return i, address - t.address
        return None


def layout(params: list[tuple[str, str, torch.Tensor]]) -> list[KernelTensor]:
    """Fresh contiguous copies of the launch's tensors, placed one after another in `global`, and in one host
    arena with a red zone after each (as large as the tensor, at least REDZONE bytes): a lane past a tensor's end
    lands in no tensor, whatever the host allocator would have put there."""
    sizes = [max(t.numel() * t.element_size(), 1) for _, _, t in params]
    spans = [_aligned(n) + _aligned(max(n, REDZONE)) for n in sizes]
    arena = torch.zeros(sum(spans) + ALIGN, dtype=torch.uint8)
    start = -arena.data_ptr() % ALIGN
    out, address = [], GLOBAL_BASE
    for (param, value, tensor), n, span in zip(params, sizes, spans):
        src = tensor.detach().contiguous()
        own = arena[start:start + src.numel() * src.element_size()].view(src.dtype).view(src.shape)
        own.copy_(src)
        out.append(KernelTensor(param, value, own, address))
        address += _aligned(n)
        start += span
    return out


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class ElementHistory:
    """Per element of every tensor: the last program that wrote it and the last that read it (FastTrack-style),
    so two programs touching one element, at least one writing, neither with an atomic, are a race."""

    def __init__(self, memory: KernelMemory):
        sizes = [t.tensor.numel() for t in memory.tensors]
        self.writer = [np.full(n, -1, np.int32) for n in sizes]
        self.write_step = [np.zeros(n, np.int64) for n in sizes]
        self.write_atomic = [np.zeros(n, bool) for n in sizes]
        self.reader = [np.full(n, -1, np.int32) for n in sizes]
        self.read_step = [np.zeros(n, np.int64) for n in sizes]
        self.read_atomic = [np.zeros(n, bool) for n in sizes]

    def conflicts(self, tensor: int, elements: np.ndarray, unit: int, writes: bool, atomic: bool
                  ) -> list[tuple[str, int, int, int]]:
        """(kind, first unit, first step, element) of each earlier access by another program this access races
        with: the earlier write (and, for a write, the earlier read), unless both are atomic."""
        found = []
        earlier = [("write", self.writer, self.write_step, self.write_atomic)]
        if writes:
            earlier.append(("read", self.reader, self.read_step, self.read_atomic))
        for kind, who, step, was_atomic in earlier:
            prev = who[tensor][elements]
            clash = (prev >= 0) & (prev != unit) & ~(was_atomic[tensor][elements] & atomic)
            if clash.any():
                i = int(np.flatnonzero(clash)[0])
                e = int(elements[i])
                found.append((f"{kind}-{'write' if writes else 'read'}", int(prev[i]), int(step[tensor][e]), e))
        return found

    def written(self, tensor: int) -> bool:
        """Did any program write an element of the tensor?"""
        return bool((self.writer[tensor] >= 0).any())

    def record(self, tensor: int, elements: np.ndarray, unit: int, step: int, writes: bool, atomic: bool) -> None:
        who, when, kind = (self.writer, self.write_step, self.write_atomic) if writes else \
            (self.reader, self.read_step, self.read_atomic)
        who[tensor][elements] = unit
        when[tensor][elements] = step
        kind[tensor][elements] = atomic
