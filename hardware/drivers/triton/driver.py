"""The `triton` driver: a user's Triton kernel launch is one node, its program instances are units, each Triton
operation an instruction at its kernel line (hardware/instructions.py, the sim chip's contract).

The launch's first run (at load: it says which tensors the kernel writes, the Program's outputs) records the
Schedule (which program ran each step, at which operation), every access and the findings. Any later run (stepping
inside the launch, a recomputation) starts from the nearest quiescent step at or before the one asked for (no
program half-way: every program boundary of the default order is one), with the tensors as the recorded stores
left them there, and replays the Schedule from it; the run is checked against the record.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import torch

from hardware import tensor_checks, torch_tensors
from hardware.driver import Chip, Driver, MemorySpace, Unit, WriteStats
from hardware.drivers.triton import elements
from hardware.drivers.triton.launch import KernelLaunch
from hardware.drivers.triton.memory import GLOBAL_BASE, KernelMemory, layout
from hardware.drivers.triton.run import Edit, ProgramRun, RunLog
from hardware.drivers.triton.state import KernelChipState, schedule_of
from hardware.errors import DriverError
from hardware.instructions import ChipState, InstructionDriver, InstructionInfo, MemoryRegion, NodeSchedule
from hardware.memory import Location
from hardware.program import Node, Program, Ref
from hardware.torch_tensors import TensorBytes

CODE_BASE = 0x7000_0000_0000  # instruction addresses: CODE_BASE + (unit << 24) + 4 * pc
UNIT_SHIFT = 24
AFTER = "_after"  # the Program value of a tensor the kernel writes, as the launch leaves it: `out_after`


@dataclass
class Record:
    """What the launch's first run left: its log (Schedule, operations, accesses, findings), its edits."""

    log: RunLog
    schedule: NodeSchedule
    edits: tuple[Edit, ...]
    quiescent: np.ndarray  # steps at which no program is half-way (0 included)
    last_step: np.ndarray  # per unit, its last step (-1: it never ran)

    @property
    def steps(self) -> int:
        return len(self.log.units)


