"""Happens-before race detection over vector clocks, FastTrack-style, element by element.

Every unit (core or DMA engine) has a vector clock; barriers, semaphores and DMA issue and
completion carry clocks between units. Each buffer's elements remember their last write
(unit, clock, step) and, per unit, their last read. An access conflicts with an earlier one
by another unit to the same element when at least one of them writes, they are not both
atomic adds, and the earlier one does not happen before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hardware.drivers.sim.isa import Buffer


@dataclass(frozen=True)
class Conflict:
    """An unordered pair of accesses to the same elements of one buffer."""

    buffer: Buffer
    first_unit: int
    first_step: int
    second_unit: int
    second_step: int
    first_writes: bool
    second_writes: bool
    elements: tuple[int, int]  # [first, last] flat element in conflict

    def byte_range(self) -> tuple[int, int]:
        size = self.buffer.dtype.itemsize
        return self.buffer.address + self.elements[0] * size, self.buffer.address + (self.elements[1] + 1) * size


@dataclass
class _Shadow:
    writer: np.ndarray
    clock: np.ndarray
    step: np.ndarray
    atomic: np.ndarray
    reads: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # unit -> (clock, step)

    @staticmethod
    def of(numel: int) -> "_Shadow":
        return _Shadow(np.full(numel, -1, np.int16), np.zeros(numel, np.int32), np.zeros(numel, np.int32),
                       np.zeros(numel, bool))


class RaceDetector:
    def __init__(self):
        self._shadows: dict[int, _Shadow] = {}

    def _shadow(self, buffer: Buffer) -> _Shadow:
        s = self._shadows.get(id(buffer))
        if s is None:
            s = self._shadows[id(buffer)] = _Shadow.of(buffer.numel)
        return s

    def last_write(self, buffer: Buffer) -> int | None:
        """The step of the latest write to any element of the buffer (None: never written in this node)."""
        s = self._shadows.get(id(buffer))
        return int(s.step.max()) if s is not None and (s.writer >= 0).any() else None

    def access(self, buffer: Buffer, index, unit: int, clocks: np.ndarray, step: int, write: bool,
               atomic: bool = False) -> Conflict | None:
        """Check one access by `unit` (its vector clock `clocks`) at `step`, then remember it."""
        s = self._shadow(buffer)
        found = self._against_write(s, buffer, index, unit, clocks, step, write, atomic)
        if write:
            found = found or self._against_reads(s, buffer, index, unit, clocks, step)
            s.writer[index], s.clock[index], s.step[index], s.atomic[index] = unit, clocks[unit], step, atomic
        else:
            reads = s.reads.get(unit)
            if reads is None:
                reads = s.reads[unit] = (np.zeros(buffer.numel, np.int32), np.zeros(buffer.numel, np.int32))
            reads[0][index], reads[1][index] = clocks[unit], step
        return found

    @staticmethod
    def _against_write(s: _Shadow, buffer: Buffer, index, unit: int, clocks: np.ndarray, step: int, write: bool,
                       atomic: bool) -> Conflict | None:
        writer = s.writer[index]
        other = (writer >= 0) & (writer != unit)
        if not other.any():
            return None
        who = writer.astype(np.int64)
        unordered = other & (s.clock[index] > clocks[np.where(other, who, 0)])
        if atomic:
            unordered &= ~s.atomic[index]
        return _conflict(buffer, index, unordered, who, s.step[index], unit, step, True, write)

    @staticmethod
    def _against_reads(s: _Shadow, buffer: Buffer, index, unit: int, clocks: np.ndarray, step: int) -> Conflict | None:
        for reader, (clock, steps) in s.reads.items():
            if reader == unit:
                continue
            unordered = clock[index] > clocks[reader]
            if unordered.any():
                return _conflict(buffer, index, unordered, np.full(unordered.shape, reader), steps[index], unit, step,
                                 False, True)
        return None


def _conflict(buffer: Buffer, index, unordered: np.ndarray, who: np.ndarray, steps: np.ndarray, unit: int, step: int,
              first_writes: bool, second_writes: bool) -> Conflict | None:
    hits = np.flatnonzero(unordered)
    if not len(hits):
        return None
    flat = np.arange(buffer.numel)[index] if isinstance(index, slice) else np.asarray(index)
    elements = flat[hits]
    first = int(hits[np.argmax(steps[hits])])  # the latest unordered earlier access: the one just before
    return Conflict(buffer, int(who[first]), int(steps[first]), unit, step, first_writes, second_writes,
                    (int(elements.min()), int(elements.max())))
