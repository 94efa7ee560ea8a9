"""The instruction-level part of the driver contract, for chips whose nodes run as instruction
streams on many units (the `sim` chip; a real many-core accelerator's driver implements the same).

A position inside a node is (tick, step): `step` steps of the node's recorded interleaving have run.
The driver keeps, per node, the Schedule of its last run (which unit took each step, at which
instruction) and what it found there (races, a hang), and can put the chip in the state of any step
by restoring the node's start and replaying the Schedule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from hardware.memory import Location
from hardware.program import Node


@dataclass(frozen=True)
class RaceReport:
    """Two unordered accesses to the same memory, at least one a write."""

    first_unit: int
    first_step: int
    first_pc: int
    second_unit: int
    second_step: int
    second_pc: int
    kind: str  # "write-write", "read-write", "write-read"
    space: str
    address: int
    nbytes: int
    tensor: str  # the value (or scratch area, or tile) the memory holds


@dataclass(frozen=True)
class UnitWait:
    """One edge set of a hang's wait-for graph: `unit` waits on `what` since `since`, for `waiting_for`."""

    unit: int
    what: str  # "barrier 3", "semaphore 0", "DMA tag 2"
    since: int  # the step of the node at which it began waiting
    waiting_for: tuple[int, ...]
    detail: str


@dataclass(frozen=True)
class HangReport:
    step: int  # every live unit is blocked once this many steps have run
    waits: tuple[UnitWait, ...]


@dataclass(frozen=True)
class StepFinding:
    """Something else a chip's run found at one step (a kernel's out-of-bounds lanes, padding reaching an output):
    the exception filter that stops there, and what it says."""

    filter: str
    step: int  # the step that did it: a stop is after it
    unit: int
    message: str
    detail: dict = field(default_factory=dict)


@dataclass
class NodeSchedule:
    """A node's recorded interleaving: unit (Chip unit id) and instruction index of every step."""

    units: np.ndarray
    pcs: np.ndarray
    races: list[RaceReport] = field(default_factory=list)
    hang: HangReport | None = None
    findings: list[StepFinding] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.units)

    @property
    def positions(self) -> int:
        """Distinct positions inside the node: steps 0..n-1, plus the hung state after the last step."""
        return len(self.units) + (1 if self.hang else 0)


@dataclass(frozen=True)
class UnitState:
    unit: int
    pc: int | None  # index of its next instruction (None: a DMA engine, or halted)
    status: str  # "ready", "blocked", "halted", "idle", "busy"
    detail: str  # what it waits on, or its next instruction's text


@dataclass(frozen=True)
class InstructionInfo:
    address: int
    unit: int
    pc: int
    text: str
    file: str | None = None  # the source line of the instruction itself, on a chip whose code has lines (a kernel's)
    line: int | None = None


@dataclass(frozen=True)
class MemoryRegion:
    """What an address holds: its memory, and the buffer (value, scratch or tile) there in a node."""

    space: str
    core: int | None
    bank: int | None
    start: int  # the buffer's first address (the address itself where no buffer is)
    nbytes: int
    label: str | None = None
    value: str | None = None  # a Program value held whole at `start` in DRAM


class ChipState(ABC):
    """The chip inside one node, after some steps of its Schedule."""

    step: int

    @abstractmethod
    def units(self) -> list[UnitState]: ...

    @abstractmethod
    def read(self, address: int, count: int) -> bytes: ...

    @abstractmethod
    def touches(self, address: int) -> bool:
        """Does the node read or write this address (its footprint)?"""

    @abstractmethod
    def placement(self, value: str) -> list[Location]:
        """Local-memory tiles holding elements of `value` at this step."""


@runtime_checkable
class InstructionDriver(Protocol):
    """A capability of drivers whose nodes run as interleaved instruction streams (hardware/driver.py lists the
    others), found with `isinstance`."""

    @abstractmethod
    def schedule(self, node: int) -> NodeSchedule | None:
        """The recorded Schedule of the node's last run (None before it ran)."""

    @abstractmethod
    def chip_at(self, node: Node, args: tuple, kwargs: dict, step: int) -> ChipState:
        """The chip after `step` steps of the node (its inputs are `args`): node start restored, Schedule replayed."""

    @abstractmethod
    def memory_before(self, node: int, address: int, count: int) -> bytes:
        """Bytes at a physical address when the node is about to start."""

    @abstractmethod
    def region(self, address: int, node: int | None) -> MemoryRegion | None:
        """What is at a physical address (tiles are the node's); None where no memory is mapped."""

    @abstractmethod
    def disassemble(self, node: int, unit: int) -> list[InstructionInfo]: ...

    @abstractmethod
    def instruction_at(self, address: int) -> tuple[int, int, int] | None:
        """(node, unit, pc) of the instruction at a code address."""

    @abstractmethod
    def rewrite(self, node: int, prefix: list[int], edits: list[tuple[int, int, bytes]]) -> None:
        """The node's next run follows `prefix` (unit ids) and then its policy, and applies each edit
        (step, address, bytes) before that step. Called after the Timeline forgot the node's old run."""

    @abstractmethod
    def edits(self, node: int) -> list[tuple[int, int, bytes]]:
        """The memory edits the node's last run applied."""