class TritonDriver(TensorBytes, Driver, InstructionDriver):
    name = "triton"

    def __init__(self, launch: KernelLaunch):
        self.launch = launch
        torch_tensors.keep_freed_memory()  # values cross to the host, where the ring retains them
        self.memory = KernelMemory(layout([(a.name, a.name, a.value) for a in launch.tensors]))
        self.start = self.memory.snapshot()  # the tensors when the launch starts
        self.record: Record | None = None
        self.pending: tuple[list[int], tuple[Edit, ...]] | None = None
        self.program: Program | None = None
        self._side: ProgramRun | None = None
        self._fresh = False  # the memory holds the end of the record's run, from these inputs
        self._placed: dict[str, torch.Tensor] | None = None  # the input tensors `start` was taken from
        self.steps_run = 0  # every interpreted step, replays included
        self.reference_ops: set[str] = set()  # the torch ops the file's reference() computed with (forensics.py)
        self.on_record: Callable[[Record], None] | None = None  # told of each new record (program.py's forensics)

    # -- the chip ---------------------------------------------------------------------------------------
    def describe(self) -> Chip:
        units = (Unit(0, "host"),) + tuple(Unit(u, self.launch.program_name(u))
                                          for u in range(1, self.launch.programs + 1))
        last = self.memory.tensors[-1] if self.memory.tensors else None
        size = (last.address + last.nbytes - GLOBAL_BASE) if last else 0
        return Chip("triton:interpreter", units, (MemorySpace("global", GLOBAL_BASE, size),))

    def first_run(self) -> Record:
        """Run the whole launch once, recording it (at load, before the Program exists)."""
        self._close_side()
        self.memory.restore(self.start)
        prefix, edits = self.pending or (None, ())
        self.pending = None
        run = ProgramRun(self.launch, self.memory, np.array(prefix, np.int32) if prefix else None, edits)
        run.run()
        run.unwritten_reads()
        self.steps_run += run.steps
        self.record = _record(run, self.launch.programs, edits)
        self.end = self.memory.snapshot()  # the tensors as the launch left them
        self._fresh = True
        if self.on_record is not None:
            self.on_record(self.record)
        return self.record

    def tensor_at_end(self, param: str) -> torch.Tensor:
        """A tensor of the launch as the recorded run left it."""
        t = self.memory.tensors[self._index(param)]
        raw = torch.from_numpy(self.end[self._index(param)].copy())
        return raw.view(t.tensor.dtype).reshape(t.tensor.shape)

    def written(self) -> list[str]:
        """The parameters whose tensors the recorded run stored into (in parameter order)."""
        touched = {a.tensor for a in self.record.log.accesses if a.kind != "load"}
        return [t.param for i, t in enumerate(self.memory.tensors) if i in touched]

    # -- loading and running -----------------------------------------------------------------------------
    def load(self, program: Program) -> dict[str, Any]:
        self.program = program
        return {name: tensor.clone() for name, tensor in program.initial.items()}

    def execute(self, node: Node, args: tuple, kwargs: dict) -> list[Any]:
        self._close_side()
        inputs = _bound(node, args, kwargs)
        same = all(torch.equal(self.memory.tensors[self._index(n)].tensor, t) for n, t in inputs.items()) \
            if self._fresh else False
        if not same or self.pending is not None or self.record is None:
            self._start_from(inputs)
            if self.record is None or self.pending is not None:
                self.first_run()
            else:
                self._replay(None)
        self._fresh = False
        return [self.memory.tensors[self._index(self._param_of(name))].tensor.clone() for name in node.outputs]

    def _start_from(self, inputs: dict[str, torch.Tensor]) -> None:
        """The launch's start is these inputs (placed again only when they are other tensors than last time: a
        replay restores the start itself)."""
        if self._placed is not None and self._placed.keys() == inputs.keys() and all(
                self._placed[n] is t for n, t in inputs.items()):
            return
        for name, tensor in inputs.items():
            self._place(name, tensor)
        self.start = self.memory.snapshot()
        self._placed = dict(inputs)

    def _place(self, name: str, tensor: torch.Tensor) -> None:
        own = self.memory.tensors[self._index(name)].tensor
        if tuple(own.shape) != tuple(tensor.shape) or own.dtype != tensor.dtype:
            raise DriverError(f"'{name}' is {own.dtype}{list(own.shape)} in this launch; got {tensor.dtype}"
                              f"{list(tensor.shape)}")
        own.copy_(tensor)

    def _index(self, param: str) -> int:
        return next(i for i, t in enumerate(self.memory.tensors) if t.param == param)

    def _param_of(self, value: str) -> str:
        return value.removesuffix(AFTER)

    def _replay(self, until: int | None) -> ProgramRun:
        """A run of the recorded Schedule from the nearest quiescent step at or before `until` (None: the end)."""
        record = self.record
        target = record.steps if until is None else until
        first_edit = min((e.step for e in record.edits), default=target)
        q = record.quiescent
        start = int(q[np.searchsorted(q, min(target, first_edit), side="right") - 1])
        self.memory.restore(self.start)
        for acc in record.log.accesses:
            if acc.step >= start:
                break
            if acc.kind != "load":
                self.memory.tensors[acc.tensor].flat()[acc.elements] = acc.values
        done = frozenset(int(u) for u in np.flatnonzero((record.last_step >= 0) & (record.last_step < start)))
        run = ProgramRun(self.launch, self.memory, np.asarray(record.log.units[start:], np.int32), record.edits,
                         start=start, done=done, record=False)
        run.log.units = list(record.log.units[:start])  # the policy continues the last program
        run.log.ops = record.log.ops
        run.run(until)
        self.steps_run += run.steps - start
        if until is None and run.steps != record.steps:
            raise DriverError(f"the launch of {self.launch.name} did not replay its recorded interleaving "
                              f"({run.steps} steps, {record.steps} recorded)")
        return run

    def _close_side(self) -> None:
        if self._side is not None:
            self._side.close()
            self._side = None

    # -- where values live ----------------------------------------------------------------------------------
    def locate(self, tensor: Any, unit: str | None = None) -> Location:
        return torch_tensors.locate(tensor, unit or "host")

    def locate_value(self, name: str, tensor: Any, unit: str | None = None) -> Location:
        t = self.memory.tensors[self._index(self._param_of(name))]
        shape = tuple(t.tensor.shape)
        return Location("triton:interpreter", unit or "host", "global", t.address, t.nbytes,
                        str(t.tensor.dtype).removeprefix("torch."), shape, tuple(t.tensor.stride()))

    def placement(self, name: str, tensor: Any) -> tuple[Location, ...]:
        return (self.locate_value(name, tensor),)

    def inspect(self, tensor: Any) -> WriteStats:
        return tensor_checks.inspect(tensor)

    def to_host(self, tensor: Any) -> Any:
        return torch_tensors.to_host(tensor)

    def from_host(self, tensor: Any) -> Any:
        return torch_tensors.from_host(tensor, torch.device("cpu"))

    def cast(self, tensor: Any, dtype: str) -> Any:
        return torch_tensors.cast(tensor, dtype)

    # -- instruction level --------------------------------------------------------------------------------------
    def schedule(self, node: int) -> NodeSchedule | None:
        return self.record.schedule if self.record is not None else None

    def chip_at(self, node: Node, args: tuple, kwargs: dict, step: int) -> ChipState:
        side = self._side
        if side is None or side.steps > step or side.done or side.closed:
            self._close_side()
            self._start_from(_bound(node, args, kwargs))
            self._fresh = False
            side = self._side = self._replay(step)
        else:
            before = side.steps
            side.run(step)
            self.steps_run += side.steps - before
        return KernelChipState(self.memory, side)

    def memory_before(self, node: int, address: int, count: int) -> bytes:
        where = self.memory.by_address(address)
        if where is None:
            raise DriverError(f"no memory is mapped at {address:#x}")
        t, offset = where
        return self.start[t][offset:offset + count].tobytes()

    def region(self, address: int, node: int | None) -> MemoryRegion | None:
        where = self.memory.by_address(address)
        if where is None:
            return None
        t = self.memory.tensors[where[0]]
        value = t.param if node is not None else self._after(t.param)
        return MemoryRegion("global", None, None, t.address, t.nbytes, t.param, value)

    def _after(self, param: str) -> str:
        after = param + AFTER
        return after if self.program is not None and after in self.program.values else param

    def element_writes(self, node: int, watched: str) -> list[tuple[int, str]] | None:
        """The steps whose stores or atomics write `watched` (a tensor by parameter or value name, or one element of
        it: `out_ptr[37]`, a flat index), with what each wrote there; None when it names no tensor of the launch."""
        w = elements.watched(self.memory, watched, AFTER)  # an index that is no element: refused in words
        if w is None:
            return None
        t, element = self.memory.tensors[w.tensor], w.element
        out = []
        for acc in self.record.log.accesses if self.record else ():
            if acc.tensor != w.tensor or acc.kind == "load":
                continue
            hit = np.flatnonzero(acc.elements == element) if element is not None else np.arange(min(1, len(acc.elements)))
            if len(hit):
                e = int(acc.elements[hit[0]])
                out.append((acc.step, f"{t.param}[{e}] = {elements.shown(elements.number(t, acc.values[hit[0]]))}"))
        return out

    def locate_elements(self, node: int, watched: str, steps: int | None) -> dict | None:
        """`locate` of a tensor of the launch or one element of it (`out_ptr[37]`) after `steps` steps (None: the
        whole launch): its place in `global` and what the recorded accesses did to it (elements.py); None when
        `watched` names no tensor of the launch."""
        w = elements.watched(self.memory, watched, AFTER)
        if w is None:
            return None
        record = self.record
        steps = record.steps if steps is None else min(steps, record.steps)
        story = elements.tensor_story if w.element is None else elements.element_story
        found = story(self.launch, self.memory, record.log.accesses, w, steps, record.steps)
        t = self.memory.tensors[w.tensor]
        whole = self.locate_value(w.name, t.tensor)
        shard = whole if w.element is None else replace(
            whole, address=found["address"], nbytes=found["nbytes"], shape=(), strides=(),
            elements=tuple((int(i), int(i) + 1) for i in found["index"]))
        value = w.name if self.program is not None and w.name in self.program.values else t.param
        return {"value": value, "shards": [shard.to_dict()], "kernel": found}

    def code_address(self, unit: int, pc: int) -> int:
        return CODE_BASE + (unit << UNIT_SHIFT) + 4 * pc

    def instruction_at(self, address: int) -> tuple[int, int, int] | None:
        unit, offset = divmod(address - CODE_BASE, 1 << UNIT_SHIFT)
        if address < CODE_BASE or offset % 4 or self.record is None:
            return None
        ops = self.record.log.ops.get(unit)
        if not ops or offset // 4 >= len(ops):
            return None
        return 0, unit, offset // 4

    def disassemble(self, node: int, unit: int) -> list[InstructionInfo]:
        file = str(self.launch.file)
        ops = self.record.log.ops.get(unit, []) if self.record else []
        return [InstructionInfo(self.code_address(unit, pc), unit, pc, op.text, file, op.line)
                for pc, op in enumerate(ops)]

    def rewrite(self, node: int, prefix: list[int], edits: list[tuple[int, int, bytes]]) -> None:
        kept = []
        for step, address, data in edits:
            where = self.memory.by_address(address)
            if where is None:
                raise DriverError(f"no memory is mapped at {address:#x}")
            kept.append(Edit(step, where[0], where[1], bytes(data)))
        self.pending = (list(prefix), tuple(kept))

    def edits(self, node: int) -> list[tuple[int, int, bytes]]:
        record = self.record
        return [(e.step, self.memory.tensors[e.tensor].address + e.offset, e.data) for e in record.edits] \
            if record else []


def _record(run: ProgramRun, programs: int, edits: tuple[Edit, ...]) -> Record:
    units = np.asarray(run.log.units, np.int32)
    first = np.full(programs + 1, -1, np.int64)
    last = np.full(programs + 1, -1, np.int64)
    steps = np.arange(len(units))
    np.maximum.at(last, units, steps)
    first[units[::-1]] = steps[::-1]
    ran = first >= 0
    events = np.zeros(len(units) + 2, np.int64)  # programs half-way when s steps have run: first < s <= last
    np.add.at(events, first[ran] + 1, 1)
    np.add.at(events, last[ran] + 1, -1)
    quiescent = np.flatnonzero(np.cumsum(events)[:len(units) + 1] == 0)
    return Record(run.log, schedule_of(run), edits, quiescent, last)


def _bound(node: Node, args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """Kernel parameter -> the tensor bound to it (the node's arguments are the parameters' values, by name)."""
    return {spec.name: value for spec, value in zip(node.args, args) if isinstance(spec, Ref)}
